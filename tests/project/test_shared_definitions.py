"""The definitions shared across modules (one definition each) and the guards added with them.

Each shared helper lives in one module; these tests pin what it computes and that its users
go through it: the PLSH bias ``log(C/s)`` (:func:`plsh_ref.partition.count_bias`), the
default scale (:func:`plsh_ref.validation.check_scale`), the default slopes, the partition
check, child seeds (:func:`plsh_ref.partition.derived_seed`), and ``biased_sdpa``'s refusal of
NaN/``+inf`` biases.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from plsh_ref.alibi import alibi_slopes, check_slopes
from plsh_ref.partition import (
    PartitionSample,
    check_partition,
    count_bias,
    counts,
    draw_partition,
    resolve_partition,
)
from plsh_ref.validation import check_dps, check_scale

# ----------------------------------------------------------------------------- count_bias


def test_count_bias_is_log_of_the_empirical_mean():
    partition = draw_partition(np.array([3.0, 11.0]), 7, seed=4)
    pos = np.arange(40)
    c = counts(partition, pos, pos, causal=True)
    bias = count_bias(c, 7)
    assert bias.dtype == np.float64 and bias.shape == c.shape
    assert np.all(np.isneginf(bias[c == 0]))  # exactly -inf, not a large negative number
    assert np.all(bias[c == 7] == 0.0)
    some = c > 0
    np.testing.assert_array_equal(bias[some], np.log(c[some] / 7.0))
    assert np.all(np.exp(bias) == c / 7.0) or np.allclose(np.exp(bias), c / 7.0, rtol=1e-15)


def test_count_bias_in_longdouble_is_the_same_formula_rounded_wider():
    # the extended reference (plsh_attention(precision="extended")) forms its weights here
    partition = draw_partition(np.array([3.0, 11.0]), 7, seed=4)
    pos = np.arange(40)
    c = counts(partition, pos, pos, causal=True)
    wide = count_bias(c, 7, dtype=np.longdouble)
    assert wide.dtype == np.longdouble and wide.shape == c.shape
    assert np.all(np.isneginf(wide[c == 0])) and np.all(wide[c == 7] == 0.0)
    some = c > 0
    np.testing.assert_array_equal(wide[some], np.log(c[some].astype(np.longdouble) / 7))
    # rounded to float64 it is the float64 bias up to that one's rounding: the division's
    # relative error 2^-53 becomes an absolute error of the log, plus the log's own ulp
    # (and the final rounding of the wide value: one more ulp)
    narrow = count_bias(c, 7)
    ulp = np.abs(np.spacing(narrow[some]))
    gap = np.abs(wide[some].astype(np.float64) - narrow[some])
    assert np.all(gap <= 2.0**-53 + 2 * ulp)
    # where longdouble is wider, it is not the float64 formula (control of the dtype)
    from plsh_ref.attention import EXTENDED_AVAILABLE

    assert np.any(gap > 0) == EXTENDED_AVAILABLE
    with pytest.raises(ValueError, match=r"^dtype:"):
        count_bias(c, 7, dtype=np.float32)
    with pytest.raises(ValueError, match=r"^dtype:"):
        count_bias(c, 7, dtype="not a dtype")


@pytest.mark.parametrize(
    "counts_,s,exc",
    [
        ([0, 1, 3], 2, ValueError),  # count above s
        ([0, -1], 2, ValueError),
        ([0.5], 2, ValueError),
        (["a"], 2, TypeError),
        ([1], 0, ValueError),
        ([1], 1.0, TypeError),
    ],
)
def test_count_bias_refuses_bad_input(counts_, s, exc):
    with pytest.raises(exc, match=r"^(counts|num_samples):"):
        count_bias(counts_, s)


def test_reference_plsh_attention_uses_count_bias():
    """softmax with the bias count_bias(C, s) is the reference PLSH attention, bit for bit."""
    from plsh_ref.attention import biased_attention, plsh_attention

    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 2, 24, 4)) for _ in range(3))
    partition = draw_partition(np.array([2.0, 9.0]), 5, seed=1)
    pos = np.arange(24)
    bias = count_bias(counts(partition, pos, pos, causal=True), 5)
    out, lse = biased_attention(q, k, v, bias=bias, return_lse=True)
    ref, ref_lse = plsh_attention(q, k, v, partition=partition, return_lse=True)
    np.testing.assert_array_equal(out, ref)
    np.testing.assert_array_equal(lse, ref_lse)


# ------------------------------------------------------------------- validation helpers


@pytest.mark.parametrize("head_dim", [1, 2, 3, 7, 64, 80, 128, 1000])
def test_default_scale_is_sdpa_default(head_dim):
    """check_scale(None, d) is the scale torch's SDPA uses by default (third-party check)."""
    torch = pytest.importorskip("torch")
    assert check_scale(None, head_dim) == 1.0 / math.sqrt(head_dim)
    gen = torch.Generator().manual_seed(head_dim)
    q, k, v = (torch.randn(1, 1, 5, head_dim, generator=gen, dtype=torch.float64) for _ in "qkv")
    f = torch.nn.functional.scaled_dot_product_attention
    torch.testing.assert_close(
        f(q, k, v, scale=check_scale(None, head_dim)), f(q, k, v), rtol=1e-15, atol=0
    )


