"""Deterministic tests of plsh_ref.bounds: formulas, inverses, the output certificate and
the counterexample to the signed-sum version. Coverage (probability) tests are in
tests/ref/test_statistics.py."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from plsh_ref import bounds as bd
from plsh_ref.alibi import alibi_slopes, kernel_matrix
from plsh_ref.attention import alibi_attention, plsh_attention
from plsh_ref.expectation import largest_pitch_sf, variance_proxy_limit
from plsh_ref.partition import PartitionSample, draw_partition, empirical_mean

# ---------------------------------------------------------------- max norm


@settings(max_examples=30)
@given(n=st.integers(2, 10**6), eps=st.floats(0.01, 0.99), delta=st.floats(1e-9, 0.99))
def test_required_samples_is_the_smallest(n, eps, delta):
    s = bd.required_samples(n, eps, delta)
    assert bd.max_norm_tail_bound(n, s, eps) <= delta
    if s > 1:
        assert bd.max_norm_tail_bound(n, s - 1, eps) > delta
    # and the error bound at s is below eps
    assert bd.max_norm_error_bound(n, s, delta) <= eps * (1 + 1e-12)


def test_max_norm_formulas():
    assert bd.max_norm_tail_bound(100, 150, 0.2) == pytest.approx(
        2 * 99 * math.exp(-2 * 150 * 0.04)
    )
    assert bd.max_norm_tail_bound(100, 1, 0.01) == 1.0
    eps = bd.max_norm_error_bound(512, 64, 0.05)
    assert bd.max_norm_tail_bound(512, 64, eps) == pytest.approx(0.05, rel=1e-12)
    assert bd.max_norm_tail_bound(1, 3, 0.5) == 0.0 and bd.required_samples(1, 0.5, 0.5) == 1


# ---------------------------------------------------------------- block size


@pytest.mark.parametrize(
    "sigma, s, delta",
    # delta < 2^-53: 1 - delta rounds to 1 (the bound asked a quantile at q = 1 and failed)
    [(0.5, 1, 0.5), (4.0, 16, 0.01), (256.0, 64, 1e-6), (16.0, 16, 1e-17), (16.0, 16, 1e-300)],
)
def test_block_size_bound_is_smallest_integer(sigma, s, delta):
    b = bd.block_size_bound(sigma, s, delta)
    assert bd.block_size_tail_bound(b, sigma, s) <= delta
    assert b == 0 or bd.block_size_tail_bound(b - 1, sigma, s) > delta
    assert bd.block_size_tail_bound(b, sigma, s) == largest_pitch_sf(float(b), sigma, s)


def test_bounds_for_a_delta_below_the_binary64_resolution_of_one():
    # 1 - 1e-17 == 1.0: the block bound grows past the one at 1e-16, and the spectral bound
    # (whose truncation levels came from quantiles at 1 - frac delta) is finite.
    assert bd.block_size_bound(16.0, 16, 1e-17) > bd.block_size_bound(16.0, 16, 1e-16)
    for sampler in ("stratified", "shared"):
        b = bd.block_size_bound(16.0, 16, 1e-17, sampler=sampler, group_size=4)
        assert bd.block_size_tail_bound(b, 16.0, 16, sampler=sampler, group_size=4) <= 1e-17
        assert bd.block_size_tail_bound(b - 1, 16.0, 16, sampler=sampler, group_size=4) > 1e-17
    tight = bd.spectral_error_bound(256, 16.0, 16, 1e-16)
    tiny = bd.spectral_error_bound(256, 16.0, 16, 1e-17)
    assert math.isfinite(tiny.eps) and tiny.eps > tight.eps
    assert tiny.truncation_probability < 1e-17


@settings(max_examples=20)
@given(sigma=st.floats(0.3, 20.0), seed=st.integers(0, 2**32 - 1), s=st.integers(1, 8))
def test_blocks_never_exceed_ceil_pitch(sigma, seed, s):
    # The deterministic fact behind the block-size bound: a block holds <= ceil(pitch) tokens.
    from plsh_ref.partition import block_sizes

    part = draw_partition([sigma], s, seed)
    sizes = block_sizes(part, np.arange(-30, 200))[0]
    for t in range(s):
        assert sizes[t].max() <= math.ceil(part.pitch[0, t])


# ---------------------------------------------------------------- spectral norm


def test_spectral_bound_components():
    sb = bd.spectral_error_bound(64, 4.0, 16, 0.1)
    assert sb.eps == pytest.approx(sb.bernstein + sb.bias)
    assert sb.truncation_probability < 0.1
    assert sb.variance_proxy <= variance_proxy_limit(4.0)
    # The Bernstein part solves 2n exp(-s tau^2 / (2 (v + R tau/3))) = delta - p_trunc.
    tail = (
        2
        * 64
        * math.exp(
            -16 * sb.bernstein**2 / (2 * (sb.variance_proxy + sb.range_bound * sb.bernstein / 3))
        )
    )
    assert tail == pytest.approx(0.1 - sb.truncation_probability, rel=1e-9)
    # Limit proxy for large n, and the tail bound agrees with the error bound.
    big = bd.spectral_error_bound(5000, 4.0, 16, 0.1)
    assert big.variance_proxy == variance_proxy_limit(4.0)
    assert bd.spectral_tail_bound(64, 4.0, 16, sb.eps * 1.05) <= 0.1


def test_spectral_bound_decreases_like_inverse_sqrt_s():
    eps = [bd.spectral_error_bound(128, 8.0, s, 0.05).eps for s in (10**3, 10**4, 10**5)]
    assert all(a > b for a, b in zip(eps, eps[1:]))
    ratio = eps[1] / eps[2]
    assert 2.9 < ratio < 3.5  # sqrt(10) = 3.16 once the range term is negligible


def test_spectral_required_samples():
    s = bd.spectral_required_samples(64, 2.0, 1.0, 0.1)
    assert bd.spectral_error_bound(64, 2.0, s, 0.1).eps <= 1.0
    assert bd.spectral_error_bound(64, 2.0, s - 1, 0.1).eps > 1.0


def test_spectral_bounds_for_sigma_whose_variance_limit_underflows():
    """Bug fix: above EXACT_VARIANCE_MAX_N the variance proxy is the closed-form limit,
    which is exactly 0.0 in binary64 for sigma below about 0.0014; spectral_required_samples
    passed that 0 back as ``variance`` and was refused ("variance: must be ... > 0")."""
    n = bd.EXACT_VARIANCE_MAX_N + 1
    assert variance_proxy_limit(1e-3) == 0.0  # the premise: the limit underflows
    s = bd.spectral_required_samples(n, 1e-3, 1.0, 0.01)
    bound = bd.spectral_error_bound(n, 1e-3, s, 0.01)
    assert bound.variance_proxy == 0.0 and bound.eps <= 1.0
    # a zero proxy is the range term alone: it gives a smaller eps than any positive one
    assert bound.eps < bd.spectral_error_bound(n, 1e-3, s, 0.01, variance=1e-3).eps
    with pytest.raises(ValueError, match="^variance"):
        bd.spectral_error_bound(n, 1e-3, s, 0.01, variance=-1e-300)


def test_no_truncation_needed_when_n_small():
    # n = 3 and a large sigma: ||M_t|| <= 3 always; level k = n carries no probability.
    sb = bd.spectral_error_bound(3, 50.0, 200, 0.1)
    assert sb.truncation >= 3 and sb.truncation_probability == 0.0 and sb.bias == 0.0


# ---------------------------------------------------------------- attention output


def _qkv(rng, batch, heads, n, d, dv=None):
    dv = d if dv is None else dv
    return (
        rng.normal(size=(batch, heads, n, d)),
        rng.normal(size=(batch, heads, n, d)),
        rng.normal(size=(batch, heads, n, dv)),
    )


@settings(max_examples=15)
@given(
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(1, 24),
    s=st.integers(1, 6),
    causal=st.booleans(),
    logit_scale=st.floats(0.1, 3.0),
)
def test_certificate_bounds_the_actual_error(seed, n, s, causal, logit_scale):
    rng = np.random.default_rng(seed)
    q, k, v = _qkv(rng, 1, 2, n, 4, 3)
    slopes = np.array([0.5, 0.125])
    part = draw_partition(1 / slopes, s, seed)
    out_t, _ = plsh_attention(
        q, k, v, partition=part, causal=causal, scale=logit_scale, return_lse=True
    )
    out_s, _ = alibi_attention(
        q, k, v, slopes=slopes, causal=causal, scale=logit_scale, return_lse=True
    )
    cert = bd.output_error_certificate(
        q, k, v, part, slopes=slopes, causal=causal, scale=logit_scale
    )
    # Slack only for float64 rounding of the two attention outputs (|v| = O(1)).
    assert np.all(np.abs(out_t - out_s) <= cert + 1e-12)


def test_certificate_with_empty_plsh_row():
    # Query at 5, keys 0..2, causal: M~ is 0 on the whole row (different bins) while L* > 0.
    part = PartitionSample([[1.0]], [[0.5]])
    rng = np.random.default_rng(0)
    q = rng.normal(size=(1, 1, 1, 2))
    k = rng.normal(size=(1, 1, 3, 2))
    v = rng.normal(size=(1, 1, 3, 2)) + 5.0
    kw = dict(slopes=[0.5], causal=True, query_positions=[5], key_positions=[0, 1, 2])
    out_t, _ = plsh_attention(
        q,
        k,
        v,
        partition=part,
        causal=True,
        query_positions=[5],
        key_positions=[0, 1, 2],
        return_lse=True,
    )
    out_s, _ = alibi_attention(q, k, v, **kw, return_lse=True)
    assert np.all(out_t == 0)
    cert = bd.output_error_certificate(q, k, v, part, **kw)
    assert np.all(np.abs(out_t - out_s) <= cert)


def _signed_sum_bound(q, k, v, part, slopes, scale, causal=True):
    """The FALSE version: range_k(V) |sum_j A_ij (M~_ij - L*_ij)| / sum_j A_ij L*_ij."""
    n = q.shape[2]
    pos = np.arange(n)
    a = np.exp(scale * np.einsum("bhid,bhjd->bhij", q, k))
    lstar = kernel_matrix(1 / np.asarray(slopes), pos, pos, causal=causal)
    mt = empirical_mean(part, pos, pos, causal=causal)
    signed = np.abs(np.sum(a * (mt - lstar)[None], axis=-1))
    z = np.sum(a * lstar[None], axis=-1)
    rng_v = v.max(axis=2, keepdims=True) - v.min(axis=2, keepdims=True)
    return rng_v * (signed / z)[..., None]


def test_signed_sum_version_is_false():
    # proofs_notes/output_bound.md: positions 0, 1, 2; one sample with bins {0}, {1, 2};
    # keys weighted so that A (M~ - L*) sums to zero on row 2 while T~_2 != T*_2.
    sigma = 2.0
    rho = math.exp(-1 / sigma)
    part = PartitionSample([[2.0]], [[0.5]])  # bins: 0 -> -1, 1 -> 0, 2 -> 0
    a_weights = np.array([1 - rho, rho**2, 1.0])  # row 2: E = (-rho^2, 1 - rho, 0) o A
    q = np.ones((1, 1, 3, 1))
    k = np.log(a_weights)[None, None, :, None]
    v = np.array([0.0, 1.0, 0.0])[None, None, :, None]
    slopes = [1 / sigma]
    out_t, _ = plsh_attention(q, k, v, partition=part, causal=True, scale=1.0, return_lse=True)
    out_s, _ = alibi_attention(q, k, v, slopes=slopes, causal=True, scale=1.0, return_lse=True)
    actual = np.abs(out_t - out_s)[0, 0, 2, 0]
    false_bound = _signed_sum_bound(q, k, v, part, slopes, 1.0)[0, 0, 2, 0]
    true_bound = bd.output_error_certificate(q, k, v, part, slopes=slopes, causal=True, scale=1.0)[
        0, 0, 2, 0
    ]
    assert false_bound < 1e-15  # the signed sum cancels exactly (up to rounding)
    assert actual > 0.1  # but the outputs differ by a lot
    assert actual <= true_bound + 1e-15  # while the absolute-value certificate holds


def test_signed_sum_version_fails_on_random_inputs_too():
    # Not only a constructed case: with a drawn partition and random Q/K/V the signed-sum
    # "bound" is violated on some rows (deterministic seeds; checked to happen).
    rng = np.random.default_rng(3)
    q, k, v = _qkv(rng, 1, 1, 48, 8)
    slopes = [0.25]
    part = draw_partition([4.0], 4, 11)
    out_t, _ = plsh_attention(q, k, v, partition=part, causal=True, return_lse=True)
    out_s, _ = alibi_attention(q, k, v, slopes=slopes, causal=True, return_lse=True)
    false_bound = _signed_sum_bound(q, k, v, part, slopes, 1 / math.sqrt(8))
    assert np.any(np.abs(out_t - out_s) > false_bound * (1 + 1e-9) + 1e-12)


def test_apriori_bound_dominates_certificate_on_the_event():
    # On the event max|M~ - L*| <= eps, sum_j A |M~ - L*| <= eps sum_j A: the a-priori
    # bound is at least the certificate wherever the event holds.
    rng = np.random.default_rng(5)
    q, k, v = _qkv(rng, 2, 2, 32, 4)
    slopes = alibi_slopes(2)
    part = draw_partition(1 / slopes, 512, 1)
    mt = empirical_mean(part, np.arange(32), np.arange(32), causal=True)
    lstar = kernel_matrix(1 / slopes, np.arange(32), np.arange(32), causal=True)
    eps = bd.max_norm_error_bound(32, 512, 0.1 / 2)
    assert np.max(np.abs(mt - lstar)) <= eps  # holds for this seed
    cert = bd.output_error_certificate(q, k, v, part, slopes=slopes)
    prior = bd.output_error_bound(q, k, v, 512, 0.1, slopes=slopes)
    assert np.all(cert <= prior * (1 + 1e-12) + 1e-15)


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "call, name",
    [
        (lambda: bd.max_norm_tail_bound(0, 4, 0.1), "n"),
        (lambda: bd.max_norm_tail_bound(5, 4, 0.0), "eps"),
        (lambda: bd.max_norm_tail_bound(5, 4, 1.0), "eps"),
        (lambda: bd.max_norm_error_bound(5, 0, 0.1), "num_samples"),
        (lambda: bd.max_norm_error_bound(5, 4, 1.5), "delta"),
        (lambda: bd.required_samples(5, 1.2, 0.1), "eps"),
        (lambda: bd.required_samples(5, 0.1, 0.0), "delta"),
        (lambda: bd.required_samples(0, 0.1, 0.1), "n"),
        (lambda: bd.block_size_bound(0.0, 4, 0.1), "sigma"),
        (lambda: bd.block_size_bound(2.0, 4, -0.1), "delta"),
        (lambda: bd.block_size_tail_bound(-1, 2.0, 4), "b"),
        (lambda: bd.spectral_error_bound(0, 2.0, 4, 0.1), "n"),
        (lambda: bd.spectral_error_bound(8, -2.0, 4, 0.1), "sigma"),
        (lambda: bd.spectral_error_bound(8, 2.0, 4, 1.0), "delta"),
        (lambda: bd.spectral_tail_bound(8, 2.0, 4, 0.0), "eps"),
        (lambda: bd.spectral_required_samples(8, 2.0, 1.0, 0.0), "delta"),
        (
            lambda: bd.output_error_bound(
                np.ones((1, 1, 2, 2)), np.ones((1, 1, 2, 2)), np.ones((1, 1, 2, 2)), 4, 1.0
            ),
            "delta",
        ),
        (
            lambda: bd.output_error_bound(
                np.ones((1, 1, 2, 2)), np.ones((1, 1, 2, 2)), np.ones((1, 1, 2, 2)), 0, 0.5
            ),
            "num_samples",
        ),
    ],
)
def test_bad_input(call, name):
    with pytest.raises(ValueError, match=f"^{name}"):
        call()


def test_certificate_rejects_wrong_partition():
    q = np.ones((1, 2, 3, 2))
    with pytest.raises(ValueError, match="^partition"):
        bd.output_error_certificate(q, q, q, draw_partition([2.0], 2, 0))
    with pytest.raises(TypeError, match="^partition"):
        bd.output_error_certificate(q, q, q, "not a partition")


def test_plsh_bounds_command(capsys):
    from plsh_ref.cli import main
    from plsh_ref.experiments.bounds_report import rows

    assert main(["bounds", "--n", "128", "--sigma", "2", "8", "--num-samples", "8"]) == 0
    text = capsys.readouterr().out
    assert "max|M~-L*|" in text and len(text.strip().splitlines()) == 5
    (r,) = rows(128, [2.0], 8, 0.1, 0.01)
    assert r["max_norm_eps"] == bd.max_norm_error_bound(128, 8, 0.01)
    assert r["s_max_norm"] == bd.required_samples(128, 0.1, 0.01)
    with pytest.raises(ValueError, match="^eps"):
        rows(128, [2.0], 8, 1.5, 0.01)
    with pytest.raises(ValueError, match="^sigma"):
        rows(128, [-2.0], 8, 0.1, 0.01)


def test_one_position_has_zero_variance_proxy():
    # n = 1: M_t = L* = [[1]] for every sample, so the exact proxy is 0; 1e-300 was added
    # to it (and printed by `plsh bounds --n 1`) from when a zero proxy was refused
    from plsh_ref.bounds import spectral_error_bound

    got = spectral_error_bound(1, 4.0, 16, 0.01)
    assert got.variance_proxy == 0.0
    assert got.eps == spectral_error_bound(1, 4.0, 16, 0.01, variance=0.0).eps


@pytest.mark.parametrize("causal", [True, False])
def test_output_bounds_without_keys_are_zero_like_the_outputs(causal):
    # n_k = 0: every row has no admissible key, both outputs are 0 (plsh_ref.attention), so
    # both bounds are 0 with the output's shape; they used to raise numpy's "zero-size
    # array to reduction operation maximum" instead. n_q = 0 gives empty bounds.
    rng = np.random.default_rng(0)
    q = rng.standard_normal((2, 2, 4, 8))
    k, v = rng.standard_normal((2, 2, 0, 8)), rng.standard_normal((2, 2, 0, 3))
    partition = draw_partition(np.array([2.0, 4.0]), 16, seed=0)
    kw = dict(causal=causal, query_positions=np.arange(4), key_positions=np.arange(0))
    cert = bd.output_error_certificate(q, k, v, partition, **kw)
    bound = bd.output_error_bound(q, k, v, 16, 0.1, **kw)
    gap = np.abs(
        plsh_attention(q, k, v, partition=partition, return_lse=False, **kw)
        - alibi_attention(q, k, v, return_lse=False, **kw)
    )
    for b in (cert, bound):
        assert b.shape == (2, 2, 4, 3) and np.all(b == 0.0) and np.all(gap <= b)
    q0 = rng.standard_normal((2, 2, 0, 8))
    k, v = rng.standard_normal((2, 2, 5, 8)), rng.standard_normal((2, 2, 5, 3))
    assert bd.output_error_certificate(q0, k, v, partition, causal=causal).shape == (2, 2, 0, 3)
    assert bd.output_error_bound(q0, k, v, 16, 0.1, causal=causal).shape == (2, 2, 0, 3)
