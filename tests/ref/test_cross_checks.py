"""Second, independent checks of statements that one test guarded.

Each check reaches the statement by another route than its first test: another library
or precision, an exact enumeration instead of a statistical test, or the specification's
text instead of the implementation's defaults.
"""

from __future__ import annotations

import math

import _paths
import mpmath
import numpy as np
import pytest
from scipy import stats

from plsh_ref import bounds as bd
from plsh_ref import expectation as ex
from plsh_ref import toeplitz as tp
from plsh_ref.mp_attention import alibi_attention_mp, plsh_attention_mp, weighted_attention_mp
from plsh_ref.partition import draw_partition
from plsh_ref.testing.tolerance import allowed_error, assert_close_to_reference, dtype_eps

ROOT = _paths.ROOT
EPS = np.finfo(np.float64).eps


# ---------------------------------------------------------------- collision closed form
@pytest.mark.parametrize("sigma", [0.3, 1.0, 7.5, 300.0])
def test_collision_probability_is_the_triangle_integral_at_40_digits(sigma):
    # proofs_notes/collision_probability.md sections 1-2: E[(1 - r/delta)^+] over
    # delta ~ Gamma(2, sigma), by mpmath quadrature at 40 digits (the first test uses
    # scipy's quad in float64 against numpy's exp), against the mpmath closed form.
    with mpmath.workdps(40):
        sig = mpmath.mpf(sigma)
        for r in (0, 1, 3, 17):
            integral = mpmath.quad(
                lambda d, r=r: (1 - r / d) * d * mpmath.exp(-d / sig) / sig**2,
                [r, r + sig, mpmath.inf],
            )
            closed = ex.collision_probability_mp(r, sigma, dps=40)
            assert abs(integral - closed) <= mpmath.mpf(10) ** -35
            assert ex.collision_probability(r, sigma) == pytest.approx(float(closed), rel=4 * EPS)


def test_exponential_pitch_kernel_of_the_note():
    # The note's converse: an exponential pitch gives e^-x - x E1(x), x = r / sigma, not
    # the ALiBi kernel (the law that the negative controls draw from).
    with mpmath.workdps(30):
        sig = mpmath.mpf(4)
        for r in (1, 5, 20):
            integral = mpmath.quad(
                lambda d, r=r: (1 - r / d) * mpmath.exp(-d / sig) / sig, [r, r + sig, mpmath.inf]
            )
            x = r / sig
            assert abs(integral - (mpmath.exp(-x) - x * mpmath.e1(x))) < mpmath.mpf(10) ** -25
            assert abs(integral - mpmath.exp(-x)) > mpmath.mpf(10) ** -3


# ---------------------------------------------------------------- largest pitch law
@pytest.mark.parametrize("s", [1, 7, 4096])
def test_largest_pitch_cdf_and_sf_have_relative_accuracy_in_both_tails(s):
    # (1 - (1 + x) e^-x)^s at 50 digits, from b = 1e-8 sigma (the CDF is about
    # (x^2/2)^s there; computed from the tail it used to be 0 or wrong in the 6th digit)
    # to the far right tail (the SF is about s (1 + x) e^-x).
    sigma = 2.0
    for x in (1e-8, 1e-5, 1e-3, 0.1, 1.0, 10.0, 100.0, 600.0):
        b = x * sigma
        with mpmath.workdps(50):
            xm = mpmath.mpf(b) / sigma
            cdf = (1 - (1 + xm) * mpmath.exp(-xm)) ** s
            sf = 1 - cdf
            cdf, sf = float(cdf), float(sf)
        if cdf > 1e-300:
            assert ex.largest_pitch_cdf(b, sigma, s) == pytest.approx(cdf, rel=64 * s * EPS)
        if sf > 1e-300:
            assert ex.largest_pitch_sf(b, sigma, s) == pytest.approx(sf, rel=64 * s * EPS)


