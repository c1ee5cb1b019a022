"""Per-row quantization of checkpointed rows: the stored format, and error bounds per bit width."""
import numpy as np
import pytest
from hypothesis import given, strategies as st
from hypothesis.extra import numpy as hnp

from ectable.checkpoint import quantize as qz
from ectable.errors import InvalidRequest

EPS = np.finfo(np.float32).eps

rows = st.integers(1, 12).flatmap(lambda n: st.integers(1, 70).flatmap(lambda d: hnp.arrays(
    np.float32, (n, d), elements=st.floats(-1e4, 1e4, width=32, allow_nan=False, allow_infinity=False))))


def _slack(x):
    """float32 rounding of a row's range start, step and their sum: a few ulps of its largest magnitude."""
    return 8 * EPS * np.abs(x).max(axis=1, keepdims=True) + 1e-30


@given(rows, st.sampled_from(qz.BITS))
def test_each_value_is_within_half_a_step_of_its_row(x, bits):
    stored = qz.quantize(x, bits)
    back = qz.dequantize(stored)
    assert back.dtype == np.float32 and back.shape == x.shape
    assert stored.codes.shape == (x.shape[0], -(-x.shape[1] * bits // 8))
    bound = stored.scale[:, None] / 2 * (1 + 1e-6) + _slack(x)
    assert (np.abs(back.astype(np.float64) - x) <= bound).all()
    assert (stored.scale <= (x.max(axis=1).astype(np.float64) - x.min(axis=1)) / ((1 << bits) - 1) * (1 + 1e-6) + 1e-30).all()


@given(rows, st.sampled_from(qz.BITS))
def test_the_adaptive_range_never_loses_more_than_the_plain_one(x, bits):
    plain = np.linalg.norm(qz.dequantize(qz.quantize(x, bits)).astype(np.float64) - x, axis=1)
    adaptive = np.linalg.norm(qz.dequantize(qz.quantize(x, bits, adaptive=True)).astype(np.float64) - x, axis=1)
    assert (adaptive <= plain + 2 * np.sqrt(x.shape[1]) * _slack(x)[:, 0]).all()  # each value within float32 rounding


def test_the_adaptive_range_gives_up_an_outlier_for_the_rest():
    rng = np.random.default_rng(0)
    x = rng.normal(0, 0.01, (200, 64)).astype(np.float32)
    x[:, 0] = 1.0  # one outlier per row
    for bits in (2, 4):
        plain = ((qz.dequantize(qz.quantize(x, bits)) - x) ** 2).sum()
        adaptive = ((qz.dequantize(qz.quantize(x, bits, adaptive=True)) - x) ** 2).sum()
        assert adaptive < 0.8 * plain, (bits, adaptive, plain)


@given(st.integers(1, 8).flatmap(lambda n: st.integers(1, 40).flatmap(
    lambda d: st.sampled_from(qz.BITS).flatmap(lambda b: st.tuples(
        st.just(b), hnp.arrays(np.uint8, (n, d), elements=st.integers(0, (1 << b) - 1)))))))
def test_codes_pack_and_unpack(case):
    bits, q = case
    packed = qz.pack(q, bits)
    assert packed.shape == (q.shape[0], -(-q.shape[1] * bits // 8))
    np.testing.assert_array_equal(qz.unpack(packed, bits, q.shape[1]), q)


def test_the_stored_format_is_fixed():
    """Golden bytes: codes little-endian, lowest bit first; a row of one value stores step 0 and reads back exact."""
    stored = qz.quantize(np.array([[0, 1, 2, 3], [5, 5, 5, 5]], dtype=np.float32), 2)
    assert stored.codes.tobytes() == bytes([0b11100100, 0])
    np.testing.assert_array_equal(stored.lo, [0, 5])
    np.testing.assert_array_equal(stored.scale, [1, 0])
    three = qz.quantize(np.array([[0, 7, 1, 6]], dtype=np.float32), 3)
    assert three.codes.tobytes() == bytes([0b01111000, 0b00001100])  # 000 111 100 011, lowest bit first
    np.testing.assert_array_equal(qz.dequantize(three), [[0, 7, 1, 6]])
    assert qz.row_bytes(64, 4) == 40 and qz.row_bytes(64, 3) == 32


@pytest.mark.parametrize("bad, bits, match", [
    (np.ones((2, 3), np.float32), 5, "bits must be one of"),
    (np.ones((2, 3), np.float32), None, "bits must be one of"),
    (np.array([[1.0, np.nan]], np.float32), 4, "finite"),
    (np.array([[1.0, np.inf]], np.float32), 4, "finite"),
    (np.ones(3, np.float32), 4, "2-D float array"),
    (np.ones((2, 3), np.int64), 4, "2-D float array"),
    (np.array([[-1e300, 1e300]]), 8, "fit float32"),
    (np.array([[-3e38, 3e38]], np.float32), 2, "span .* must fit float32"),
])
def test_bad_rows_are_refused(bad, bits, match):
    with pytest.raises(InvalidRequest, match=match):
        qz.quantize(bad, bits)
