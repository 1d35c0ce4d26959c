"""Sharded-FFT computations for ``tests/ops/test_sharded.py``, run in a subprocess.

``python -m tests.ops.sharded_cases`` makes 4 virtual CPU devices, runs every case
and prints one JSON line ``{case_id: {...errors...}}``.
"""

from __future__ import annotations

import json
import sys

import numpy as np

# (id, mesh size, [chains, n0, n1, n2], norm). n2 // 2 + 1 is divisible by the mesh
# size only for "m-divisible" ones; odd n0/n1 need an odd mesh (3 of the 4 devices).
CASES = [
    ("even-8cube-P4", 4, (2, 8, 8, 8), "backward"),
    ("odd-n2-P4", 4, (1, 4, 8, 7), "ortho"),
    ("noncubic-m-divisible-P4", 4, (3, 8, 4, 6), "forward"),
    ("noncubic-P2", 2, (2, 6, 4, 9), "ortho"),
    ("odd-all-P3", 3, (1, 9, 3, 5), "backward"),
    ("P1", 1, (2, 5, 3, 4), "ortho"),
]
DTYPES = ("float32", "float64")
# The default run: even and odd, cubic and not, mesh dividing n2//2+1 and not, f32 and
# f64 -- each property at least once; every case x dtype runs under ``slow``.
DEFAULT = (
    "even-8cube-P4-float32",
    "noncubic-m-divisible-P4-float64",
    "odd-all-P3-float64",
    "odd-n2-P4-float32",
)


def _inner(a, b) -> float:
    """Real inner product ``sum Re(conj(a) b)`` in float64."""
    return float(np.sum(np.real(np.conj(a.astype(np.complex128)) * b.astype(np.complex128))))


def run_case(mesh, shape, norm, dtype, seed):
    import tensorflow as tf

    from fieldhmc.ops import irfft3d as irfft3d_1
    from fieldhmc.ops import rfft3d as rfft3d_1
    from fieldhmc.ops import sharded as sh

    rng = np.random.default_rng(seed)
    n = shape[1:]
    m = n[2] // 2 + 1
    cdtype = np.complex64 if dtype == "float32" else np.complex128
    x = rng.standard_normal(shape).astype(dtype)
    z = (rng.standard_normal((*shape[:3], m)) + 1j * rng.standard_normal((*shape[:3], m))).astype(
        cdtype
    )
    xd = sh.shard(x, sh.slab_layout(mesh))
    zd = sh.shard(z, sh.spectrum_layout(mesh))

    @tf.function
    def forward(xd, zd):
        with tf.GradientTape(persistent=True) as tape:
            tape.watch([xd, zd])
            y = sh.rfft3d(xd, mesh, norm=norm)
            f = sh.irfft3d(zd, mesh, fft_length=n, norm=norm)
            a = tf.reduce_sum(tf.math.real(tf.math.conj(zd) * y))
            b = tf.reduce_sum(xd * f)
        return y, f, tape.gradient(a, xd), tape.gradient(b, zd)

    y, f, vjp_r, vjp_i = forward(xd, zd)
    y_np, f_np = sh.gather(y), sh.gather(f)
    vjp_r_np, vjp_i_np = sh.gather(vjp_r), sh.gather(vjp_i)
    ref_y = np.fft.rfftn(x.astype(np.float64), axes=(1, 2, 3), norm=norm)
    ref_f = np.fft.irfftn(z.astype(np.complex128), s=n, axes=(1, 2, 3), norm=norm)

    # Single-device fieldhmc.ops gradients (the conventions to match).
    xt, zt = tf.constant(x), tf.constant(z)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch([xt, zt])
        a1 = tf.reduce_sum(tf.math.real(tf.math.conj(zt) * rfft3d_1(xt, norm=norm)))
        b1 = tf.reduce_sum(xt * irfft3d_1(zt, fft_length=n, norm=norm))
    g_r, g_i = tape.gradient(a1, xt).numpy(), tape.gradient(b1, zt).numpy()

    def rel(a, b):
        return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))

    # Dot-product tests: <A x, z> = <x, A^T z> with A^T from the custom gradient.
    lhs_r, rhs_r = _inner(y_np, z), _inner(x, vjp_r_np)
    lhs_i, rhs_i = _inner(f_np, x), _inner(z, vjp_i_np)
    return {
        "rfft_value": rel(y_np, ref_y),
        "irfft_value": rel(f_np, ref_f),
        "rfft_adjoint": float(abs(lhs_r - rhs_r) / (np.linalg.norm(x) * np.linalg.norm(z))),
        "irfft_adjoint": float(abs(lhs_i - rhs_i) / (np.linalg.norm(x) * np.linalg.norm(z))),
        "rfft_grad_vs_ops": rel(vjp_r_np, g_r),
        "irfft_grad_vs_ops": rel(vjp_i_np, g_i),
        "spectrum_specs": list(tf.experimental.dtensor.fetch_layout(y).sharding_specs),
        "field_specs": list(tf.experimental.dtensor.fetch_layout(f).sharding_specs),
        "spectrum_dtype": y.dtype.name,
    }


