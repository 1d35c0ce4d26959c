"""The Wiener-filter linear system and its preconditioned conjugate-gradient solver (NumPy).

For a zero-mean Gaussian field with Fourier-diagonal covariance :math:`S`
(eigenvalues :math:`s_k = P(k) N/V` in the orthonormal Fourier basis) observed as
:math:`d = \\delta + n` with diagonal noise precision
:math:`W = \\mathrm{diag}(m_x / \\sigma_x^2)` (``m`` the mask), the posterior mean
solves :math:`(S^{-1} + W)\\hat\\delta = W d`. With :math:`\\delta = S^{1/2} y` this
becomes the well-conditioned symmetric positive definite system

.. math:: (I + S^{1/2} W S^{1/2})\\, y = S^{1/2} W d, \\qquad \\hat\\delta = S^{1/2} y,

preconditioned by its Fourier-diagonal part :math:`(1 + s_k \\bar W)^{-1}`,
:math:`\\bar W = \\mathrm{mean}(W)` (exact when :math:`W` is constant, then CG
converges in one step). :math:`S^{1/2}` removes the ``k = 0`` mode, as the models
fix it. All arithmetic is float64 with ``numpy.fft`` (``norm="ortho"``).

References
----------
1. Elsner & Wandelt (2013), "Efficient Wiener filtering without preconditioning",
   arXiv:1210.4931.
2. Kitaura & Enßlin (2008), "Bayesian reconstruction of the cosmological
   large-scale structure", arXiv:0705.0429.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np
import scipy.fft

__all__ = ["CGResult", "WienerSystem", "conjugate_gradient", "wiener_filter_mean"]


class CGResult(NamedTuple):
    """Result of :func:`conjugate_gradient`.

    Attributes
    ----------
    solution : np.ndarray
        float64, the shape of ``b``.
    num_iterations : int
    residual : float
        Final relative residual :math:`\\|b - A x\\| / \\|b\\|` (0 for ``b = 0``).
    """

    solution: np.ndarray
    num_iterations: int
    residual: float


def conjugate_gradient(
    apply_a: Callable[[np.ndarray], np.ndarray],
    b: np.ndarray,
    apply_preconditioner: Callable[[np.ndarray], np.ndarray] | None = None,
    tol: float = 1e-10,
    max_iter: int = 1000,
) -> CGResult:
    """Preconditioned conjugate gradients for a symmetric positive definite ``A``.

    Stops when :math:`\\|b - A x\\|_2 \\le \\mathrm{tol}\\, \\|b\\|_2` (the residual is
    recomputed from scratch at the end and reported).

    Raises
    ------
    RuntimeError
        If the tolerance is not reached within ``max_iter`` iterations.
    """
    b = np.asarray(b, dtype=np.float64)
    b_norm = float(np.linalg.norm(b))
    x = np.zeros_like(b)
    if b_norm == 0.0:
        return CGResult(x, 0, 0.0)
    # Four vectors live across iterations (b, x, r, p) and at most one more (A p, then
    # the preconditioned residual) within one: every update is in place, so at 512³
    # the solver holds ~5 float64 fields plus what ``apply_a`` allocates, not ~12.
    r = b.copy()
    z = apply_preconditioner(r) if apply_preconditioner is not None else r
    p = z.copy()
    rz = float(np.vdot(r, z))
    del z
    it = 0
    while float(np.linalg.norm(r)) > tol * b_norm:
        if it >= max_iter:
            raise RuntimeError(
                f"conjugate gradients did not reach tol {tol} in {max_iter} iterations "
                f"(residual {np.linalg.norm(r) / b_norm:.3g})"
            )
        work = np.asarray(apply_a(p), dtype=np.float64)
        if np.may_share_memory(work, p):
            work = work.copy()
        alpha = rz / float(np.vdot(p, work))
        work *= alpha  # r <- r - alpha A p
        r -= work
        np.multiply(p, alpha, out=work)  # x <- x + alpha p
        x += work
        del work
        z = apply_preconditioner(r) if apply_preconditioner is not None else r
        rz_new = float(np.vdot(r, z))
        p *= rz_new / rz  # p <- z + beta p
        p += z
        del z
        rz = rz_new
        it += 1
    del r, p
    work = np.asarray(apply_a(x), dtype=np.float64)
    work -= b
    residual = float(np.linalg.norm(work)) / b_norm
    return CGResult(x, it, residual)


class WienerSystem:
    """The whitened Wiener-filter operator :math:`A = I + S^{1/2} W S^{1/2}` on a grid.

    Parameters
    ----------
    grid_shape : sequence of 3 int
    signal_variance : np.ndarray
        float ``[n0, n1, n2 // 2 + 1]``: :math:`s_k \\ge 0` (0 at ``k = 0``).
    weights : np.ndarray or float
        Noise precision :math:`W` per voxel, ``grid_shape`` or scalar, ``>= 0``.
    """

    def __init__(self, grid_shape: Sequence[int], signal_variance: np.ndarray, weights):
        self.grid_shape = tuple(int(n) for n in grid_shape)
        self.signal_variance = np.asarray(signal_variance, dtype=np.float64)
        self.weights = np.broadcast_to(np.asarray(weights, dtype=np.float64), self.grid_shape)
        self.mean_weight = float(self.weights.mean())
        self._sqrt_s = np.sqrt(self.signal_variance)
        self._precond = 1.0 / (1.0 + self.signal_variance * self.mean_weight)

    def fourier_multiply(self, x: np.ndarray, factor: np.ndarray) -> np.ndarray:
        """:math:`F^{-1} \\mathrm{diag}(\\text{factor}) F x` with orthonormal FFTs."""
        # scipy.fft allocates only its output (numpy.fft also a same-sized temporary);
        # the product is formed in place and the inverse may overwrite it.
        modes = scipy.fft.rfftn(x, axes=(-3, -2, -1), norm="ortho", workers=-1)
        modes *= factor
        return scipy.fft.irfftn(
            modes, s=self.grid_shape, axes=(-3, -2, -1), norm="ortho", overwrite_x=True, workers=-1
        )

    def sqrt_signal(self, x: np.ndarray) -> np.ndarray:
        """:math:`S^{1/2} x`."""
        return self.fourier_multiply(x, self._sqrt_s)

    def apply(self, y: np.ndarray) -> np.ndarray:
        """:math:`(I + S^{1/2} W S^{1/2})\\, y`."""
        out = self.sqrt_signal(y)
        out *= self.weights
        out = self.sqrt_signal(out)
        out += y
        return out

    def precondition(self, r: np.ndarray) -> np.ndarray:
        """:math:`F^{-1} (1 + s_k \\bar W)^{-1} F r`."""
        return self.fourier_multiply(r, self._precond)

    def solve(self, b: np.ndarray, tol: float = 1e-10, max_iter: int | None = None) -> CGResult:
        """Solve :math:`A y = b` by preconditioned CG (relative residual ``tol``)."""
        if max_iter is None:
            max_iter = max(1000, 10 * int(np.sqrt(np.prod(self.grid_shape))))
        return conjugate_gradient(self.apply, b, self.precondition, tol=tol, max_iter=max_iter)


def wiener_filter_mean(
    grid_shape: Sequence[int],
    signal_variance: np.ndarray,
    weights,
    data: np.ndarray,
    tol: float = 1e-10,
    max_iter: int | None = None,
) -> tuple[np.ndarray, CGResult]:
    """Posterior mean :math:`\\hat\\delta = (S^{-1} + W)^{-1} W d` by preconditioned CG.

    Parameters
    ----------
    grid_shape : sequence of 3 int
    signal_variance : np.ndarray
        float ``[n0, n1, n2 // 2 + 1]``, :math:`s_k = P(k) N / V` (0 at ``k = 0``).
    weights : np.ndarray or float
        Noise precision per voxel, ``mask / sigma**2`` (0 where masked).
    data : np.ndarray
        float ``grid_shape``.
    tol : float
        Relative residual of the whitened system.
    max_iter : int, optional

    Returns
    -------
    mean_field : np.ndarray
        float64 ``grid_shape``, zero mean.
    result : CGResult
        Of the whitened system (``solution`` is :math:`y`).
    """
    system = WienerSystem(grid_shape, signal_variance, weights)
    rhs = system.weights * np.asarray(data, dtype=np.float64)
    del data  # the caller's temporaries (e.g. a float64 copy of the data) go with it
    rhs = system.sqrt_signal(rhs)
    result = system.solve(rhs, tol=tol, max_iter=max_iter)
    del rhs
    return system.sqrt_signal(result.solution), result
