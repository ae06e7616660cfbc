"""plsh_ref.testing.battery: each case has the property of the bug class it targets.

The battery's cases are listed in the module docstring with their bug classes. A weakened
case (a sequence of 200 tokens in ``sequence_longer_than_256``, positions that stay below
256 in ``positions_beyond_256``, padding that masks nothing) would still run and pass
against a broken kernel, so the property that makes each case catch its bug class is
asserted, derived from the documented purpose (not a frozen table of fields: a case may
change shape as long as it keeps its property). Also: the documented names are the
battery's, and the restrictions of :func:`battery_plan` (options and capabilities) drop
or change exactly the cases they concern, with the documented reasons.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import plsh_ref.testing.battery as battery_module
from plsh_ref.testing.battery import NotCovered, battery, battery_plan


def _positions(spec):
    qpos, kpos = spec.build().positions_and_keep()[:2]
    return qpos.ravel(), kpos.ravel()


def _cases(**kwargs):
    return dict(battery(**kwargs))


def test_standard_slopes_drop_the_random_slopes_case():
    assert "random_slopes" not in _cases(slopes="standard")
    assert all(s.slopes == "standard" for s in _cases(slopes="standard").values())


def test_plsh_cases_use_several_samples():
    assert all(s.num_samples == 4 for s in _cases(kind="plsh").values())
    assert all(s.kind == "plsh" for s in _cases(kind="plsh").values())
    assert all(s.num_samples == 1 and s.kind == "alibi" for s in _cases().values())


def test_seed_moves_only_the_data():
    a, b = battery(seed=0), battery(seed=2)
    for i, ((na, sa), (nb, sb)) in enumerate(zip(a, b)):
        assert na == nb
        assert sa.data_seed == i and sb.data_seed == 2000 + i
        assert sa.replace(data_seed=0) == sb.replace(data_seed=0)


def test_dtype_choice():
    names = [n for n, _ in battery(dtypes=("float64", "float16"))]
    assert "heads_16_float64" in names and "heads_16_float16" in names
    assert _cases(dtypes=("float64", "float16"))["batch"].dtype == "float64"
    # bfloat16 is preferred over float16 as the low-precision dtype
    assert "peaked_softmax_bfloat16" in [n for n, _ in battery(dtypes=("float16", "bfloat16"))]
    # float32 is preferred as the main dtype, then float64, float16, bfloat16
    assert _cases(dtypes=("float16", "float64", "float32"))["batch"].dtype == "float32"
    assert _cases(dtypes=("bfloat16", "float16"))["batch"].dtype == "float16"
    assert battery(dtypes=["float32"]) == battery(dtypes=("float32",))  # any sequence


def test_bad_arguments():
    with pytest.raises(ValueError, match=r"^kind: must be one of \('alibi', 'plsh'\), got 'x'$"):
        battery("x")
    with pytest.raises(ValueError, match=r"^slopes: must be 'given' or 'standard', got 'r'$"):
        battery(slopes="r")
    for bad in ((), ("float8",), ("float32", "int8")):
        with pytest.raises(ValueError, match=r"^dtypes: must be a non-empty subset of "):
            battery(dtypes=bad)


def _keep(spec):
    """Per-sequence positions and keep masks of the built problem."""
    return spec.build().positions_and_keep()


def _documented_names():
    """Case names of the module docstring's table (``<half>`` kept as written)."""
    doc = battery_module.__doc__
    table = doc[doc.index("=\n") : doc.rindex("=====")]
    names = []
    for line in table.splitlines():
        first = line[:38]
        names += re.findall(r"``([a-z][a-z0-9_<>]*)``", first)
        names += [f"heads_{h}" for h in re.findall(r"``_(\d+)``", first)]
    return names


def test_the_documented_cases_are_the_battery():
    """Every case the docstring documents is in the battery and every case is documented
    (``<half>``: bfloat16 and float16; ``_12`` etc.: ``heads_12``)."""
    got = [n for n, _ in battery(dtypes=("bfloat16", "float16", "float32"))]
    assert len(got) == len(set(got))  # names are unique
    documented = set()
    for name in _documented_names():
        if "<half>" in name:
            documented |= {name.replace("<half>", h) for h in ("bfloat16",)}
        else:
            documented.add(name)
    documented |= {"sequence_longer_than_256_float16"}  # each of bfloat16 and float16
    assert set(got) == documented


