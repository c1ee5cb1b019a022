import itertools

import numpy as np
import pytest
import zfec
from hypothesis import given, strategies as st

from ectable.codes import RSCode, XorCode, get_code, gf256
from ectable.codes.rs import generator


def blocks(k, n, width, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, (n, width), dtype=np.uint8) for _ in range(k)]


@pytest.mark.parametrize("k,r", [(1, 1), (2, 1), (4, 2), (3, 3), (6, 3), (10, 4)])
def test_rs_encode_is_zfec(k, r):
    data = blocks(k, 7, 24)
    ours = RSCode(k, r).encode(data)
    theirs = zfec.Encoder(k, k + r).encode([d.tobytes() for d in data])
    for j in range(r):
        assert ours[j].tobytes() == bytes(theirs[k + j])


@pytest.mark.parametrize("code,k,r", [("xor", 1, 1), ("xor", 4, 1), ("rs", 2, 2), ("rs", 4, 2), ("rs", 3, 3), ("rs", 5, 3)])
def test_every_erasure_pattern_decodes(code, k, r):
    c = get_code(code, k, r)
    data = blocks(k, 5, 16, seed=k * 10 + r)
    every = dict(enumerate(data + c.encode(data)))
    for n_lost in range(1, r + 1):
        for lost in itertools.combinations(range(k + r), n_lost):
            got = c.decode({t: b.copy() for t, b in every.items() if t not in lost}, list(lost))
            for t in lost:
                np.testing.assert_array_equal(got[t], every[t], err_msg=f"{code} lost {lost}")


@pytest.mark.parametrize("code,k,r", [("xor", 1, 1), ("xor", 4, 1), ("rs", 4, 2), ("rs", 3, 3)])
@given(data=st.data())
def test_stripes_decode_in_place_whatever_each_stripe_lost(code, k, r, data):
    """`decode_stripes` fills every slot a stripe's mask leaves out, stripe by stripe (each its own pattern),
    with what a fresh encode gives (zfec's for rs), whatever those slots held, and leaves the chosen ones."""
    c = get_code(code, k, r)
    n, width = data.draw(st.integers(1, 12)), 4 * data.draw(st.integers(1, 5)) + data.draw(st.sampled_from([0, 1, 2]))
    stripes = blocks(k, n, width, seed=data.draw(st.integers(0, 999)))
    parity = c.encode(stripes) if code == "xor" else \
        [np.frombuffer(bytes(b), dtype=np.uint8).reshape(n, width)
         for b in zfec.Encoder(k, k + r).encode([d.tobytes() for d in stripes])[k:]]
    every = np.stack(stripes + parity, axis=1)
    chosen = np.zeros((n, k + r), dtype=bool)
    for x in range(n):
        chosen[x, data.draw(st.lists(st.integers(0, k + r - 1), min_size=k, max_size=k + r, unique=True))] = True
    got = np.where(chosen[:, :, None], every, data.draw(st.integers(0, 255))).astype(np.uint8)
    c.decode_stripes(got, chosen)
    np.testing.assert_array_equal(got, every)


def test_xor_parity_is_plain_xor_and_zfec_is_not():
    data = blocks(3, 4, 8)
    np.testing.assert_array_equal(XorCode(3).encode(data)[0], data[0] ^ data[1] ^ data[2])
    assert RSCode(3, 1).encode(data)[0].tobytes() != XorCode(3).encode(data)[0].tobytes()


@given(st.integers(1, 8), st.integers(1, 4), st.data())
def test_deltas_keep_parity_equal_to_a_fresh_encode(k, r, data):
    code = get_code("rs", k, r)
    old = blocks(k, 6, 12, seed=data.draw(st.integers(0, 999)))
    parity = code.encode(old)
    new = [b.copy() for b in old]
    for _ in range(data.draw(st.integers(1, 5))):
        i = data.draw(st.integers(0, k - 1))
        row = data.draw(st.integers(0, 5))
        value = np.frombuffer(data.draw(st.binary(min_size=12, max_size=12)), dtype=np.uint8)
        delta = new[i][row] ^ value
        new[i][row] = value
        for j in range(r):
            code.add_delta(parity[j][row:row + 1], j, i, delta[None])
    theirs = zfec.Encoder(k, k + r).encode([b.tobytes() for b in new])
    for j in range(r):
        assert parity[j].tobytes() == bytes(theirs[k + j])


def test_generator_matches_field_arithmetic():
    G = generator(4, 2)
    data = blocks(4, 1, 1)
    expect = [0, 0]
    for j in range(2):
        for i in range(4):
            expect[j] ^= gf256.mul(G[j][i], int(data[i][0, 0]))
    assert [int(p[0, 0]) for p in RSCode(4, 2).encode(data)] == expect


