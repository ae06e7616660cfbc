"""Float64 attention against mpmath attention at 30 digits.

The mpmath versions take the binary64 inputs as exact and compute at ``dps`` digits, so
the difference to the float64 reference is the float64 rounding error alone. It is
checked against an a-priori bound (see :func:`_float64_error_bound`) rather than a
fixed tolerance.
"""

import mpmath
import numpy as np
import pytest
from _oracles import random_qkv
from _strategies import problems
from hypothesis import given
from hypothesis import strategies as st

from plsh_ref.alibi import alibi_slopes
from plsh_ref.attention import alibi_attention, plsh_attention
from plsh_ref.mp_attention import alibi_attention_mp, plsh_attention_mp, weighted_attention_mp
from plsh_ref.partition import counts, draw_partition

EPS = 2.0**-53  # unit roundoff of binary64
SMALL = dict(max_seq_len=8, max_heads=2, max_batch=2, max_head_dim=4, max_samples=4)


def _float64_error_bound(q, k, v, bias_max, scale, n_k):
    """A-priori bound on |float64 - exact| for outputs and LSEs, per problem.

    Each logit ``scale q.k + b`` is computed with absolute error at most
    ``(d + 3) EPS L`` where ``L = scale max sum_e |q_e k_e| + bias_max``; subtracting the
    row max and ``exp`` add ``2 EPS`` relative, so every weight carries a relative error
    ``delta <= (2 d + 8) EPS (L + 1)``. A convex combination with weights perturbed by
    ``delta`` moves by at most ``2 delta max|v|``; the two sums of ``n_k`` terms add
    ``2 n_k EPS max|v|``. The LSE ``shift + log z`` has error ``<= delta + 2 n_k EPS +
    EPS |lse|``. The bound below is this, doubled.
    """
    d = q.shape[-1]
    grp = q.shape[1] // max(k.shape[1], 1)
    kk = np.repeat(np.abs(k), grp, axis=1)
    dot_max = np.max(np.abs(q) @ np.swapaxes(kk, -1, -2), initial=0.0)
    big_l = scale * dot_max + bias_max
    delta = (2 * d + 8) * EPS * (big_l + 1)
    vmax = np.max(np.abs(v), initial=0.0)
    out_tol = 2 * (2 * delta + 2 * n_k * EPS) * vmax
    lse_tol = 2 * (delta + 2 * n_k * EPS + EPS * (big_l + np.log(max(n_k, 1))))
    return out_tol, lse_tol


def _compare(got, mp_result, tols):
    out, lse = got
    mp_out, mp_lse = mp_result
    out_tol, lse_tol = tols
    assert mp_out.shape == out.shape and mp_lse.shape == lse.shape
    for x, y in zip(out.ravel(), mp_out.ravel()):
        assert isinstance(y, mpmath.mpf)
        assert abs(x - float(y)) <= out_tol, (x, y, out_tol)
    for x, y in zip(lse.ravel(), mp_lse.ravel()):
        if y == mpmath.ninf:
            assert x == -np.inf
        else:
            assert abs(x - float(y)) <= lse_tol, (x, y, lse_tol)


def _scale(prob):
    return prob.scale if prob.scale is not None else 1.0 / np.sqrt(prob.query.shape[3])


def _bias_max(prob):
    qpos, kpos = prob.positions
    if len(qpos) == 0 or len(kpos) == 0:
        return 0.0
    return float(np.max(prob.slopes)) * float(np.max(np.abs(qpos[:, None] - kpos[None, :])))


@given(problems(**SMALL))
def test_alibi_float64_equals_mpmath_30_digits(prob):
    got = alibi_attention(
        prob.query, prob.key, prob.value, slopes=prob.slopes, **prob.kwargs, return_lse=True
    )
    exact = alibi_attention_mp(
        prob.query, prob.key, prob.value, slopes=prob.slopes, return_lse=True, dps=30, **prob.kwargs
    )
    _compare(
        got,
        exact,
        _float64_error_bound(
            prob.query, prob.key, prob.value, _bias_max(prob), _scale(prob), prob.key.shape[2]
        ),
    )


