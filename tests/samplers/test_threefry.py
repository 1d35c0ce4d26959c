"""The samplers' float32 normal draws (``fieldhmc.samplers.threefry``): Threefry-2x32
against Random123's known-answer vectors and an independent NumPy Threefry, the draws
as normal quantiles of their bits, eager and under XLA, and the draw fused under XLA
(no field-sized integer buffer)."""

from __future__ import annotations

import re

import numpy as np
import pytest
import tensorflow as tf
from scipy.special import ndtri

from fieldhmc.samplers.threefry import standard_normal, threefry2x32

# Random123 kat_vectors, threefry2x32 with 20 rounds: (counter, key, output).
KAT = [
    ((0x00000000, 0x00000000), (0x00000000, 0x00000000), (0x6B200159, 0x99BA4EFE)),
    ((0xFFFFFFFF, 0xFFFFFFFF), (0xFFFFFFFF, 0xFFFFFFFF), (0x1CB996FC, 0xBB002BE7)),
    ((0x243F6A88, 0x85A308D3), (0x13198A2E, 0x03707344), (0xC4923A9C, 0x483DF7A0)),
]


def _numpy_threefry2x32(key, x0, x1):
    """Threefry-2x32, 20 rounds, in NumPy uint32 arithmetic (the reference)."""
    rot = (13, 15, 26, 6, 17, 29, 16, 24)
    k0, k1 = np.uint32(key[0]), np.uint32(key[1])
    ks = (k0, k1, k0 ^ k1 ^ np.uint32(0x1BD11BDA))
    x0 = np.asarray(x0, np.uint32) + ks[0]
    x1 = np.asarray(x1, np.uint32) + ks[1]
    with np.errstate(over="ignore"):
        for r in range(20):
            x0 = x0 + x1
            x1 = ((x1 << np.uint32(rot[r % 8])) | (x1 >> np.uint32(32 - rot[r % 8]))) ^ x0
            if r % 4 == 3:
                s = (r + 1) // 4
                x0 = x0 + ks[s % 3]
                x1 = x1 + ks[(s + 1) % 3] + np.uint32(s)
    return x0, x1


def assert_quantiles_of_bits(draw, seed, bits):
    """``draw(shape, seed)``, eager and under XLA, is the float64 normal quantile of each
    element's 32 ``bits`` (uint32 array of the draw's shape: sign bit times the quantile
    of (2k + 1) 2^-25) to float32 accuracy, and its moments agree with N(0, 1) within 4
    standard errors."""
    shape = list(bits.shape)
    p = (2 * (bits >> 9).astype(np.float64) + 1) / 2.0**25
    exact = np.where(bits & 1, ndtri(p), -ndtri(p))
    xla = tf.function(lambda s: draw(shape, s), jit_compile=True)
    for z, rtol in ((xla(seed).numpy(), 6e-6), (draw(shape, seed).numpy(), 1e-6)):
        assert z.dtype == np.float32 and z.shape == tuple(shape)
        np.testing.assert_allclose(z, exact, rtol=rtol, atol=1e-7)
    x = xla(seed).numpy().astype(np.float64).ravel()
    n = x.size
    assert abs(x.mean()) < 4 / np.sqrt(n)
    assert abs(x.var() - 1) < 4 * np.sqrt(2 / n)
    assert abs(np.mean(x**4) - 3) < 4 * np.sqrt(96 / n)
    assert np.abs(x).max() <= -ndtri(2.0**-25) * (1 + 1e-6)


@pytest.mark.parametrize("counter, key, expected", KAT)
def test_threefry2x32_matches_random123_known_answers(counter, key, expected):
    out = threefry2x32(tf.constant(key, tf.uint32), *[tf.constant(c, tf.uint32) for c in counter])
    assert tuple(int(o) for o in out) == expected
    assert tuple(int(o) for o in _numpy_threefry2x32(key, *counter)) == expected


def test_standard_normal_is_the_normal_quantile_of_its_threefry_bits():
    """Element i is the float64 normal quantile of the 24-bit level of word 0 of
    Threefry-2x32((i, 0)) under the seed's key (sign bit times the quantile of
    (2k + 1) 2^-25) to float32 accuracy, eager and under XLA; moments agree with
    N(0, 1) within 4 standard errors; a dynamic shape gives the same draw."""
    seed = tf.constant([7, -11])
    shape = [4, 1 << 18]
    key = np.array([7, -11], np.int32).view(np.uint32)
    bits, _ = _numpy_threefry2x32(key, np.arange(np.prod(shape), dtype=np.uint32), 0)
    assert_quantiles_of_bits(standard_normal, seed, bits.reshape(shape))
    dynamic = tf.function(
        lambda s, x: standard_normal(tf.shape(x), s),
        input_signature=[tf.TensorSpec([2], tf.int32), tf.TensorSpec(None, tf.float32)],
    )
    np.testing.assert_array_equal(
        dynamic(seed, tf.zeros([3, 5])).numpy(), standard_normal([3, 5], seed).numpy()
    )


def test_standard_normal_streams_differ_by_seed_and_not_by_shape():
    """Another seed gives an uncorrelated draw; a longer draw starts with the shorter."""
    a = standard_normal([1 << 16], tf.constant([1, 2])).numpy()
    b = standard_normal([1 << 16], tf.constant([1, 3])).numpy()
    assert abs(np.corrcoef(a, b)[0, 1]) < 4 / np.sqrt(a.size)
    c = standard_normal([2, 1 << 16], tf.constant([1, 2])).numpy()
    np.testing.assert_array_equal(c[0], a)


def test_standard_normal_under_xla_is_one_fusion_without_an_integer_field():
    """Under XLA the counter, the 20 rounds and the inversion fuse into elementwise
    work: no field-sized uint32 (or int64 index) buffer is materialised, only the
    float32 output."""
    shape = [2, 16, 16, 16]
    size = int(np.prod(shape))
    fn = tf.function(lambda s: standard_normal(shape, s), jit_compile=True)
    hlo = fn.experimental_get_compiler_ir(tf.constant([1, 2]))(stage="optimized_hlo")
    entry = hlo[hlo.index("ENTRY") :]
    # the entry computation's values (fusion bodies are not materialised)
    sizes = [
        int(np.prod([int(d) for d in dims.split(",")]))
        for dt, dims in re.findall(r"= (u32|s64|u64|s32)\[([\d,]+)\]", entry)
    ]
    assert not sizes or max(sizes) < size, sizes
