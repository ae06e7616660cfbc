"""plsh_ref.testing.suite with JAX kernels: jax inputs (x64 mode on and off), jax results,
framework detection of a JAX kernel.

A file of its own (in ``mutation/targets.toml``'s entry of suite.py): JAX's CPU backend
costs CPU time in each mutant's run, so only the mutants of the functions these tests call
run them; ``tests/testing/test_suite_edges.py`` has no JAX.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from test_suite_edges import _problem, _recording

from plsh_ref.testing import suite as S
from plsh_ref.testing.problems import ProblemSpec

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")


@pytest.fixture
def jax_x64():
    """JAX with x64 mode set by the test (``set(True/False)``), restored afterwards."""
    before = jax.config.read("jax_enable_x64")
    yield lambda on: jax.config.update("jax_enable_x64", on)
    jax.config.update("jax_enable_x64", before)


def test_jax_inputs_without_and_with_x64(jax_x64):
    padded = ProblemSpec(
        dtype="float32", positions="padded", pad=2, batch=2, offset=3, n_q=4, n_k=4
    ).build()
    for x64, ints, floats in ((False, jnp.int32, jnp.float32), (True, jnp.int64, jnp.float64)):
        jax_x64(x64)
        assert S.jax_x64_enabled() is x64
        seen = []
        with warnings.catch_warnings():
            # no dtype the mode lacks is asked for (jax warns and truncates then)
            warnings.simplefilter("error")
            res = S.check_case(_recording("jax", seen), padded, framework="jax")
        assert res.passed and res.lse_error is not None, res.message
        query, kw = seen[0]
        assert isinstance(query, jax.Array) and query.dtype == jnp.float32
        np.testing.assert_array_equal(np.asarray(query), padded.query)
        for name in ("query_positions", "key_positions", "attention_mask"):
            assert isinstance(kw[name], jax.Array) and kw[name].dtype == ints, (x64, name)
            np.testing.assert_array_equal(np.asarray(kw[name]), padded.kernel_kwargs()[name])
        assert kw["slopes"].dtype == floats
        np.testing.assert_allclose(np.asarray(kw["slopes"]), padded.slopes, rtol=1e-7)
        assert kw["causal"] is True and kw["scale"] is None
    # float64 problems: only in x64 mode
    p64 = _problem()
    assert S.check_case(_recording("jax", []), p64, framework="jax").passed
    jax_x64(False)
    with pytest.raises(
        S.KernelContractError, match=r"^--dtypes: float64 with --framework jax needs"
    ):
        S.check_case(_recording("jax", []), p64, framework="jax")
    assert S.JAX_X64_MESSAGE.startswith("--dtypes: float64 with --framework jax needs x64 mode")
    # packed sequences: cu_seqlens as jax integers too
    seen = []

    def varlen(query, key, value, *, cu_seqlens, **kw):
        seen.append(cu_seqlens)
        return jnp.zeros((1, 2, query.shape[2], 4), dtype=query.dtype)

    packed = ProblemSpec(dtype="float32", positions="packed", pad=2, n_q=6, n_k=6).build()
    S.check_case(varlen, packed, framework="jax")
    assert seen[0].dtype == jnp.int32
    np.testing.assert_array_equal(np.asarray(seen[0]), packed.cu_seqlens)
    # a bfloat16 result (jax has bfloat16) is compared in float64
    bf16 = ProblemSpec(dtype="bfloat16", n_q=4, n_k=4).build()
    res = S.check_case(
        lambda q, k, v, **kw: jnp.zeros((1, 2, 4, 4), dtype=jnp.bfloat16), bf16, framework="jax"
    )
    assert res.error == pytest.approx(np.abs(bf16.reference()[0]).max(), rel=1e-12)
    with pytest.raises(
        S.KernelContractError,
        match=r"^kernel: returned output of type ndarray; expected jax.Array$",
    ):
        S.check_case(
            lambda q, k, v, **kw: np.zeros((1, 2, 4, 4), np.float32), padded, framework="jax"
        )


def test_detect_framework_finds_a_jax_kernel():

    def jax_kernel(query, key, value, **kw):
        return jnp.zeros((1,)), jnp.zeros((1,))

    assert S.detect_framework(jax_kernel, "alibi", "given", True) == "jax"
    assert S.probe_framework(jax_kernel, "alibi", "given", True, "jax") == ("jax", "")


def test_jax_results_are_read_as_float64(jax_x64):
    """A jax result of any dtype (bfloat16 too: through ml_dtypes) is read exactly."""
    jax_x64(True)
    values = np.array([[1.5, -0.25, 3.0]])
    for dtype in (jnp.bfloat16, jnp.float16, jnp.float32, jnp.float64):
        got = S._as_float64(jnp.asarray(values, dtype=dtype), "jax")
        assert type(got) is np.ndarray and got.dtype == np.float64, dtype
        np.testing.assert_array_equal(got, values)


def test_a_result_type_of_the_jax_package_is_a_jax_result():
    """jax < 0.4 defined its arrays in ``jax.interpreters.xla`` (today's are jaxlib's): a
    result whose type comes from the jax package is accepted as a jax array."""
    device_array = type("DeviceArray", (np.ndarray,), {"__module__": "jax.interpreters.xla"})
    inner = _recording("jax", [])

    def kernel(query, key, value, **kw):
        out, lse = inner(query, key, value, **kw)
        return np.asarray(out).view(device_array), lse

    res = S.check_case(kernel, _problem(dtype="float32"), framework="jax")
    assert res.passed and res.lse_error is not None, res.message
