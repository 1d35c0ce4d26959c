"""What a run on a DTensor mesh supports, stated once (no TensorFlow import).

The config validation, the mesh target (:class:`fieldhmc.models.sharded.ShardedGaussianTarget`)
and the mesh sampler (:class:`fieldhmc.samplers.sharded.ShardedSampler`) all ask
:func:`mesh_support`; it answers with the one-line reason a combination cannot run on
a mesh, or None.
"""

from __future__ import annotations

from fieldhmc.samplers import kinds

__all__ = [
    "MESH_KINDS",
    "MESH_LIKELIHOODS",
    "MESH_PARAMETRISATIONS",
    "MESH_PRECONDITIONERS",
    "mesh_support",
]

#: Sampler kinds with a mesh transition (fieldhmc.samplers.sharded / sharded_mclmc).
MESH_KINDS = kinds.names_where(lambda k: k.runs_on_mesh)
#: Fourier-diagonal metrics the mesh target applies as a map of its white-noise latent.
MESH_PRECONDITIONERS = ("identity", "prior", "posterior")
#: Likelihoods (``model.likelihood.kind``) the mesh target evaluates: per-voxel sums in real space.
MESH_LIKELIHOODS = ("gaussian", "masked_gaussian", "lognormal_poisson")
#: Latents the mesh target maps to the field per Fourier mode (white-noise latents).
MESH_PARAMETRISATIONS = ("noncentred", "conditional", "conditional_scale")


def mesh_support(
    kind: str,
    *,
    preconditioner: str = "identity",
    jitter_leapfrog: bool = False,
    step_size_jitter: float = 0.0,
    likelihood: str = "gaussian",
    forward_model: bool = False,
    sampled_hyperparameters: bool = False,
    sampled_cosmology: bool = False,
    parametrisation: str = "noncentred",
) -> str | None:
    """Why a run with these settings cannot go on a mesh; None if it can.

    Parameters
    ----------
    kind : str
        ``sampler.kind``.
    preconditioner : str
        ``sampler.preconditioner`` (``"diagonal"``: the windowed adaptation, of the
        per-element variance of the mesh target's latent; the kinds that tune their own
        metric refuse it in their settings check).
    jitter_leapfrog : bool
        HMC with a randomised number of leapfrog steps (supported; kept so that callers
        pass every sampler option).
    step_size_jitter : float
        Randomised step size: an option of ``fieldnuts`` only (the kind check names
        why fieldnuts does not run on a mesh); the other kinds ignore it, as on one
        device.
    likelihood : str
        ``model.likelihood.kind`` (or the class name of a user-defined likelihood).
    forward_model : bool
        A forward model between the field and the data (not the identity).
    sampled_hyperparameters : bool
        Any power-spectrum hyperparameter sampled with the field (supported: parts
        ``[chains]`` of the state next to the sharded field).
    sampled_cosmology : bool
        A sampled parameter of the cosmological power spectrum (Omega_m, sigma8):
        supported (the Eisenstein-Hu table on the distinct |k|, replicated, gathered by
        the |k| index sharded as the spectrum).
    parametrisation : str
        ``model.parametrisation``.

    Returns
    -------
    str or None
        One line naming the setting and why it does not run on a mesh.
    """
    # supported; step_size_jitter is fieldnuts' option only (refused with that kind),
    # ignored by the other kinds as on one device
    del jitter_leapfrog, sampled_hyperparameters, sampled_cosmology, step_size_jitter
    spec = kinds.get(kind)
    problems = [
        (
            not spec.runs_on_mesh,
            f"sampler.kind={kind}: the mesh runs {', '.join(MESH_KINDS)}"
            + (f" ({kind}: {spec.mesh_refusal})" if spec.mesh_refusal else ""),
        ),
        (
            preconditioner not in (*MESH_PRECONDITIONERS, "diagonal"),
            f"sampler.preconditioner={preconditioner}: the mesh applies the Fourier-diagonal"
            f" metrics ({', '.join(MESH_PRECONDITIONERS)}) as maps of the target's latent and"
            " the windowed diagonal one as per-element scales",
        ),
        (
            likelihood not in MESH_LIKELIHOODS,
            f"model.likelihood.kind={likelihood}: the mesh target evaluates"
            f" {', '.join(MESH_LIKELIHOODS)} (a likelihood's per-voxel terms and constants"
            " must be known to lay them out in slabs)",
        ),
        (
            bool(forward_model),
            "model.forward: the zeldovich and lpt models paint particles by a CIC"
            " scatter-add, which DTensor computes replicated (a whole field on every device,"
            " the memory the mesh exists to split; a slab-local paint needs the particles"
            " exchanged between slabs), and a python forward function is written for whole,"
            " unsharded fields",
        ),
        (
            parametrisation not in MESH_PARAMETRISATIONS,
            f"model.parametrisation={parametrisation}: the mesh target's latent is white noise"
            f" ({', '.join(MESH_PARAMETRISATIONS)}); the centred latent's prior is a"
            " convolution in real space (not implemented)",
        ),
    ]
    for bad, reason in problems:
        if bad:
            return f"not on a mesh: {reason}"
    return None
