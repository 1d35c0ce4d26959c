r"""Microcanonical samplers for TensorFlow: MCLMC (unadjusted) and MAMS (adjusted).

Both kernels integrate the *isokinetic* (microcanonical) dynamics of [1, 2]: the
velocity :math:`u` lives on the unit sphere :math:`|u| = 1` of the state's
:math:`d` dimensions, the position moves as :math:`\dot x = u`, and the velocity
turns toward the gradient :math:`g = \nabla \log \pi(x)` as

.. math::

    \dot u = \frac{1}{d - 1} (I - u u^\top)\, g .

Its exact solution over a time :math:`\tau` with fixed :math:`g` (the velocity
update of every integrator, ESH dynamics [3]) is, with :math:`e = g/|g|`,
:math:`\delta = \tau |g| / (d - 1)`, :math:`\zeta = e^{-\delta}` and
:math:`c = u \cdot e`,

.. math::

    u' \propto e\,(1 - \zeta)\,(1 + \zeta + c\,(1 - \zeta)) + 2 \zeta u ,
    \qquad
    \Delta K = (d - 1)\left[\delta - \log 2 + \log\!\big(1 + c + (1 - c)\zeta^2\big)\right],

where :math:`\Delta K` is the change of the "kinetic energy" that makes
:math:`-\log \pi(x) + K` the conserved energy of the flow [2]. The energy error of a
step is :math:`\Delta E = \Delta K - \log \pi(x') + \log \pi(x)`.

Integrators (``integrator``): ``"minimal_norm"`` (the 2nd-order minimal-norm /
McLachlan / Omelyan scheme, velocity-position-velocity-position-velocity with
:math:`\lambda = 0.1931833275037836`, two gradients per step; BlackJAX's
default) and ``"leapfrog"`` (velocity Verlet, one gradient per step).

`MicrocanonicalLangevin` (MCLMC [1], unadjusted)
    One integrator step per transition followed by a partial velocity refresh
    :math:`u \leftarrow (u + \nu z)/|u + \nu z|`, :math:`z \sim \mathcal N(0, I)`,
    :math:`\nu = \sqrt{(e^{2 \epsilon / L} - 1)/d}`: Langevin noise with the
    momentum decoherence length :math:`L`. No Metropolis test, so its stationary
    distribution differs from :math:`\pi` by an asymptotic bias that grows with
    :math:`\epsilon`. The tuner sets :math:`\epsilon` so that the energy-error
    variance per dimension :math:`\mathrm{Var}[\Delta E]/d` equals
    ``desired_energy_var``, which for Gaussian targets bounds the squared relative
    error of the second moments [4]; ``L`` from the chain's autocorrelation.
`MetropolisAdjustedMicrocanonical` (MAMS [5], exact)
    Full velocity refresh, :math:`N` integrator steps with
    :math:`N = \lceil U\, s \rceil`, :math:`U \sim \mathcal U(0, 1)`, where ``s`` makes
    :math:`\mathbb E[N] = L / \epsilon` (BlackJAX's ``rescale``), then a Metropolis
    test on :math:`e^{-\Delta E}`. The flow preserves :math:`\pi` together with the
    uniform velocity up to the energy error, so the test makes the kernel exact.

Automatic tuning
----------------
Both kernels tune themselves during their first ``num_adaptation_steps``
transitions (the driver's warm-up), one step size and one ``L`` shared by all chains
(statistics pooled over chains), following BlackJAX's
``mclmc_find_L_and_step_size`` and ``adjusted_mclmc_find_L_and_step_size`` [6]:

MCLMC, warm-up split into stages of fractions ``(0.4, 0.3, 0.3)``:

1. step size from the energy error: each step contributes
   :math:`\xi = \overline{\Delta E^2} / (d\,\mathrm{Var}_\mathrm{desired})` with weight
   :math:`w = \exp(-\tfrac12 [\log \xi / (6 \cdot 1.5)]^2)` to exponentially decaying
   averages (memory of 150 steps) of :math:`w\,\xi / \epsilon^6` and :math:`w`,
   and :math:`\epsilon = (\overline{\xi/\epsilon^6})^{-1/6}` (the
   :math:`\mathrm{Var}[\Delta E] \propto \epsilon^6` law); a non-finite step, or
   one with :math:`|\Delta E| >` ``MAX_ENERGY_ERROR`` (throughout warm-up), is undone
   and caps :math:`\epsilon` at 0.8 times its value (unadjusted, a kept divergent step
   can throw a stiff sampled parameter far out: b2 from 0 to 16 on the galaxy model at
   32³ from the very first steps, the log density 10⁶ lower);
2. the same, and step-size-weighted means of :math:`x` and :math:`x^2`;
   :math:`L = \sqrt{\sum_i \mathrm{Var}[x_i]}` at the end;
3. positions of a strided subset of at most 512 coordinates per
   chain are kept, and :math:`L = 0.4\,\epsilon\,\tau_\max` from the largest
   integrated autocorrelation time among them (in steps; Geyer's initial positive
   sequence, pooled over chains), at most 4x the moment stage's :math:`L`. BlackJAX
   takes the mean over coordinates; the figure of merit is the minimum ESS, and on
   the masked hierarchical model at 64³ the mean left :math:`L` at a quarter of what
   the slab's modes need (their min ESS 15 of 1600 draws, 55 with the largest;
   ``benchmarks/README.md``). The maximum of the estimates from a short buffer is
   mostly the estimator's upper tail (identical AR(1) coordinates: 2-11x the true
   :math:`\tau` at 60-300 rows; the 20% slab at 64³: 6.4 against a median of 1.8),
   so after a short warm-up :math:`L` lands near its cap (64³: 3.96-4x after 200
   transitions; 0.9-1.2x unmasked and 2.9x with the slab after 600). A longer
   :math:`L` raises the means' ESS and lowers the squares' (on the 8³ Gaussian
   posterior at 4x, 3.7x and 0.42x: the variances and P(k) mix more slowly). Not in
   BlackJAX: the stage also measures :math:`\mathrm{Var}[\Delta E]/d` in 4 windows at
   stationarity and after each re-sets the step by
   :math:`(\text{desired}/\text{measured})^{1/6}` (at most 4x either way;
   after the last window at most :math:`2^{1/6}` up, so the kept step's variance is by
   the law at most twice a measured one), and :math:`\epsilon` in the rule for
   :math:`L` is the stage's mean step. A window above twice the tolerance takes the
   step to its law value at once and caps it, for the rest of warm-up, at the step
   that window measured, or at the law value if one of its transitions diverged
   (:math:`|\Delta E| >` ``MAX_ENERGY_ERROR`` or non-finite). If the window's step is
   above that of an earlier window within the tolerance and its law value below it,
   the ε⁶ law broke down between the two (a stability cliff), and that earlier,
   measured step is kept and caps the rest of warm-up. The predictor of stages 1-2
   remembers the chains' way in from the start (its memory is most of a short
   warm-up), which left its step several times too small on field posteriors and far
   too large on hierarchical ones under the prior metric. The window after a large
   step increase measures a transient above the stationary value (the chains relax to
   the new step's stationary state over ~15-20 transitions; at 64³ 3.5x after a 3x
   increase, negligible at 8³), so without a divergence its law value caps nothing.
   Warm-up then ends with :math:`\epsilon/\sqrt d` at most 0.8 times the integrator's
   linear stability limit (leapfrog 2, minimal norm :math:`2/\sqrt{1-2\lambda}` =
   2.55) times the narrowest scalar part's conditional width
   :math:`1/\sqrt{E[g_j^2]}` over stage 3: a sampled hyperparameter adds ~1/d of the
   energy error, so the tolerance does not see it go unstable
   (:meth:`MicrocanonicalLangevin._stiff_scalar_limit`).

MAMS, stages ``(0.3, 0.2, 0.2, 0.3)``: (1) dual averaging of the step size to
``target_accept_prob`` (0.9 by default [5]; Nesterov's scheme as in Stan and
BlackJAX) with :math:`L/\epsilon` fixed; (2) step size frozen at its averaged
value, step-size-weighted moments of :math:`x`, then
:math:`L \leftarrow L \cdot \min(2, 1.3 \sqrt{\sum_i \mathrm{Var}[x_i]} / L)`, the step
kept (capped at :math:`L/1.1`); under the convergence stop (below) the moments restart
wherever the chains are found still drifting, and from stationary chains
:math:`L \leftarrow 1.3 \sqrt{\sum_i \mathrm{Var}[x_i]}` without the cap; (3)
:math:`L \leftarrow \mathrm{clip}(0.5\, L\, \tau_\mathrm{max},\ L,\ 2 L)` from the
largest integrated autocorrelation time (in transitions) among the recorded
coordinates of the stage's draws (BlackJAX's ``max="max"``: its minimum ESS); (4) dual
averaging again with :math:`L` fixed; the final step size is its average.

Two departures from BlackJAX's ``adjusted_mclmc_find_L_and_step_size`` (which has
the same four stages when ``frac_tune3 > 0``), both found on the whitened field
posteriors (``tests/samplers/test_mams_tuning.py``):

* BlackJAX scales :math:`\epsilon` with :math:`L` at the end of stage 2 and re-runs
  dual averaging before stage 3; without that re-run stage 3 ran at
  :math:`L/\epsilon = 10` with a quarter of the accepted step. Keeping the
  dual-averaged step (the energy error of the integrator does not grow with the
  trajectory length) makes stage 3 measure the integrator that is then used, at a
  quarter of the gradients.
* The rule :math:`0.5\, L \bar\tau` has its fixed point at :math:`\bar\tau = 2`
  transitions, so it *shortens* :math:`L` whenever one transition already
  decorrelates the chain. On a whitened (near-isotropic) target, where
  :math:`L/\sqrt d` is the HMC trajectory time :math:`T`, a uniformly randomised
  length has lag-1 autocorrelation :math:`\sin(2T)/(2T)` and gradients per ESS
  :math:`\propto T(1+\rho)/(1-\rho)`, falling up to :math:`T \approx 2`; the
  unfloored rule took the moment-stage :math:`T = 1.3` down to 0.8--0.9 and, with the
  step re-tuned in stage 4, 1.4--2 integration steps per transition. Stage 3 may
  therefore lengthen :math:`L` (slow directions, e.g. a masked region) but not
  shorten it below the moment-stage value. It reads the slowest coordinate, not
  the mean over coordinates (BlackJAX's default ``max="avg"``): the figure of merit
  is the minimum ESS, and at 32³ (``benchmarks/microcanonical.py``) the mean left
  :math:`L/\sqrt d` at 1.3 (31 and 92 gradients per min-ESS unmasked / masked)
  where the slowest coordinate takes it to the cap 2.6 (18 and 28).

MAMS' convergence stop (``warmup_stop="converged"``; ``"fixed"``, the kernel's default,
runs the stages above): the stages keep their order and their fixed-count lengths become
maxima, so warm-up never exceeds ``num_adaptation_steps``; each ends early once the
estimate it hands on has converged, checked every ``_CHECK_WINDOW`` (10) transitions of
the stage, and only once the chains are stationary:

* stationarity (stages 1, 2 and 4): the chains' mean change of log density over the
  window is at most ``_DRIFT`` (2) times its pooled standard deviation within the window
  (:meth:`MetropolisAdjustedMicrocanonical._stationarity`; changes, so the driver's
  re-centring of log densities between chunks does not enter). Chains climbing in from a
  start far out in some directions (a non-centred prior draw where the data narrow the
  posterior 16-fold) take a step ~30x below the stationary one, at which the step and
  the variance checks pass as well as at stationarity; without the gate both stages
  ended within 60 transitions of the start on the hierarchical model at 64³ with A and
  n fixed, the 2x cap tied L to the climbing step, and the final step stage left
  L/ε = 1.3 (``benchmarks/README.md``). The gate does not rescue that run (its chains are
  still climbing when stage 1 reaches its count); it does the tests' synthetic far start.
  In stage 2 a failed check restarts the moments;
* stages 1 and 4: the mean of the dual-averaging iterates' log step over a window is
  within ``_STEP_CHANGE`` (0.1) of the previous window's (the first window is compared
  with the stage's starting step), and the window's acceptance, pooled over chains, is
  within ``_ACCEPT_ERROR`` (0.05) of ``target_accept_prob``; the step handed on is the
  dual average, as at the fixed count (the check decides when, not what). A step 10% off
  moves :math:`1 - \bar a` by ~20% (:math:`\propto \epsilon^2` for a second-order
  integrator), e.g. 0.9 to 0.88 or 0.92, within which MAMS' gradients per ESS are flat
  within noise; 0.05 is about twice the standard error of a window's acceptance (4 chains
  x 10 transitions), so a window still far off the target does not pass;
* stage 2: the relative Monte Carlo error of :math:`\sum_i \mathrm{Var}[x_i]` below
  ``_VARIANCE_ERROR`` (5%) at ``_PASSES`` (2) consecutive checks (the error estimate
  has chains - 1 degrees of freedom: one check can be lucky). The error is the standard
  error of the mean of the chains' own within-chain totals (independent chains: honest
  whatever the autocorrelation, and large while the chains still disagree, i.e. travel
  in; infinite with one chain, which then runs the stage's maximum). 5% in the variance
  is 2.5% in :math:`L`, against the factor 2 by which stage 3 may still change it;
* stage 3: its buffer filled (its fixed length: the autocorrelation time is estimated
  over the whole buffer).

The tuner then reports itself done (``tuning.stage`` 4, ``tuning.stage_start`` the
first post-warm-up step) and holds its values; the driver
(:mod:`fieldhmc.samplers.driver`) ends warm-up at that transition and starts sampling.
A warm-up with a stage shorter than 2 transitions, and the mesh path, run the fixed
schedule. Stopping saves the warm-up transitions the estimates did not need; the later
stages (longer ``L``) cost the most gradients per transition. Warm-up is also the
chains' burn-in: the stage-2 check (the chains agree on the variance) is what keeps a
short one honest, and the exactness test (``tests/samplers/test_posterior.py``) runs
the draws after the stop.

All tuning state is in the kernel results, so a checkpointed and resumed run tunes
exactly as an uninterrupted one.

Units: ``step_size`` and ``trajectory_length`` are BlackJAX's (a step moves the
whitened state by :math:`\epsilon`, as :math:`|u| = 1`); an HMC step size
:math:`h` moves it by about :math:`h \sqrt d`. `fieldhmc.samplers.build_kernel`
takes and reports them divided by :math:`\sqrt d` so that they read like HMC's.

References
----------
.. [1] J. Robnik, G. B. De Luca, E. Silverstein and U. Seljak, "Microcanonical
   Hamiltonian Monte Carlo", JMLR 24 (2023), arXiv:2212.08549.
.. [2] J. Robnik and U. Seljak, "Fluctuation without dissipation: Microcanonical
   Langevin Monte Carlo", arXiv:2303.18221 (2023).
.. [3] G. Ver Steeg and A. Galstyan, "Hamiltonian dynamics with non-Newtonian
   momentum for rapid sampling", NeurIPS 2021, arXiv:2111.02434.
.. [4] J. Robnik, R. Cohn-Gordon and U. Seljak, "Controlling the asymptotic bias of
   the unadjusted (microcanonical) Hamiltonian and Langevin Monte Carlo",
   arXiv:2412.08876 (2024).
.. [5] J. Robnik, R. Cohn-Gordon and U. Seljak, "Metropolis adjusted microcanonical
   Hamiltonian Monte Carlo", arXiv:2503.01707 (2025).
.. [6] BlackJAX, ``blackjax/mcmc/integrators.py`` (``isokinetic_mclachlan``,
   ``esh_dynamics_momentum_update_one_step``), ``mcmc/mclmc.py``,
   ``mcmc/adjusted_mclmc_dynamic.py`` and ``adaptation/mclmc_adaptation.py``,
   ``adaptation/adjusted_mclmc_adaptation.py``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

import tensorflow as tf
import tensorflow_probability as tfp
from tensorflow.python.ops import control_flow_util  # no public XLA-context query

from fieldhmc.samplers import threefry
from fieldhmc.samplers.loops import pinned_to

__all__ = [
    "INTEGRATORS",
    "MetropolisAdjustedMicrocanonical",
    "MicrocanonicalLangevin",
    "MicrocanonicalResults",
    "MicrocanonicalTuning",
]


def _rng_alg() -> str:
    """The uniforms' (and float64 normals') algorithm: Threefry under XLA, where
    TensorFlow's Threefry normals cost 0.45x its Philox ones on XLA:CPU; Philox outside
    XLA, where TensorFlow's own kernels refuse Threefry ("counter must be a vector with
    length at least 2"). XLA's draws differ from TensorFlow's for the same seed with
    either algorithm. float32 refresh normals come from :func:`_normal`."""
    in_xla = control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph())
    return "threefry" if in_xla else "philox"


def _normal(shape, seed, dtype) -> tf.Tensor:
    """mclmc's partial-refresh normals: float32 by
    :func:`fieldhmc.samplers.threefry.standard_normal` (one per step: 44 against 209 µs
    for TensorFlow's Threefry normal at [4, 16, 16, 16] under XLA:CPU), other dtypes
    TensorFlow's (:func:`_rng_alg`)."""
    if tf.as_dtype(dtype) == tf.float32:
        return threefry.standard_normal(shape, seed)
    return tf.random.stateless_normal(shape, seed=seed, dtype=dtype, alg=_rng_alg())


_LAMBDA = 0.1931833275037836  # minimal-norm integrator (Omelyan et al. 2003)
# (velocity coefficients, position coefficients); gradients per step = len(positions)
INTEGRATORS = {
    "minimal_norm": ((_LAMBDA, 1.0 - 2.0 * _LAMBDA, _LAMBDA), (0.5, 0.5)),
    "leapfrog": ((0.5, 0.5), (1.0,)),
}
MAX_ENERGY_ERROR = 1000.0
MCLMC_STAGES = (0.4, 0.3, 0.3)
MAMS_STAGES = (0.3, 0.2, 0.2, 0.3)
_ESS_COORDINATES = 512
_DECAY = (150.0 - 1.0) / (150.0 + 1.0)  # BlackJAX num_effective_samples=150
_TRUST = 1.5
_TOLERANCE_WINDOWS = 4  # MCLMC stage 3: step re-set against desired_energy_var
_MAX_STEP_CHANGE = 4.0  # per window, either way, unless a window is above _OVER x desired
_OVER = 2.0  # MCLMC stage 3: a window above _OVER x desired_energy_var caps the step
_MAX_L_GROWTH = 4.0  # MCLMC stage 3: L at most this x the moment stage's
# MCLMC: the end of warm-up keeps eps / sqrt(d) within _STIFF_MARGIN x the integrator's
# linear stability limit (h omega, per step: leapfrog 2, minimal norm 2 / sqrt(1 - 2 lambda))
# times the narrowest scalar part's conditional width 1 / sqrt(E[g^2]).
_STABILITY_LIMIT = {"leapfrog": 2.0, "minimal_norm": 2.0 / math.sqrt(1.0 - 2.0 * _LAMBDA)}
_STIFF_MARGIN = 0.8
# MAMS' convergence stop (warmup_stop="converged"; see the module docstring)
WARMUP_STOPS = ("converged", "fixed")
_CHECK_WINDOW = 10  # transitions between two convergence checks of a stage
_STEP_CHANGE = 0.1  # stages 1 and 4: |change of the window-mean log step| between windows
_ACCEPT_ERROR = 0.05  # stages 1 and 4: |window acceptance - target|
_PASSES_STEP = 1  # stages 1 and 4: checks to pass (each compares two windows)
_VARIANCE_ERROR = 0.05  # stage 2: relative Monte Carlo error of sum_i Var[x_i]
_PASSES = 2  # stage 2: consecutive checks to pass
_DRIFT = 2.0  # stages 1, 2, 4: |window drift of mean lp| <= this x lp's sd within the window


class MicrocanonicalTuning(NamedTuple):
    """Tuning state carried in the results (scalars are shared by all chains).

    ``time``, ``x_average``: decaying averages of the MCLMC step-size predictor
    (stage 3 keeps its sum of the scalar parts' largest mean squared gradient in
    ``x_average``);
    ``step_size_max``: cap after non-finite steps; ``log_step_size``,
    ``log_step_size_avg``, ``da_step``, ``avg_error``, ``mu``: dual averaging (MAMS;
    MCLMC's stage 3 keeps its windowed sum and count of Var[dE]/d in ``avg_error``
    and ``da_step``, whether the window has diverged in ``mu``, the sum of its step
    sizes in ``log_step_size_avg`` and the largest step a window measured within the
    tolerance in ``log_step_size``, not a log);
    ``weight``, ``mean``, ``m2``: step-size-weighted Welford moments per chain
    (``[chains, ...]`` per part); ``buffer``: ``[n3, chains, K]`` positions of a
    coordinate subset for the autocorrelation estimate of ``L``.

    MAMS' convergence stop (``warmup_stop="converged"``; unused otherwise): ``stage``
    (int32, 0-3 tuning, 4 done), ``stage_start`` (int32, the step its stage began; once
    done, the first post-warm-up step), ``passes`` (int32, consecutive convergence
    checks passed), ``reference`` (stages 1 and 4: the last window's mean log step),
    ``window_sum`` and ``accept_sum`` (the current window's sums of log steps and
    acceptances), ``lp_drift``, ``lp_sum``, ``lp_sq`` (float64 ``[chains]``: each
    chain's change of log density since the window began, and the window's sums of it
    and of its square: the stationarity check). They default to None for the mesh path,
    which builds the nine scalars above itself and runs the fixed schedule.
    """

    time: tf.Tensor
    x_average: tf.Tensor
    step_size_max: tf.Tensor
    log_step_size: tf.Tensor
    log_step_size_avg: tf.Tensor
    da_step: tf.Tensor
    avg_error: tf.Tensor
    mu: tf.Tensor
    weight: tf.Tensor
    mean: list
    m2: list
    buffer: tf.Tensor
    stage: tf.Tensor | None = None
    stage_start: tf.Tensor | None = None
    passes: tf.Tensor | None = None
    reference: tf.Tensor | None = None
    window_sum: tf.Tensor | None = None
    accept_sum: tf.Tensor | None = None
    lp_drift: tf.Tensor | None = None
    lp_sum: tf.Tensor | None = None
    lp_sq: tf.Tensor | None = None


class MicrocanonicalResults(NamedTuple):
    """Kernel results of the microcanonical kernels (batch shape ``B`` = chains).

    Attributes
    ----------
    target_log_prob : tf.Tensor
        :math:`\\log \\pi` at the current state, ``B``.
    grads_target_log_prob : list of tf.Tensor
        Its gradient per state part.
    velocity : list of tf.Tensor
        Unit velocity per part (jointly :math:`|u| = 1` per chain).
    step_size, trajectory_length : tf.Tensor
        Scalars: :math:`\\epsilon` and :math:`L` for the next transition.
    energy_change : tf.Tensor
        :math:`\\Delta E` of the transition's proposal, ``B`` (0 if non-finite).
    log_accept_ratio : tf.Tensor
        :math:`-\\Delta E` (``-inf`` if non-finite), ``B``; MCLMC accepts regardless.
    is_accepted : tf.Tensor
        ``bool``, ``B``; always true for MCLMC unless the step was non-finite.
    is_divergent : tf.Tensor
        ``bool``, ``B``; non-finite or :math:`\\Delta E >` 1000.
    num_integration_steps : tf.Tensor
        ``int32`` scalar, integrator steps of the transition (all chains).
    num_gradient_evaluations : tf.Tensor
        ``int32`` scalar, gradient evaluations of the transition per chain.
    step : tf.Tensor
        ``int32`` scalar, transitions taken so far (drives the tuning stages).
    tuning : MicrocanonicalTuning
    seed : tf.Tensor
        Seed of the transition, ``[2]``.
    """

    target_log_prob: tf.Tensor
    grads_target_log_prob: list
    velocity: list
    step_size: tf.Tensor
    trajectory_length: tf.Tensor
    energy_change: tf.Tensor
    log_accept_ratio: tf.Tensor
    is_accepted: tf.Tensor
    is_divergent: tf.Tensor
    num_integration_steps: tf.Tensor
    num_gradient_evaluations: tf.Tensor
    step: tf.Tensor
    tuning: MicrocanonicalTuning
    seed: tf.Tensor


# ---------------------------------------------------------------------------------
# Vector helpers over lists of parts with a leading chain axis
# ---------------------------------------------------------------------------------


def _event_axes(x):
    return list(range(1, x.shape.rank))


def _dot(a, b):
    """Per-chain ``sum(a * b)`` over the parts, in the state dtype (the single-device
    kernels' reduction; :func:`dot64` is the mesh's)."""
    return sum(tf.reduce_sum(ai * bi, axis=_event_axes(ai)) for ai, bi in zip(a, b, strict=True))


def dot64(a, b):
    """Per-chain ``sum(a * b)`` over the parts as a float64 sum. On a DTensor mesh the
    sum over the sharded axis is a global one (DTensor inserts the all-reduce): the
    reduction of every field-sized dot product of the mesh path."""
    return sum(
        tf.reduce_sum(tf.cast(ai, tf.float64) * tf.cast(bi, tf.float64), axis=_event_axes(ai))
        for ai, bi in zip(a, b, strict=True)
    )


def _bcast(c, x):
    """A ``[chains]`` tensor reshaped to broadcast against part ``x``."""
    return tf.reshape(c, [-1] + [1] * (x.shape.rank - 1))


def _bcast_as(c, x):
    """:func:`_bcast` in ``x``'s dtype (a no-op cast under the state-dtype reduction)."""
    return _bcast(tf.cast(c, x.dtype), x)


def _normalize(v, dot=_dot):
    norm = tf.sqrt(dot(v, v))
    return [vi / _bcast_as(norm, vi) for vi in v]


def _dimension(parts) -> int:
    return sum(math.prod(p.shape[1:]) for p in parts)


def _unit_vector(like, seed):
    seeds = tfp.random.split_seed(seed, n=len(like))
    # TensorFlow's Threefry normal, not _normal: the velocity is normalised (a norm and
    # a divide both read the draw), and XLA then fused our Threefry rounds into each
    # reader, which made mams' transition slower (benchmarks/README.md)
    z = [
        tf.random.stateless_normal(tf.shape(x), seed=s, dtype=x.dtype, alg=_rng_alg())
        for x, s in zip(like, seeds, strict=True)
    ]
    return _normalize(z)


def _select(cond, new, old):
    """Per-chain ``where`` over lists of parts."""
    return [tf.where(_bcast(cond, n), n, o) for n, o in zip(new, old, strict=True)]


def _all_finite(parts):
    return tf.reduce_all(
        tf.stack([tf.reduce_all(tf.math.is_finite(p), axis=_event_axes(p)) for p in parts]), 0
    )


# ---------------------------------------------------------------------------------
# Isokinetic dynamics
# ---------------------------------------------------------------------------------


def velocity_update(u, g, tau, dim: int, dot=_dot):
    """ESH velocity update over time ``tau`` (``[]``) with gradient ``g``.

    Returns the new unit velocity and :math:`\\Delta K` per chain (see module docs).
    ``dot`` is the per-chain reduction (:func:`_dot` on one device, :func:`dot64` on a
    mesh); the scalars follow its dtype.
    """
    g_norm = tf.sqrt(dot(g, g))
    safe = tf.where(g_norm > 0, g_norm, tf.ones_like(g_norm))
    e = [gi / _bcast_as(safe, gi) for gi in g]
    c = dot(u, e)
    delta = tau * g_norm / tf.cast(dim - 1, g_norm.dtype)
    zeta = tf.exp(-delta)
    a = (1.0 - zeta) * (1.0 + zeta + c * (1.0 - zeta))
    raw = [
        _bcast_as(a, ei) * ei + _bcast_as(2.0 * zeta, ui) * ui for ei, ui in zip(e, u, strict=True)
    ]
    dk = (delta - math.log(2.0) + tf.math.log(1.0 + c + (1.0 - c) * zeta**2)) * (dim - 1)
    return _normalize(raw, dot), dk


def integrator_step(value_and_grad_fn, integrator: str, dim: int, dot=_dot):
    """One step of the chosen isokinetic integrator: ``(x, u, g, eps) -> (x, u, lp, g, dK)``
    over lists of parts (``eps`` in the reduction's dtype)."""
    b, a = INTEGRATORS[integrator]

    def step(x, u, g, eps):
        dk_total = 0.0
        lp = None
        for i, ai in enumerate(a):
            u, dk = velocity_update(u, g, b[i] * eps, dim, dot)
            dk_total = dk_total + dk
            x = [xi + tf.cast(ai * eps, xi.dtype) * ui for xi, ui in zip(x, u, strict=True)]
            lp, g = value_and_grad_fn(x)
        u, dk = velocity_update(u, g, b[-1] * eps, dim, dot)
        return x, u, lp, g, dk_total + dk

    return step


def partial_refresh(u, z, nu, dot=_dot):
    """MCLMC's velocity refresh :math:`(u + \\nu z)/|u + \\nu z|` (``z`` standard normal)."""
    return _normalize([ui + tf.cast(nu, ui.dtype) * zi for ui, zi in zip(u, z, strict=True)], dot)


def refresh_scale(eps, big_l, dim: int):
    """:math:`\\nu = \\sqrt{(e^{2 \\epsilon / L} - 1)/d}` of the partial refresh."""
    return tf.sqrt((tf.exp(2.0 * eps / big_l) - 1.0) / dim)


def _stage_bounds(num_adaptation_steps: int, fractions: Sequence[float]) -> list[int]:
    """Cumulative ends of the tuning stages (integers, last = num_adaptation_steps)."""
    ends, acc = [], 0.0
    for f in fractions[:-1]:
        acc += f
        ends.append(int(round(acc * num_adaptation_steps)))
    ends.append(num_adaptation_steps)
    return ends


def _autocorrelation_time(buffer, reduce=tf.reduce_mean):
    """Integrated autocorrelation time (in steps), ``reduce`` over the coordinates of ``buffer``.

    ``buffer``: ``[n, chains, K]``. Autocovariances by FFT per chain, combined over
    chains as Stan's rank-free ESS (:math:`\\rho_t = 1 - (W - \\bar\\gamma_t)/\\hat V`),
    summed over Geyer's initial positive sequence of pairs.
    """
    x = tf.cast(tf.transpose(buffer, [1, 2, 0]), tf.float64)  # chains, K, n
    n = x.shape[-1]
    chains = x.shape[0]
    x = x - tf.reduce_mean(x, axis=-1, keepdims=True)
    size = 2 ** int(math.ceil(math.log2(2 * n)))
    f = tf.signal.rfft(x, fft_length=[size])
    acov = tf.signal.irfft(f * tf.math.conj(f), fft_length=[size])[..., :n] / n
    mean_acov = tf.reduce_mean(acov, axis=0)  # K, n
    w = mean_acov[..., 0] * n / max(n - 1, 1)
    if chains > 1:
        means = tf.reduce_mean(tf.cast(tf.transpose(buffer, [1, 2, 0]), tf.float64), axis=-1)
        b_over_n = tf.math.reduce_variance(means, axis=0) * chains / (chains - 1)
    else:
        b_over_n = tf.zeros_like(w)
    var_plus = w * (n - 1) / n + b_over_n
    var_plus = tf.where(var_plus > 0, var_plus, tf.ones_like(var_plus))
    rho = 1.0 - (w[:, None] - mean_acov) / var_plus[:, None]
    m = n // 2
    pairs = rho[:, 0 : 2 * m : 2] + rho[:, 1 : 2 * m : 2]  # K, m
    keep = tf.math.cumprod(tf.cast(pairs > 0, tf.float64), axis=-1)
    tau = -1.0 + 2.0 * tf.reduce_sum(pairs * keep, axis=-1)
    return reduce(tf.maximum(tau, 1.0 / n))


def _subset(parts, k: int):
    """A strided subset of at most ``k`` coordinates per chain, ``[chains, k']``."""
    flat = tf.concat([tf.reshape(p, [tf.shape(p)[0], -1]) for p in parts], axis=1)
    dim = flat.shape[1]
    stride = max(1, dim // k)
    return flat[:, ::stride][:, :k]


class TunerFieldOps(NamedTuple):
    """The field-sized operations of the staged tuners; everything else in ``_tune`` is
    scalar. On one device they are the kernel's own (run inside the compiled chunk); the
    mesh path (:mod:`fieldhmc.samplers.sharded_mclmc`) gives compiled DTensor versions
    and runs the same ``_tune`` between its compiled steps.

    ``moments(tuning, x, weight) -> tuning``: step-size-weighted Welford update;
    ``total_variance(tuning) -> []``: :math:`\\sum_i \\mathrm{Var}[x_i]`;
    ``record(tuning, x, index) -> tuning``: row ``index`` (clipped) of the stage-3 buffer.
    """

    moments: Callable
    total_variance: Callable
    record: Callable


class _MicrocanonicalBase(tfp.mcmc.TransitionKernel):
    """Shared construction, bootstrap and tuning helpers."""

    _stages: tuple = ()
    _stops_on_convergence = False

    def __init__(
        self,
        target_log_prob_fn: Callable[..., tf.Tensor],
        step_size,
        trajectory_length,
        num_adaptation_steps: int = 0,
        integrator: str = "minimal_norm",
        desired_energy_var: float = 5e-4,
        target_accept_prob: float = 0.9,
        name: str | None = None,
        field_ops: TunerFieldOps | None = None,
        warmup_stop: str = "fixed",
        target_has_aux: bool = False,
    ):
        if warmup_stop not in WARMUP_STOPS:
            raise ValueError(f"warmup_stop must be one of {WARMUP_STOPS}, got {warmup_stop!r}")
        if warmup_stop == "converged" and not self._stops_on_convergence:
            raise ValueError(f"{type(self).__name__} tunes for a fixed count: warmup_stop='fixed'")
        if integrator not in INTEGRATORS:
            raise ValueError(f"integrator must be one of {tuple(INTEGRATORS)}, got {integrator!r}")
        if num_adaptation_steps < 0:
            raise ValueError(f"num_adaptation_steps must be >= 0, got {num_adaptation_steps}")
        self._parameters = dict(
            target_log_prob_fn=target_log_prob_fn,
            step_size=step_size,
            trajectory_length=trajectory_length,
            num_adaptation_steps=num_adaptation_steps,
            integrator=integrator,
            desired_energy_var=desired_energy_var,
            target_accept_prob=target_accept_prob,
            name=name,
            field_ops=field_ops,
            warmup_stop=warmup_stop,
            target_has_aux=target_has_aux,
        )
        self._field_ops = field_ops or TunerFieldOps(
            self._moments, self._total_variance, self._record
        )

    @property
    def parameters(self):
        return self._parameters

    @property
    def is_calibrated(self) -> bool:
        return False

    @property
    def target_log_prob_fn(self):
        return self._parameters["target_log_prob_fn"]

    @property
    def num_adaptation_steps(self) -> int:
        return self._parameters["num_adaptation_steps"]

    @property
    def integrator(self) -> str:
        return self._parameters["integrator"]

    @property
    def gradients_per_step(self) -> int:
        return len(INTEGRATORS[self.integrator][1])

    @property
    def stage_ends(self) -> list[int]:
        return _stage_bounds(self.num_adaptation_steps, self._stages)

    @property
    def stops_on_convergence(self) -> bool:
        """Each tuning stage ends once its estimate has converged (``warmup_stop``
        "converged"), its fixed-count length the bound; a warm-up with a stage shorter
        than 2 transitions runs the fixed schedule."""
        ends = self.stage_ends
        lengths = [b - a for a, b in zip([0, *ends[:-1]], ends, strict=True)]
        return self._parameters["warmup_stop"] == "converged" and min(lengths, default=0) >= 2

    def _value_and_grad(self, x):
        lp, g, _ = self._value_grad_aux(x)
        return lp, g

    def _value_grad_aux(self, x):
        """``(lp, gradients, aux)``: ``aux`` what a ``target_has_aux`` target returns
        beside the log density (made by the same evaluation), else None."""
        if not self._parameters["target_has_aux"]:
            lp, g = tfp.math.value_and_gradient(lambda *p: self.target_log_prob_fn(*p), x)
            return lp, list(g), None
        with tf.GradientTape(watch_accessed_variables=False) as tape:
            tape.watch(x)
            lp, aux = self.target_log_prob_fn(*x)
        g = tape.gradient(lp, x, unconnected_gradients=tf.UnconnectedGradients.ZERO)
        return lp, list(g), aux

    def _tapped_value_and_grad(self, taps: list):
        """``x -> (lp, gradients)`` that appends each evaluation's ``aux`` to ``taps``."""

        def value_and_grad(x):
            lp, g, aux = self._value_grad_aux(x)
            taps.append(aux)
            return lp, g

        return value_and_grad

    def _maybe_tune(self, r, x, statistic, finite, dim, lp_change=None):
        """:meth:`_tune` (its only caller) on warm-up transitions; after warm-up the step,
        L and the tuner's state stay as tuned and no tuner code runs. The conditional is
        a ``tf.while_loop`` of zero or one trips, not a ``tf.cond``: an XLA conditional
        copies the loop-carried moments and stage-3 buffer it passes through (twice per
        transition, on every post-warm-up transition of a driver program that runs
        warm-up and sampling, ``separate_sampling_program`` False), while a loop updates
        its state in place."""
        if self.num_adaptation_steps == 0:
            return r.step_size, r.trajectory_length, r.tuning
        warm = r.step < self.num_adaptation_steps
        if self.stops_on_convergence:  # done before the count: held from then on
            warm = warm & (r.tuning.stage < len(self._stages))
        trips = tf.cast(warm, tf.int32)
        extra = () if lp_change is None else (lp_change,)

        def tune(j, eps, big_l, tuning):
            # the state through pinned_to: nothing computed from it is hoisted out of
            # the loop to run after warm-up too
            xs, stat, more, grads = pinned_to(j, (x, statistic, extra, r.grads_target_log_prob))
            now = r._replace(
                step_size=eps, trajectory_length=big_l, tuning=tuning, grads_target_log_prob=grads
            )
            return (j + 1, *self._tune(now, xs, stat, finite, dim, *more))

        _, eps, big_l, tuning = tf.while_loop(
            lambda j, *_: j < trips,
            tune,
            (tf.constant(0), r.step_size, r.trajectory_length, r.tuning),
            maximum_iterations=1,
        )
        return eps, big_l, tuning

    def bootstrap_results(self, init_state) -> MicrocanonicalResults:
        x = [tf.convert_to_tensor(p) for p in tf.nest.flatten(init_state)]
        dtype = x[0].dtype
        lp, g = self._value_and_grad(x)
        chains = tf.shape(lp)[0]
        dim = _dimension(x)
        u = _unit_vector(x, tf.constant([0, 0], tf.int32))
        zero = tf.zeros([], dtype)
        eps = _as_dtype(self._parameters["step_size"], dtype)
        k = min(dim, _ESS_COORDINATES)
        n3 = self._buffer_steps()
        tuning = MicrocanonicalTuning(
            time=zero,
            x_average=zero,
            step_size_max=tf.constant(float("inf"), dtype),
            log_step_size=tf.math.log(eps),
            log_step_size_avg=zero,
            da_step=tf.ones([], dtype),
            avg_error=zero,
            mu=tf.math.log(10.0 * eps),
            weight=zero,
            mean=[tf.zeros_like(p) for p in x],
            m2=[tf.zeros_like(p) for p in x],
            buffer=tf.zeros([max(n3, 1), chains, len(range(0, dim, max(1, dim // k))[:k])], dtype),
            stage=tf.zeros([], tf.int32),
            stage_start=tf.zeros([], tf.int32),
            passes=tf.zeros([], tf.int32),
            reference=tf.math.log(eps),
            window_sum=zero,
            accept_sum=zero,
            lp_drift=tf.zeros([chains], tf.float64),
            lp_sum=tf.zeros([chains], tf.float64),
            lp_sq=tf.zeros([chains], tf.float64),
        )
        return MicrocanonicalResults(
            target_log_prob=lp,
            grads_target_log_prob=g,
            velocity=u,
            step_size=eps,
            trajectory_length=_as_dtype(self._parameters["trajectory_length"], dtype),
            energy_change=tf.zeros_like(lp),
            log_accept_ratio=tf.zeros_like(lp),
            is_accepted=tf.ones([chains], tf.bool),
            is_divergent=tf.zeros([chains], tf.bool),
            num_integration_steps=tf.zeros([], tf.int32),
            num_gradient_evaluations=tf.zeros([], tf.int32),
            step=tf.zeros([], tf.int32),
            tuning=tuning,
            seed=tf.zeros([2], tf.int32),
        )

    def _buffer_steps(self) -> int:
        raise NotImplementedError

    # -- tuning helpers ------------------------------------------------------------
    @staticmethod
    def _moments(tuning, x, weight):
        """Step-size-weighted Welford update of per-chain moments (``weight`` scalar).

        Skipped at weight 0 (outside the moment stage, and after warm-up), where it is an
        identity: by a ``tf.while_loop`` of zero or one trips, not a ``tf.cond`` -- XLA
        copies loop-carried buffers through a conditional, while a loop updates its
        state in place. Unconditional, it read and wrote the moments on every transition
        (~5% of an mclmc transition at 64³, ``benchmarks/README.md``)."""
        total = tuning.weight + weight
        one = tf.ones_like(total)
        frac = tf.where(total > 0, weight / tf.where(total > 0, total, one), 0.0 * one)

        def update(j, mean, m2):
            new_means, new_m2 = [], []
            for xi, mi, si in zip(x, mean, m2, strict=True):
                d = xi - mi
                new_mean = mi + frac * d
                new_means.append(new_mean)
                new_m2.append(si + weight * d * (xi - new_mean))
            return j + 1, new_means, new_m2

        trips = tf.cast(weight > 0, tf.int32)
        _, mean, m2 = tf.while_loop(
            lambda j, *_: j < trips,
            update,
            (tf.constant(0), list(tuning.mean), list(tuning.m2)),
            maximum_iterations=1,
        )
        return tuning._replace(weight=total, mean=mean, m2=m2)

    @staticmethod
    def _total_variance(tuning):
        """:math:`\\sum_i \\mathrm{Var}[x_i]` pooled over chains (within + between)."""
        w = tf.where(tuning.weight > 0, tuning.weight, tf.ones_like(tuning.weight))
        total = 0.0
        for mi, si in zip(tuning.mean, tuning.m2, strict=True):
            within = tf.reduce_mean(si, axis=0) / w
            between = tf.math.reduce_variance(mi, axis=0)
            total = total + tf.reduce_sum(within + between)
        return total

    @staticmethod
    def _record(tuning, x, index):
        return write_buffer_row(tuning, _subset(x, tuning.buffer.shape[-1]), index)


def write_buffer_row(tuning: MicrocanonicalTuning, row, index) -> MicrocanonicalTuning:
    """Row ``index`` (clipped to the buffer) of stage 3's buffer set to ``row`` ``[chains, K]``."""
    row = tf.cast(row, tuning.buffer.dtype)
    n = tuning.buffer.shape[0]
    index = tf.clip_by_value(index, 0, n - 1)
    buffer = tf.tensor_scatter_nd_update(tuning.buffer, [[index]], row[None])
    return tuning._replace(buffer=buffer)


class MicrocanonicalLangevin(_MicrocanonicalBase):
    """Unadjusted microcanonical Langevin Monte Carlo (MCLMC), self-tuning.

    Parameters
    ----------
    target_log_prob_fn : callable
        ``(*parts) -> [chains]`` log density (whitened; the state dtype).
    step_size, trajectory_length : float or Tensor
        Initial :math:`\\epsilon` and :math:`L` (BlackJAX units); the values used
        throughout when ``num_adaptation_steps == 0``.
    num_adaptation_steps : int
        Tuning transitions (stages ``MCLMC_STAGES``), then both freeze.
    integrator : {"minimal_norm", "leapfrog"}
    desired_energy_var : float
        Target energy-error variance per dimension :math:`\\mathrm{Var}[\\Delta E]/d`,
        the bias tolerance of [4] (BlackJAX's default 5e-4).
    """

    _stages = MCLMC_STAGES

    def _buffer_steps(self) -> int:
        ends = self.stage_ends
        return ends[2] - ends[1]

    def one_step(self, current_state, previous_kernel_results, seed=None):
        state, results, _ = self.one_step_with_aux(current_state, previous_kernel_results, seed)
        return state, results

    def one_step_with_aux(self, current_state, previous_kernel_results, seed=None):
        """:meth:`one_step`, and the target's ``aux`` (``target_has_aux``; else None) at
        the integrator's end point: the new state where ``is_accepted``, not where the
        step was undone (there the state is the previous one). The driver reads the field
        a transition stores from it instead of transforming the state again."""
        r = previous_kernel_results
        seed = tfp.random.sanitize_seed(seed)
        refresh_seed, nan_seed = tfp.random.split_seed(seed)
        x0 = [tf.convert_to_tensor(p) for p in tf.nest.flatten(current_state)]
        dim = _dimension(x0)
        dtype = x0[0].dtype
        eps, big_l = r.step_size, r.trajectory_length
        taps = []  # the aux of each evaluation, traced in this graph: the last is the end's
        step = integrator_step(self._tapped_value_and_grad(taps), self.integrator, dim)
        x, u, lp, g, dk = step(x0, r.velocity, r.grads_target_log_prob, eps)
        # Partial refresh: nu = sqrt((exp(2 eps / L) - 1) / d).
        nu = refresh_scale(eps, big_l, dim)
        zs = tfp.random.split_seed(refresh_seed, n=len(x))
        z = [_normal(tf.shape(xi), s, dtype) for xi, s in zip(x, zs, strict=True)]
        u = partial_refresh(u, z, nu)
        energy_change = dk - lp + r.target_log_prob
        finite = _all_finite(x) & tf.math.is_finite(lp) & tf.math.is_finite(energy_change)
        if self.num_adaptation_steps > 0:
            # During warm-up a divergent step (|dE| > MAX_ENERGY_ERROR) is undone as a
            # non-finite one is (and caps the step): unadjusted, the kernel would keep a
            # state thrown far out (a stiff sampled parameter's), which the smaller steps
            # that follow take long to bring back. After warm-up nothing changes.
            warm = r.step < self.num_adaptation_steps
            finite = finite & ~(warm & (tf.abs(energy_change) > MAX_ENERGY_ERROR))
        x = _select(finite, x, x0)
        g = _select(finite, g, r.grads_target_log_prob)
        # A fresh velocity only where the step failed: under a tf.cond, so the common
        # all-finite transition does not draw a second full-size normal (as costly as
        # a gradient at 64³); the same draw as before when it is needed.
        u = tf.cond(
            tf.reduce_all(finite),
            lambda: u,
            lambda: _select(finite, u, _unit_vector(x0, nan_seed)),
        )
        lp = tf.where(finite, lp, r.target_log_prob)
        energy_change = tf.where(finite, energy_change, tf.zeros_like(energy_change))
        # the tuner reads the new state's gradients (its scalar parts: _stiff_scalar_limit)
        eps_new, l_new, tuning = self._maybe_tune(
            r._replace(grads_target_log_prob=g), x, energy_change, finite, dim
        )
        results = MicrocanonicalResults(
            target_log_prob=lp,
            grads_target_log_prob=g,
            velocity=u,
            step_size=eps_new,
            trajectory_length=l_new,
            energy_change=energy_change,
            log_accept_ratio=tf.where(
                finite, -energy_change, tf.fill(tf.shape(lp), tf.constant(-float("inf"), dtype))
            ),
            is_accepted=finite,
            is_divergent=~finite | (energy_change > MAX_ENERGY_ERROR),
            num_integration_steps=tf.ones([], tf.int32),
            num_gradient_evaluations=tf.constant(self.gradients_per_step, tf.int32),
            step=r.step + 1,
            tuning=tuning,
            seed=seed,
        )
        return tf.nest.pack_sequence_as(current_state, x), results, taps[-1]

    def _tune(self, r, x, energy_change, finite, dim):
        t = r.step
        eps, big_l, tuning = r.step_size, r.trajectory_length, r.tuning
        dtype = eps.dtype
        end1, end2, end3 = self.stage_ends
        all_finite = tf.reduce_all(finite)
        # Stages 1-2: the energy-variance predictor (pooled over chains).
        xi = tf.reduce_mean(tf.square(energy_change)) / (
            dim * self._parameters["desired_energy_var"]
        ) + tf.constant(1e-8, dtype)
        weight = tf.exp(-0.5 * tf.square(tf.math.log(xi) / (6.0 * _TRUST)))
        x_average = _DECAY * tuning.x_average + weight * (xi / eps**6)
        time = _DECAY * tuning.time + weight
        step_size_max = tf.where(all_finite, tuning.step_size_max, 0.8 * eps)
        predicted = tf.where(
            time > 0, (x_average / tf.where(time > 0, time, 1.0 + 0.0 * time)) ** (-1.0 / 6.0), eps
        )
        predicted = tf.minimum(predicted, step_size_max)
        predicting = t < end2
        tuning = tuning._replace(
            time=tf.where(predicting, time, tuning.time),
            x_average=tf.where(predicting, x_average, tuning.x_average),
            step_size_max=tf.where(predicting, step_size_max, tuning.step_size_max),
        )
        eps_new = tf.where(predicting, predicted, eps)
        # Stage 2: moments -> L = sqrt(sum Var[x_i]).
        in2 = (t >= end1) & (t < end2)
        w = tf.where(in2 & all_finite, eps, tf.zeros([], dtype))
        tuning = self._field_ops.moments(tuning, x, w)
        if end2 - end1 > 1:
            # a field-sized reduction: only on the transition that uses it
            big_l = tf.cond(
                t == end2 - 1,
                lambda: tf.sqrt(self._field_ops.total_variance(tuning)),
                lambda: big_l,
            )
        # Stage 3: autocorrelation of a coordinate subset -> L = 0.4 eps tau.
        if end3 - end2 >= 2:
            tuning = self._field_ops.record(tuning, x, t - end2)
            # The buffer's steps had the sizes of stage 3's windows: their mean converts
            # the autocorrelation time in steps to a distance.
            in3 = (t >= end2) & (t < end3)
            eps_sum = tf.where(t == end2, tf.zeros([], dtype), tuning.log_step_size_avg) + eps
            tuning = _replace_if(in3, tuning, log_step_size_avg=eps_sum)
            # The slowest recorded coordinate's time, not the mean (BlackJAX's): the
            # figure of merit is the minimum ESS. At most _MAX_L_GROWTH x the moment
            # stage's L (one slow or still drifting coordinate of the subset).
            big_l = tf.cond(
                t == end3 - 1,
                lambda: tf.minimum(
                    tf.cast(
                        0.4
                        * tf.cast(eps_sum / float(end3 - end2), tf.float64)
                        * _autocorrelation_time(tuning.buffer, tf.reduce_max),
                        dtype,
                    ),
                    _MAX_L_GROWTH * big_l,
                ),
                lambda: big_l,
            )
            eps_new, tuning = self._meet_tolerance(t, eps_new, energy_change, finite, dim, tuning)
            eps_new, tuning = self._stiff_scalar_limit(r, x, t, eps_new, dim, tuning)
        return eps_new, big_l, tuning

    def _stiff_scalar_limit(self, r, x, t, eps, dim, tuning):
        r"""Stage 3: the step at the end of warm-up at most ``_STIFF_MARGIN`` times the
        integrator's stability limit over the scalar parts' narrowest conditional width.

        A scalar part (a sampled hyperparameter, ``[chains]``) adds ~1/d of the energy
        error, so Var[dE]/d does not see it go unstable. Per coordinate MCLMC moves like
        HMC with step :math:`h = \epsilon/\sqrt d`; a second-order integrator is stable
        on a harmonic direction of width :math:`\sigma` for :math:`h/\sigma` below its
        limit (``_STABILITY_LIMIT``), and the conditional width of part :math:`j` is
        :math:`1/\sqrt{E[g_j^2]}` (the Fisher identity, exact for a Gaussian; the
        precision's largest eigenvalue is at least this diagonal entry, so the cap is a
        necessary condition). On the 8³ non-centred model with log A and
        n under the prior metric (``benchmarks/README.md``) the tolerance took
        :math:`h` to 2.7x log A's stage-3 width, and with a long L the chains made
        excursions in log A with Var[dE]/d ~1000x the tolerance; at 2.0x there were none.
        :math:`E[g_j^2]` is averaged over stage 3 (the largest part's per transition,
        pooled over chains) in ``x_average``, which the step predictor of stages 1-2 no
        longer reads. Smaller steps only lower the energy error, so the cap applied after
        the last tolerance window needs no window of its own.
        """
        end2, end3 = self.stage_ends[1], self.stage_ends[2]
        scalars = [i for i, p in enumerate(x) if p.shape.rank == 1]
        if not scalars:
            return eps, tuning
        dtype = eps.dtype
        g2 = tf.reduce_max(
            tf.stack(
                [
                    tf.reduce_mean(tf.square(tf.cast(r.grads_target_log_prob[i], dtype)))
                    for i in scalars
                ]
            )
        )
        in3 = (t >= end2) & (t < end3)
        total = tf.where(t == end2, tf.zeros([], dtype), tuning.x_average) + g2
        tuning = _replace_if(in3, tuning, x_average=total)
        limit = _STIFF_MARGIN * _STABILITY_LIMIT[self.integrator]
        width = tf.sqrt(float(end3 - end2) / tf.maximum(total, tf.constant(1e-30, dtype)))
        capped = tf.minimum(eps, tf.constant(limit * math.sqrt(dim), dtype) * width)
        return tf.where(t == end3 - 1, capped, eps), tuning

    def _meet_tolerance(self, t, eps, energy_change, finite, dim, tuning):
        r"""Stage 3: the step re-set from Var[dE]/d measured at stationarity.

        The predictor of stages 1-2 averages over the chains' way in from the start
        (its memory, 150 steps, is most of a short warm-up), so its step can be far off
        the bias tolerance either way: too large where the posterior's scale changes
        along the chain (hierarchical and lognormal-Poisson targets under the prior
        metric), and several times too small on a plain field posterior (Var[dE]/d
        well below ``desired_energy_var``; the same in BlackJAX). Stage 3 measures
        Var[dE]/d, pooled over chains, in ``_TOLERANCE_WINDOWS`` windows (a non-finite
        step counts as :math:`\Delta E = ` ``MAX_ENERGY_ERROR``) and after each sets
        :math:`\epsilon \leftarrow \epsilon\,(\mathrm{desired}/\mathrm{measured})^{1/6}`
        (the :math:`\epsilon^6` law of the predictor), the factor clipped to
        ``[1/_MAX_STEP_CHANGE, _MAX_STEP_CHANGE]`` per window and the step to
        ``step_size_max``; after the last window the step grows by at most
        ``_OVER^(1/6)``. A window above ``_OVER`` times the tolerance sets the step to
        its law value (unclipped) and lowers ``step_size_max`` for the rest of warm-up
        to the window's step, or to the law value if a transition of the window
        diverged; if the window's step is above that of an earlier window within the
        tolerance (no divergence) and its law value below it, the step and the cap
        are that earlier step. Uses the MAMS-only ``avg_error`` (sum), ``da_step``
        (count), ``mu`` (1 if the window has diverged so far, else 0) and
        ``log_step_size`` (the largest step measured within the tolerance, 0 if none)
        of the tuning state.
        """
        end2, end3 = self.stage_ends[1], self.stage_ends[2]
        dtype = eps.dtype
        window = max(1, math.ceil((end3 - end2) / _TOLERANCE_WINDOWS))
        in3 = (t >= end2) & (t < end3)
        error = tf.where(finite, energy_change, tf.constant(MAX_ENERGY_ERROR, dtype))
        value = tf.reduce_mean(tf.square(error)) / dim
        restart = t == end2
        total = tf.where(restart, tf.zeros_like(tuning.avg_error), tuning.avg_error) + value
        count = tf.where(restart, tf.zeros_like(tuning.da_step), tuning.da_step) + 1.0
        done = in3 & (((t - end2 + 1) % window == 0) | (t == end3 - 1))
        measured = total / count
        desired = _as_dtype(self._parameters["desired_energy_var"], dtype)
        # the eps^6 law's factor to the step that meets the tolerance
        law = (desired / tf.maximum(measured, tf.constant(1e-30, dtype))) ** (1.0 / 6.0)
        factor = tf.clip_by_value(law, 1.0 / _MAX_STEP_CHANGE, _MAX_STEP_CHANGE)
        # The last window's step grows by at most _OVER^(1/6) (by the law, at most _OVER x
        # the variance it measured): a larger step would go unmeasured, and near the
        # integrator's stability limit the eps^6 law breaks down. Not only downwards: a
        # window after a step increase measures a transient above the stationary value.
        factor = tf.where(
            t == end3 - 1, tf.minimum(factor, tf.constant(_OVER ** (1.0 / 6.0), dtype)), factor
        )
        # A window clearly above the tolerance takes the step to its eps^6-law value at
        # once (no clip), and no later window of warm-up may return above the step it
        # measured. A window with a divergent transition (|dE| > MAX_ENERGY_ERROR or
        # non-finite) caps the step at its law value instead: where the posterior's
        # scale moves along the chain (sampled hyperparameters under the prior metric)
        # a short window can miss the large errors of a step that already diverged once.
        # Without divergences the law value is no cap: the window after a large step
        # change measures a transient (the chains relax to the new step's stationary
        # state over ~15-20 transitions, the excess growing with d), and its law value
        # would pin the step far below the tolerance for good (benchmarks/README.md).
        over = done & (measured > _OVER * desired)
        diverging = tf.reduce_any(~finite | (tf.abs(energy_change) > MAX_ENERGY_ERROR))
        diverged = tf.maximum(
            tf.where(restart, tf.zeros([], dtype), tuning.mu), tf.cast(diverging, dtype)
        )  # 1 if a transition of the window so far diverged, else 0
        # The largest step a window of this stage measured within _OVER x the tolerance
        # and without a divergence (0: none yet).
        good = tf.where(restart, tf.zeros([], dtype), tuning.log_step_size)
        # A window over the tolerance at a larger step than one a window measured good,
        # whose law value lands below that good step: the eps^6 law broke down between
        # the two steps (a stability cliff: galaxy model at 16³, Var[dE]/d 3e-8 at one
        # step, ~10 with a |dE| > 1000 at 4x it, law value 0.8x the good step). The good
        # step, which was measured, is kept and caps the rest of warm-up. Not a step
        # between the two: one passed its window on that model and then read Var[dE]/d
        # 56x the tolerance after warm-up (a window misses rare large errors). Only over
        # a step increase (eps > good): below the good step an over window means the
        # good window's estimate was low (8³: windows of 15 transitions).
        broken = (good > 0) & (eps > good) & (eps * law < good)
        over_step = tf.where(broken, good, eps * law)
        ceiling = tf.where(broken | (diverged > 0), over_step, eps)
        cap = tf.where(over, tf.minimum(tuning.step_size_max, ceiling), tuning.step_size_max)
        within = done & ~over & (diverged == 0)
        good = tf.where(within, tf.maximum(good, eps), good)
        eps = tf.where(done, tf.minimum(tf.where(over, over_step, eps * factor), cap), eps)
        tuning = _replace_if(
            in3,
            tuning,
            avg_error=tf.where(done, tf.zeros([], dtype), total),
            da_step=tf.where(done, tf.zeros([], dtype), count),
            mu=tf.where(done, tf.zeros([], dtype), diverged),
            log_step_size=good,
            step_size_max=cap,
        )
        return eps, tuning


class MetropolisAdjustedMicrocanonical(_MicrocanonicalBase):
    """Metropolis-adjusted microcanonical sampler (MAMS), self-tuning, exact.

    Parameters as `MicrocanonicalLangevin`, plus ``target_accept_prob`` (dual
    averaging target, default 0.9 as [5]); ``desired_energy_var`` is unused.
    """

    _stages = MAMS_STAGES
    _stops_on_convergence = True

    def _buffer_steps(self) -> int:
        ends = self.stage_ends
        return ends[2] - ends[1]

    def one_step(self, current_state, previous_kernel_results, seed=None):
        state, results, _ = self.one_step_with_aux(current_state, previous_kernel_results, seed)
        return state, results

    def one_step_with_aux(self, current_state, previous_kernel_results, seed=None):
        """:meth:`one_step`, and the target's ``aux`` (``target_has_aux``; else None) at
        the proposal: the new state where ``is_accepted``. With ``target_has_aux`` the
        trajectory's last integrator step runs in a loop of its own that also carries
        the ``aux`` out (``num_steps >= 1``). A loop, not the step traced here: a loop
        body is compiled on its own, so the proposal rounds the same whatever the
        program around it (the one-program and post-warm-up chunks draw the same to the
        bit; traced here, the energy error differed in the last bits)."""
        r = previous_kernel_results
        seed = tfp.random.sanitize_seed(seed)
        velocity_seed, length_seed, accept_seed = tfp.random.split_seed(seed, n=3)
        x0 = [tf.convert_to_tensor(p) for p in tf.nest.flatten(current_state)]
        dim = _dimension(x0)
        dtype = x0[0].dtype
        eps, big_l = r.step_size, r.trajectory_length
        num_steps = _num_integration_steps(big_l / eps, length_seed)
        u0 = _unit_vector(x0, velocity_seed)
        step = integrator_step(self._value_and_grad, self.integrator, dim)
        with_aux = self._parameters["target_has_aux"]

        def body(i, x, u, lp, g, dk):
            x, u, lp, g, d = step(x, u, g, eps)
            return i + 1, x, u, lp, g, dk + d

        _, x, u, lp, g, dk = tf.while_loop(
            lambda i, *_: i < num_steps - int(with_aux),
            body,
            (
                tf.constant(0),
                x0,
                u0,
                r.target_log_prob,
                list(r.grads_target_log_prob),
                tf.zeros_like(r.target_log_prob),
            ),
        )
        aux = None
        if with_aux:  # the last step, in a loop of one trip that carries its aux out
            taps = []
            last = integrator_step(self._tapped_value_and_grad(taps), self.integrator, dim)

            def last_body(i, x, u, lp, g, dk, _):
                x, u, lp, g, d = last(x, u, g, eps)
                return i + 1, x, u, lp, g, dk + d, taps[-1]

            # (its shape only: the probe's evaluation is not used, and compiled away)
            probe = self._value_grad_aux(x)[2]
            _, x, u, lp, g, dk, aux = tf.while_loop(
                lambda i, *_: i < tf.minimum(num_steps, 1),
                last_body,
                (tf.constant(0), x, u, lp, g, dk, tf.zeros_like(probe)),
                maximum_iterations=1,
            )
        energy_change = dk - lp + r.target_log_prob
        finite = _all_finite(x) & tf.math.is_finite(lp) & tf.math.is_finite(energy_change)
        log_accept = tf.where(
            finite, -energy_change, tf.fill(tf.shape(lp), tf.constant(-float("inf"), dtype))
        )
        uniform = tf.random.stateless_uniform(
            tf.shape(lp), accept_seed, dtype=dtype, alg=_rng_alg()
        )
        accepted = tf.math.log(uniform) < log_accept
        x = _select(accepted, x, x0)
        g = _select(accepted, g, r.grads_target_log_prob)
        u = _select(accepted, u, u0)
        lp = tf.where(accepted, lp, r.target_log_prob)
        accept_prob = tf.exp(tf.minimum(log_accept, 0.0))
        # the change of each chain's log density: the tuner's stationarity check (the
        # driver re-centres the carried log densities between chunks; a change is free
        # of that shift)
        lp_change = lp - r.target_log_prob
        eps_new, l_new, tuning = self._maybe_tune(r, x, accept_prob, finite, dim, lp_change)
        results = MicrocanonicalResults(
            target_log_prob=lp,
            grads_target_log_prob=g,
            velocity=u,
            step_size=eps_new,
            trajectory_length=l_new,
            energy_change=tf.where(finite, energy_change, tf.zeros_like(energy_change)),
            log_accept_ratio=log_accept,
            is_accepted=accepted,
            is_divergent=~finite | (energy_change > MAX_ENERGY_ERROR),
            num_integration_steps=num_steps,
            num_gradient_evaluations=num_steps * self.gradients_per_step,
            step=r.step + 1,
            tuning=tuning,
            seed=seed,
        )
        return tf.nest.pack_sequence_as(current_state, x), results, aux

    def _tune(self, r, x, accept_prob, finite, dim, lp_change=None):
        t = r.step
        eps, big_l, tuning = r.step_size, r.trajectory_length, r.tuning
        dtype = eps.dtype
        end1, end2, end3, end4 = self.stage_ends
        converging = self.stops_on_convergence
        if converging:  # stages by the tuner's own state (module docs: the convergence stop)
            stage, since = tuning.stage, t - tuning.stage_start
            in1, in2, in3, in4 = (stage == k for k in range(4))
            checked = (since + 1) % _CHECK_WINDOW == 0
            # the stationarity check: on every check, and where stage 2 reaches its count
            end_of_2 = in2 & (since == end2 - end1 - 1)
            stationary, lp_window = self._stationarity(
                tuning,
                lp_change,
                checked | end_of_2,
                tf.cast(since % _CHECK_WINDOW + 1, tf.float64),
            )
        target = _as_dtype(self._parameters["target_accept_prob"], dtype)
        # Dual averaging (Hoffman & Gelman 2014; BlackJAX t0=10, gamma=0.05, kappa=0.75).
        da_t = tuning.da_step
        acc = tf.reduce_mean(tf.where(finite, accept_prob, tf.zeros_like(accept_prob)))
        avg_error = (1.0 - 1.0 / (da_t + 10.0)) * tuning.avg_error + (target - acc) / (da_t + 10.0)
        log_eps = tuning.mu - tf.sqrt(da_t) / 0.05 * avg_error
        # Never more than L / 1.1 per step (BlackJAX's clamp).
        log_eps = tf.minimum(log_eps, tf.math.log(big_l / 1.1))
        eta = da_t ** (-0.75)
        log_eps_avg = eta * log_eps + (1.0 - eta) * tuning.log_step_size_avg
        if converging:
            adapting = in1 | in4
        else:
            adapting = (t < end1) | ((t >= end3) & (t < end4))
        tuning = _replace_if(
            adapting,
            tuning,
            log_step_size=log_eps,
            log_step_size_avg=log_eps_avg,
            da_step=da_t + 1.0,
            avg_error=avg_error,
        )
        eps_new = tf.where(adapting, tf.exp(log_eps), eps)
        # Stage 1: L follows the step size (fixed number of integration steps).
        l_new = tf.where(in1 if converging else t < end1, big_l * eps_new / eps, big_l)
        # End of stages 1 and 4: the averaged step size.
        final = tf.exp(tuning.log_step_size_avg)
        if converging:
            # Stages 1 and 4 converge when a window's mean log step (of the iterates) is
            # within _STEP_CHANGE of the previous window's and its acceptance within
            # _ACCEPT_ERROR of the target. The step handed on is the dual average, as
            # at the fixed count: the convergence check decides when, not what.
            window_sum = tf.where(adapting, tuning.window_sum + log_eps, tuning.window_sum)
            accept_sum = tf.where(adapting, tuning.accept_sum + acc, tuning.accept_sum)
            check_da = adapting & checked
            window_mean = window_sum / _CHECK_WINDOW
            steady = (
                (tf.abs(window_mean - tuning.reference) < _STEP_CHANGE)
                & (tf.abs(accept_sum / _CHECK_WINDOW - target) < _ACCEPT_ERROR)
                & stationary
            )
            passes = tf.where(check_da, tf.where(steady, tuning.passes + 1, 0), tuning.passes)
            reference = tf.where(check_da, window_mean, tuning.reference)
            window_sum = tf.where(check_da, tf.zeros_like(window_sum), window_sum)
            accept_sum = tf.where(check_da, tf.zeros_like(accept_sum), accept_sum)
            done_da = check_da & (passes >= _PASSES_STEP)
            last1 = in1 & ((since == end1 - 1) | done_da)
            last4 = in4 & ((since == end4 - end3 - 1) | done_da)
        else:
            last1, last4 = t == end1 - 1, t == end4 - 1
        eps_new = tf.where(last1 | last4, final, eps_new)
        l_new = tf.where(last1, l_new * final / tf.exp(log_eps), l_new)
        # Stage 2: moments -> L.
        if not converging:
            in2 = (t >= end1) & (t < end2)
        w = tf.where(in2 & tf.reduce_all(finite), eps, tf.zeros([], dtype))
        if converging:  # the moments restart where the chains were found still drifting,
            # except on stage 2's last transition (it would leave one draw to estimate from)
            restart = in2 & checked & ~stationary & ~end_of_2
            keep = tf.where(restart, tf.zeros([], dtype), tf.ones([], dtype))
            tuning = tuning._replace(weight=tuning.weight * keep, m2=[m * keep for m in tuning.m2])
        tuning = self._field_ops.moments(tuning, x, w)
        at2 = tf.zeros([], tf.bool)
        if end2 - end1 > 1:
            if converging:
                # Converged when the relative Monte Carlo error of sum_i Var[x_i], from
                # the spread of the chains' own estimates, is below _VARIANCE_ERROR at
                # _PASSES consecutive checks. Field-sized: only on a check.
                check2 = (in2 & checked) | end_of_2
                total, error = tf.cond(
                    check2,
                    lambda: self._variance_and_error(tuning),
                    lambda: (tf.ones([], dtype), tf.constant(float("inf"), dtype)),
                )
                passes = tf.where(
                    in2 & checked,
                    tf.where((error < _VARIANCE_ERROR) & stationary, passes + 1, 0),
                    passes,
                )
                at2 = end_of_2 | (in2 & (passes >= _PASSES))
                # From stationary chains the moments are L's estimate; otherwise
                # BlackJAX's cap (at most 2x the stage-1 L, which follows a step tuned
                # while the chains drifted).
                change = 1.3 * tf.sqrt(total) / l_new
                change = tf.where(stationary, change, tf.clip_by_value(change, 0.0, 2.0))
            else:
                at2 = t == end2 - 1
                # a field-sized reduction: only on the transition that uses it
                change = tf.cond(
                    at2,
                    lambda: tf.clip_by_value(
                        1.3 * tf.sqrt(self._field_ops.total_variance(tuning)) / l_new, 0.0, 2.0
                    ),
                    lambda: tf.ones_like(l_new),
                )
            l_new = tf.where(at2, l_new * change, l_new)
            # The dual-averaged step is kept (BlackJAX scales it with L, which at the
            # initial L / eps = 10 left stage 3 at a quarter of the accepted step).
            eps_new = tf.where(at2, tf.minimum(eps_new, l_new / 1.1), eps_new)
        # Stage 3: autocorrelation of the slowest recorded coordinate -> L, never below
        # the moment-stage L.
        last3 = tf.zeros([], tf.bool)
        if end3 - end2 >= 2:
            if converging:  # the buffer's row; before the stage row 0, after it the last
                row = tf.where(in3, since, tf.where(stage < 2, 0, end3 - end2 - 1))
                last3 = in3 & (since == end3 - end2 - 1)
            else:
                row, last3 = t - end2, t == end3 - 1
            tuning = self._field_ops.record(tuning, x, row)
            l_new = tf.cond(
                last3,
                lambda: tf.clip_by_value(
                    tf.cast(
                        0.5
                        * tf.cast(l_new, tf.float64)
                        * _autocorrelation_time(tuning.buffer, tf.reduce_max),
                        dtype,
                    ),
                    l_new,
                    2.0 * l_new,
                ),
                lambda: l_new,
            )
        # Restart dual averaging for stage 4 from the current step size.
        restart = last3 if converging else t == end3 - 1
        tuning = _replace_if(
            restart,
            tuning,
            log_step_size=tf.math.log(eps_new),
            log_step_size_avg=tf.zeros([], dtype),
            da_step=tf.ones([], dtype),
            avg_error=tf.zeros([], dtype),
            mu=tf.math.log(10.0 * eps_new),
        )
        if converging:  # the next stage starts on the next transition
            ended = last1 | at2 | last3 | last4
            tuning = tuning._replace(
                stage=stage + tf.cast(ended, tf.int32),
                stage_start=tf.where(ended, t + 1, tuning.stage_start),
                passes=tf.where(ended, 0, passes),
                reference=tf.where(ended, tf.math.log(eps_new), reference),
                window_sum=tf.where(ended, tf.zeros_like(window_sum), window_sum),
                accept_sum=tf.where(ended, tf.zeros_like(accept_sum), accept_sum),
                **{
                    name: tf.where(ended, tf.zeros_like(v), v)
                    for name, v in zip(("lp_drift", "lp_sum", "lp_sq"), lp_window, strict=True)
                },
            )
        return eps_new, l_new, tuning

    @staticmethod
    def _stationarity(tuning, lp_change, checked, n):
        r"""``(stationary, (lp_drift, lp_sum, lp_sq))``: whether the chains' log density
        has stopped drifting, decided on a check (False between checks) over the window's
        ``n`` transitions, and the window's accumulators after this transition (zeroed on
        a check, which ends the window).

        Each chain's change of log density since the window began, :math:`y_t`, is free
        of the driver's re-centring of log densities between chunks. Stationary when the
        chains' mean drift over the window, :math:`|\bar y_n|`, is at most ``_DRIFT`` (2)
        times the pooled standard deviation of :math:`y_t` within the window. A chain
        still travelling in from its start climbs steadily (a ramp's drift is
        :math:`\sqrt{12}` of its spread); at stationarity the mean drift of 4 chains is
        a fraction of the spread whether or not the log density mixes fast."""
        y = tuning.lp_drift + tf.cast(lp_change, tf.float64)
        y_sum = tuning.lp_sum + y
        y_sq = tuning.lp_sq + tf.square(y)
        spread = tf.reduce_mean(tf.maximum(y_sq / n - tf.square(y_sum / n), 0.0))
        stationary = (
            checked
            & (tf.abs(tf.reduce_mean(y)) <= _DRIFT * tf.sqrt(spread))
            & tf.reduce_all(tf.math.is_finite(y))
        )
        window = tuple(tf.where(checked, tf.zeros_like(v), v) for v in (y, y_sum, y_sq))
        return stationary, window

    @staticmethod
    def _variance_and_error(tuning):
        r""":math:`\sum_i \mathrm{Var}[x_i]` pooled over chains (as
        :meth:`_total_variance`) and its relative Monte Carlo error: the standard error
        of the mean of the chains' own within-chain totals over that mean (infinite for
        one chain). Independent chains make the spread of their estimates an honest
        error whatever the autocorrelation within each."""
        w = tf.where(tuning.weight > 0, tuning.weight, tf.ones_like(tuning.weight))
        within, between = 0.0, 0.0
        for mi, si in zip(tuning.mean, tuning.m2, strict=True):
            within = within + tf.reduce_sum(si, axis=_event_axes(si)) / w  # [chains]
            between = between + tf.reduce_sum(tf.math.reduce_variance(mi, axis=0))
        chains = within.shape[0]
        mean = tf.reduce_mean(within)
        if chains is None or chains < 2:
            return mean + between, tf.constant(float("inf"), mean.dtype)
        spread = tf.math.reduce_std(within) * math.sqrt(chains / (chains - 1))
        error = spread / math.sqrt(chains) / tf.maximum(mean, tf.constant(1e-30, mean.dtype))
        return mean + between, error


def _as_dtype(value, dtype: tf.DType) -> tf.Tensor:
    """``value`` as a ``dtype`` tensor; a Python float directly (``tf.cast(0.9, tf.float64)``
    goes through float32 and gives 0.89999998, which moved float64 runs' dual-averaging
    target, bias tolerance and initial ``L`` by ~1e-8)."""
    if tf.is_tensor(value):
        return tf.cast(value, dtype)
    return tf.constant(value, dtype)


def _replace_if(cond, tuning: MicrocanonicalTuning, **values) -> MicrocanonicalTuning:
    """Scalar fields of ``tuning`` replaced by ``values`` where ``cond`` holds."""
    return tuning._replace(
        **{name: tf.where(cond, v, getattr(tuning, name)) for name, v in values.items()}
    )


def _num_integration_steps(mean_steps, seed):
    """:math:`N = \\lceil U s \\rceil` with :math:`\\mathbb E[N]` = ``mean_steps`` (>= 1)."""
    u = tf.random.stateless_uniform([], seed, dtype=mean_steps.dtype, alg=_rng_alg())
    return num_integration_steps(mean_steps, u)


def num_integration_steps(mean_steps, uniform):
    """:math:`N = \\lceil U s \\rceil` for the uniform :math:`U` = ``uniform``, with ``s``
    such that :math:`\\mathbb E[N]` = ``mean_steps`` (>= 1) (BlackJAX's ``rescale``)."""
    mu = tf.maximum(mean_steps, tf.ones_like(mean_steps))
    k = tf.floor(2.0 * mu - 1.0)
    s = k + k * (mu - 0.5 * (k + 1.0)) / (k + 1.0 - mu)
    return tf.maximum(tf.cast(tf.math.ceil(uniform * s), tf.int32), 1)
