"""Self-conjugate modes on every grid shape: which they are, and that the imaginary part
of a tracked one is never a sampled quantity."""

import itertools

import numpy as np
import pytest

from fieldhmc import diagnostics as diag
from fieldhmc.diagnostics.modes import _independent_mode_masks

SHAPES = [(8, 8, 8), (9, 9, 9), (24, 32, 40), (6, 8, 10), (7, 8, 9), (8, 7, 6), (5, 6, 1)]


def _brute_force(shape):
    """Modes equal to their own partner -k (mod n): by conjugating an index."""
    n0, n1, n2 = shape
    out = np.zeros((n0, n1, n2 // 2 + 1), dtype=bool)
    for i, j, l in itertools.product(range(n0), range(n1), range(n2 // 2 + 1)):
        out[i, j, l] = ((-i) % n0, (-j) % n1, (-l) % n2) == (i, j, l)
    return out


@pytest.mark.parametrize("shape", SHAPES, ids=["x".join(map(str, s)) for s in SHAPES])
def test_self_conjugate_mask_on_every_shape(shape):
    mask = diag.self_conjugate_mask(shape)
    np.testing.assert_array_equal(mask, _brute_force(shape))
    assert mask.sum() == 2 ** sum(n % 2 == 0 for n in shape)
    for index in np.argwhere(mask):
        assert diag.is_self_conjugate(index, shape)
    # the FFT of a real field is real exactly there (float64: round-off only)
    field = np.random.default_rng(0).normal(size=shape)
    modes = np.fft.rfftn(field)
    assert np.abs(modes.imag[mask]).max() < 1e-10
    assert np.all(np.abs(modes.imag[~mask & _independent_mode_masks(shape)[1]]) > 0)


@pytest.mark.parametrize("shape", SHAPES, ids=["x".join(map(str, s)) for s in SHAPES])
def test_field_test_skips_exactly_the_self_conjugate_imaginary_parts(shape):
    keep_real, keep_imag = _independent_mode_masks(shape)
    assert not np.any(keep_imag & diag.self_conjugate_mask(shape))
    # one value per real degree of freedom of a real field: n0 n1 n2 in all
    assert keep_real.sum() + keep_imag.sum() == np.prod(shape)


def _posterior(rng, corner: str, chains=4, draws=400):
    post = {f"mode[0,0,1].{p}": rng.normal(size=(chains, draws)) for p in ("real", "imag")}
    post[f"{corner}.real"] = rng.normal(size=(chains, draws))
    # float32 FFT round-off: tiny, noisy, and nearly independent between draws -- but a
    # stuck-looking run of identical values in one chain makes its ESS low
    imag = 3e-6 * rng.normal(size=(chains, draws))
    imag[0, :300] = imag[0, 0]
    post[f"{corner}.imag"] = imag
    return post


@pytest.mark.parametrize(
    ("shape", "corner"),
    [
        ((24, 32, 40), "mode[12,16,20]"),
        ((32, 32, 32), "mode[16,16,16]"),
        ((9, 8, 7), "mode[0,4,0]"),
    ],
)
def test_tracked_self_conjugate_imaginary_part_is_not_sampled(shape, corner):
    """The issue's 24x32x40 case: round-off in the imaginary part counted as a sampled
    quantity with low ESS; with the grid shape it is listed as zero by symmetry."""
    rng = np.random.default_rng(3)
    posterior = _posterior(rng, corner)
    without = diag.build_summary(posterior=posterior, scalars_method="numpy")
    assert any(f"{corner}.imag" in w for w in without["warnings"])  # what happened before
    summary = diag.build_summary(posterior=posterior, scalars_method="numpy", grid_shape=shape)
    assert summary["zero_by_symmetry"] == [f"{corner}.imag"]
    assert f"{corner}.imag" not in summary["scalars"] and f"{corner}.real" in summary["scalars"]
    assert summary["warnings"] == []
    report = diag.format_report(summary)
    assert "zero by Hermitian symmetry" in report and f"{corner}.imag" in report


def test_non_self_conjugate_imaginary_parts_stay_sampled():
    names = ["mode[12,16,19].imag", "mode[1,16,20].imag", "mode[12,0,0].imag", "lp"]
    names += ["mode[0,16,20].real"]
    assert diag.zero_by_symmetry(names, (24, 32, 40)) == ["mode[12,0,0].imag"]
    assert diag.zero_by_symmetry(names, (25, 32, 40)) == []
    assert diag.zero_by_symmetry(names, None) == []
