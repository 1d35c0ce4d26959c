"""safe_abs / safe_angle: finite gradients at 0, identical to TF elsewhere."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from fieldhmc import ops


@pytest.mark.parametrize("dtype", [tf.complex64, tf.complex128])
@pytest.mark.parametrize("fn", ["abs", "angle"])
def test_safe_complex_helpers(dtype, fn):
    safe, ref = {"abs": (ops.safe_abs, tf.abs), "angle": (ops.safe_angle, tf.math.angle)}[fn]
    z = tf.constant(np.array([0.0, 1 + 2j, -3 - 0.5j, 1e-30j, -2.0]), dtype)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(z)
        got, want = safe(z), ref(z)
    g_got = tape.gradient(got, z).numpy()
    g_want = tape.gradient(want, z).numpy()
    assert np.all(np.isfinite(g_got))
    assert g_got[0] == 0
    assert got.numpy()[0] == 0
    if fn == "angle":  # TF's own gives -inf + nan j at 0 (the trap this guards)
        assert not np.all(np.isfinite(g_want))
    np.testing.assert_array_equal(got.numpy()[1:], want.numpy()[1:])
    np.testing.assert_array_equal(g_got[1:], g_want[1:])


def test_safe_helpers_reject_real_input():
    with pytest.raises(TypeError, match="complex"):
        ops.safe_abs(tf.constant([1.0]))
