r"""No-U-Turn Sampler with Stan's corrected U-turn criterion, for TensorFlow.

`StanNUTS` is a `tfp.mcmc.TransitionKernel` implementing the dynamic HMC
transition that Stan uses since 2019:

* iterative trajectory doubling in a random direction (forward or backward in
  time) up to ``max_tree_depth`` doublings [1];
* multinomial sampling of the trajectory: within a new subtree each state is
  drawn with probability proportional to its weight
  :math:`w_i = \exp(H_0 - H_i)`, and the subtree's draw replaces the current
  sample with the *biased* progressive probability
  :math:`\min(1, W_\mathrm{new} / W_\mathrm{old})` [2, appendix A];
* the generalised no-U-turn criterion on momentum sums [2]: a (sub)trajectory
  with end points :math:`-, +` and summed momentum
  :math:`\rho = \sum_i p_i` continues while

  .. math::

      p^\sharp_- \cdot \rho > 0 \quad\text{and}\quad p^\sharp_+ \cdot \rho > 0,
      \qquad p^\sharp = M^{-1} p ,

  *plus* the two extra checks across every merge of two subtrees L and R
  (Stan issue #2799, fixed in stan-dev/stan PR #2800 [3]): the criterion must
  also hold for L extended by the first state of R, and for R extended by the
  last state of L.  Without these checks the sampler resonates on
  near-isotropic Gaussians -- exactly what a well-preconditioned field
  posterior looks like -- taking up to hundreds of times too many leapfrog
  steps at some step sizes (TFP 0.25's `NoUTurnSampler` has this defect);
* divergence when the energy error :math:`H - H_0` exceeds
  ``max_energy_error`` (1000 by default, as Stan);
* Stan's acceptance statistic: the mean Metropolis probability
  :math:`\min(1, e^{H_0 - H_i})` over every leapfrog state of the trajectory,
  including those of a rejected final subtree;
* Stan's step-size jitter :math:`\epsilon (1 + j\,u)`, :math:`u \sim U(-1, 1)`,
  drawn once per transition and chain.

The Hamiltonian is :math:`H(x, p) = -\log \pi(x) + \tfrac12 p^\top M^{-1} p`
with :math:`p \sim \mathcal N(0, M)`; the inverse mass (metric)
:math:`M^{-1}` may be the identity, a diagonal given as a tensor of the state's
event shape, or any symmetric positive-definite `tf.linalg.LinearOperator`.

Implementation
--------------
All chains (the leading batch axes of the state, i.e. the shape of
``target_log_prob_fn(state)``) build their own trees in lock step inside
``tf.while_loop``\ s: an outer loop over doublings and an inner loop over the
leaves of the new subtree.  A chain whose trajectory has stopped (U-turn,
divergence) keeps running with a zero step size and is masked out of every
accumulator, and a loop exits as soon as no chain needs it; a batch costs as
many leapfrog steps as its longest trajectory.

The recursion of [1, 3] is replaced by iterative checks, as in NumPyro and
BlackJAX [4]: at leaf :math:`b` of a subtree (subtree-local numbering) the
sub-subtrees of sizes :math:`2, 4, \dots, 2^t` complete, :math:`t` being the
number of trailing one bits of :math:`b`.  Every leaf :math:`i` records
:math:`p^\sharp_i`, the subtree's momentum sum before it
:math:`\rho_{<i}`, and their dot product, in one of ``2 * max_tree_depth``
slots keyed by trailing-zero counts so that a record is kept exactly as long
as a pending check needs it (see `_Checkpoints`).  A check of a criterion over
leaves :math:`s..b` then costs two dot products with the record of :math:`s`
(:math:`\rho_{s..b} = \rho_{\le b} - \rho_{<s}`).  Memory is
:math:`O(\text{max\_tree\_depth} \times \text{state})`, every leaf costs one
gradient evaluation, and nothing leaves the device during a transition.  The
extra check "left half extended by the first state of the right half" only
involves leaves up to the right half's first one, so it is evaluated there and
its verdict applied when the subtree completes, where Stan's recursion would
see it.  The tree depths, leapfrog counts, acceptance statistics and
divergences equal those of a transcription of Stan's ``base_nuts.hpp`` fed the
same momenta and directions (tested).

The kernel is compatible with ``tf.function(jit_compile=True)`` (dot products
are batched matrix-vector products, which XLA:CPU runs several times faster
than reductions of elementwise products).

Composition with step-size adaptation
-------------------------------------
The results carry ``step_size`` and ``log_accept_ratio`` (the log of Stan's
acceptance statistic), so the default hooks of
`tfp.mcmc.DualAveragingStepSizeAdaptation` and
`tfp.mcmc.SimpleStepSizeAdaptation` work unchanged.  The kernel reads its step
size from ``previous_kernel_results.step_size`` (which those wrappers set), and
every constructor argument, including ``inverse_mass``, is held in
``parameters``, so wrappers that rebuild the kernel from its parameters keep the
metric.

References
----------
.. [1] M. D. Hoffman and A. Gelman, "The No-U-Turn Sampler: adaptively setting
   path lengths in Hamiltonian Monte Carlo", JMLR 15:1593-1623 (2014),
   arXiv:1111.4246.
.. [2] M. Betancourt, "A Conceptual Introduction to Hamiltonian Monte Carlo",
   arXiv:1701.02434 (2017).
.. [3] Stan Development Team, "Improve robustness of the NUTS termination
   criterion", stan-dev/stan issue #2799 and pull request #2800 (2019),
   ``src/stan/mcmc/hmc/nuts/base_nuts.hpp``.
.. [4] D. Phan, N. Pradhan and M. Jankowiak, "Composable effects for flexible
   and accelerated probabilistic programming in NumPyro", arXiv:1912.11554
   (2019) (iterative NUTS); BlackJAX ``mcmc/termination.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np
import tensorflow as tf
import tensorflow_probability as tfp

from fieldhmc.samplers import threefry

__all__ = ["NoUTurnSampler", "StanNUTS", "StanNUTSResults"]

_NO_PENDING_FAILURE = np.iinfo(np.int32).max
# Philox explicitly: XLA:CPU's default ("auto_select") normal sampler is ~100x slower
# (uniforms, float64 momenta; float32 momenta come from threefry.standard_normal).
# (Eager and graph mode give identical draws; XLA's float conversion differs.)
_RNG_ALG = "philox"


class StanNUTSResults(NamedTuple):
    """Kernel results (per-step diagnostics) of `StanNUTS`.

    Every field except ``step_size`` and ``seed`` has the chains' batch shape
    ``B`` (the shape of ``target_log_prob``).

    Attributes
    ----------
    target_log_prob : tf.Tensor
        :math:`\\log \\pi` at the current state, shape ``B``.
    grads_target_log_prob : list of tf.Tensor
        Gradient of ``target_log_prob`` with respect to each state part.
    step_size : tf.Tensor or list of tf.Tensor
        Nominal step size used by the step (before jitter); step-size adaptation
        wrappers overwrite this field.
    log_accept_ratio : tf.Tensor
        Log of ``accept_prob``; what step-size adaptation reads.
    accept_prob : tf.Tensor
        Stan's ``accept_stat__``: mean of :math:`\\min(1, e^{H_0 - H_i})` over
        all leapfrog states of the trajectory.
    is_accepted : tf.Tensor
        ``bool``; the new state is not the initial one.
    is_divergent : tf.Tensor
        ``bool``; some leapfrog step had :math:`H - H_0 >` ``max_energy_error``.
    energy : tf.Tensor
        Hamiltonian of the returned state and its momentum, Stan sign:
        :math:`-\\log \\pi(x) + \\tfrac12 p^\\top M^{-1} p`.
    tree_depth : tf.Tensor
        ``int32``; number of successful doublings (Stan's ``treedepth__``).
    num_leapfrog_steps : tf.Tensor
        ``int32``; leapfrog steps (= gradient evaluations) of this chain.
    seed : tf.Tensor
        The stateless seed the step was run with, shape ``[2]``.
    """

    target_log_prob: tf.Tensor
    grads_target_log_prob: list
    step_size: Any
    log_accept_ratio: tf.Tensor
    accept_prob: tf.Tensor
    is_accepted: tf.Tensor
    is_divergent: tf.Tensor
    energy: tf.Tensor
    tree_depth: tf.Tensor
    num_leapfrog_steps: tf.Tensor
    seed: tf.Tensor


# --------------------------------------------------------------------------
# Internal loop state
# --------------------------------------------------------------------------


class _Point(NamedTuple):
    """A phase-space point at one end of a trajectory."""

    x: list
    p: list
    g: list
    logp: tf.Tensor


class _Sample(NamedTuple):
    """The current multinomial draw of a (sub)trajectory."""

    x: list
    g: list
    logp: tf.Tensor
    energy: tf.Tensor


class _Checkpoints(NamedTuple):
    """Leaf records needed by pending U-turn checks, ``2 * max_tree_depth`` slots.

    Leaf ``i`` of a subtree records :math:`p^\\sharp_i`, the subtree's momentum
    sum before it, :math:`\\rho_{<i} = \\sum_{l < i} p_l`, and their dot product
    (and :math:`M^{-1} \\rho_{<i}` for a non-identity metric).
    An even leaf ``s`` (a possible left end of a subtree) is kept until the
    largest subtree starting at it completes, at ``s + 2**tz(s) - 1``
    (``tz``: number of trailing zero bits); it goes to slot ``tz(s)`` (``0`` for
    ``s = 0``).  An odd leaf ``i`` (a possible last leaf of a left half) is kept
    until that subtree completes, at ``i + 2**tz(i + 1)``; it goes to slot
    ``max_tree_depth + tz(i + 1) - 1``.  Two leaves sharing a slot are at least
    ``2**(key + 1)`` apart, so a slot is reused only after its record expired.
    """

    p_sharp: list
    rho_before: list
    rho_sharp_before: list  # M^-1 rho_{<i}; empty for the identity metric
    dot: tf.Tensor


class _Subtree(NamedTuple):
    end: _Point
    rho: list
    sample: _Sample
    log_sum_weight: tf.Tensor
    sum_metro_prob: tf.Tensor
    num_leapfrog_steps: tf.Tensor
    pending_failure: tf.Tensor
    is_valid: tf.Tensor
    is_divergent: tf.Tensor
    checkpoints: _Checkpoints
    seed: tf.Tensor


class _Trajectory(NamedTuple):
    fwd: _Point
    bck: _Point
    rho: list
    sample: _Sample
    log_sum_weight: tf.Tensor
    sum_metro_prob: tf.Tensor
    num_leapfrog_steps: tf.Tensor
    tree_depth: tf.Tensor
    is_divergent: tf.Tensor
    is_accepted: tf.Tensor
    is_building: tf.Tensor


class _Context(NamedTuple):
    """Per-transition constants shared by every leaf."""

    metric: _Metric
    step_sizes: list
    energy0: tf.Tensor
    batch_ndims: int


# --------------------------------------------------------------------------
# Small helpers (all chain-batched; ``b`` = number of batch dimensions)
# --------------------------------------------------------------------------


def _expand_to(mask: tf.Tensor, like: tf.Tensor) -> tf.Tensor:
    """Append singleton axes to a batch-shaped tensor to broadcast against ``like``."""
    extra = like.shape.rank - mask.shape.rank
    return tf.reshape(mask, tf.concat([tf.shape(mask), tf.ones([extra], tf.int32)], 0))


def _select(mask: tf.Tensor, a: Any, b: Any) -> Any:
    """``where(mask, a, b)`` over matching structures, mask of batch shape."""
    return tf.nest.map_structure(lambda u, v: tf.where(_expand_to(mask, u), u, v), a, b)


def _select_if_any(mask: tf.Tensor, a: Any, b: Any) -> Any:
    """`_select`, skipped when no chain selects ``a`` (a 0/1-trip loop, no copies).

    Late leaves of a long trajectory rarely replace the draw, so this saves
    most of the per-leaf selects of the (large) state and gradient.
    """
    num_trips = tf.cast(tf.reduce_any(mask), tf.int32)
    _, out = tf.while_loop(
        lambda k, _: k < num_trips, lambda k, v: (k + 1, _select(mask, a, v)), (0, b)
    )
    return out


def _dot(a: Sequence[tf.Tensor], b: Sequence[tf.Tensor], batch_ndims: int) -> tf.Tensor:
    """Sum over parts of the per-chain inner products ``<a_k, b_k>``."""
    total = None
    for u, v in zip(a, b, strict=True):
        d = tf.reduce_sum(u * v, axis=list(range(batch_ndims, u.shape.rank)))
        total = d if total is None else total + d
    return total


def _flatten_event(x: tf.Tensor, batch_ndims: int, extra: int = 0) -> tf.Tensor:
    """Reshape ``B + extra dims + E`` to ``B + extra dims + [prod(E)]``."""
    keep = batch_ndims + extra
    return tf.reshape(x, tf.concat([tf.shape(x)[:keep], [-1]], 0))


def _pair(a: Sequence[tf.Tensor], b: Sequence[tf.Tensor], batch_ndims: int) -> list:
    """Stack two chain-batched structures per part into ``B + [2, prod(E)]``."""
    return [
        _flatten_event(tf.stack([u, v], axis=batch_ndims), batch_ndims, 1)
        for u, v in zip(a, b, strict=True)
    ]


def _pair_dot(pair: Sequence[tf.Tensor], w: Sequence[tf.Tensor], batch_ndims: int) -> tuple:
    """``(<a, w>, <b, w>)`` per chain for ``pair = _pair(a, b)``.

    One batched matrix-vector product per part: on XLA:CPU this is several times
    faster than two ``reduce_sum(u * w)``, which materialise the product.
    """
    total = None
    for u, v in zip(pair, w, strict=True):
        d = tf.linalg.matvec(u, _flatten_event(v, batch_ndims))
        total = d if total is None else total + d
    return total[..., 0], total[..., 1]


def _add(a: Sequence[tf.Tensor], b: Sequence[tf.Tensor]) -> list:
    return [u + v for u, v in zip(a, b, strict=True)]


def _log_add_exp(a: tf.Tensor, b: tf.Tensor) -> tf.Tensor:
    """``log(exp(a) + exp(b))``, exact when both are ``-inf``."""
    m = tf.maximum(a, b)
    safe = tf.where(tf.math.is_finite(m), m, tf.zeros_like(m))
    out = safe + tf.math.log(tf.exp(a - safe) + tf.exp(b - safe))
    return tf.where(tf.math.is_finite(m), out, m)


def _popcount(n: tf.Tensor, num_bits: int) -> tf.Tensor:
    """Number of set bits of a non-negative scalar ``int32`` below ``2**num_bits``."""
    count = tf.zeros([], tf.int32)
    for k in range(num_bits):
        count += tf.bitwise.bitwise_and(tf.bitwise.right_shift(n, k), 1)
    return count


def _trailing_zeros(n: tf.Tensor, num_bits: int) -> tf.Tensor:
    """Number of trailing zero bits of a positive scalar ``int32`` below ``2**num_bits``."""
    return _popcount(tf.bitwise.bitwise_and(n, -n) - 1, num_bits)


def _gather_slot(stack: Sequence[tf.Tensor], slot: tf.Tensor) -> list:
    return [tf.gather(s, slot) for s in stack]


def _write_slot(stack: Sequence[tf.Tensor], slot: tf.Tensor, values: Sequence[tf.Tensor]) -> list:
    index = tf.reshape(slot, [1, 1])
    return [
        tf.tensor_scatter_nd_update(s, index, v[tf.newaxis])
        for s, v in zip(stack, values, strict=True)
    ]


def _is_list_like(x: Any) -> bool:
    return isinstance(x, (list, tuple))


def _prepare_step_sizes(step_size: Any, dtype: tf.DType, num_parts: int) -> list:
    parts = tf.nest.flatten(step_size)
    parts = [tf.convert_to_tensor(s, dtype=dtype) for s in parts]
    if len(parts) == 1:
        parts = parts * num_parts
    if len(parts) != num_parts:
        raise ValueError(
            f"`step_size` must be one tensor or one per state part ({num_parts}), got {len(parts)}."
        )
    return parts


# --------------------------------------------------------------------------
# Metric
# --------------------------------------------------------------------------


def _is_diagonal_operator(op: tf.linalg.LinearOperator) -> bool:
    return isinstance(
        op,
        (
            tf.linalg.LinearOperatorDiag,
            tf.linalg.LinearOperatorIdentity,
            tf.linalg.LinearOperatorScaledIdentity,
        ),
    )


def _validate_operator(op: tf.linalg.LinearOperator) -> None:
    if _is_diagonal_operator(op):
        return
    if not (op.is_self_adjoint and op.is_positive_definite):
        raise ValueError(
            "A `tf.linalg.LinearOperator` inverse mass must be symmetric positive "
            "definite and say so: build it with `is_self_adjoint=True, "
            f"is_positive_definite=True` (got {type(op).__name__} with "
            f"is_self_adjoint={op.is_self_adjoint}, "
            f"is_positive_definite={op.is_positive_definite})."
        )


class _Metric:
    r"""The inverse mass :math:`M^{-1}` acting on a list of chain-batched state parts.

    ``inverse_mass`` is ``None`` (identity), a `tf.linalg.LinearOperator`
    acting jointly on the concatenation of all parts' flattened events, or one
    entry per part, each ``None``, a tensor (the diagonal of :math:`M^{-1}`, of
    the part's event shape) or a `tf.linalg.LinearOperator` acting on the
    part's flattened event.
    """

    def __init__(self, inverse_mass: Any, parts: Sequence[tf.Tensor], batch_ndims: int):
        self._batch_ndims = batch_ndims
        self._event_shapes = [p.shape[batch_ndims:] for p in parts]
        self._event_sizes = [int(np.prod(s, dtype=np.int64)) for s in self._event_shapes]
        self._joint = None
        self._parts = [None] * len(parts)
        if inverse_mass is None:
            return
        if isinstance(inverse_mass, tf.linalg.LinearOperator) and len(parts) > 1:
            self._joint = inverse_mass
            return
        entries = inverse_mass if _is_list_like(inverse_mass) else [inverse_mass]
        if len(entries) != len(parts):
            raise ValueError(
                f"`inverse_mass` has {len(entries)} entries for {len(parts)} state parts."
            )
        for k, (entry, part) in enumerate(zip(entries, parts, strict=True)):
            if entry is None:
                continue
            if isinstance(entry, tf.linalg.LinearOperator):
                if _is_diagonal_operator(entry):
                    diag = tf.reshape(tf.cast(entry.diag_part(), part.dtype), self._event_shapes[k])
                    self._parts[k] = ("diag", diag, tf.math.rsqrt(diag))
                else:
                    self._parts[k] = ("op", entry, entry.cholesky())
            else:
                diag = tf.cast(tf.convert_to_tensor(entry), part.dtype)
                self._parts[k] = ("diag", diag, tf.math.rsqrt(diag))

    # flatten / unflatten the event of one chain-batched part
    def _flat(self, x: tf.Tensor) -> tf.Tensor:
        shape = tf.concat([tf.shape(x)[: self._batch_ndims], [-1]], 0)
        return tf.reshape(x, shape)

    def _unflat(self, x: tf.Tensor, k: int) -> tf.Tensor:
        shape = tf.concat(
            [
                tf.shape(x)[: self._batch_ndims],
                tf.constant(self._event_shapes[k].as_list(), tf.int32),
            ],
            0,
        )
        return tf.reshape(x, shape)

    def _joint_apply(self, parts: Sequence[tf.Tensor], fn: Callable) -> list:
        flat = tf.concat([self._flat(p) for p in parts], axis=-1)
        out = tf.split(fn(flat), self._event_sizes, axis=-1)
        return [self._unflat(o, k) for k, o in enumerate(out)]

    @property
    def is_identity(self) -> bool:
        return self._joint is None and all(entry is None for entry in self._parts)

    def sharp(self, p: Sequence[tf.Tensor]) -> list:
        r""":math:`p^\sharp = M^{-1} p`."""
        if self._joint is not None:
            return self._joint_apply(p, self._joint.matvec)
        out = []
        for k, (entry, pk) in enumerate(zip(self._parts, p, strict=True)):
            if entry is None:
                out.append(pk)
            elif entry[0] == "diag":
                out.append(entry[1] * pk)
            else:
                out.append(self._unflat(entry[1].matvec(self._flat(pk)), k))
        return out

    def sample_momentum(self, like: Sequence[tf.Tensor], seed: tf.Tensor) -> list:
        r"""Draw :math:`p \sim \mathcal N(0, M)` for every chain."""
        seeds = tfp.random.split_seed(seed, n=len(like))
        z = [
            threefry.standard_normal(tf.shape(x), s)
            if x.dtype == tf.float32
            else tf.random.stateless_normal(tf.shape(x), seed=s, dtype=x.dtype, alg=_RNG_ALG)
            for x, s in zip(like, seeds, strict=True)
        ]
        if self._joint is not None:
            op = self._joint
            if _is_diagonal_operator(op):
                return self._joint_apply(z, lambda v: v * tf.math.rsqrt(op.diag_part()))
            chol = op.cholesky()
            # M^{-1} = L L^T  =>  p = L^{-T} z has covariance (L L^T)^{-1} = M.
            return self._joint_apply(z, lambda v: chol.solvevec(v, adjoint=True))
        out = []
        for k, (entry, zk) in enumerate(zip(self._parts, z, strict=True)):
            if entry is None:
                out.append(zk)
            elif entry[0] == "diag":
                out.append(zk * entry[2])
            else:
                out.append(self._unflat(entry[2].solvevec(self._flat(zk), adjoint=True), k))
        return out


# --------------------------------------------------------------------------
# The kernel
# --------------------------------------------------------------------------


class StanNUTS(tfp.mcmc.TransitionKernel):
    r"""No-U-Turn Sampler with Stan's multinomial sampling and U-turn criterion.

    See the module docstring for the algorithm and references.

    Parameters
    ----------
    target_log_prob_fn : callable
        ``target_log_prob_fn(*state_parts)`` (or ``(state)`` for a single
        tensor) returns :math:`\log \pi` up to a constant, summed over event
        dimensions; its shape is the chains' batch shape ``B``.
    step_size : float, tf.Tensor or list of tf.Tensor
        Leapfrog step size :math:`\epsilon` (in the units of the state, or of
        :math:`M^{-1/2}`-whitened coordinates when a metric is given): one value
        or one per state part, each broadcasting against its part's shape
        ``B + E`` (so a per-chain step size has shape ``B + [1] * len(E)``).
    max_tree_depth : int
        Maximum number of trajectory doublings; at most
        ``2**max_tree_depth - 1`` leapfrog steps per transition.
    inverse_mass : None, tf.Tensor, tf.linalg.LinearOperator or list
        The metric :math:`M^{-1}` (momenta are drawn from :math:`\mathcal N(0, M)`).
        ``None`` is the identity.  For a single-tensor state: a tensor of the
        event shape ``E`` (the diagonal of :math:`M^{-1}`) or a symmetric
        positive-definite `tf.linalg.LinearOperator` acting on the flattened
        event (``prod(E)`` rows; it must support ``cholesky()``, e.g. Diag,
        FullMatrix, LowerTriangular, Kronecker, BlockDiag).  For a list state:
        a list with one such entry (or ``None``) per part, or a single
        `tf.linalg.LinearOperator` acting on the concatenation of all parts'
        flattened events.
    step_size_jitter : float
        Stan's ``stepsize_jitter`` :math:`j \in [0, 1)`: each transition and
        chain uses :math:`\epsilon (1 + j u)`, :math:`u \sim U(-1, 1)`.
    max_energy_error : float
        A leapfrog state with :math:`H - H_0` above this is a divergence and
        ends the trajectory (Stan's default 1000).
    name : str, optional
        Name scope of the ops; default ``"StanNUTS"``.

    Notes
    -----
    The state is a tensor or a list of tensors with leading chain (batch) axes
    ``B``; every chain builds its own tree.  ``one_step`` adds no
    ``tf.function``; wrap the sampling loop in
    ``tf.function(jit_compile=True)``.  Seeds are stateless: pass a
    ``[2]``-shaped integer seed (``tfp.random.sanitize_seed``) to ``one_step``.

    Examples
    --------
    >>> kernel = tfp.mcmc.DualAveragingStepSizeAdaptation(
    ...     StanNUTS(target_log_prob_fn, step_size=0.1, inverse_mass=var),
    ...     num_adaptation_steps=400)
    >>> run = tf.function(lambda x, seed: tfp.mcmc.sample_chain(
    ...     500, x, kernel=kernel, num_burnin_steps=500, seed=seed,
    ...     trace_fn=lambda _, r: r.inner_results.tree_depth), jit_compile=True)
    """

    def __init__(
        self,
        target_log_prob_fn: Callable[..., tf.Tensor],
        step_size: Any,
        max_tree_depth: int = 10,
        inverse_mass: Any = None,
        step_size_jitter: float = 0.0,
        max_energy_error: float = 1000.0,
        name: str | None = None,
    ):
        max_tree_depth = tf.get_static_value(max_tree_depth)
        if max_tree_depth is None or int(max_tree_depth) < 1 or int(max_tree_depth) > 30:
            raise ValueError(
                f"`max_tree_depth` must be a static int in [1, 30], got {max_tree_depth}."
            )
        max_tree_depth = int(max_tree_depth)
        jitter = tf.get_static_value(step_size_jitter)
        if jitter is None or not 0.0 <= float(jitter) < 1.0:
            raise ValueError(f"`step_size_jitter` must be a static float in [0, 1), got {jitter}.")
        for op in tf.nest.flatten(inverse_mass, expand_composites=False):
            if isinstance(op, tf.linalg.LinearOperator):
                _validate_operator(op)
        self._parameters = dict(
            target_log_prob_fn=target_log_prob_fn,
            step_size=step_size,
            max_tree_depth=max_tree_depth,
            inverse_mass=inverse_mass,
            step_size_jitter=float(jitter),
            max_energy_error=max_energy_error,
            name=name or "StanNUTS",
        )

    # ---------------------------------------------------------------- properties
    @property
    def target_log_prob_fn(self) -> Callable[..., tf.Tensor]:
        return self._parameters["target_log_prob_fn"]

    @property
    def step_size(self) -> Any:
        return self._parameters["step_size"]

    @property
    def max_tree_depth(self) -> int:
        return self._parameters["max_tree_depth"]

    @property
    def inverse_mass(self) -> Any:
        return self._parameters["inverse_mass"]

    @property
    def step_size_jitter(self) -> float:
        return self._parameters["step_size_jitter"]

    @property
    def max_energy_error(self) -> float:
        return self._parameters["max_energy_error"]

    @property
    def name(self) -> str:
        return self._parameters["name"]

    @property
    def parameters(self) -> dict:
        return self._parameters

    @property
    def is_calibrated(self) -> bool:
        return True

    @property
    def experimental_shard_axis_names(self) -> None:
        return None

    # ---------------------------------------------------------------- public API
    def bootstrap_results(self, init_state: Any) -> StanNUTSResults:
        """Kernel results for ``init_state`` (one gradient evaluation).

        Parameters
        ----------
        init_state : tf.Tensor or list of tf.Tensor
            Initial state, leading axes the chains' batch shape.

        Returns
        -------
        StanNUTSResults
            Diagnostics are zero; ``energy`` is :math:`-\\log \\pi` (no momentum).
        """
        with tf.name_scope(self.name + ".bootstrap_results"):
            is_list = _is_list_like(init_state)
            parts = [tf.convert_to_tensor(s) for s in (init_state if is_list else [init_state])]
            logp, grads = self._value_and_grads(parts, is_list)
            step_size = tf.nest.map_structure(
                lambda s: tf.convert_to_tensor(s, dtype=logp.dtype), self.step_size
            )
            _prepare_step_sizes(step_size, logp.dtype, len(parts))
            zeros_int = tf.zeros_like(logp, dtype=tf.int32)
            false = tf.zeros_like(logp, dtype=tf.bool)
            return StanNUTSResults(
                target_log_prob=logp,
                grads_target_log_prob=grads,
                step_size=step_size,
                log_accept_ratio=tf.zeros_like(logp),
                accept_prob=tf.ones_like(logp),
                is_accepted=false,
                is_divergent=false,
                energy=-logp,
                tree_depth=zeros_int,
                num_leapfrog_steps=zeros_int,
                seed=tf.zeros([2], tf.int32),
            )

    def one_step(
        self, current_state: Any, previous_kernel_results: StanNUTSResults, seed: Any = None
    ) -> tuple[Any, StanNUTSResults]:
        """Run one NUTS transition for every chain.

        Parameters
        ----------
        current_state : tf.Tensor or list of tf.Tensor
            Current state, leading axes the chains' batch shape ``B``.
        previous_kernel_results : StanNUTSResults
            Results of the previous step (or of `bootstrap_results`); its
            ``target_log_prob``, ``grads_target_log_prob`` and ``step_size``
            are used.
        seed : tf.Tensor, optional
            Stateless seed, shape ``[2]`` (anything `tfp.random.sanitize_seed`
            accepts).

        Returns
        -------
        next_state : tf.Tensor or list of tf.Tensor
            Same structure as ``current_state``.
        kernel_results : StanNUTSResults
        """
        with tf.name_scope(self.name + ".one_step"):
            seed = tfp.random.sanitize_seed(seed)
            is_list = _is_list_like(current_state)
            x0 = [tf.convert_to_tensor(s) for s in (current_state if is_list else [current_state])]
            logp0 = previous_kernel_results.target_log_prob
            g0 = list(previous_kernel_results.grads_target_log_prob)
            batch_ndims = logp0.shape.rank
            if batch_ndims is None:
                raise ValueError("The rank of `target_log_prob` must be known statically.")
            batch_shape = tf.shape(logp0)
            dtype = logp0.dtype
            metric = _Metric(self.inverse_mass, x0, batch_ndims)
            step_sizes = _prepare_step_sizes(previous_kernel_results.step_size, dtype, len(x0))

            momentum_seed, jitter_seed, loop_seed = tfp.random.split_seed(seed, n=3)
            p0 = metric.sample_momentum(x0, momentum_seed)
            energy0 = -logp0 + 0.5 * _dot(p0, metric.sharp(p0), batch_ndims)
            if self.step_size_jitter > 0.0:
                u = tf.random.stateless_uniform(
                    batch_shape,
                    seed=jitter_seed,
                    minval=-1.0,
                    maxval=1.0,
                    dtype=dtype,
                    alg=_RNG_ALG,
                )
                scale = 1.0 + self.step_size_jitter * u
            else:
                scale = tf.ones_like(logp0)
            ctx = _Context(metric, step_sizes, energy0, batch_ndims)

            start = _Point(x0, p0, g0, logp0)
            zeros_int = tf.zeros_like(logp0, dtype=tf.int32)
            false = tf.zeros_like(logp0, dtype=tf.bool)
            trajectory = _Trajectory(
                fwd=start,
                bck=start,
                rho=list(p0),
                sample=_Sample(x0, g0, logp0, energy0),
                log_sum_weight=tf.zeros_like(logp0),
                sum_metro_prob=tf.zeros_like(logp0),
                num_leapfrog_steps=zeros_int,
                tree_depth=zeros_int,
                is_divergent=false,
                is_accepted=false,
                is_building=tf.ones_like(logp0, dtype=tf.bool),
            )
            num_slots = 2 * self.max_tree_depth

            def _slots(x: tf.Tensor) -> tf.Tensor:
                return tf.zeros(tf.concat([[num_slots], tf.shape(x)], 0), x.dtype)

            checkpoints = _Checkpoints(
                p_sharp=[_slots(x) for x in x0],
                rho_before=[_slots(x) for x in x0],
                rho_sharp_before=[] if metric.is_identity else [_slots(x) for x in x0],
                dot=_slots(logp0),
            )

            def cond(depth, seed, trajectory, checkpoints):
                del seed, checkpoints
                return (depth < self.max_tree_depth) & tf.reduce_any(trajectory.is_building)

            def body(depth, seed, trajectory, checkpoints):
                next_seed, step_seed = tfp.random.split_seed(seed)
                trajectory, checkpoints = self._double(
                    ctx, depth, trajectory, checkpoints, scale, is_list, step_seed
                )
                return depth + 1, next_seed, trajectory, checkpoints

            _, _, trajectory, _ = tf.while_loop(
                cond, body, (tf.zeros([], tf.int32), loop_seed, trajectory, checkpoints)
            )

            accept_prob = trajectory.sum_metro_prob / tf.cast(
                tf.maximum(trajectory.num_leapfrog_steps, 1), dtype
            )
            sample = trajectory.sample
            results = StanNUTSResults(
                target_log_prob=sample.logp,
                grads_target_log_prob=sample.g,
                step_size=previous_kernel_results.step_size,
                log_accept_ratio=tf.math.log(accept_prob),
                accept_prob=accept_prob,
                is_accepted=trajectory.is_accepted,
                is_divergent=trajectory.is_divergent,
                energy=sample.energy,
                tree_depth=trajectory.tree_depth,
                num_leapfrog_steps=trajectory.num_leapfrog_steps,
                seed=seed,
            )
            next_state = (
                tf.nest.pack_sequence_as(current_state, sample.x) if is_list else sample.x[0]
            )
            return next_state, results

    # ------------------------------------------------------------ internals
    def _value_and_grads(self, parts: Sequence[tf.Tensor], is_list: bool) -> tuple:
        def fn(*args):
            return self.target_log_prob_fn(*args) if is_list else self.target_log_prob_fn(args[0])

        logp, grads = tfp.math.value_and_gradient(fn, list(parts))
        grads = list(grads)
        if any(g is None for g in grads):
            raise ValueError("`target_log_prob_fn` has no gradient for some state part.")
        return logp, grads

    def _leapfrog(
        self, ctx: _Context, point: _Point, chain_step: tf.Tensor, is_list: bool
    ) -> _Point:
        """One leapfrog step of signed per-chain size ``chain_step * step_size``."""
        eps = [s * _expand_to(chain_step, x) for s, x in zip(ctx.step_sizes, point.x, strict=True)]
        p_half = [p + 0.5 * e * g for p, e, g in zip(point.p, eps, point.g, strict=True)]
        v_half = ctx.metric.sharp(p_half)
        x = [x + e * v for x, e, v in zip(point.x, eps, v_half, strict=True)]
        logp, g = self._value_and_grads(x, is_list)
        p = [p + 0.5 * e * gi for p, e, gi in zip(p_half, eps, g, strict=True)]
        return _Point(x, p, g, logp)

    def _double(
        self,
        ctx: _Context,
        depth: tf.Tensor,
        trajectory: _Trajectory,
        checkpoints: _Checkpoints,
        scale: tf.Tensor,
        is_list: bool,
        seed: tf.Tensor,
    ) -> tuple[_Trajectory, _Checkpoints]:
        """Build a subtree of ``2**depth`` leaves in a random direction and merge it."""
        b = ctx.batch_ndims
        metric = ctx.metric
        dir_seed, merge_seed, leaf_seed = tfp.random.split_seed(seed, n=3)
        shape = tf.shape(trajectory.log_sum_weight)
        dtype = trajectory.log_sum_weight.dtype
        forward = tf.random.stateless_uniform(shape, seed=dir_seed, dtype=dtype, alg=_RNG_ALG) > 0.5
        junction = _select(forward, trajectory.fwd, trajectory.bck)
        far = _select(forward, trajectory.bck, trajectory.fwd)
        chain_step = tf.where(forward, scale, -scale)

        subtree, first_p = self._build_subtree(
            ctx,
            depth,
            junction,
            chain_step,
            trajectory.is_building,
            checkpoints,
            is_list,
            leaf_seed,
        )

        merged = trajectory.is_building & subtree.is_valid
        # Biased progressive sampling between the old trajectory and the subtree.
        log_u = tf.math.log(
            tf.random.stateless_uniform(shape, seed=merge_seed, dtype=dtype, alg=_RNG_ALG)
        )
        take = merged & (log_u < subtree.log_sum_weight - trajectory.log_sum_weight)
        sample = _select(take, subtree.sample, trajectory.sample)
        log_sum_weight = tf.where(
            merged,
            _log_add_exp(trajectory.log_sum_weight, subtree.log_sum_weight),
            trajectory.log_sum_weight,
        )
        rho = _add(trajectory.rho, subtree.rho)

        # Generalised U-turn criterion around the merged trajectory and across the
        # junction (Stan PR #2800): old + first new state, last old state + new.
        ps_far = metric.sharp(far.p)
        ps_junction = metric.sharp(junction.p)
        ps_end = metric.sharp(subtree.end.p)
        ps_first = metric.sharp(first_p)
        persist = tf.ones_like(merged)
        for ends, span in [
            ((ps_far, ps_end), rho),
            ((ps_far, ps_first), _add(trajectory.rho, first_p)),
            ((ps_junction, ps_end), _add(subtree.rho, junction.p)),
        ]:
            dot_a, dot_b = _pair_dot(_pair(*ends, b), span, b)
            persist &= (dot_a > 0) & (dot_b > 0)

        new_trajectory = _Trajectory(
            fwd=_select(merged & forward, subtree.end, trajectory.fwd),
            bck=_select(merged & ~forward, subtree.end, trajectory.bck),
            rho=_select(merged, rho, trajectory.rho),
            sample=sample,
            log_sum_weight=log_sum_weight,
            sum_metro_prob=trajectory.sum_metro_prob + subtree.sum_metro_prob,
            num_leapfrog_steps=trajectory.num_leapfrog_steps + subtree.num_leapfrog_steps,
            tree_depth=trajectory.tree_depth + tf.cast(merged, tf.int32),
            is_divergent=trajectory.is_divergent | subtree.is_divergent,
            is_accepted=trajectory.is_accepted | take,
            is_building=merged & persist,
        )
        return new_trajectory, subtree.checkpoints

    def _build_subtree(
        self,
        ctx: _Context,
        depth: tf.Tensor,
        start: _Point,
        chain_step: tf.Tensor,
        is_building: tf.Tensor,
        checkpoints: _Checkpoints,
        is_list: bool,
        seed: tf.Tensor,
    ) -> tuple[_Subtree, list]:
        """Integrate ``2**depth`` leaves from ``start``; return the subtree, leaf 0's momentum."""
        logp = start.logp
        init = _Subtree(
            end=start,
            rho=[tf.zeros_like(p) for p in start.p],
            sample=_Sample(start.x, start.g, logp, ctx.energy0),
            log_sum_weight=tf.fill(tf.shape(logp), tf.constant(-np.inf, logp.dtype)),
            sum_metro_prob=tf.zeros_like(logp),
            num_leapfrog_steps=tf.zeros_like(logp, dtype=tf.int32),
            pending_failure=tf.fill(tf.shape(logp), _NO_PENDING_FAILURE),
            is_valid=tf.ones_like(logp, dtype=tf.bool),
            is_divergent=tf.zeros_like(logp, dtype=tf.bool),
            checkpoints=checkpoints,
            seed=seed,
        )
        # Leaf 0 is peeled off the loop: its momentum is needed by the merge checks.
        subtree = self._leaf(ctx, 0, init, chain_step, is_building, is_list)
        first_p = subtree.end.p
        num_leaves = tf.bitwise.left_shift(1, depth)

        def cond(i, subtree):
            return (i < num_leaves) & tf.reduce_any(is_building & subtree.is_valid)

        def body(i, subtree):
            return i + 1, self._leaf(ctx, i, subtree, chain_step, is_building, is_list)

        _, subtree = tf.while_loop(cond, body, (tf.ones([], tf.int32), subtree))
        return subtree, first_p

    def _leaf(
        self,
        ctx: _Context,
        i: int | tf.Tensor,
        st: _Subtree,
        chain_step: tf.Tensor,
        is_building: tf.Tensor,
        is_list: bool,
    ) -> _Subtree:
        """Add leaf ``i`` (subtree-local index) to the subtree ``st``."""
        b = ctx.batch_ndims
        metric = ctx.metric
        accept_seed, next_seed = tfp.random.split_seed(st.seed)
        active = is_building & st.is_valid
        prev = st.end
        # Record rho_{<i} first, so that the running sum can then be updated in place
        # (it is read back from the record below).
        slot = self._record_slot(i)
        rho_recorded = st.checkpoints._replace(
            rho_before=_write_slot(st.checkpoints.rho_before, slot, st.rho),
            rho_sharp_before=(
                []
                if metric.is_identity
                else _write_slot(st.checkpoints.rho_sharp_before, slot, metric.sharp(st.rho))
            ),
        )
        new = self._leapfrog(
            ctx, prev, tf.where(active, chain_step, tf.zeros_like(chain_step)), is_list
        )
        p_sharp = metric.sharp(new.p)
        # (rho_i, p_i) side by side: each check below is then two batched mat-vecs.
        rho = _add(_gather_slot(rho_recorded.rho_before, slot), new.p)
        current = _pair(rho, new.p, b)
        dot_end, twice_kinetic = _pair_dot(current, p_sharp, b)  # p#_i.rho_i, p#_i.p_i
        energy = -new.logp + 0.5 * twice_kinetic
        energy = tf.where(tf.math.is_nan(energy), tf.constant(np.inf, energy.dtype), energy)
        log_weight = ctx.energy0 - energy
        diverged = active & (energy - ctx.energy0 > self.max_energy_error)

        # Multinomial sampling within the subtree (progressive, uniform).
        log_sum_weight = tf.where(
            active, _log_add_exp(st.log_sum_weight, log_weight), st.log_sum_weight
        )
        log_u = tf.math.log(
            tf.random.stateless_uniform(
                tf.shape(energy), seed=accept_seed, dtype=energy.dtype, alg=_RNG_ALG
            )
        )
        take = active & (log_u < log_weight - log_sum_weight)
        new_sample = _Sample(new.x, new.g, new.logp, energy)
        if isinstance(i, int):
            # Leaf 0 is always drawn (a zero-weight leaf 0 is a divergence, and the
            # subtree is then discarded anyway).
            sample = new_sample
        else:
            sample = _select_if_any(take, new_sample, st.sample)
        metro = tf.exp(tf.minimum(log_weight, 0.0))
        sum_metro_prob = st.sum_metro_prob + tf.where(active, metro, tf.zeros_like(metro))
        num_leapfrog_steps = st.num_leapfrog_steps + tf.cast(active, tf.int32)

        # p#_i . rho_{<i}, recorded for later checks against this leaf
        dot_before = dot_end - twice_kinetic

        if isinstance(i, int):  # leaf 0: nothing to check yet
            checkpoints = rho_recorded
            pending_failure = st.pending_failure
            turned = tf.zeros_like(active)
        else:
            checkpoints, pending_failure, turned = self._check_leaf(
                i, rho_recorded, st.pending_failure, active, current, dot_end, b
            )
        checkpoints = checkpoints._replace(
            p_sharp=_write_slot(checkpoints.p_sharp, slot, p_sharp),
            dot=_write_slot([checkpoints.dot], slot, [dot_before])[0],
        )

        is_valid = st.is_valid & ~(active & (diverged | turned))
        return _Subtree(
            end=new,
            rho=rho,
            sample=sample,
            log_sum_weight=log_sum_weight,
            sum_metro_prob=sum_metro_prob,
            num_leapfrog_steps=num_leapfrog_steps,
            pending_failure=pending_failure,
            is_valid=is_valid,
            is_divergent=st.is_divergent | diverged,
            checkpoints=checkpoints,
            seed=next_seed,
        )

    def _record_slot(self, i: int | tf.Tensor) -> tf.Tensor:
        """Checkpoint slot of leaf ``i`` (see `_Checkpoints`)."""
        if isinstance(i, int):
            if i != 0:
                raise ValueError("Only leaf 0 has a static index.")
            return tf.zeros([], tf.int32)
        num_bits = self.max_tree_depth + 1
        is_odd = tf.equal(tf.bitwise.bitwise_and(i, 1), 1)
        return tf.where(
            is_odd,
            self.max_tree_depth + _trailing_zeros(i + 1, num_bits) - 1,
            _trailing_zeros(i, num_bits),
        )

    def _check_leaf(
        self,
        i: tf.Tensor,
        checkpoints: _Checkpoints,
        pending_failure: tf.Tensor,
        active: tf.Tensor,
        current: list,
        dot_end: tf.Tensor,
        b: int,
    ) -> tuple[_Checkpoints, tf.Tensor, tf.Tensor]:
        r"""U-turn checks at leaf ``i >= 1`` against recorded leaves.

        Every check has the form "criterion over leaves ``s..i``" for a recorded
        leaf ``s``: :math:`p^\sharp_s \cdot \rho_{s..i} > 0` and
        :math:`p^\sharp_i \cdot \rho_{s..i} > 0`, where
        :math:`\rho_{s..i} = \rho_{\le i} - \rho_{<s}`.

        * Odd ``i`` completes the subtrees of sizes :math:`2^k`,
          :math:`k = 1..t` (``t`` trailing one bits of ``i``), with left ends
          :math:`a_k = i + 1 - 2^k`: check ``s = a_k`` (the whole subtree) and, for
          :math:`k \ge 2`, ``s = m_k - 1`` with :math:`m_k = a_k + 2^{k-1}` (the
          last leaf of the left half followed by the right half).  A failure
          invalidates the subtree now.
        * Even ``i = m`` is the first leaf of the right half of the subtree of
          size :math:`2\,\mathrm{lowbit}(i)` starting at ``a = i - lowbit(i)``:
          check ``s = a`` (the left half followed by leaf ``m``) now, since it only
          involves leaves up to ``m``; a failure invalidates the subtree when it
          completes, at leaf ``i + lowbit(i) - 1``, where Stan's recursion would
          notice it.

        Returns the checkpoints (passed through the loop, so that later writes
        are ordered after these reads), the updated pending failures and whether
        the subtree turned at this leaf.
        """
        num_bits = self.max_tree_depth + 1
        half_base = self.max_tree_depth - 2
        is_odd = tf.equal(tf.bitwise.bitwise_and(i, 1), 1)
        num_levels = _trailing_zeros(i + 1, num_bits)  # trailing ones of i
        num_checks = tf.where(is_odd, 2 * num_levels - 1, 1)
        lowbit = tf.bitwise.bitwise_and(i, -i)
        completes_at = i + lowbit - 1

        def even_slot(s):
            return tf.where(s == 0, 0, _trailing_zeros(s, num_bits))

        def slot_of(j):
            # odd i: checks j = 0, 1, 2, ... are a_1, a_2, m_2 - 1, a_3, m_3 - 1, ...
            k = tf.where(j == 0, 1, (j + 3) // 2)
            is_half = (j > 0) & tf.equal(tf.bitwise.bitwise_and(j, 1), 0)
            a_k = i + 1 - tf.bitwise.left_shift(1, k)
            odd_case = tf.where(is_half, half_base + k, even_slot(a_k))
            return tf.where(is_odd, odd_case, even_slot(i - lowbit))

        def cond(j, ok, pending, checkpoints):
            del pending, checkpoints
            return (j < num_checks) & tf.reduce_any(active & ok)

        def body(j, ok, pending, checkpoints):
            slot = slot_of(j)
            # p#_s . rho_i and p#_i . rho_{<s} = p_i . (M^-1 rho_{<s})
            ps_dot_rho, _ = _pair_dot(current, _gather_slot(checkpoints.p_sharp, slot), b)
            rho_sharp_s = checkpoints.rho_sharp_before or checkpoints.rho_before
            _, ps_dot_rho_s = _pair_dot(current, _gather_slot(rho_sharp_s, slot), b)
            passed = (ps_dot_rho - tf.gather(checkpoints.dot, slot) > 0) & (
                dot_end - ps_dot_rho_s > 0
            )
            ok = tf.where(is_odd, ok & passed, ok)
            pending = tf.where(
                ~is_odd & active & ~passed, tf.minimum(pending, completes_at), pending
            )
            return j + 1, ok, pending, checkpoints

        _, ok, pending, checkpoints = tf.while_loop(
            cond,
            body,
            (tf.zeros([], tf.int32), tf.ones_like(active), pending_failure, checkpoints),
        )
        return checkpoints, pending, ~ok | (pending <= i)


#: The same kernel under TFP's name, in this module's namespace (used by
#: `fieldhmc.samplers.kernels.build_kernel` for ``kind="fieldnuts"``).
NoUTurnSampler = StanNUTS