def test_check_scale_keeps_and_checks_a_given_scale():
    assert check_scale(0.25, 64) == 0.25
    assert check_scale(None, 0) == 1.0
    for bad, exc in (
        (0.0, ValueError),
        (-1.0, ValueError),
        (math.inf, ValueError),
        ("1", TypeError),
    ):
        with pytest.raises(exc, match="^scale:"):
            check_scale(bad, 4)


def test_check_slopes_defaults_and_shape():
    np.testing.assert_array_equal(check_slopes(None, 6), alibi_slopes(6))
    np.testing.assert_array_equal(check_slopes([0.5, 0.25], 2), [0.5, 0.25])
    with pytest.raises(ValueError, match=r"^slopes: must have shape \(3,\)"):
        check_slopes([0.5, 0.25], 3)
    with pytest.raises(ValueError, match="^slopes:"):
        check_slopes([0.5, 0.0], 2)


def test_check_partition_and_dps():
    part = PartitionSample(np.ones((2, 3)), np.zeros((2, 3)))
    assert check_partition(part, 2) is part
    assert check_partition(part) is part
    with pytest.raises(ValueError, match="^partition: has 2 heads, query has 4"):
        check_partition(part, 4)
    with pytest.raises(TypeError, match="^partition: must be a PartitionSample"):
        check_partition((part.pitch, part.offset), 2)
    assert check_dps(15) == 15
    with pytest.raises(ValueError, match="^dps:"):
        check_dps(14)


def test_resolve_partition_draws_with_the_default_num_samples_or_checks_the_given_one():
    from plsh_ref.partition import DEFAULT_NUM_SAMPLES

    drawn = resolve_partition(num_heads=3, seed=5)
    assert drawn.num_samples == DEFAULT_NUM_SAMPLES and drawn.num_heads == 3
    assert drawn == draw_partition(1.0 / alibi_slopes(3), DEFAULT_NUM_SAMPLES, 5)
    assert resolve_partition(drawn, num_heads=3, num_samples=DEFAULT_NUM_SAMPLES) is drawn
    with pytest.raises(ValueError, match="^num_samples: 4 differs"):
        resolve_partition(drawn, num_heads=3, num_samples=4)
    with pytest.raises(ValueError, match="^seed: pass either"):
        resolve_partition(drawn, num_heads=3, seed=1)
    with pytest.raises(ValueError, match="^slopes: too small"):
        resolve_partition(num_heads=1, slopes=[1e-320], seed=0)


def test_distributed_draws_the_default_num_samples():
    """The distributed entry point resolves its partition like every other (no own default)."""
    pytest.importorskip("torch")
    import inspect

    import plsh_fast.distributed as D

    source = inspect.getsource(D)
    assert "resolve_partition(" in source and "16 if num_samples" not in source


# --------------------------------------------------------------------------- child seeds


def test_derived_seed_is_reproducible_and_used_by_modules_and_models():
    pytest.importorskip("torch")
    from plsh_fast.experiments.model import ByteLM
    from plsh_fast.nn import PLSHAttention
    from plsh_ref.partition import derived_seed

    seeds = {derived_seed(7, k) for k in range(200)}
    assert len(seeds) == 200 and all(0 <= s < 2**63 for s in seeds)
    assert derived_seed(7, 3) == derived_seed(7, 3) != derived_seed(8, 3)
    assert derived_seed(7, 1, 2) != derived_seed(7, 2, 1)
    module = PLSHAttention(2, 4, seed=7)
    expected = draw_partition(module.sigma, 4, derived_seed(7, 5))
    np.testing.assert_array_equal(module.training_partition(5).pitch, expected.pitch)
    model = ByteLM("plsh-4", d_model=8, num_layers=3, num_heads=2, seed=7)
    assert [core.seed for core in model.attention_cores()] == [derived_seed(7, l) for l in range(3)]
    with pytest.raises(ValueError, match="^seed:"):
        derived_seed(-1, 0)
    with pytest.raises(TypeError, match="^keys:"):
        derived_seed(0, 1.5)


# --------------------------------------------------------------------- biased_sdpa guard


@pytest.mark.parametrize(
    "fill",
    ["all_nan", "one_nan", "plus_inf", "overflows_float16"],
)
def test_biased_sdpa_refuses_nan_and_plus_inf_bias(fill):
    """Regression: an all-NaN bias row was taken for an empty row and gave zeros silently."""
    torch = pytest.importorskip("torch")
    from plsh_fast.nn import biased_sdpa

    dtype = torch.float16 if fill == "overflows_float16" else torch.float32
    q = k = v = torch.ones(1, 2, 3, 4, dtype=dtype)
    bias = torch.zeros(2, 3, 3, dtype=torch.float64)
    if fill == "all_nan":
        bias[:] = math.nan
    elif fill == "one_nan":
        bias[1, 2, 0] = math.nan
    elif fill == "plus_inf":
        bias[0, 0, 0] = math.inf
    else:
        bias[0, 0, 0] = 1e6  # finite in float64, +inf in float16
    with pytest.raises(ValueError, match="^bias: contains NaN or"):
        biased_sdpa(q, k, v, bias=bias)


