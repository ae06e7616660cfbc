"""plsh_ref.testing.battery: each case's definition, field by field, and the property of
the bug class it targets.

The battery is a fixed table (the module docstring lists it): a weakened case (a
sequence of 200 tokens in ``sequence_longer_than_256``, positions that stay below 256 in
``positions_beyond_256``) would still run and pass against a broken kernel, so both the
exact table and the property that makes each case catch its bug class are asserted.
"""

from __future__ import annotations

import pytest

from plsh_ref.testing.battery import battery
from plsh_ref.testing.problems import ProblemSpec

BASE = dict(
    num_heads=4,
    num_heads_kv=4,
    n_q=10,
    n_k=10,
    head_dim=8,
    head_dim_v=8,
    causal=True,
)

# name -> fields that differ from BASE (the module's table); "{main}"/"{half}" are the
# main and low-precision dtypes
TABLE = [
    ("heads_6", dict(num_heads=6, num_heads_kv=6)),
    ("heads_12", dict(num_heads=12, num_heads_kv=12)),
    ("heads_20", dict(num_heads=20, num_heads_kv=20)),
    ("heads_40", dict(num_heads=40, num_heads_kv=40)),
    ("heads_16_{main}", dict(num_heads=16, num_heads_kv=16, n_q=24, n_k=24)),
    ("gqa_grouped", dict(num_heads=8, num_heads_kv=2)),
    ("gqa_single_kv", dict(num_heads=4, num_heads_kv=1)),
    ("decode_one_query", dict(n_q=1, n_k=12)),
    ("decode_chunk", dict(n_q=3, n_k=12)),
    ("longer_queries", dict(n_q=12, n_k=5)),
    ("bidirectional", dict(causal=False)),
    ("bidirectional_decode", dict(causal=False, n_q=4, n_k=12)),
    ("no_keys", dict(n_q=3, n_k=0)),
    ("positions_beyond_256", dict(offset=300, n_q=8, n_k=8)),
    ("positions_far_from_zero", dict(offset=2**20 - 3, n_q=8, n_k=8)),
    ("sequence_longer_than_256", dict(num_heads=2, num_heads_kv=2, n_q=300, n_k=300)),
    ("positions_with_gaps", dict(positions="explicit", pad=4)),
    ("per_sequence_positions", dict(positions="per_sequence", pad=3, batch=2)),
    ("left_padding_masked", dict(positions="padded", pad=10, batch=3)),
    ("padded_decode", dict(positions="padded", pad=6, batch=2, n_q=2, n_k=10)),
    ("head_dim_not_power_of_two", dict(head_dim=12, head_dim_v=12)),
    ("value_head_dim_differs", dict(head_dim=4, head_dim_v=6)),
    ("batch", dict(batch=3)),
    ("scale_not_default", dict(scale=0.3)),
    ("default_scale", dict(head_dim=16, head_dim_v=16, amplitude=2.0)),
]
GIVEN_SLOPES = [("random_slopes", dict(slopes="random"))]
HALF = [
    ("heads_16_{half}", dict(num_heads=16, num_heads_kv=16, n_q=24, n_k=24, dtype="{half}")),
    ("positions_beyond_256_{half}", dict(offset=300, n_q=8, n_k=8, dtype="{half}")),
    ("positions_far_from_zero_{half}", dict(offset=2**20 - 3, n_q=8, n_k=8, dtype="{half}")),
    (
        "peaked_softmax_{half}",
        dict(dtype="{half}", head_dim=16, head_dim_v=16, amplitude=4.0, n_q=16, n_k=16),
    ),
]


def expected(kind, seed, main, half, slopes):
    rows = TABLE + (GIVEN_SLOPES if slopes == "given" else []) + (HALF if half else [])
    base = ProblemSpec(kind=kind, dtype=main, num_samples=4 if kind == "plsh" else 1, **BASE)
    out = []
    for i, (name, changes) in enumerate(rows):
        changes = {
            k: (v.format(main=main, half=half) if isinstance(v, str) else v)
            for k, v in changes.items()
        }
        out.append(
            (name.format(main=main, half=half), base.replace(data_seed=1000 * seed + i, **changes))
        )
    return out


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
