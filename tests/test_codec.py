"""The wire format: round trips, and garbage is refused with Malformed, never anything else."""
import msgpack
import numpy as np
import pytest
from hypothesis import given, strategies as st

from ectable.transport import codec

arrays = st.sampled_from(["i8", "f4", "f8", "u1"]).flatmap(
    lambda code: st.lists(st.integers(0, 5), min_size=0, max_size=3).map(
        lambda shape: np.arange(int(np.prod(shape, dtype=np.int64))).astype(codec.DTYPES[code]).reshape(shape)))


@given(st.dictionaries(st.text(max_size=5).filter(lambda k: k != "arrays"), st.integers(-2**63, 2**63 - 1) | st.text(max_size=5),
                       max_size=4),
       st.lists(arrays, max_size=4))
def test_round_trip(header, arrs):
    got_header, got = codec.decode([bytes(f) for f in codec.encode(header, arrs)])
    assert got_header == header
    assert len(got) == len(arrs)
    for a, b in zip(arrs, got):
        assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)


@given(st.lists(st.binary(max_size=40), min_size=0, max_size=4))
def test_garbage_is_malformed(frames):
    try:
        header, arrs = codec.decode(frames)
    except codec.Malformed:
        return
    assert isinstance(header, dict) and all(isinstance(a, np.ndarray) for a in arrs)


@given(st.lists(st.one_of(st.none(), st.integers(-2, 2), st.text(max_size=3),
                          st.lists(st.one_of(st.text(max_size=3), st.integers(-2, 2), st.lists(st.integers(-2, 2), max_size=2)),
                                   max_size=3)), max_size=3),
       st.lists(st.binary(max_size=24), max_size=3))
def test_bad_descriptors_are_malformed(descs, frames):
    """Any descriptors and frames: either Malformed, or arrays that are exactly what the descriptors say,
    each backed by bytes the message carried (never anything else raised, never an array out of thin air)."""
    try:
        header, arrays = codec.decode([msgpack.packb({"op": "get", "arrays": descs}), *frames])
    except codec.Malformed:
        return
    assert header == {"op": "get"} and len(arrays) == len(descs)
    assert sum(a.nbytes for a in arrays) <= sum(len(f) for f in frames)
    for desc, array in zip(descs, arrays):
        assert isinstance(desc, list) and array.dtype == np.dtype(desc[0]) and list(array.shape) == list(desc[1])


def test_refuses_other_dtypes():
    with pytest.raises(TypeError):
        codec.encode({}, [np.array(["x"])])
    with pytest.raises(codec.Malformed):
        codec.decode([msgpack.packb({"arrays": [["O", [1]]]}), b"12345678"])


def test_small_arrays_share_one_frame_and_large_ones_travel_alone():
    small = [np.arange(n, dtype=np.int64) for n in (0, 1, 3, 100)]
    large = np.ones((codec.PACK_BELOW // 4 + 1,), dtype=np.float32)
    strided = np.ones(codec.PACK_BELOW // 2 + 2, dtype=np.float32)[::2]  # not contiguous, PACK_BELOW + 4 bytes
    sent = [small[0], large, *small[1:], strided]
    frames = codec.encode({"op": "x"}, sent)
    assert len(frames) == 1 + 1 + 2  # header, the shared frame, the two large arrays
    _, got = codec.decode([bytes(f) for f in frames])
    for a, b in zip(sent, got):
        assert a.dtype == b.dtype and np.array_equal(a, b)
    assert all(a.ctypes.data % codec.ALIGN == 0 for a in got[2:5] if a.size)  # aligned inside the shared frame


@pytest.mark.parametrize("desc,frames", [
    (["i8", [2], 8], [b"x" * 16]),        # overruns the shared frame
    (["i8", [1], 3], [b"x" * 16]),        # unaligned offset
    (["i8", [1], -8], [b"x" * 16]),       # negative offset
    (["i8", [1], 0], []),                 # the shared frame is missing
    (["i8", [1], 0, 1], [b"x" * 16]),     # too many fields
])
def test_bad_shared_frame_descriptors_are_malformed(desc, frames):
    with pytest.raises(codec.Malformed):
        codec.decode([msgpack.packb({"arrays": [desc]}), *frames])


def test_any_byte_order_or_memory_layout_crosses_as_little_endian_c_order():
    sent = [np.arange(5, dtype=">f4"), np.arange(12, dtype=">i8").reshape(3, 4), np.asfortranarray(np.ones((3, 2))),
            np.arange(10, dtype=np.uint8)[::3], [1, 2, 3]]
    frames = codec.encode({}, sent)
    _, got = codec.decode([bytes(f) for f in frames])
    for a, b in zip(sent, got):
        assert b.dtype.byteorder in "=|<" and b.flags.c_contiguous and np.array_equal(np.asarray(a), b)
    shared, offsets = bytes(frames[1]), [d[2] for d in msgpack.unpackb(frames[0])["arrays"]]
    ends = [offset + b.nbytes for offset, b in zip(offsets, got)]
    assert all(set(shared[end:start]) <= {0} for end, start in zip(ends, offsets[1:] + [len(shared)]))  # padding: zeros