@given(st.integers(0, 255), st.binary(min_size=0, max_size=300))
def test_gf_kernel_matches_scalar_multiply(c, raw):
    src = np.frombuffer(raw, dtype=np.uint8).copy()
    dst = np.arange(src.size, dtype=np.uint8)
    expect = np.array([int(d) ^ gf256.mul(c, int(s)) for d, s in zip(dst, src)], dtype=np.uint8)
    gf256.addmul(dst, c, src)
    np.testing.assert_array_equal(dst, expect)
    scaled = gf256.scale_rows(np.array([c], dtype=np.uint8), src.reshape(1, -1))
    np.testing.assert_array_equal(scaled.reshape(-1), expect ^ np.arange(src.size, dtype=np.uint8))


@given(st.integers(1, 8), st.integers(1, 4), st.integers(0, 40), st.data())
def test_delta_terms_scale_each_row_by_its_own_coefficient(k, r, n, data):
    code = get_code("rs", k, r)
    j = np.array(data.draw(st.lists(st.integers(0, r - 1), min_size=n, max_size=n)), dtype=np.int64)
    i = np.array(data.draw(st.lists(st.integers(0, k - 1), min_size=n, max_size=n)), dtype=np.int64)
    delta = blocks(1, n, 9, seed=data.draw(st.integers(0, 999)))[0]
    expect = np.array([[gf256.mul(code.coefficient(int(a), int(b)), int(x)) for x in row]
                       for a, b, row in zip(j, i, delta)], dtype=np.uint8).reshape(n, 9)
    np.testing.assert_array_equal(code.delta_terms(j, i, delta), expect)


@given(st.integers(1, 8), st.integers(1, 4), st.lists(st.integers(0, 300), min_size=0, max_size=6),
       st.sampled_from([260, 9]), st.data())
def test_grouped_rows_stay_in_their_group_and_addmul_sorted_adds_each_rows_term(k, r, sizes, width, data):
    code = get_code("rs", k, r)
    n = sum(sizes)
    groups = np.repeat(np.arange(len(sizes)), sizes)
    j = np.array(data.draw(st.lists(st.integers(0, r - 1), min_size=n, max_size=n)), dtype=np.int64)
    i = np.array(data.draw(st.lists(st.integers(0, k - 1), min_size=n, max_size=n)), dtype=np.int64)
    delta = blocks(1, n, width, seed=data.draw(st.integers(0, 999)))[0]  # 260: a record of 65 floats, 252 rows a pass
    order, coef = code.grouped(j, i, groups)
    assert sorted(order.tolist()) == list(range(n))
    np.testing.assert_array_equal(groups[order], groups)  # every group's rows where they were
    np.testing.assert_array_equal(coef, code.coefficients[j, i][order])
    for g in range(len(sizes)):  # within a group, the rows of a coefficient together
        assert (np.diff(coef[groups == g].astype(int)) >= 0).all()
    dst = blocks(1, n, width, seed=1000)[0].copy()
    expect = dst ^ code.delta_terms(j, i, delta)[order]
    gf256.addmul_sorted(dst, coef, delta, order)
    np.testing.assert_array_equal(dst, expect)
    np.testing.assert_array_equal(gf256.scale_sorted(coef, delta, order), code.delta_terms(j, i, delta)[order])


def test_gf_kernel_scales_rows_past_a_chunk_and_leaves_its_input_alone():
    rng = np.random.default_rng(2)
    for width in (260, gf256.CHUNK + 7):  # many rows of a coefficient per lookup pass, and rows wider than one
        src = rng.integers(0, 256, (3 * gf256.CHUNK // width + 5, width), dtype=np.uint8)
        coef = rng.integers(0, 4, src.shape[0]).astype(np.uint8) * 0x47  # 0 included
        before = src.copy()
        out = gf256.scale_rows(coef, src[:, ::-1])  # not contiguous
        expect = [np.frombuffer(row[::-1].tobytes().translate(gf256.PRODUCT[c]), dtype=np.uint8)
                  for c, row in zip(coef, src)]
        np.testing.assert_array_equal(out, np.array(expect))
        np.testing.assert_array_equal(src, before)


def test_gf_kernel_crosses_chunk_boundaries():
    src = np.random.default_rng(1).integers(0, 256, gf256.CHUNK * 2 + 13, dtype=np.uint8)
    dst = np.zeros_like(src)
    gf256.addmul(dst, 0x8E, src)
    np.testing.assert_array_equal(dst, np.frombuffer(src.tobytes().translate(gf256.PRODUCT[0x8E]), dtype=np.uint8))


@pytest.mark.parametrize("bad", [("xor", 4, 2), ("none", 4, 1), ("rs", 200, 100), ("lrc", 4, 1)])
def test_bad_codes_are_refused(bad):
    with pytest.raises(ValueError):
        get_code(*bad)


def test_config_round_trips():
    for code in (get_code("xor", 4, 1), get_code("rs", 6, 3), get_code("none", 4, 0)):
        assert get_code(code.get_config()).get_config() == code.get_config()
