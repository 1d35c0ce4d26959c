"""The forward-model extension point: generic construction, checks of user functions, CLI."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from fieldhmc import cli, models
from tests.models import user_forward
from tests.models.conftest import HYPER_PRIORS, LIKELIHOODS, build_model, make_power

ROOT = Path(__file__).resolve().parents[2]
NUM_CHAINS = 3


def _generic(model, forward=None, check=None):
    """The same model assembled from the public pieces: ForwardFieldModel + a Likelihood."""
    if isinstance(model, models.GaussianFieldModel):
        likelihood = models.GaussianLikelihood(model.grid, model.sigma, model.mask)
    else:
        likelihood = models.LognormalPoissonLikelihood(model.grid, model.mean_density, model.mask)
    return models.ForwardFieldModel(
        model.grid,
        make_power(),
        likelihood,
        forward,
        check_forward=check,
        parametrization=model.parametrization,
        hyper_priors=HYPER_PRIORS if model.hyper_names else None,
        dtype=model.dtype,
    )


def _identity(delta):
    return delta * 1.0


@pytest.mark.parametrize(
    ("parametrization", "sampled"),
    [("noncentred", False), ("centred", True)],
    ids=["noncentred-fixed", "centred-sampled"],
)
@pytest.mark.parametrize("likelihood", LIKELIHOODS)
def test_generic_construction_matches_numpy_reference(likelihood, parametrization, sampled):
    """Gaussian and lognormal-Poisson models built generically (identity forward, and a
    user identity *function*, checked in one case) have the independent NumPy log density."""
    model, ref = build_model("odd", likelihood, parametrization, sampled)
    draw = model.sample(seed=[1, 2], sample_shape=NUM_CHAINS)
    data = draw["data"][0].numpy()
    latents = [draw[n] for n in model.latent_names]

    def hypers(i):
        return tuple(
            float(draw[n][i]) if n in draw else model.fiducial[n]
            for n in ("log_amplitude", "index")
        )

    expected = [ref.log_prob(draw["field"][i].numpy(), data, *hypers(i)) for i in range(3)]
    # the user function's check (an XLA compile) is the same for every case: run it once
    checked = likelihood == LIKELIHOODS[0] and parametrization == "noncentred"
    for candidate in (_generic(model), _generic(model, _identity, check=checked)):
        lp = candidate.target_log_prob_fn(data)(*latents)
        np.testing.assert_allclose(lp.numpy(), expected, rtol=1e-10)
        values = {n: draw[n] for n in model.latent_names}
        jd = candidate.joint_distribution().log_prob(**values, data=tf.constant(data))
        np.testing.assert_allclose(jd.numpy(), expected, rtol=1e-10)
    np.testing.assert_allclose(
        model.target_log_prob_fn(data)(*latents).numpy(), expected, rtol=1e-10
    )
    assert model.is_gaussian_likelihood == (likelihood != "poisson_mask")
    assert not _generic(model, _identity).is_gaussian_likelihood  # forward: Wiener not exact


def test_forward_params_are_passed_and_change_the_likelihood():
    model, _ = build_model("even", "gaussian")
    grid = model.grid
    lik = models.GaussianLikelihood(grid, 0.4)
    biased = models.ForwardFieldModel(
        grid,
        make_power(),
        lik,
        user_forward.biased_tracer,
        {"bias": 2.0, "smoothing_cells": 0.0},
        dtype=tf.float64,
    )
    draw = biased.sample(seed=[3, 4], sample_shape=2)
    delta = draw["delta"]
    np.testing.assert_allclose(biased.predict(delta).numpy(), 2.0 * delta.numpy(), atol=1e-12)
    # data simulated through the forward model: residual is pure noise of sigma 0.4
    resid = draw["data"].numpy() - 2.0 * delta.numpy()
    assert 0.3 < resid.std() < 0.5
    # an unbatched delta (TFP sample_shape ()) is given a chain axis and restored
    assert biased.predict(delta[0]).shape == delta.shape[1:]


@pytest.mark.parametrize(
    ("name", "match"),
    [
        ("needs_two", "cannot be called as function"),
        ("wrong_shape", "returned shape"),
        ("wrong_dtype", "returned float32 for float64 delta"),
        ("not_differentiable", "not differentiable"),
        ("numpy_inside", "not a tf.Tensor"),
        ("rounds", "not differentiable"),
        ("raises", "raised RuntimeError: boom"),
        ("eager_only", "does not compile with XLA"),
        ("inconsistent_modes", r"from_modes\(rfft3d\(delta\)\) differs"),
    ],
)
def test_check_forward_fn_reports_each_bad_function_in_one_line(name, match):
    grid = models.Grid((6, 6, 6), 60.0)
    lik = models.GaussianLikelihood(grid, 1.0)
    with pytest.raises(models.ForwardModelError, match=match) as info:
        models.ForwardFieldModel(
            grid, make_power(), lik, getattr(user_forward, name), dtype=tf.float64
        )
    assert "\n" not in str(info.value)


def test_modes_hook_of_a_user_function_is_used_and_changes_nothing():
    """A forward function with ``from_modes``: the model calls it (not the function) and
    the log density and gradient equal those of the function without the hook."""
    grid = models.Grid((6, 6, 6), 60.0)
    lik = models.GaussianLikelihood(grid, 0.3)
    params = {"bias": 1.7, "smoothing_cells": 0.8}
    calls = []

    def plain(delta, bias, smoothing_cells):
        calls.append("delta")
        return user_forward.biased_tracer(delta, bias, smoothing_cells)

    def with_modes(delta, bias, smoothing_cells):
        calls.append("delta")
        return user_forward.biased_tracer(delta, bias, smoothing_cells)

    def from_modes(modes, **kw):
        calls.append("modes")
        return user_forward.biased_tracer_with_modes.from_modes(modes, **kw)

    with_modes.from_modes = from_modes
    built = {
        f: models.ForwardFieldModel(
            grid, make_power(), lik, f, params, check_forward=False, dtype=tf.float64
        )
        for f in (plain, with_modes)
    }
    data = built[plain].sample(seed=[5, 6])["data"]
    latents = built[plain].init_latents("prior", 2, seed=[7, 8])
    out = {}
    for f, model in built.items():
        target = model.target_log_prob_fn(data)
        calls.clear()
        with tf.GradientTape() as tape:
            tape.watch(latents)
            value = target(*latents)
        out[f] = (value.numpy(), tape.gradient(value, latents)[0].numpy())
        assert calls == (["modes"] if f is with_modes else ["delta"])
    np.testing.assert_allclose(out[with_modes][0], out[plain][0], rtol=1e-12)
    np.testing.assert_allclose(out[with_modes][1], out[plain][1], atol=1e-10)
    # the registered example passes the checks (consistency, gradient, XLA)
    delta = built[plain].field_from_latents(*latents)
    models.check_forward_fn(user_forward.biased_tracer_with_modes, delta, params)


def test_check_forward_fn_other_failures():
    delta = tf.random.stateless_normal([2, 4, 4, 4], [1, 2])
    with pytest.raises(models.ForwardModelError, match="identically zero"):
        models.check_forward_fn(tf.sign, delta)
    with pytest.raises(models.ForwardModelError, match="non-finite values"):
        models.check_forward_fn(lambda d: d / 0.0, delta)
    with pytest.raises(models.ForwardModelError, match=r"function\(delta, scale=...\)"):
        models.check_forward_fn(lambda d: d, delta, {"scale": 2.0})
    models.check_forward_fn(lambda d, scale: scale * d, delta, {"scale": 2.0})  # fine

    def bad_hook(d):
        return d * 1.0

    bad_hook.from_modes = 3.0
    with pytest.raises(models.ForwardModelError, match="from_modes is a float"):
        models.check_forward_fn(bad_hook, delta)


def test_load_forward_target(tmp_path):
    fn = models.load_forward_target("tests.models.user_forward:biased_tracer")
    assert fn is user_forward.biased_tracer
    file = tmp_path / "my_forward.py"
    file.write_text("def square(delta):\n    return delta * delta\n")
    assert models.load_forward_target(f"{file}:square")(3.0) == 9.0
    cases = {
        "no_colon": "must be 'module:function'",
        "nosuchpkg_xyz.mod:f": "cannot import 'nosuchpkg_xyz.mod': ModuleNotFoundError",
        "tests.models.user_forward:missing": "has no attribute 'missing'",
        "tests.models.user_forward:NOT_A_FUNCTION": "is a float, not a function",
        f"{tmp_path / 'absent.py'}:f": "cannot import",
    }
    for target, match in cases.items():
        with pytest.raises(models.ForwardModelError, match=match):
            models.load_forward_target(target)
    broken = tmp_path / "broken.py"
    broken.write_text("import nosuchpkg_xyz\n")
    with pytest.raises(models.ForwardModelError, match="ModuleNotFoundError"):
        models.load_forward_target(f"{broken}:f")


# --- from YAML, through the CLI -------------------------------------------------------------
def _config(tmp_path: Path, forward: str) -> Path:
    path = tmp_path / "user.yaml"
    path.write_text(
        "grid: {shape: [8, 8, 8], box_size: 80.0}\n"
        "model:\n"
        f"  forward: {forward}\n"
        "  likelihood: {kind: gaussian, sigma: 0.5}\n"
        "sampler: {kind: hmc, num_chains: 2, num_burnin_steps: 20, num_results: 24,\n"
        "          chunk_size: 12, num_leapfrog_steps: 8, preconditioner: posterior}\n"
        "outputs: {field_thin: 2, tracked_modes: 4}\n"
    )
    return path


def test_user_function_from_yaml_runs_end_to_end(tmp_path, capsys):
    import json

    forward = (
        '{kind: python, target: "tests.models.user_forward:biased_tracer", '
        "params: {bias: 1.5, smoothing_cells: 0.5}}"
    )
    config = _config(tmp_path, forward)
    # validate imports and checks the function (as run does) and writes nothing
    assert cli.main(["validate", str(config)]) == 0
    assert "forward tests.models.user_forward:biased_tracer checked" in capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["user.yaml"]
    out = tmp_path / "run"
    assert cli.main(["-q", "run", str(config), "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["num_draws"] == 24
    truth, data = np.load(out / "data" / "truth.npy"), np.load(out / "data" / "data.npy")
    # data are the forward-modelled truth plus noise of sigma 0.5
    pred = user_forward.biased_tracer(tf.constant(truth[None]), 1.5, 0.5).numpy()[0]
    assert 0.4 < np.std(data - pred) < 0.6
    assert "biased_tracer" in (out / "config.yaml").read_text()


@pytest.mark.parametrize(
    ("target", "match"),
    [
        ("nosuchpkg_xyz.mod:f", "cannot import"),
        ("tests.models.user_forward:needs_two", "cannot be called as function"),
        ("tests.models.user_forward:wrong_shape", "returned shape"),
        ("tests.models.user_forward:wrong_dtype", "returned float64 for float32 delta"),
        ("tests.models.user_forward:not_differentiable", "not differentiable"),
    ],
)
def test_bad_user_function_exits_2_in_one_line_and_writes_nothing(tmp_path, capsys, target, match):
    config = _config(tmp_path, f'{{kind: python, target: "{target}"}}')
    for command in ("run", "simulate"):
        out = tmp_path / f"out-{command}"
        capsys.readouterr()
        assert cli.main(["-q", command, str(config), "--out", str(out)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1, err
        assert err[0].startswith("config error: model.forward.target:") and match in err[0]
        assert not out.exists()
    # validate imports and checks the function as run does; it writes nothing
    before = sorted(p.name for p in tmp_path.iterdir())
    capsys.readouterr()
    assert cli.main(["-q", "validate", str(config)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("config error: model.forward.target:") and match in err[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_docs_example_is_the_tested_user_function():
    """The function printed in docs/forward-models.md is the one the tests run."""
    import inspect

    text = (ROOT / "docs" / "forward-models.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    source = inspect.getsource(user_forward.biased_tracer)
    assert source in blocks


def test_forward_config_validation(tmp_path):
    from fieldhmc.config import ConfigError, config_from_dict

    def load(forward, **extra):
        return config_from_dict({"model": {"forward": forward}, **extra}, tmp_path)

    za = load({"kind": "zeldovich", "growth": 0.8, "smoothing": 4.0}).model.forward
    assert (za.growth, za.smoothing, za.target, za.params) == (0.8, 4.0, None, None)
    py = load({"kind": "python", "target": "a.b:c"}).model.forward
    assert (py.params, py.growth, py.smoothing) == ({}, None, None)
    (tmp_path / "f.py").write_text("def f(delta, a=None, b=None):\n    return delta\n")
    config = load({"kind": "python", "target": "f.py:f", "params": {"a": [1, 2.5], "b": "x"}})
    assert config.model.forward.target == f"{tmp_path / 'f.py'}:f"
    assert config_from_dict(config.to_dict(), "/") == config
    bad = {
        "target: required when model.forward.kind=python": {"kind": "python"},
        "target: must be 'package.module:function'": {"kind": "python", "target": "a b"},
        "target: only used when model.forward.kind=python": {"kind": "zeldovich", "target": "a:b"},
        "growth: only used when model.forward.kind=zeldovich": {
            "kind": "python",
            "target": "a:b",
            "growth": 2.0,
        },
        "smoothing: must be >= 0.0 (got -1.0)": {
            "kind": "zeldovich",
            "smoothing": -1.0,
        },
        "params.x: must be a number, string, bool or a list": {
            "kind": "python",
            "target": "a:b",
            "params": {"x": [{"y": 1}]},
        },
        "params.x.y: unknown key (allowed: sample, prior)": {
            "kind": "python",
            "target": "a:b",
            "params": {"x": {"y": 1, "prior": {"kind": "normal", "loc": 0.0, "scale": 1.0}}},
        },
        "params.x.prior: required key is missing": {
            "kind": "python",
            "target": "a:b",
            "params": {"x": {"sample": True}},
        },
        "target: file not found": {"kind": "python", "target": "absent.py:f"},
        "kind: must be 'python', 'zeldovich' or 'lpt' (got 'lpt2')": {"kind": "lpt2"},
    }
    for match, forward in bad.items():
        with pytest.raises(ConfigError, match=re.escape(match.split(": ", 1)[1][:30])) as info:
            load(forward)
        assert f"model.forward.{match.split(':')[0]}" in str(info.value), str(info.value)
    # a parameter the function does not accept: found from its source, before TensorFlow
    with pytest.raises(ConfigError, match=r"params.zz: f\(delta, a, b\) does not accept"):
        load({"kind": "python", "target": "f.py:f", "params": {"zz": 1}})
    with pytest.raises(ConfigError, match="sampler.init: wiener needs the identity forward"):
        load({"kind": "zeldovich"}, sampler={"init": "wiener"})