def test_largest_pitch_density_integrates_to_the_cdf():
    # d/db F(b)^s = s F^(s-1) f(b) with f the Gamma(2, sigma) density: scipy's quad of the
    # density of the maximum reproduces the closed-form CDF (no formula shared).
    from scipy import integrate

    sigma, s = 3.0, 5
    g = stats.gamma(2.0, scale=sigma)
    for b in (0.5, 4.0, 20.0):
        value, err = integrate.quad(lambda t: s * g.cdf(t) ** (s - 1) * g.pdf(t), 0, b)
        assert err < 1e-8
        assert ex.largest_pitch_cdf(b, sigma, s) == pytest.approx(value, rel=1e-9, abs=1e-13)


# ---------------------------------------------------------------- mpmath global precision
def test_every_mpmath_entry_point_leaves_the_global_context_alone():
    # The first test checks the two attention functions at round dps values; here every
    # public function that takes dps, with a binary precision that is no dps value
    # (mp.prec = 113), and the results do not depend on it.
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 1, 3, 2)) for _ in range(3))
    part = draw_partition([2.0], 2, seed=0)
    calls = [
        lambda: alibi_attention_mp(q, k, v, slopes=[0.5], return_lse=True, dps=25)[0],
        lambda: plsh_attention_mp(q, k, v, partition=part, return_lse=True, dps=25)[0],
        lambda: weighted_attention_mp(q, k, v, np.ones((1, 3, 3)), dps=25)[0],
        lambda: [ex.collision_probability_mp(3, 2.0, dps=25)],
        lambda: tp.kms_angles_mp(4, 2.0, dps=25),
        lambda: tp.kms_eigenvalues_mp(4, 2.0, dps=25),
    ]
    saved = (mpmath.mp.dps, mpmath.mp.prec)
    try:
        results = {}
        for prec in (113, 53, 300):
            mpmath.mp.prec = prec
            for i, call in enumerate(calls):
                out = [x for x in np.ravel(np.asarray(call(), dtype=object))]
                assert mpmath.mp.prec == prec, i
                results.setdefault(i, []).append(out)  # mpf(x) here would round to prec
        for i, runs in results.items():
            for other in runs[1:]:
                with mpmath.workdps(30):
                    assert all(
                        abs(a - b) <= mpmath.mpf(10) ** -23 * max(1, abs(b))
                        for a, b in zip(other, runs[0])
                    ), i
    finally:
        mpmath.mp.dps, mpmath.mp.prec = saved[0], saved[1]
    assert (mpmath.mp.dps, mpmath.mp.prec) == saved


# ---------------------------------------------------------------- check_finite
def test_check_finite_refuses_each_argument_and_leaves_results_alone():
    torch = pytest.importorskip("torch")
    from plsh_fast import plsh_attention

    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 9, 4, generator=gen) for _ in range(3))
    a = plsh_attention(q, k, v, seed=1, num_samples=4)
    b = plsh_attention(q, k, v, seed=1, num_samples=4, check_finite=False)
    assert torch.equal(a, b)  # the check reads the inputs only
    for name, index in (("query", 0), ("key", 1), ("value", 2)):
        for bad in (float("nan"), float("inf"), -float("inf")):
            args = [q.clone(), k.clone(), v.clone()]
            args[index][0, 1, 4, 2] = bad
            with pytest.raises(ValueError, match=f"^{name}"):
                plsh_attention(*args, seed=1, num_samples=4)
            plsh_attention(*args, seed=1, num_samples=4, check_finite=False)  # no error


