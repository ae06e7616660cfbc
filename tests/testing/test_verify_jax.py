"""`plsh verify --framework jax`: jax arrays in and out, bfloat16, float64 only in x64 mode
(a clear message otherwise), detection of a JAX kernel. Few and small cases (each new
shape costs a compile)."""

from __future__ import annotations

import pytest

jax = pytest.importorskip("jax")

import _alibi_kernels as K  # noqa: E402

from plsh_ref.cli import main  # noqa: E402
from plsh_ref.testing import ProblemSpec, check_case  # noqa: E402
from plsh_ref.testing.battery import battery  # noqa: E402


def test_jax_kernel_is_detected_and_passes(capsys):
    code = main(
        ["verify", "_alibi_kernels:jax_alibi", "--no-battery", "--cases", "4", "--long-cases", "0"]
    )
    out = capsys.readouterr().out
    assert code == 0 and "framework=jax" in out, out
    assert "dtypes=float16,bfloat16,float32" in out


def test_jax_bfloat16_positions_bug_is_caught():
    specs = dict(battery(dtypes=("bfloat16", "float32")))
    spec = specs["positions_beyond_256_bfloat16"]
    good = check_case(K.jax_alibi, spec.build(), framework="jax")
    bad = check_case(K.jax_positions_in_input_dtype, spec.build(), framework="jax")
    assert good.passed, good.message
    assert bad.status == "FAIL", bad  # negative control
    float32 = specs["positions_beyond_256"]
    assert check_case(K.jax_positions_in_input_dtype, float32.build(), framework="jax").passed


def test_jax_float64_needs_x64_mode(capsys):
    previous = jax.config.read("jax_enable_x64")
    jax.config.update("jax_enable_x64", False)
    try:
        code = main(
            ["verify", "_alibi_kernels:jax_alibi", "--framework", "jax", "--dtypes", "float64"]
        )
    finally:
        jax.config.update("jax_enable_x64", previous)
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert "float64 with --framework jax needs x64 mode: set JAX_ENABLE_X64=1" in err


def test_jax_float64_in_x64_mode():
    previous = jax.config.read("jax_enable_x64")
    jax.config.update("jax_enable_x64", True)
    try:
        problem = ProblemSpec(dtype="float64", n_q=5, n_k=7).build()
        result = check_case(K.jax_alibi, problem, framework="jax")
        assert result.passed, result.message
    finally:
        jax.config.update("jax_enable_x64", previous)
