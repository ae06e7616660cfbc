"""The a-priori error bound a decoding cache reports (PLSHDecodingCache.error_bound) holds at
its stated probability on real activations (the shipped MiniLM Q/K/V)."""

import numpy as np
import pytest
from scipy.stats import binom

torch = pytest.importorskip("torch")

from plsh_fast.decoding import DecodingErrorBound, PLSHDecodingCache  # noqa: E402
from plsh_ref import alibi_slopes, draw_partition  # noqa: E402
from plsh_ref.attention import alibi_attention  # noqa: E402
from plsh_ref.bounds import max_norm_error_bound, output_error_bound  # noqa: E402
from plsh_ref.data import load_qkv  # noqa: E402

N, PREFILL, S, DELTA, TRIALS = 160, 32, 64, 0.2, 12


@pytest.fixture(scope="module")
def minilm():
    data = load_qkv(layer=3)
    q, k, v = (data[x][:, :, :N] for x in ("query", "key", "value"))
    slopes = alibi_slopes(q.shape[1])
    exact = alibi_attention(q, k, v, slopes=slopes, causal=True, return_lse=False)
    bound = output_error_bound(q, k, v, S, DELTA, slopes=slopes, causal=True)
    return q, k, v, slopes, exact, bound


def _decode(part, q, k, v):
    qt, kt, vt = (torch.from_numpy(x) for x in (q, k, v))
    cache = PLSHDecodingCache(part)
    outs = [cache.update(qt[:, :, :PREFILL], kt[:, :, :PREFILL], vt[:, :, :PREFILL])]
    for j in range(PREFILL, N):
        outs.append(cache.update(qt[:, :, j : j + 1], kt[:, :, j : j + 1], vt[:, :, j : j + 1]))
    return cache, torch.cat(outs, dim=2).numpy()


def test_the_reported_bound_is_the_theorems_for_the_positions_seen():
    part = draw_partition(1 / alibi_slopes(4), S, seed=0)
    cache = PLSHDecodingCache(part)
    with pytest.raises(ValueError, match="^delta: no positions decoded yet"):
        cache.error_bound()
    q = torch.randn(1, 4, 10, 8, dtype=torch.float64)
    cache.update(q, q, q, query_positions=torch.arange(5, 15))
    cache.update(q[:, :, :1], q[:, :, :1], q[:, :, :1], query_positions=torch.tensor([40]))
    got = cache.error_bound(0.1)
    assert got == DecodingErrorBound(max_norm_error_bound(36, S, 0.1 / 4), 0.1, 36, S, 4)
    assert cache.error_bound(0.01).eps > got.eps  # smaller delta, larger eps
    with pytest.raises(ValueError, match="^delta:"):
        cache.error_bound(1.5)


def test_decoding_error_stays_within_the_bound_at_its_probability(minilm):
    """TRIALS independent partitions decode the first N MiniLM tokens (layer 3, 12 heads);
    a trial fails if any output element exceeds the a-priori bound of Theorem 2.2 with the
    cache's eps (``plsh_ref.bounds.output_error_bound``, probability ``1 - DELTA``)."""
    q, k, v, slopes, exact, bound = minilm
    failures = 0
    for seed in range(TRIALS):
        cache, out = _decode(draw_partition(1 / slopes, S, seed=1000 + seed), q, k, v)
        reported = cache.error_bound(DELTA)
        assert reported.eps == max_norm_error_bound(N, S, DELTA / q.shape[1])
        failures += bool((np.abs(out - exact) > bound + 1e-9).any())
    # If the bound holds with probability >= 1 - DELTA per trial, failures is dominated by
    # Bin(TRIALS, DELTA): exceeding its 1 - 1e-6 quantile has probability <= 1e-6.
    assert failures <= binom.ppf(1 - 1e-6, TRIALS, DELTA)


def test_a_bound_25_times_smaller_is_violated(minilm):
    """Negative control: the same check with the bound divided by 25 fails in at least 5 of 6 trials
    (measured on this data: the largest error reaches 0.07 to 0.14 of the bound in every
    one of 10 trials), so the test above can fail."""
    q, k, v, slopes, exact, bound = minilm
    violated = 0
    for seed in range(6):
        _, out = _decode(draw_partition(1 / slopes, S, seed=2000 + seed), q, k, v)
        violated += bool((np.abs(out - exact) > bound / 25 + 1e-9).any())
    assert violated >= 5