# ---------------------------------------------------------------- tolerance factor
def test_tolerance_defaults_are_the_numbers_of_spec_section_6():
    # The SPEC text (docs/spec.md section 6) against the implementation's defaults.
    text = (ROOT / "docs" / "spec.md").read_text()
    section = text[text.index("## 6.") : text.index("## 7.")]
    factor = float(section.split("max|out - ref| <= ")[1].split()[0])
    ref = np.array([0.25, -1.5, 3.0])
    baseline = ref + np.array([0.0, 1e-3, 0.0])
    floor = allowed_error(ref, ref, "float32")  # no baseline error: the floor alone
    assert floor == pytest.approx(4 * dtype_eps("float32") * 3.0, rel=1e-15)  # "a few ulps"
    assert allowed_error(ref, baseline, "float32") == pytest.approx(factor * 1e-3 + floor)
    # and at the boundary, through the assertion users call
    assert_close_to_reference(
        ref + [0.0, 0.0, 0.99 * (factor * 1e-3 + floor)], ref, baseline, "float32"
    )
    with pytest.raises(AssertionError):
        assert_close_to_reference(
            ref + [0.0, 0.0, 1.01 * (factor * 1e-3 + floor)], ref, baseline, "float32"
        )


# ---------------------------------------------------------------- DKW constant
def _exact_max_norm_tail_n2(s: int, rho: float, eps: float) -> float:
    """P(|C/s - rho| > eps), C ~ Binomial(s, rho): the max-norm error for n = 2 positions."""
    k = np.arange(s + 1)
    return float(stats.binom.pmf(k, s, rho)[np.abs(k / s - rho) > eps].sum())


def _exact_max_norm_tail_n3(s: int, rho: float, eps: float) -> float:
    """Positions 0, 1, 2: one hash makes blocks {012}, {01|2}, {0|12} or {0|1|2} with
    probabilities rho^2, rho - rho^2, rho - rho^2, (1 - rho)^2 (collision_probability.md);
    s hashes are multinomial. Sum over every count vector."""
    probs = [rho**2, rho - rho**2, rho - rho**2, (1 - rho) ** 2]
    total = 0.0
    for a in range(s + 1):
        for b in range(s + 1 - a):
            for c in range(s + 1 - a - b):
                d = s - a - b - c
                errors = (
                    abs((a + b) / s - rho),  # M~_01
                    abs((a + c) / s - rho),  # M~_12
                    abs(a / s - rho**2),  # M~_02
                )
                if max(errors) > eps:
                    total += stats.multinomial.pmf([a, b, c, d], s, probs)
    return total


def test_max_norm_bound_constant_pinned_by_exact_small_cases():
    # The coverage test draws samples and cannot tell 2 (n-1) exp(-2 s eps^2) from twice or
    # half that. Exactly, for n = 2 and 3 positions and s <= 8: the bound holds at every
    # eps of a fine grid (so the constant is not too small to be valid), the bound with
    # half the constant fails somewhere for n = 2 (so 2 is needed: 1 would be wrong), and
    # the unclipped bound is exactly 2 (n - 1) exp(-2 s eps^2) (so it is not 4).
    grid = np.linspace(0.005, 0.995, 199)
    halved_fails = False
    for sigma in (0.7, 2.0, 8.0):
        rho = math.exp(-1.0 / sigma)
        for s in (1, 2, 3, 5, 8):
            for eps in grid:
                bound = bd.max_norm_tail_bound(2, s, eps)
                exact2 = _exact_max_norm_tail_n2(s, rho, eps)
                assert exact2 <= bound + 1e-12, (sigma, s, eps)
                halved_fails |= exact2 > min(1.0, 0.5 * 2 * math.exp(-2 * s * eps**2)) + 1e-9
                if s <= 5 and round(eps * 1000) % 50 == 5:  # n = 3 on a coarser grid
                    exact3 = _exact_max_norm_tail_n3(s, rho, eps)
                    assert exact3 <= bd.max_norm_tail_bound(3, s, eps) + 1e-12
            unclipped = 2 * (3 - 1) * math.exp(-2 * s * 0.9**2)
            if unclipped < 1:
                assert bd.max_norm_tail_bound(3, s, 0.9) == pytest.approx(unclipped, rel=1e-14)
    assert halved_fails
