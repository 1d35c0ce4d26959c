"""Slab-decomposed real 3-D FFTs of DTensors on a 1-D device mesh, with exact gradients.

A batch of fields ``[chains, n0, n1, n2]`` is laid out in *x-slabs*,
``Layout([UNSHARDED, "x", UNSHARDED, UNSHARDED], mesh)``: each of the ``P`` devices
holds ``n0 / P`` planes. :func:`rfft3d` transforms

1. the two unsharded axes locally, ``rfft2d`` over ``(n1, n2)``;
2. redistributes with one all-to-all (``dtensor.relayout``) so that ``n0`` is whole
   and ``n1`` is sharded;
3. transforms along ``n0`` locally (complex ``fft``),

and returns the half-spectrum ``[chains, n0, n1, n2 // 2 + 1]`` in *y-pencils*,
``Layout([UNSHARDED, UNSHARDED, "x", UNSHARDED], mesh)`` -- sharded along ``n1``,
**not** along the halved axis, so a mesh size need not divide ``n2 // 2 + 1`` (it
must divide ``n0`` and ``n1``). :func:`irfft3d` takes that layout and runs the
three steps backwards. Each transform moves :math:`(P-1)/P` of the complex
half-spectrum across devices once; ``benchmarks/sharded.py`` measures it.

Norms, Hermitian weights and gradients are those of :mod:`fieldhmc.ops.fft`: with
:math:`N = n_0 n_1 n_2` and Hermitian weights :math:`w`,

.. math::

    x = \\mathrm{irfft}(Z) \\Rightarrow \\bar Z = \\mathrm{rfft}(\\bar x)\\, w / N,
    \\qquad
    X = \\mathrm{rfft}(x) \\Rightarrow \\bar x = N\\, \\mathrm{irfft}(H(\\bar X) / w).

The Hermitian projection :math:`H` of the self-paired planes commutes with the
inverse transform along ``n0``, so the inverse applies it after step 3 as the
rank-2 projection along the (then unsharded) ``n1`` axis, locally. Both transforms
are ``tf.custom_gradient``s whose gradient calls the other (linear, differentiable)
transform, so reverse mode (and reverse-over-reverse) works, eagerly for values and
inside ``tf.function`` for gradients (an eager ``GradientTape.gradient`` seeds the
output gradient with a plain tensor, which DTensor rejects). **Forward mode is not
available**: ``tf.autodiff.ForwardAccumulator`` through these custom gradients on
DTensors segfaults in TF 2.21 (plain DTensor ops are fine; no upstream issue found).
XLA (``jit_compile=True``) is not used for DTensor programs: DTensor compiles its
own SPMD program.

**Workaround** (TF 2.21): DTensor's all-to-all relayout (``DTensorAllToAll``, added
in tensorflow/tensorflow#60075) returns wrong values for rank-4 tensors when the
two exchanged axes are not led by axis 0 -- e.g. ``[c, n0/P, n1, m] -> [c, n0,
n1/P, m]`` scrambles the data (it is right when the exchanged axes include axis
0). The transforms therefore move ``n0`` to the front (local transposes) before
the exchange. ``tests/ops/test_sharded.py::test_dtensor_alltoall_bug_still_present``
shows the bug; the value tests fail without the workaround. No upstream issue was
found for it.

A pencil decomposition (2-D mesh) is not provided: it needs two exchanges per
transform on sub-meshes; the slab form scales to ``P <= min(n0, n1)`` devices.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf
from tensorflow.experimental import dtensor

__all__ = [
    "check_mesh",
    "gather",
    "irfft3d",
    "make_mesh",
    "rfft3d",
    "shard",
    "slab_layout",
    "spectrum_layout",
]

_NORMS = ("backward", "ortho", "forward")
_U = dtensor.UNSHARDED


def _mesh_dim(mesh: dtensor.Mesh) -> str:
    names = mesh.dim_names
    if len(names) != 1:
        raise ValueError(f"the slab FFT needs a 1-D mesh, got dimensions {list(names)}")
    return names[0]


def make_mesh(num_devices: int, devices: str = "cpu", name: str = "x") -> dtensor.Mesh:
    """A 1-D DTensor mesh over the first ``num_devices`` local devices of a type.

    For ``devices="cpu"`` with fewer physical CPUs than ``num_devices`` (one, as a
    rule), the first CPU is split into ``num_devices`` logical devices. That only
    works before TensorFlow has initialised its devices (before the first op), so
    call this first; afterwards a ValueError says so.

    Parameters
    ----------
    num_devices : int
        Mesh size ``P``.
    devices : {"cpu", "gpu"}
        Device type. GPUs are used as found (one mesh device per GPU).
    name : str
        The mesh dimension's name.
    """
    devices = devices.lower()
    if devices not in ("cpu", "gpu"):
        raise ValueError(f"devices must be 'cpu' or 'gpu', got {devices!r}")
    num_devices = int(num_devices)
    if num_devices < 1:
        raise ValueError(f"the mesh needs at least one device, got {num_devices}")
    kind = devices.upper()
    physical = tf.config.list_physical_devices(kind)
    if kind == "CPU" and len(physical) < num_devices:
        have = tf.config.get_logical_device_configuration(physical[0])
        if not have or len(have) < num_devices:
            try:
                tf.config.set_logical_device_configuration(
                    physical[0], [tf.config.LogicalDeviceConfiguration()] * num_devices
                )
            except RuntimeError as exc:
                raise ValueError(
                    f"cannot create {num_devices} virtual CPU devices: TensorFlow has "
                    "initialised its devices already (make the mesh first)"
                ) from exc
    logical = tf.config.list_logical_devices(kind)
    if len(logical) < num_devices:
        raise ValueError(f"a mesh of {num_devices} {kind}s needs that many, found {len(logical)}")
    names = [f"{kind}:{i}" for i in range(num_devices)]
    return dtensor.create_mesh([(name, num_devices)], devices=names)


def shard(value, layout: dtensor.Layout) -> tf.Tensor:
    """Copy a host array or tensor onto ``layout``'s mesh with that layout.

    The value is first replicated (every device holds it whole), then sliced: for
    data that fit one host. Large fields should be made sharded (e.g. by a sharded
    random draw), not copied.
    """
    t = tf.convert_to_tensor(value)
    replicated = dtensor.Layout.replicated(layout.mesh, t.shape.rank)
    return dtensor.relayout(dtensor.copy_to_mesh(t, replicated), layout)


def gather(t: tf.Tensor):
    """The global value of a DTensor sharded along at most one axis, as a NumPy array."""
    layout = dtensor.fetch_layout(t)
    axes = [i for i, spec in enumerate(layout.sharding_specs) if spec != _U]
    parts = [p.numpy() for p in dtensor.unpack(t)]
    if not axes:
        return parts[0]
    if len(axes) > 1:
        raise ValueError(f"gather handles one sharded axis, got layout {layout.sharding_specs}")
    return np.concatenate(parts, axis=axes[0])


def slab_layout(mesh: dtensor.Mesh) -> dtensor.Layout:
    """``Layout([UNSHARDED, dim, UNSHARDED, UNSHARDED], mesh)``: fields in x-slabs."""
    return dtensor.Layout([_U, _mesh_dim(mesh), _U, _U], mesh)


def spectrum_layout(mesh: dtensor.Mesh) -> dtensor.Layout:
    """``Layout([UNSHARDED, UNSHARDED, dim, UNSHARDED], mesh)``: spectra sharded along n1."""
    return dtensor.Layout([_U, _U, _mesh_dim(mesh), _U], mesh)


def check_mesh(mesh: dtensor.Mesh, grid_shape) -> None:
    """Raise ValueError unless the 1-D ``mesh`` size divides ``n0`` and ``n1``.

    Parameters
    ----------
    mesh : dtensor.Mesh
        1-D mesh of ``P`` devices.
    grid_shape : sequence of int
        ``(n0, n1, n2)``; ``n2`` (and ``n2 // 2 + 1``) may be anything.
    """
    dim = _mesh_dim(mesh)
    p = mesh.dim_size(dim)
    n0, n1, _ = (int(n) for n in grid_shape)
    if n0 % p or n1 % p:
        raise ValueError(
            f"a mesh of {p} devices must divide n0 and n1 of the grid {tuple(grid_shape)}"
        )


def _scale(norm: str, n: int, *, inverse: bool) -> float | None:
    if norm not in _NORMS:
        raise ValueError(f"norm must be one of {_NORMS}, got {norm!r}")
    if norm == "backward":
        return None
    if norm == "ortho":
        return n**0.5 if inverse else n**-0.5
    return float(n) if inverse else 1.0 / n


def _weighted(z: tf.Tensor, n2: int, *, inverse: bool) -> tf.Tensor:
    """``z * w`` (or ``z / w``) along the unsharded last axis, without a mesh constant."""
    m = n2 // 2 + 1
    lo = 1
    hi = m - 1 if n2 % 2 == 0 and m > 1 else m
    if hi <= lo:
        return z
    f = 0.5 if inverse else 2.0
    pieces = [z[..., :lo], z[..., lo:hi] * tf.constant(f, z.dtype)]
    if hi < m:
        pieces.append(z[..., hi:])
    return tf.concat(pieces, axis=-1)


def _hermitian_project_n1(y: tf.Tensor, n1: int, n2: int) -> tf.Tensor:
    """Rank-2 :func:`~fieldhmc.ops.hermitian_project` along the unsharded ``n1`` axis.

    DTensor has no SPMD rule for ``ReverseV2`` (TF 2.21), so the partner
    ``conj(y[-k1 mod n1])`` is a gather.
    """
    m = n2 // 2 + 1
    planes = [0] + ([m - 1] if n2 % 2 == 0 and m > 1 else [])
    partner = [(-k) % n1 for k in range(n1)]
    pieces, start = [], 0
    for p in planes:
        if p > start:
            pieces.append(y[..., start:p])
        plane = y[..., p : p + 1]
        mirrored = tf.math.conj(tf.gather(plane, partner, axis=2))
        pieces.append(tf.constant(0.5, y.dtype) * (plane + mirrored))
        start = p + 1
    if start < m:
        pieces.append(y[..., start:])
    return pieces[0] if len(pieces) == 1 else tf.concat(pieces, axis=-1)


def _exchange(t: tf.Tensor, layout: dtensor.Layout) -> tf.Tensor:
    """All-to-all of a rank-4 DTensor whose exchanged axes are 0 and 1 (see module docs)."""
    return dtensor.relayout(t, layout)


def _forward(x: tf.Tensor, mesh: dtensor.Mesh, n1: int, n2: int) -> tf.Tensor:
    dim = _mesh_dim(mesh)
    x = dtensor.relayout(x, slab_layout(mesh))  # no-op when already slabs
    y = tf.signal.rfft2d(x, fft_length=[n1, n2])  # [c, n0/P, n1, m], local
    y = tf.transpose(y, [1, 2, 0, 3])  # [n0/P, n1, c, m]
    y = _exchange(y, dtensor.Layout([_U, dim, _U, _U], mesh))  # [n0, n1/P, c, m]
    y = tf.transpose(y, [1, 2, 3, 0])  # [n1/P, c, m, n0]
    y = tf.signal.fft(y)
    return tf.transpose(y, [1, 3, 0, 2])  # [c, n0, n1/P, m]


def _inverse(z: tf.Tensor, mesh: dtensor.Mesh, n1: int, n2: int) -> tf.Tensor:
    dim = _mesh_dim(mesh)
    z = dtensor.relayout(z, spectrum_layout(mesh))
    y = tf.transpose(z, [2, 0, 3, 1])  # [n1/P, c, m, n0]
    y = tf.signal.ifft(y)
    y = tf.transpose(y, [3, 0, 1, 2])  # [n0, n1/P, c, m]
    y = _exchange(y, dtensor.Layout([dim, _U, _U, _U], mesh))  # [n0/P, n1, c, m]
    y = tf.transpose(y, [2, 0, 1, 3])  # [c, n0/P, n1, m]
    y = _hermitian_project_n1(y, n1, n2)
    # ifft along n0 already divided by n0; irfft2d divides by n1 n2.
    return tf.signal.irfft2d(y, fft_length=[n1, n2])


def _make_pair(mesh: dtensor.Mesh, grid_shape: tuple[int, int, int]):
    """Backward-normalised rfft/irfft with custom gradients that call each other."""
    n0, n1, n2 = grid_shape
    num_cells = float(n0 * n1 * n2)

    @tf.custom_gradient
    def rfft_raw(x):
        def grad(dy):
            return irfft_raw(_weighted(dy, n2, inverse=True)) * tf.constant(num_cells, x.dtype)

        return _forward(x, mesh, n1, n2), grad

    @tf.custom_gradient
    def irfft_raw(z):
        def grad(dx):
            dz = _weighted(rfft_raw(dx), n2, inverse=False)
            return dz * tf.constant(1.0 / num_cells, dz.dtype)

        return _inverse(z, mesh, n1, n2), grad

    return rfft_raw, irfft_raw


def _check_rank(t: tf.Tensor, what: str) -> None:
    if t.shape.rank != 4:
        raise ValueError(f"{what} must be [chains, n0, n1, n_last], got shape {t.shape}")


def rfft3d(x: tf.Tensor, mesh: dtensor.Mesh, norm: str = "backward") -> tf.Tensor:
    """Real-to-complex 3-D FFT of x-slab DTensors, as :func:`fieldhmc.ops.rfft3d`.

    .. math:: X_k = s \\sum_x f(x)\\, e^{-2\\pi i k\\cdot x/n},\\qquad
              s = 1,\\ N^{-1/2},\\ N^{-1}\\ \\text{for backward, ortho, forward.}

    Parameters
    ----------
    x : tf.Tensor
        Real float32/float64 DTensor ``[chains, n0, n1, n2]`` on ``mesh``, laid out
        as :func:`slab_layout` (other layouts are relaid out first).
    mesh : dtensor.Mesh
        1-D mesh whose size divides ``n0`` and ``n1``.
    norm : {"backward", "ortho", "forward"}
        NumPy's meaning.

    Returns
    -------
    tf.Tensor
        Complex64/128 DTensor ``[chains, n0, n1, n2 // 2 + 1]`` in
        :func:`spectrum_layout` (sharded along ``n1``).
    """
    x = tf.convert_to_tensor(x)
    _check_rank(x, "x")
    if not x.dtype.is_floating:
        raise TypeError(f"rfft3d needs a real float input, got {x.dtype}")
    grid_shape = tuple(int(n) for n in x.shape[1:])
    check_mesh(mesh, grid_shape)
    s = _scale(norm, grid_shape[0] * grid_shape[1] * grid_shape[2], inverse=False)
    rfft_raw, _ = _make_pair(mesh, grid_shape)
    out = rfft_raw(x)
    return out if s is None else out * tf.constant(s, out.dtype)


def irfft3d(
    modes: tf.Tensor, mesh: dtensor.Mesh, fft_length=None, norm: str = "backward"
) -> tf.Tensor:
    """Complex-to-real inverse of :func:`rfft3d` (as :func:`fieldhmc.ops.irfft3d`).

    .. math:: f(x) = \\frac{1}{s N} \\sum_{k \\in \\text{half}} w_k\\,
              \\mathrm{Re}\\left(Z_k e^{2\\pi i k\\cdot x/n}\\right)

    Only the Hermitian part of the self-paired planes is read.

    Parameters
    ----------
    modes : tf.Tensor
        Complex DTensor ``[chains, n0, n1, m]`` on ``mesh``, laid out as
        :func:`spectrum_layout` (other layouts are relaid out first).
    mesh : dtensor.Mesh
        1-D mesh whose size divides ``n0`` and ``n1``.
    fft_length : sequence of 3 int, optional
        ``(n0, n1, n2)``; default ``(n0, n1, 2 (m - 1))`` as NumPy. Pass it for odd
        ``n2``. Cropping and zero-padding are not supported.
    norm : {"backward", "ortho", "forward"}
        As :func:`rfft3d`.

    Returns
    -------
    tf.Tensor
        Real DTensor ``[chains, n0, n1, n2]`` in :func:`slab_layout`.
    """
    modes = tf.convert_to_tensor(modes)
    _check_rank(modes, "modes")
    if not modes.dtype.is_complex:
        raise TypeError(f"irfft3d needs a complex input, got {modes.dtype}")
    n0, n1, m = (int(n) for n in modes.shape[1:])
    if fft_length is None:
        fft_length = (n0, n1, 2 * (m - 1))
    grid_shape = tuple(int(n) for n in fft_length)
    if len(grid_shape) != 3 or grid_shape[:2] != (n0, n1) or grid_shape[2] // 2 + 1 != m:
        raise ValueError(
            f"fft_length {tuple(fft_length)} does not match modes of shape {tuple(modes.shape)}"
        )
    check_mesh(mesh, grid_shape)
    s = _scale(norm, n0 * n1 * grid_shape[2], inverse=True)
    _, irfft_raw = _make_pair(mesh, grid_shape)
    out = irfft_raw(modes)
    return out if s is None else out * tf.constant(s, out.dtype)
