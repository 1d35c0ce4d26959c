"""Independent NumPy/SciPy reference for :mod:`fieldhmc.models.cosmology`.

Written from the papers, not from the TensorFlow code:

* the Eisenstein & Hu (1998, astro-ph/9709112) transfer function, eqs. 2-24 (with
  baryon oscillations) and eqs. 26-31 (no-wiggle), in Mpc^-1 internally; the
  ``convention="hu_code"`` switch reproduces the authors' ``tf_fit.c`` (and CCL's
  ``ccl_eh.c``), which treat eq. 2's :math:`z_{eq}` as :math:`1 + z_{eq}` and put
  :math:`1 + z_d` into :math:`R_d`;
* sigma(R) by ``scipy.integrate.quad`` over ln k, piecewise between log-spaced nodes;
* the growth factors by ``scipy.integrate.solve_ivp`` (DOP853) on D(a) itself, in the
  variable a (the TensorFlow code integrates D/a^m in ln a with RK4), and D1 by the
  Heath (1977) integral for flat LCDM.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.integrate import quad, solve_ivp


def eh_transfer(k_hmpc, omega_m, omega_b, h, t_cmb, wiggles=True, convention="paper"):
    """E&H (1998) T(k), k in h/Mpc. ``convention`` in {"paper", "hu_code"}."""
    k = np.asarray(k_hmpc, dtype=np.float64) * h  # Mpc^-1
    theta = t_cmb / 2.7
    om_h2 = omega_m * h * h
    ob_h2 = omega_b * h * h
    fb = omega_b / omega_m
    fc = (omega_m - omega_b) / omega_m
    if not wiggles:
        s = 44.5 * math.log(9.83 / om_h2) / math.sqrt(1.0 + 10.0 * ob_h2**0.75)  # eq 26
        alpha_g = 1.0 - 0.328 * math.log(431.0 * om_h2) * fb + 0.38 * math.log(22.3 * om_h2) * fb**2
        gamma_eff = omega_m * h * (alpha_g + (1.0 - alpha_g) / (1.0 + (0.43 * k * s) ** 4))
        q = (k / h) * theta**2 / gamma_eff  # eq 28, k in h/Mpc
        l0 = np.log(2.0 * math.e + 1.8 * q)
        c0 = 14.2 + 731.0 / (1.0 + 62.5 * q)
        return l0 / (l0 + c0 * q * q)  # eq 29
    z_eq = 2.50e4 * om_h2 * theta**-4  # eq 2
    k_eq = 7.46e-2 * om_h2 * theta**-2  # eq 3
    b1 = 0.313 * om_h2**-0.419 * (1.0 + 0.607 * om_h2**0.674)
    b2 = 0.238 * om_h2**0.223
    z_d = 1291.0 * om_h2**0.251 / (1.0 + 0.659 * om_h2**0.828) * (1.0 + b1 * ob_h2**b2)  # eq 4

    def r_of(z):  # eq 5
        return 31.5 * ob_h2 * theta**-4 * (z / 1e3) ** -1

    if convention == "paper":
        r_d, r_eq, y = r_of(z_d), r_of(z_eq), (1.0 + z_eq) / (1.0 + z_d)
    elif convention == "hu_code":
        r_d, r_eq, y = r_of(1.0 + z_d), r_of(z_eq), z_eq / (1.0 + z_d)
    else:
        raise ValueError(convention)
    s = (
        2.0
        / (3.0 * k_eq)
        * math.sqrt(6.0 / r_eq)
        * math.log((math.sqrt(1.0 + r_d) + math.sqrt(r_d + r_eq)) / (1.0 + math.sqrt(r_eq)))
    )  # eq 6
    k_silk = 1.6 * ob_h2**0.52 * om_h2**0.73 * (1.0 + (10.4 * om_h2) ** -0.95)  # eq 7
    q = k / (13.41 * k_eq)  # eq 10
    a1 = (46.9 * om_h2) ** 0.670 * (1.0 + (32.1 * om_h2) ** -0.532)
    a2 = (12.0 * om_h2) ** 0.424 * (1.0 + (45.0 * om_h2) ** -0.582)
    alpha_c = a1**-fb * a2 ** -(fb**3)  # eq 11
    bb1 = 0.944 / (1.0 + (458.0 * om_h2) ** -0.708)
    bb2 = (0.395 * om_h2) ** -0.0266
    beta_c = 1.0 / (1.0 + bb1 * (fc**bb2 - 1.0))  # eq 12

    def t0(alpha, beta):  # eqs 19-20
        ln = np.log(math.e + 1.8 * beta * q)
        c = 14.2 / alpha + 386.0 / (1.0 + 69.9 * q**1.08)
        return ln / (ln + c * q * q)

    f = 1.0 / (1.0 + (k * s / 5.4) ** 4)  # eq 18
    t_c = f * t0(1.0, beta_c) + (1.0 - f) * t0(alpha_c, beta_c)  # eq 17
    x = math.sqrt(1.0 + y)
    g = y * (-6.0 * x + (2.0 + 3.0 * y) * math.log((x + 1.0) / (x - 1.0)))  # eq 15
    alpha_b = 2.07 * k_eq * s * (1.0 + r_d) ** -0.75 * g  # eq 14
    beta_node = 8.41 * om_h2**0.435  # eq 23
    beta_b = 0.5 + fb + (3.0 - 2.0 * fb) * math.sqrt((17.2 * om_h2) ** 2 + 1.0)  # eq 24
    s_tilde = s / (1.0 + (beta_node / (k * s)) ** 3) ** (1.0 / 3.0)  # eq 22
    j0 = np.sinc(k * s_tilde / math.pi)
    t_b = (
        t0(1.0, 1.0) / (1.0 + (k * s / 5.2) ** 2)
        + alpha_b / (1.0 + (beta_b / (k * s)) ** 3) * np.exp(-((k / k_silk) ** 1.4))
    ) * j0  # eq 21
    return fb * t_b + fc * t_c  # eq 16


def tophat_window(x):
    """3 j1(x)/x with its series near 0."""
    x = np.asarray(x, dtype=np.float64)
    small = x < 1e-3
    xs = np.where(small, 1.0, x)
    big = 3.0 * (np.sin(xs) - xs * np.cos(xs)) / xs**3
    return np.where(small, 1.0 - x * x / 10.0, big)


def sigma_r_squared(power_fn, radius=8.0, k_min=1e-6, k_max=1e3, num_pieces=120):
    """sigma^2(R) = int dlnk k^3 P(k) W^2(kR) / (2 pi^2) by piecewise ``quad``.

    Outside [k_min, k_max] the integrand is below 1e-9 of its peak for CDM spectra
    (k^(3+n) at low k, (kR)^-4 at high k).
    """

    def integrand(ln_k):
        k = math.exp(ln_k)
        return k**3 * float(power_fn(np.array([k]))[0]) * float(tophat_window(k * radius)) ** 2

    nodes = np.linspace(math.log(k_min), math.log(k_max), num_pieces + 1)
    scale = max(integrand(x) for x in nodes)
    total = 0.0
    for lo, hi in zip(nodes[:-1], nodes[1:], strict=True):
        total += quad(integrand, lo, hi, epsabs=1e-13 * scale, epsrel=1e-10, limit=100)[0]
    return total / (2.0 * math.pi**2)


def linear_power(k, omega_m, sigma8, omega_b, h, n_s, t_cmb, wiggles=True, convention="paper"):
    """P(k) at a = 1 normalised to sigma8; also returns the amplitude A."""

    def shape(kk):
        return kk**n_s * eh_transfer(kk, omega_m, omega_b, h, t_cmb, wiggles, convention) ** 2

    amplitude = sigma8**2 / sigma_r_squared(shape)
    return amplitude * shape(np.asarray(k, dtype=np.float64)), amplitude


def growth_ode(omega_m, a_eval, a_init=1e-5):
    """(D1, f1, D2, f2) at ``a_eval`` from ``solve_ivp`` on D(a), D1 -> a, D2 -> -3/7 a^2."""
    ol = 1.0 - omega_m

    def rhs(a, y):
        e2 = omega_m * a**-3 + ol
        dlne_da = -1.5 * omega_m * a**-4 / e2
        om_a = omega_m * a**-3 / e2
        d1, dd1, d2, dd2 = y
        fric = 3.0 / a + dlne_da
        src = 1.5 * om_a / a**2
        return [dd1, -fric * dd1 + src * d1, dd2, -fric * dd2 + src * (d2 - d1 * d1)]

    y0 = [a_init, 1.0, -3.0 / 7.0 * a_init**2, -6.0 / 7.0 * a_init]
    a_eval = np.atleast_1d(np.asarray(a_eval, dtype=np.float64))
    sol = solve_ivp(
        rhs,
        (a_init, float(a_eval.max())),
        y0,
        method="DOP853",
        t_eval=np.sort(a_eval),
        rtol=1e-12,
        atol=1e-15,
    )
    order = np.argsort(np.argsort(a_eval))
    d1, dd1, d2, dd2 = (v[order] for v in sol.y)
    return d1, a_eval * dd1 / d1, d2, a_eval * dd2 / d2


def growth_heath(omega_m, a):
    """D1(a) = (5 Om / 2) E(a) int_0^a da' / (a' E(a'))^3, normalised D1 -> a as a -> 0."""

    def e_of(x):
        return math.sqrt(omega_m * x**-3 + 1.0 - omega_m)

    def integrand(x):  # (x E(x))^-3 without overflow near 0
        return x**1.5 / (omega_m + (1.0 - omega_m) * x**3) ** 1.5

    out = []
    for ai in np.atleast_1d(a):
        integral = quad(integrand, 0.0, ai, epsabs=0.0, epsrel=1e-13)[0]
        out.append(2.5 * omega_m * e_of(ai) * integral)
    return np.array(out)
