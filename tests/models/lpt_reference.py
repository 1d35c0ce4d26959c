"""Independent NumPy 2LPT, redshift space, Lagrangian bias and CIC window (float64).

Written from the equations with full complex FFTs (``numpy.fft.fftn``) and plain
``fftfreq`` wavenumbers. A single derivative on the Nyquist plane of an even axis is not
special-cased: taking the real part of the inverse transform drops exactly the
anti-Hermitian part it creates, which is the library's convention of zeroing it. Mixed
second derivatives zero each factor's Nyquist frequency explicitly (S. G. Johnson,
"Notes on FFT-based differentiation"; pmwd): on the edge where both axes are at their
Nyquist frequency :math:`k_ik_j` is Hermitian and the real part would keep it.
"""

from __future__ import annotations

import itertools

import numpy as np

AXES = (-3, -2, -1)


def wavevectors(grid_shape, box_size):
    """Full-spectrum k components (h/Mpc), broadcastable ``[n0, n1, n2]``."""
    ks = [
        2 * np.pi * np.fft.fftfreq(n, d=ell / n)
        for n, ell in zip(grid_shape, box_size, strict=True)
    ]
    return np.meshgrid(*ks, indexing="ij")


def _ifft(x):
    return np.fft.ifftn(x, axes=AXES).real


def _no_nyquist(ka, n):
    return np.where(np.isclose(np.abs(ka), np.abs(ka).max()) & (n % 2 == 0), 0.0, ka)


def _tidal_kernel(k, i, j, shape):
    """k_i k_j / k^2 (mixed: Nyquist factors zeroed); NaN-free at k = 0 (set there later)."""
    k2 = sum(ka**2 for ka in k)
    safe = np.where(k2 == 0, 1.0, k2)
    if i == j:
        return k[i] ** 2 / safe
    return _no_nyquist(k[i], shape[i]) * _no_nyquist(k[j], shape[j]) / safe


def tidal_tensor(delta, box_size):
    """phi_ij = ifft(k_i k_j / k^2 delta_k), with phi_ij(k=0) = delta_ij delta_0 / 3;
    returns a dict {(i, j): field} for all 9 pairs."""
    shape = delta.shape[-3:]
    k = wavevectors(shape, box_size)
    zero = sum(ka**2 for ka in k) == 0
    dk = np.fft.fftn(delta, axes=AXES)
    phi = {}
    for i, j in itertools.product(range(3), repeat=2):
        kernel = np.where(zero, 1.0 / 3.0 if i == j else 0.0, _tidal_kernel(k, i, j, shape))
        phi[i, j] = _ifft(kernel * dk)
    return phi


def second_order_source(delta, box_size):
    """delta2 = sum_{i<j} [phi_ii phi_jj - phi_ij^2]."""
    phi = tidal_tensor(delta, box_size)
    return sum(phi[i, i] * phi[j, j] - phi[i, j] ** 2 for i in range(3) for j in range(i + 1, 3))


def inverse_gradient(source, box_size):
    """ifft(i k / k^2 source_k) per axis, in Mpc/h: [..., 3, n0, n1, n2] (0 at k = 0)."""
    shape = source.shape[-3:]
    k = wavevectors(shape, box_size)
    k2 = sum(ka**2 for ka in k)
    sk = np.fft.fftn(source, axes=AXES)
    inv = np.where(k2 == 0, 0.0, 1.0 / np.where(k2 == 0, 1.0, k2))
    return np.stack([_ifft(1j * ka * inv * sk) for ka in k], axis=-4)


def lpt_components(delta, box_size):
    """(Psi1, Psi2) in **cells**: Psi1 = i k/k^2 delta_k, Psi2 = -i k/k^2 delta2_k."""
    cell = np.asarray(box_size) / np.asarray(delta.shape[-3:])
    scale = (1.0 / cell)[:, None, None, None]
    psi1 = inverse_gradient(delta, box_size) * scale
    psi2 = -inverse_gradient(second_order_source(delta, box_size), box_size) * scale
    return psi1, psi2


def redshift_space_displacement(delta, box_size, d1, d2, f1, f2, los_axis):
    """D1 Psi1 + D2 Psi2 + (f1 D1 Psi1 + f2 D2 Psi2) . z z, cells, [chains, 3, ...];
    d1, d2, f1, f2 are [chains] arrays."""
    psi1, psi2 = lpt_components(delta, box_size)
    c = lambda v: np.asarray(v, float).reshape(-1, 1, 1, 1)  # noqa: E731
    disp = c(d1)[:, None] * psi1 + c(d2)[:, None] * psi2
    disp[:, los_axis] += c(f1) * c(d1) * psi1[:, los_axis] + c(f2) * c(d2) * psi2[:, los_axis]
    return disp


def bias_weights(delta, box_size, d1, b1, b2, bs2, bnabla2):
    """1 + b1 dL + b2 (dL^2 - <dL^2>) + bs2 (s^2 - <s^2>) + bn2 lap dL, dL = D1 delta,
    s_ij = (k_i k_j / k^2 - delta_ij / 3) dL_k (0 at k = 0); box means per chain."""
    c = lambda v: np.asarray(v, float).reshape(-1, 1, 1, 1)  # noqa: E731
    dl = c(d1) * delta
    shape = delta.shape[-3:]
    k = wavevectors(shape, box_size)
    k2 = sum(ka**2 for ka in k)
    dk = np.fft.fftn(dl, axes=AXES)
    s2 = 0.0
    for i, j in itertools.product(range(3), repeat=2):
        kernel = np.where(k2 == 0, 0.0, _tidal_kernel(k, i, j, shape) - (i == j) / 3.0)
        s2 = s2 + _ifft(kernel * dk) ** 2
    lap = _ifft(-k2 * dk)
    mean = lambda x: x.mean(axis=AXES, keepdims=True)  # noqa: E731
    return (
        1.0
        + c(b1) * dl
        + c(b2) * (dl**2 - mean(dl**2))
        + c(bs2) * (s2 - mean(s2))
        + c(bnabla2) * lap
    )


def cic_window(grid_shape):
    """prod_a sinc^2(k_a h_a / 2) on the full spectrum, written with sin."""
    out = 1.0
    for a, n in enumerate(grid_shape):
        x = np.pi * np.fft.fftfreq(n)  # k h / 2
        with np.errstate(invalid="ignore", divide="ignore"):
            s = np.where(x == 0, 1.0, np.sin(x) / np.where(x == 0, 1.0, x)) ** 2
        shape = [1, 1, 1]
        shape[a] = n
        out = out * s.reshape(shape)
    return out
