"""plsh_ref.attention with ``precision="extended"``: longdouble throughout, float64 at the end.

The extended reference is checked against the mpmath twins (``plsh_ref.mp_attention`` at 40
digits) to one float64 ulp of ``max|mp|``; the float64 reference, on the same problems, is
not that close (the control showing the comparison can fail). The default stays the
float64 computation, bit for bit.
"""

from __future__ import annotations

import numpy as np
import pytest

from plsh_ref import attention as A
from plsh_ref.attention import alibi_attention, plsh_attention, precision_dtype
from plsh_ref.mp_attention import alibi_attention_mp, plsh_attention_mp
from plsh_ref.partition import draw_partition

EPS64 = 2.0**-52

pytestmark = pytest.mark.skipif(
    not A.EXTENDED_AVAILABLE, reason="numpy.longdouble is float64 on this platform"
)


def _problems(count: int, seed: int):
    """Small random problems: GQA, causal or not, padded or explicit positions, scales."""
    rng = np.random.default_rng(seed)
    for t in range(count):
        batch, num_heads, num_heads_kv = 2, 2, (1, 2)[t % 2]
        n_q, n_k, head_dim = int(rng.integers(1, 7)), int(rng.integers(1, 9)), 4
        amplitude = float(rng.choice([0.5, 2.0, 4.0]))  # larger logits, larger rounding
        q = amplitude * rng.standard_normal((batch, num_heads, n_q, head_dim))
        k = amplitude * rng.standard_normal((batch, num_heads_kv, n_k, head_dim))
        v = rng.standard_normal((batch, num_heads_kv, n_k, head_dim))
        kw = dict(causal=bool(t % 3), scale=[None, 0.3][t % 2])
        if t % 4 == 1:
            kw["attention_mask"] = (rng.random((batch, n_k)) > 0.3).astype(np.int64)
        elif t % 4 == 2:
            kpos = np.cumsum(rng.integers(1, 4, size=n_k)) + 100
            kw["key_positions"] = kpos
            kw["query_positions"] = kpos[-1] - n_q + 1 + np.arange(n_q)
        slopes = rng.uniform(0.01, 1.5, size=num_heads)
        yield q, k, v, slopes, kw


def _ulps(got, want_mp) -> tuple[float, float]:
    """``max|got - mp|`` of output and LSE, in float64 ulps of ``max|mp|`` (at least 1)."""
    errors = []
    for g, w in zip(got, want_mp):
        w = w.astype(np.float64)
        finite = np.isfinite(w)
        assert np.array_equal(np.isneginf(g), np.isneginf(w))  # empty rows: -inf exactly
        if not finite.any():
            errors.append(0.0)
            continue
        scale = max(float(np.abs(w[finite]).max()), 1.0 if g.ndim == 3 else 0.0) or 1.0
        errors.append(float(np.abs(g[finite] - w[finite]).max()) / (EPS64 * scale))
    return errors[0], errors[1]


def test_extended_alibi_is_within_one_ulp_of_mpmath():
    worst_extended = worst_float64 = 0.0
    for q, k, v, slopes, kw in _problems(24, seed=0):
        mp = alibi_attention_mp(q, k, v, slopes=slopes, **kw, return_lse=True, dps=40)
        ext = alibi_attention(q, k, v, slopes=slopes, **kw, return_lse=True, precision="extended")
        f64 = alibi_attention(q, k, v, slopes=slopes, **kw, return_lse=True)
        worst_extended = max(worst_extended, *_ulps(ext, mp))
        worst_float64 = max(worst_float64, *_ulps(f64, mp))
    assert worst_extended <= 1.0, worst_extended  # measured 0.22 ulps (2026-12-02, x86-64)
    # control: binary64 arithmetic errs by more than an ulp on this set (measured 3.4 ulps)
    assert worst_float64 > 1.0, worst_float64


@pytest.mark.parametrize("method", ["counts", "reduction"])
def test_extended_plsh_is_within_one_ulp_of_mpmath(method):
    worst_extended = worst_float64 = 0.0
    for i, (q, k, v, slopes, kw) in enumerate(_problems(16, seed=1)):
        partition = draw_partition(1.0 / slopes, num_samples=3 + i % 5, seed=i)
        pk = dict(partition=partition, **kw, return_lse=True)
        mp = plsh_attention_mp(q, k, v, **pk, dps=40)
        ext = plsh_attention(q, k, v, **pk, method=method, precision="extended")
        f64 = plsh_attention(q, k, v, **pk, method=method)
        worst_extended = max(worst_extended, *_ulps(ext, mp))
        worst_float64 = max(worst_float64, *_ulps(f64, mp))
    assert worst_extended <= 1.0, worst_extended  # measured 0 (counts), 9e-5 (reduction)
    assert worst_float64 > 1.0, worst_float64  # control: measured 1.8 and 1.6 ulps


def test_float64_is_the_default_bit_for_bit():
    for q, k, v, slopes, kw in _problems(6, seed=2):
        default = alibi_attention(q, k, v, slopes=slopes, **kw, return_lse=True)
        explicit = alibi_attention(
            q, k, v, slopes=slopes, **kw, return_lse=True, precision="float64"
        )
        for a, b in zip(default, explicit):
            assert a.dtype == b.dtype == np.float64
            np.testing.assert_array_equal(a, b)
        ext = alibi_attention(q, k, v, slopes=slopes, **kw, return_lse=True, precision="extended")
        assert ext[0].dtype == ext[1].dtype == np.float64  # rounded to float64 at the end


def test_extended_empty_rows_and_overflow_refusal():
    q = np.ones((1, 1, 3, 2))
    out, lse = alibi_attention(
        q, q[:, :, :1], q[:, :, :1], slopes=[0.5], key_positions=[5], query_positions=[4, 5, 6],
        return_lse=True, precision="extended",
    )  # fmt: skip
    assert out[0, 0, 0].tolist() == [0.0, 0.0] and np.isneginf(lse[0, 0, 0])
    assert np.isfinite(lse[0, 0, 1:]).all()
    # logits that overflow float64 are refused at every precision (longdouble would not overflow)
    big = np.full((1, 1, 1, 2), 1e200)
    for precision in ("float64", "extended"):
        with pytest.raises(ValueError, match=r"^query: scale \* query \. key overflows float64"):
            alibi_attention(big, big, big, slopes=[0.5], return_lse=False, precision=precision)


def test_precision_refusals(monkeypatch):
    assert precision_dtype("float64") is np.float64
    assert precision_dtype("extended") is np.longdouble
    q = np.ones((1, 1, 2, 2))
    for bad in ("float32", "double", None):
        with pytest.raises(
            ValueError, match=r"^precision: must be one of \('float64', 'extended'\)"
        ):
            alibi_attention(q, q, q, slopes=[0.5], return_lse=False, precision=bad)
    partition = draw_partition([2.0], num_samples=2, seed=0)
    with pytest.raises(ValueError, match=r"^precision: must be one of"):
        plsh_attention(q, q, q, partition=partition, return_lse=False, precision="quad")
    monkeypatch.setattr(A, "EXTENDED_AVAILABLE", False)  # a platform whose longdouble is float64
    with pytest.raises(ValueError, match=r"^precision: 'extended' needs numpy\.longdouble wider"):
        alibi_attention(q, q, q, slopes=[0.5], return_lse=False, precision="extended")
    assert precision_dtype("float64") is np.float64