def test_biased_sdpa_still_gives_zero_rows_for_fully_masked_rows():
    """Negative control of the guard: -inf marks masked pairs; a fully masked row gives 0."""
    torch = pytest.importorskip("torch")
    from plsh_fast.nn import biased_sdpa

    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 3, 4, generator=gen) for _ in range(3))
    bias = torch.zeros(2, 3, 3)
    bias[1, 0] = -math.inf
    out = biased_sdpa(q, k, v, bias=bias)
    assert torch.all(out[0, 1, 0] == 0) and torch.isfinite(out).all()
    assert not torch.all(out[0, 0, 0] == 0)


# -------------------------------------------------------------------- position layouts


@pytest.mark.parametrize("n_q,n_k", [(0, 0), (1, 7), (9, 9), (12, 5)])
def test_draw_positions_layouts(n_q, n_k):
    """Each layout of the one seeded position generator has its stated shape."""
    from plsh_ref.testing.strategies import POSITION_LAYOUTS, draw_positions

    seen_empty_row = False
    for seed in range(20):
        for mode in POSITION_LAYOUTS:
            qpos, kpos = draw_positions(mode, n_q, n_k, np.random.default_rng(seed))
            if mode == "default":
                assert qpos is None and kpos is None
                continue
            assert qpos.dtype == kpos.dtype == np.int64
            assert qpos.shape == (n_q,) and kpos.shape == (n_k,)
            if mode in ("explicit", "gaps") and n_k > 1:
                assert np.all(np.diff(kpos) >= 1)  # increasing
            if mode in ("shifted", "left_padding"):
                np.testing.assert_array_equal(np.diff(kpos), 1)
                if n_q:
                    assert qpos[-1] == kpos[-1] if n_k else True  # end-aligned
            if mode == "left_padding" and n_k:
                assert kpos[0] <= 0
            if mode == "gaps" and n_q and n_k:
                seen_empty_row |= bool(qpos.min() < kpos.min())
    if n_q and n_k:
        # gaps puts some queries before every key. Fixed seeds, so deterministic; with fresh
        # seeds P(no such query in 20 draws) <= (22/25)^20 < 8% at n_q = 1, tiny otherwise.
        assert seen_empty_row
    with pytest.raises(ValueError, match="^mode:"):
        draw_positions("sorted", 2, 2, np.random.default_rng(0))


def test_fast_path_num_samples_limit_is_the_reference_one():
    """plsh_fast checks num_samples with plsh_ref.validation.check_num_samples (one limit)."""
    torch = pytest.importorskip("torch")
    from plsh_fast import plsh_attention
    from plsh_fast.nn import PLSHAttention
    from plsh_ref.validation import MAX_NUM_SAMPLES

    q = torch.zeros(1, 1, 2, 4)
    for call in (
        lambda: plsh_attention(q, q, q, num_samples=MAX_NUM_SAMPLES + 1, seed=0),
        lambda: PLSHAttention(1, MAX_NUM_SAMPLES + 1),
    ):
        with pytest.raises(ValueError, match=f"^num_samples: must be <= {MAX_NUM_SAMPLES}"):
            call()


def test_torch_count_bias_equals_the_reference_bit_for_bit():
    torch = pytest.importorskip("torch")
    from plsh_fast._partition import count_bias as torch_count_bias

    partition = draw_partition(np.array([1.5, 6.0, 40.0]), 9, seed=2)
    pos = np.arange(-5, 50)
    c = counts(partition, pos, pos, causal=False)
    ref = count_bias(c, 9)
    got = torch_count_bias(torch.from_numpy(c), 9)
    assert got.dtype == torch.float64
    np.testing.assert_array_equal(got.numpy(), ref)
    got32 = torch_count_bias(torch.from_numpy(c).int(), 9, dtype=torch.float32)
    np.testing.assert_array_equal(got32.numpy(), ref.astype(np.float32))
    assert torch.isneginf(got32[torch.from_numpy(c) == 0]).all()


@pytest.mark.parametrize("n_q,n_k", [(0, 0), (0, 3), (3, 0), (1, 1), (5, 9), (9, 5), (64, 64)])
def test_torch_default_positions_equal_the_reference(n_q, n_k):
    torch = pytest.importorskip("torch")
    from plsh_fast._padding import default_positions as torch_default_positions
    from plsh_ref.alibi import default_positions

    got_q, got_k = torch_default_positions(n_q, n_k)
    want_q, want_k = default_positions(n_q, n_k)
    assert got_q.dtype == got_k.dtype == torch.int64
    np.testing.assert_array_equal(got_q.numpy(), want_q)
    np.testing.assert_array_equal(got_k.numpy(), want_k)
