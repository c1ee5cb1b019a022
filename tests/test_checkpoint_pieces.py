"""A checkpoint's files: pieces round-trip exactly (or within the quantization bound), on a local directory
and on fsspec's in-memory filesystem; a partial, corrupt, truncated or missing piece is refused by name."""
import uuid

import lz4.frame
import msgpack
import numpy as np
import pytest
from hypothesis import given, strategies as st

from ectable.checkpoint import pieces
from ectable.checkpoint.pieces import BadCheckpoint
from ectable.transport import codec


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


@pytest.mark.parametrize("ids, width", [([5], 1), ([], 8), ([7, 2, 9], 1), ([1, 1, 2], 8), (np.arange(0, 3000, 3), 1),
                                        ([0, 255, 510], 1), ([0, 256, 300], 2), ([3, 65_538], 2), ([3, 65_539], 4),
                                        ([0, (1 << 32) - 1], 4), ([0, 1 << 32], 8), ([(1 << 62) - 1], 1),
                                        ([1 << 62], 8), ([-4, 0], 8), ([0, 1 << 33, (1 << 33) + 70_000], 8)])
def test_ids_read_back_whatever_their_order_and_gaps(ids, width):
    """Ascending ids (in any order) as gaps of the narrowest width that holds them; others as int64."""
    ids = np.asarray(ids, dtype=np.int64)
    weights, state = np.ones((ids.size, 4), np.float32), np.zeros((ids.size, 1), np.float32)
    weights[:, 0] = np.arange(ids.size)  # each row says where it was given
    data = pieces.encode_piece("t", ids, weights, state)
    got = pieces.decode_piece(data)
    np.testing.assert_array_equal(np.sort(got["ids"]), np.sort(ids))
    np.testing.assert_array_equal(ids[got["weights"][:, 0].astype(int)], got["ids"])
    assert got["ids"].dtype == np.int64 and got["rows"] == ids.size
    header, _ = codec.decode(msgpack.unpackb(lz4.frame.decompress(data[len(pieces.MAGIC):])))
    assert (header["first"] is None) == (width == 8) and header["gap_bytes"] == width


@pytest.mark.parametrize("change", [{"first": -1}, {"first": 1 << 62}, {"first": 2.5}, {"gap_bytes": 3},
                                    {"rows": 4}, {"rows": 2}, {"gaps": [1, 0]}, {"gaps": [1, 2, 3]},
                                    {"gaps": np.array([1, 2], "<u2").view(np.uint8), "gap_bytes": 1},
                                    {"first": (1 << 62) - 3, "gaps": [1, 2]}, {"first": None}])
def test_forged_ids_are_refused(change):
    """A piece whose id fields contradict each other (first id, gap width, gaps, rows) is refused, whatever
    its checksum says."""
    header = {"table": "t", "rows": 3, "dim": 1, "first": 10, "gap_bytes": 1, "bits": None, "adaptive": False,
              "state_bits": None, "state_width": 0}
    gaps = change.pop("gaps", [1, 2])
    header.update(change)
    arrays = [np.asarray(gaps, dtype=np.uint8), np.zeros((3, 1), np.float32), np.zeros((3, 0), np.float32)]
    data = pieces.MAGIC + lz4.frame.compress(msgpack.packb([bytes(f) for f in codec.encode(header, arrays)]))
    with pytest.raises(BadCheckpoint, match="forged: "):
        pieces.decode_piece(data, "forged")


def test_ids_take_far_less_than_eight_bytes_a_row():
    rng = np.random.default_rng(3)
    weights, state = np.zeros((100_000, 1), np.float32), np.zeros((100_000, 0), np.float32)
    contiguous = pieces.encode_piece("t", np.arange(100_000), weights, state)
    sparse = np.sort(rng.choice(400_000, 100_000, replace=False))
    scattered = pieces.encode_piece("t", sparse, weights, state)
    shuffled = pieces.encode_piece("t", rng.permutation(sparse), weights, state)
    repeated = pieces.encode_piece("t", np.repeat(sparse[:50_000], 2), weights, state)  # not ids of one piece
    assert len(contiguous) < 10_000 and len(scattered) < 150_000 and len(shuffled) == len(scattered)
    assert len(repeated) > 300_000


def test_a_piece_of_the_earlier_format_still_reads():
    """tests/fixtures/piece-v2-4bit.ectp: written by `ECTABLE-PIECE-2` code (ids always int64)."""
    with open(__file__.rsplit("/", 1)[0] + "/fixtures/piece-v2-4bit.ectp", "rb") as f:
        got = pieces.decode_piece(f.read())
    rng = np.random.default_rng(7)
    ids = np.sort(rng.choice(100_000, 40, replace=False))
    weights = rng.normal(0, 0.1, (40, 8)).astype(np.float32)
    np.testing.assert_array_equal(got["ids"], ids)
    assert got["table"] == "golden" and got["bits"] == 4 and got["state"].shape == (40, 1)
    assert np.abs(got["weights"] - weights).max() <= (np.ptp(weights, axis=1).max() / 15) / 2 + 1e-6
