"""A checkpoint's files: pieces round-trip exactly (or within the quantization bound), on a local directory
and on fsspec's in-memory filesystem; a partial, corrupt, truncated or missing piece is refused by name."""
import uuid

import numpy as np
import pytest
from hypothesis import given, strategies as st

from ectable.checkpoint import pieces
from ectable.checkpoint.pieces import BadCheckpoint


@pytest.fixture(params=["local", "memory"])
def directory(request, tmp_path):
    if request.param == "local":
        url = str(tmp_path / "ckpt")
    else:
        url = f"memory://ectable-test-{uuid.uuid4().hex}/ckpt"
    fs, root = pieces.location(url)
    fs.makedirs(root, exist_ok=True)
    yield fs, root
    fs.rm(root, recursive=True)


def _rows(n=500, dim=16, state=1, seed=0):
    rng = np.random.default_rng(seed)
    ids = np.sort(rng.choice(1_000_000, n, replace=False)).astype(np.int64)
    return ids, rng.normal(0, 0.1, (n, dim)).astype(np.float32), rng.random((n, state)).astype(np.float32)


def _checkpoint(fs, root, bits=None):
    entries = []
    for t, table in enumerate(["users", "items"]):
        ids, weights, state = _rows(seed=t)
        entries.append({"table": table, **pieces.write_piece(fs, root, pieces.encode_piece(table, ids, weights, state, bits))})
    pieces.write_manifest(fs, root, {"pieces": entries})
    return entries


def test_a_checkpoint_reads_back_bit_exact_without_quantization(directory):
    fs, root = directory
    _checkpoint(fs, root)
    manifest = pieces.read_manifest(fs, root)
    assert [e["table"] for e in manifest["pieces"]] == ["users", "items"]
    for t, entry in enumerate(manifest["pieces"]):
        got = pieces.read_piece(fs, root, entry)
        ids, weights, state = _rows(seed=t)
        assert got["table"] == entry["table"] and got["bits"] is None
        np.testing.assert_array_equal(got["ids"], ids)
        assert got["weights"].tobytes() == weights.tobytes() and got["state"].tobytes() == state.tobytes()
    listed = [f"{root}/{e['file']}" for e in manifest["pieces"]] + [f"{root}/{pieces.MANIFEST}"]
    assert sorted(fs.ls(root, detail=False)) == sorted(listed)  # no temporary manifest left


@pytest.mark.parametrize("bits", [2, 4, 8])
def test_quantized_weights_read_back_within_half_a_step_and_state_exact(directory, bits):
    fs, root = directory
    entry = _checkpoint(fs, root, bits)[0]
    got = pieces.read_piece(fs, root, entry)
    ids, weights, state = _rows(seed=0)
    span = weights.max(axis=1, keepdims=True) - weights.min(axis=1, keepdims=True)
    assert (np.abs(got["weights"] - weights) <= span / ((1 << bits) - 1) / 2 * 1.0001 + 1e-7).all()
    assert got["state"].tobytes() == state.tobytes()
    assert entry["bytes"] < weights.nbytes  # smaller than the float32 weights alone, with ids and state


def test_a_directory_without_its_manifest_is_not_a_checkpoint(directory):
    fs, root = directory
    ids, weights, state = _rows()
    pieces.write_piece(fs, root, pieces.encode_piece("users", ids, weights, state))  # then the writer died
    with pytest.raises(BadCheckpoint, match="no finished checkpoint"):
        pieces.read_manifest(fs, root)
    fs.pipe_file(f"{root}/{pieces.MANIFEST}", b"{not json")
    with pytest.raises(BadCheckpoint, match="not a manifest"):
        pieces.read_manifest(fs, root)


@pytest.mark.parametrize("damage", ["flip", "truncate", "remove"])
def test_a_damaged_piece_is_refused_by_name(directory, damage):
    fs, root = directory
    entry = _checkpoint(fs, root)[1]
    path = f"{root}/{entry['file']}"
    data = bytearray(fs.cat_file(path))
    if damage == "flip":
        data[len(data) // 2] ^= 0x40
        fs.pipe_file(path, bytes(data))
    elif damage == "truncate":
        fs.pipe_file(path, bytes(data[:-10]))
    else:
        fs.rm(path)
    with pytest.raises(BadCheckpoint, match=entry["file"]):
        pieces.read_piece(fs, root, pieces.read_manifest(fs, root)["pieces"][1])


_PIECE = pieces.encode_piece("t", *_rows(n=40, dim=8), bits=4)


@given(st.lists(st.tuples(st.integers(0, len(_PIECE) - 1), st.integers(1, 255)), max_size=4),
       st.integers(0, len(_PIECE)))
def test_damaged_piece_bytes_decode_or_are_refused_never_crash(flips, cut):
    data = bytearray(_PIECE[:cut] if cut < len(_PIECE) // 2 else _PIECE)
    for at, bit in flips:
        if at < len(data):
            data[at] ^= bit
    try:
        got = pieces.decode_piece(bytes(data), "p")
    except BadCheckpoint as exc:
        assert str(exc).startswith("p: ")
    else:
        assert got["weights"].shape == (got["rows"], got["dim"])