def run_extras(meshes):
    """The DTensor all-to-all bug, the scatter into a slab field, and the mesh-size check."""
    import tensorflow as tf
    from tensorflow.experimental import dtensor

    from fieldhmc.ops import sharded as sh

    mesh = meshes[4]
    u = dtensor.UNSHARDED
    x = np.arange(2 * 8 * 8 * 5, dtype=np.float32).reshape(2, 8, 8, 5)
    xd = sh.shard(x, dtensor.Layout([u, "x", u, u], mesh))
    naive = sh.gather(dtensor.relayout(xd, dtensor.Layout([u, u, "x", u], mesh)))
    xt = sh.shard(x.transpose(1, 2, 0, 3).copy(), dtensor.Layout(["x", u, u, u], mesh))
    fixed = sh.gather(dtensor.relayout(xt, dtensor.Layout([u, "x", u, u], mesh)))
    out = {
        "naive_alltoall_error": float(np.abs(naive - x).max()),
        "leading_axis_alltoall_error": float(np.abs(fixed - x.transpose(1, 2, 0, 3)).max()),
    }
    # The CIC paint's scatter-add into a slab-sharded field (why the mesh refuses the
    # particle-mesh forward models): DTensor returns the field replicated.
    idx = np.random.default_rng(3).integers(0, 8, size=(64, 4)).astype(np.int32)
    idx[:, 0] = 0
    painted = tf.function(tf.tensor_scatter_nd_add)(
        sh.shard(np.zeros((1, 8, 8, 8)), sh.slab_layout(mesh)),
        sh.shard(idx, dtensor.Layout.replicated(mesh, rank=2)),
        sh.shard(np.ones(64), dtensor.Layout.replicated(mesh, rank=1)),
    )
    expected = np.zeros((1, 8, 8, 8))
    np.add.at(expected, tuple(idx.T), 1.0)
    out["scatter_specs"] = list(dtensor.fetch_layout(painted).sharding_specs)
    out["scatter_error"] = float(np.abs(sh.gather(painted) - expected).max())
    try:
        sh.rfft3d(sh.shard(np.zeros((1, 8, 6, 4), np.float32), sh.slab_layout(mesh)), mesh)
        out["bad_mesh_error"] = None
    except ValueError as exc:
        out["bad_mesh_error"] = str(exc)
    return out


def results(every_case: bool = False) -> dict:
    """The :data:`DEFAULT` cases (or every one), on meshes of 1-4 of the (already made)
    4 virtual CPUs."""
    from tensorflow.experimental import dtensor

    from fieldhmc.ops import sharded as sh

    meshes = {4: sh.make_mesh(4)}
    for p in (1, 2, 3):
        meshes[p] = dtensor.create_mesh([("x", p)], devices=[f"CPU:{i}" for i in range(p)])
    results = {}
    for i, (case_id, p, shape, norm) in enumerate(CASES):
        for j, dtype in enumerate(DTYPES):
            if every_case or f"{case_id}-{dtype}" in DEFAULT:
                key = f"{case_id}-{dtype}"
                results[key] = run_case(meshes[p], shape, norm, dtype, 10 * i + j)
    results["extras"] = run_extras(meshes)
    return results


def main() -> None:
    from fieldhmc.ops import sharded as sh

    sh.make_mesh(4)
    sys.stdout.write(json.dumps(results("--all" in sys.argv)) + "\n")


if __name__ == "__main__":
    main()