@given(problems(**SMALL), st.sampled_from(["counts", "reduction"]))
def test_plsh_float64_equals_mpmath_30_digits(prob, method):
    got = plsh_attention(
        prob.query,
        prob.key,
        prob.value,
        partition=prob.partition,
        method=method,
        **prob.kwargs,
        return_lse=True,
    )
    exact = plsh_attention_mp(
        prob.query,
        prob.key,
        prob.value,
        partition=prob.partition,
        return_lse=True,
        dps=30,
        **prob.kwargs,
    )
    # log(C / s) lies in [-log s, 0]
    bias_max = float(np.log(prob.partition.num_samples))
    _compare(
        got,
        exact,
        _float64_error_bound(
            prob.query, prob.key, prob.value, bias_max, _scale(prob), prob.key.shape[2]
        ),
    )


def test_large_logits_are_stable():
    """Logits of size ~ 1e3 overflow a naive exp; the max-shifted float64 reference still
    matches 30-digit mpmath within the a-priori bound."""
    q, k, v = random_qkv(21, 1, 2, 2, 6, 6, 4, 3, magnitude=25.0)
    for causal in (True, False):
        got = alibi_attention(q, k, v, causal=causal, return_lse=True)
        assert np.max(np.abs(got[1])) > 700  # exp of these LSEs is beyond float64
        exact = alibi_attention_mp(q, k, v, causal=causal, return_lse=True, dps=30)
        _compare(got, exact, _float64_error_bound(q, k, v, 5.0, 0.5, 6))


def test_mpmath_global_precision_untouched():
    q, k, v = random_qkv(22, 1, 2, 1, 3, 4, 2, 2)
    part = draw_partition(1 / alibi_slopes(2), 3, seed=1)
    saved = (mpmath.mp.dps, mpmath.mp.prec)
    try:
        for global_dps in (15, 7, 60):
            mpmath.mp.dps = global_dps
            before = (mpmath.mp.dps, mpmath.mp.prec)
            a = alibi_attention_mp(q, k, v, return_lse=True, dps=30)
            p = plsh_attention_mp(q, k, v, partition=part, return_lse=True, dps=30)
            assert (mpmath.mp.dps, mpmath.mp.prec) == before
            if global_dps == 15:
                ref_a, ref_p = a, p
            else:
                # the result depends on dps only, not on the caller's global precision
                for x, y in zip(
                    np.concatenate([a[0].ravel(), p[0].ravel()]),
                    np.concatenate([ref_a[0].ravel(), ref_p[0].ravel()]),
                ):
                    with mpmath.workdps(40):
                        assert abs(x - y) <= mpmath.mpf(10) ** -29 * max(1, abs(y))
        # an error raised by validation leaves the precision alone too
        mpmath.mp.dps = 15
        with pytest.raises(ValueError):
            alibi_attention_mp(q, k, v, return_lse=True, dps=30, slopes=[-1.0, 1.0])
        assert mpmath.mp.dps == 15
    finally:
        mpmath.mp.dps, mpmath.mp.prec = saved[0], saved[1]


def test_mpmath_precision_is_the_requested_one():
    """30-digit and 60-digit results agree to ~30 digits but not to 60: dps is honoured."""
    q, k, v = random_qkv(23, 1, 1, 1, 4, 4, 3, 2)
    a30 = alibi_attention_mp(q, k, v, return_lse=True, dps=30)[0].ravel()
    a60 = alibi_attention_mp(q, k, v, return_lse=True, dps=60)[0].ravel()
    with mpmath.workdps(80):
        diffs = [abs(x - y) / max(abs(y), 1) for x, y in zip(a30, a60)]
        assert max(diffs) <= mpmath.mpf(10) ** -27
        assert max(diffs) > mpmath.mpf(10) ** -50  # 30 digits are not 60


def test_weighted_attention_array_equals_callable_and_empty_rows():
    q, k, v = random_qkv(24, 1, 2, 2, 3, 4, 2, 2)
    part = draw_partition([2.0, 5.0], 4, seed=2)
    qpos, kpos = np.array([-9, 1, 3]), np.arange(4)  # the query at -9 has no causal key
    c = counts(part, qpos, kpos, causal=True)
    via_array = weighted_attention_mp(q, k, v, c / 4, dps=30)
    via_plsh = plsh_attention_mp(
        q, k, v, partition=part, return_lse=True, query_positions=qpos, key_positions=kpos, dps=30
    )
    for x, y in zip(
        np.concatenate([via_array[0].ravel(), via_array[1].ravel()]),
        np.concatenate([via_plsh[0].ravel(), via_plsh[1].ravel()]),
    ):
        assert x == y  # C/s is exact in binary64 here (s = 4)
    assert all(x == 0 for x in via_plsh[0][0, :, 0].ravel())
    assert all(x == mpmath.ninf for x in via_plsh[1][0, :, 0])