def test_each_case_has_the_property_of_its_bug_class():
    cases = _cases(kind="alibi", dtypes=("bfloat16", "float16", "float32"))
    main, half = "float32", "bfloat16"
    for h in (6, 12, 20, 40):  # not powers of two: the interleaved part of Press et al.
        spec = cases[f"heads_{h}"]
        assert spec.num_heads == spec.num_heads_kv == h and h & (h - 1)
    for name, dtype in (("heads_16_float32", main), ("heads_16_bfloat16", half)):
        assert cases[name].num_heads >= 9 and cases[name].dtype == dtype  # inexact slopes
    g = cases["gqa_grouped"]
    assert 1 < g.num_heads_kv < g.num_heads and g.num_heads % g.num_heads_kv == 0
    group = g.num_heads // g.num_heads_kv  # h % H_kv and h // group differ for some head
    assert any(h % g.num_heads_kv != h // group for h in range(g.num_heads))
    assert cases["gqa_single_kv"].num_heads_kv == 1 < cases["gqa_single_kv"].num_heads
    for name in ("decode_one_query", "decode_chunk"):
        assert cases[name].causal and cases[name].n_k > cases[name].n_q
    assert cases["decode_one_query"].n_q == 1 < cases["decode_chunk"].n_q
    longer = cases["longer_queries"]
    assert longer.n_q > longer.n_k > 0 and longer.causal
    qpos, kpos = _positions(longer)
    assert qpos.min() < kpos.min()  # causal rows without an admissible key
    for name in ("bidirectional", "bidirectional_decode", "bidirectional_padded"):
        assert not cases[name].causal, name
    assert cases["bidirectional_decode"].n_q < cases["bidirectional_decode"].n_k
    assert cases["no_keys"].n_k == 0 < cases["no_keys"].n_q
    for name in ("positions_beyond_256", f"positions_beyond_256_{half}"):
        qpos, kpos = _positions(cases[name])
        assert min(qpos.min(), kpos.min()) > 256, name  # bf16 spacing there is 2
    for name in ("positions_far_from_zero", f"positions_far_from_zero_{half}"):
        qpos, kpos = _positions(cases[name])
        # around 2**20 and crossing it, beyond float16's range (65504)
        assert kpos.min() < 2**20 <= kpos.max() and kpos.min() > 65504, name
        assert qpos.min() > 65504, name
    for name, dtype in (
        (f"positions_beyond_256_{half}", half),
        (f"positions_far_from_zero_{half}", half),
        (f"peaked_softmax_{half}", half),
        ("positions_beyond_256", main),
    ):
        assert cases[name].dtype == dtype, name
    for name in (
        "sequence_longer_than_256",
        *(f"sequence_longer_than_256_{h}" for h in (half, "float16")),
    ):
        spec = cases[name]
        assert spec.n_q > 256 and spec.n_k > 256 and spec.positions == "default", name
        qpos, kpos = _positions(spec)
        assert kpos.max() > 256  # positions past a 256-entry table
    assert cases["sequence_longer_than_256_float16"].dtype == "float16"
    assert cases[f"sequence_longer_than_256_{half}"].dtype == half
    gaps = cases["positions_with_gaps"]
    qpos, kpos = _positions(gaps)
    assert gaps.positions == "explicit" and np.any(np.diff(kpos) > 1)  # gaps
    per = cases["per_sequence_positions"]
    assert per.positions == "per_sequence" and per.batch > 1
    qpos, kpos, _, _ = _keep(per)
    assert any(not np.array_equal(kpos[0], kpos[b]) for b in range(1, per.batch))
    for name in ("left_padding_masked", "padded_decode", "bidirectional_padded", "right_padding"):
        spec = cases[name]
        _, _, q_keep, k_keep = _keep(spec)
        assert spec.batch > 1 and not k_keep.all(), name  # some keys are padded
        # the sequences pad differently (in the same slots, pad in one, real in another)
        assert len({row.sum() for row in k_keep}) > 1, name
        steps = np.diff(k_keep.astype(int), axis=1)
        if name == "right_padding":
            assert spec.positions == "right_padded" and (steps <= 0).all(), name
        else:
            assert spec.positions == "padded" and (steps >= 0).all(), name  # left padding
    _, _, q_keep, _ = _keep(cases["left_padding_masked"])
    assert not q_keep.all()  # pad rows (empty)
    assert cases["padded_decode"].n_q < cases["padded_decode"].n_k
    tp = cases["tensor_parallel_heads"]
    assert tp.head_start > 0 and tp.num_heads_total > tp.head_start + tp.num_heads
    decode = cases["decode_cache_offset"]
    qpos, kpos = _positions(decode)
    assert decode.n_q == 1 < decode.n_k and kpos.min() >= 1000 and qpos[0] == kpos.max()
    packed = cases["packed_varlen"]
    qpos, kpos = _positions(packed)
    assert packed.positions == "packed" and np.any(np.diff(kpos) < 0)  # positions restart
    hd = cases["head_dim_not_power_of_two"]
    assert hd.head_dim & (hd.head_dim - 1) and hd.head_dim_v == hd.head_dim
    vd = cases["value_head_dim_differs"]
    assert vd.head_dim_v != vd.head_dim
    assert cases["batch"].batch > 1 and cases["batch"].positions == "default"
    sc = cases["scale_not_default"]
    assert sc.scale is not None and sc.scale not in (1.0, 1 / sc.head_dim)
    assert sc.scale != 1 / np.sqrt(sc.head_dim)
    ds = cases["default_scale"]
    assert ds.scale is None and ds.head_dim > 1 and ds.amplitude > 1
    assert cases["random_slopes"].slopes == "random"
    peaked = cases[f"peaked_softmax_{half}"]
    assert peaked.amplitude >= 4
    for name, spec in cases.items():
        assert max(spec.n_q, spec.n_k) <= 300, name  # "at most 300 tokens"
        if max(spec.n_q, spec.n_k) > 256:
            assert spec.num_heads <= 8, name  # "8 heads for the long half-precision ones"


def test_the_float16_low_precision_cases_without_bfloat16():
    cases = _cases(dtypes=("float16", "float64"))
    assert cases["peaked_softmax_float16"].dtype == "float16"
    assert "sequence_longer_than_256_bfloat16" not in cases
    assert cases["sequence_longer_than_256_float16"].dtype == "float16"
    assert cases["batch"].dtype == "float64"
    assert not any(n.endswith("_half") for n in cases)
    only = _cases(dtypes=("float64",))  # no low-precision dtype: no low-precision case
    assert all(s.dtype == "float64" for s in only.values())
    assert not any("float16" in n or "bfloat16" in n for n in only)


# ----------------------------------------------------------------------------- restrictions


def _plan(**kwargs):
    cases, not_covered = battery_plan(**kwargs)
    return dict(cases), {n.name: n.reason for n in not_covered}


def test_no_restriction_covers_every_case():
    cases, missing = _plan()
    assert not missing and list(cases) == [n for n, _ in battery()]
    assert all(isinstance(n, NotCovered) for n in battery_plan(causal=True)[1])


def test_a_causal_only_run_drops_the_bidirectional_cases_and_keeps_the_rest_causal():
    cases, missing = _plan(causal=True)
    bidi = {"bidirectional", "bidirectional_decode", "bidirectional_padded"}
    assert bidi <= set(missing) and all(missing[n] == "--causal" for n in bidi)
    assert all(spec.causal for spec in cases.values())
    assert "decode_one_query" in cases and "longer_queries" in cases


def test_a_bidirectional_only_run_drops_the_cases_about_causality():
    cases, missing = _plan(causal=False)
    assert missing.get("longer_queries") == "--causal"  # its target: causal empty rows
    assert all(not spec.causal for spec in cases.values())
    assert "bidirectional" in cases and "batch" in cases
    # the causal cases that are not about causality run bidirectionally; one that
    # becomes the same problem as an earlier one is not repeated
    assert all("the same problem as" in r or r == "--causal" for r in missing.values())


def test_positions_option_excludes_the_other_modes_and_the_offsets():
    cases, missing = _plan(positions=("default",))
    for name in ("positions_with_gaps", "per_sequence_positions", "left_padding_masked"):
        assert missing[name] == "--positions", name
    for name in ("positions_beyond_256", "positions_far_from_zero", "decode_cache_offset"):
        assert missing[name] == "--positions", name  # an offset needs explicit positions
    assert all(s.positions == "default" and s.offset == 0 for s in cases.values())
    for mode in ("explicit", "left_padding", "per_sequence"):
        cases, missing = _plan(positions=(mode,))
        assert "positions_beyond_256" in cases and "decode_cache_offset" in cases, mode
    cases, missing = _plan(positions=("padded",))
    assert "left_padding_masked" in cases and missing["positions_beyond_256"] == "--positions"
    assert missing["per_sequence_positions"] == "--positions"
    with pytest.raises(ValueError, match=r"^positions: entries must be in "):
        battery_plan(positions=("nowhere",))


def test_a_missing_capability_excludes_the_cases_it_targets():
    cases, missing = _plan(capabilities={"gqa": False})
    assert missing["gqa_grouped"] == missing["gqa_single_kv"] == "gqa"
    assert "batch" in cases
    cases, missing = _plan(capabilities={"attention_mask": False})
    for name in ("left_padding_masked", "padded_decode", "bidirectional_padded", "right_padding"):
        assert missing[name] == "attention_mask", name
    cases, missing = _plan(capabilities={"empty_rows": False})
    assert missing["no_keys"] == "empty_rows"  # what is compared: nothing left
    with pytest.raises(ValueError, match=r"^capabilities: unknown capability 'wings'$"):
        battery_plan(capabilities={"wings": True})
    cases, missing = _plan(capabilities={"gqa": True, "batch_positions": 1})
    assert not missing  # true values restrict nothing


def test_an_unsupported_dtype_is_not_the_main_dtype():
    cases, _ = _plan(dtypes=("float32", "float64"), capabilities={"float32": False})
    assert {s.dtype for s in cases.values()} == {"float64"}
    # no usable dtype at all: the given one is used, so every case names it as the reason
    cases, missing = _plan(dtypes=("float32",), capabilities={"float32": False})
    assert not cases and set(missing.values()) == {"float32"}
    assert list(missing) == [n for n, _ in battery(dtypes=("float32",))]


def test_the_standard_slope_rule_takes_the_max_bias():
    cases, _ = _plan(slopes="standard", max_bias=4.0)
    assert all(s.max_bias == 4.0 for s in cases.values())
    assert all(s.max_bias == 8.0 for s in _plan()[0].values())


#: cases whose bug class concerns no optional capability (slope rules, lengths, head_dim,
#: batch, default scale, low precision): any kernel that takes their dtype must run them
_UNIVERSAL = (
    *(f"heads_{h}" for h in (6, 12, 20, 40)),
    "heads_16_float32",
    "heads_16_bfloat16",
    "sequence_longer_than_256",
    "sequence_longer_than_256_bfloat16",
    "sequence_longer_than_256_float16",
    "head_dim_not_power_of_two",
    "batch",
    "default_scale",
    "random_slopes",
    "peaked_softmax_bfloat16",
)


def test_the_cases_about_no_capability_run_unchanged_on_a_minimal_kernel():
    """A causal, square, one-kv-head-per-head kernel without positions, mask or scale
    (only the core capabilities) runs every case that targets no capability as it is: a
    case that needed GQA or unequal lengths would be changed there (its purpose, the slope
    rule or the length, then tested on another problem than the documented one)."""
    dtypes = ("bfloat16", "float16", "float32")
    full = _cases(dtypes=dtypes)
    off = (
        "bidirectional",
        "gqa",
        "unequal_lengths",
        "head_dim_v",
        "scale",
        "positions",
        "batch_positions",
        "attention_mask",
        "right_padding",
        "varlen",
        "head_slice",
    )
    cases, missing = _plan(dtypes=dtypes, capabilities=dict.fromkeys(off, False))
    for name in _UNIVERSAL:
        assert name not in missing, (name, missing.get(name))
        assert cases[name] == full[name], name
        spec = cases[name]
        assert spec.num_heads_kv == spec.num_heads and spec.n_q == spec.n_k, name


def test_battery_defaults_and_restrictions_are_battery_plan_s():
    """``battery()`` is ``battery_plan()``'s cases with the documented defaults (seed 0)
    and the same restrictions."""
    assert battery() == battery_plan()[0] == battery(seed=0)
    assert [s.data_seed for _, s in battery()] == list(range(len(battery())))
    for restrictions in (
        dict(causal=True),
        dict(causal=False),
        dict(positions=("default",)),
        dict(capabilities={"gqa": False}),
        dict(max_bias=4.0, slopes="standard"),
    ):
        assert battery(**restrictions) == battery_plan(**restrictions)[0], restrictions
        assert battery(**restrictions) != battery(), restrictions


#: the capabilities each case is about (its bug class, module docstring): a kernel without
#: one of them cannot run the case as what it tests
_TARGETS = {
    "gqa_grouped": ("gqa",),
    "gqa_single_kv": ("gqa",),
    "decode_one_query": ("unequal_lengths",),
    "decode_chunk": ("unequal_lengths", "prefill"),
    "longer_queries": ("unequal_lengths", "prefill"),
    "bidirectional": ("bidirectional",),
    "bidirectional_decode": ("bidirectional",),
    "no_keys": ("empty", "empty_rows"),
    "positions_beyond_256": ("positions",),
    "positions_beyond_256_bfloat16": ("positions",),
    "positions_far_from_zero": ("positions",),
    "positions_far_from_zero_bfloat16": ("positions",),
    "positions_with_gaps": ("positions",),
    "decode_cache_offset": ("positions",),
    "per_sequence_positions": ("positions", "batch_positions"),
    "left_padding_masked": ("attention_mask",),
    "padded_decode": ("attention_mask",),
    "bidirectional_padded": ("attention_mask", "bidirectional"),
    "right_padding": ("attention_mask", "right_padding"),
    "tensor_parallel_heads": ("head_slice",),
    "packed_varlen": ("varlen",),
    "value_head_dim_differs": ("head_dim_v",),
    "scale_not_default": ("scale",),
}


def test_each_case_is_excluded_by_the_capabilities_it_targets():
    """A kernel without a capability does not run the cases about it as a changed problem
    (a decode case made square, positions dropped from a positions case): each is listed as
    not covered with that capability; the other cases stay (run, restricted, or the same
    problem as an earlier case)."""
    dtypes = ("bfloat16", "float32")
    everything = _cases(dtypes=dtypes)
    assert set(_TARGETS) | set(_UNIVERSAL) >= set(everything)
    for capability in sorted({c for caps in _TARGETS.values() for c in caps}):
        cases, missing = _plan(dtypes=dtypes, capabilities={capability: False})
        for name in everything:
            if capability in _TARGETS.get(name, ()):
                assert missing.get(name) == capability, (capability, name, missing.get(name))
            else:
                reason = missing.get(name, "the same problem as")
                # a packed batch has no one-query form (restrict returns None)
                nearest = (name, capability) == ("packed_varlen", "prefill")
                assert reason.startswith("the same problem as") or nearest, (name, reason)
        assert "batch" in cases and "heads_6" in cases


def test_the_bidirectional_cases_say_causal_false():
    """``causal`` of a bidirectional case is the bool ``False`` (a kernel is called with
    ``causal=spec.causal``; ``None`` is not a documented value)."""
    cases = _cases()
    for name in ("bidirectional", "bidirectional_decode", "bidirectional_padded"):
        assert cases[name].causal is False, name
    assert all(s.causal is True for n, s in cases.items() if not n.startswith("bidirectional"))


def test_a_bfloat16_only_kernel_gets_a_bfloat16_battery():
    """bfloat16 is the last main dtype choice: a kernel that takes only bfloat16 still gets
    every case, in bfloat16."""
    cases = _cases(dtypes=("bfloat16",))
    assert cases and {s.dtype for s in cases.values()} == {"bfloat16"}
    assert "heads_16_bfloat16" in cases and "batch" in cases


def test_a_repeated_problem_names_the_case_it_repeats():
    """Under ``causal=False`` some causal cases become earlier ones: each is listed by its
    own name with the name of a case that runs."""
    cases, not_covered = battery_plan(causal=False)
    names = [n for n, _ in battery()]
    repeats = [n for n in not_covered if n.reason.startswith("the same problem as")]
    assert repeats
    ran = {n for n, _ in cases}
    for entry in repeats:
        assert entry.name in names
        earlier = entry.reason.removeprefix("the same problem as ").removesuffix(" here")
        assert earlier in ran and names.index(earlier) < names.index(entry.name), entry
