"""plsh_ref.testing.suite at its edges: the case result's ratio and status in every
branch, the capability rules of each problem, the kernel contract's refusals, and
check_case's verdicts and messages for kernels that are wrong in one precise way.
"""

from __future__ import annotations

import functools
import math
import time

import numpy as np
import pytest

from plsh_ref.testing import suite as S
from plsh_ref.testing.examples import numpy_alibi, numpy_alibi_standard_slopes
from plsh_ref.testing.problems import ProblemSpec

INF = math.inf


# --- CaseResult -----------------------------------------------------------------------


def test_ratio_and_status_in_every_branch():
    R = S.CaseResult
    assert R(True, 1.0, 4.0).ratio == 0.25 and R(True, 1.0, 4.0).status == "pass"
    assert R(False, 5.0, 4.0).status == "FAIL"
    skip = R(False, math.nan, 0.0, skipped=True)
    assert skip.ratio == 0.0 and skip.status == "skip"
    assert R(False, INF, 1.0).ratio == INF
    assert R(False, math.nan, 1.0).ratio == INF
    assert R(True, 0.0, 0.0).ratio == 0.0  # nothing allowed, nothing wrong
    assert R(False, 1e-300, 0.0).ratio == INF
    assert R(True, 1.0, 2.0, lse_error=3.0, lse_allowed=1.0).ratio == 3.0
    assert R(True, 3.0, 2.0, lse_error=1.0, lse_allowed=4.0).ratio == 1.5
    assert R(False, 1.0, 2.0, lse_error=INF, lse_allowed=1.0).ratio == INF
    assert R(True, 1.0, 2.0, lse_error=0.0, lse_allowed=0.0).ratio == 0.5
    assert R(False, 1.0, 2.0, lse_error=1e-9, lse_allowed=0.0).ratio == INF
    # a failure reported by message only (e.g. lse -inf on the wrong rows)
    assert R(False, 1.0, 2.0, message="lse must be -inf exactly").ratio == INF
    assert R(False, 1.0, 2.0, message="output contains NaN at 1 entries").ratio == INF
    assert R(False, 1.0, 2.0, message="output error 3 > allowed 2").ratio == 0.5
    assert R(True, 1.0, 2.0, message="lse -inf note").ratio == 0.5  # passed: message ignored


# --- capabilities ----------------------------------------------------------------------


def test_kernel_capabilities():
    def kernel(query, key, value, **kw):
        return None

    caps = S.kernel_capabilities(kernel)
    assert set(caps) == set(S.CAPABILITIES) and all(caps.values())
    kernel.supports = {"gqa": False, "float16": np.bool_(False)}
    caps = S.kernel_capabilities(kernel, {"causal": False, "gqa": True})
    assert caps["gqa"] is True and caps["float16"] is False and caps["causal"] is False
    assert type(caps["float16"]) is bool
    assert caps["bidirectional"] is True
    with pytest.raises(
        S.KernelContractError, match=r"^supports: unknown capability 'flash'; known: causal, "
    ):
        S.kernel_capabilities(kernel, {"flash": True})
    with pytest.raises(
        S.KernelContractError, match=r"^supports: 'gqa' must be True or False, got int 0$"
    ):
        S.kernel_capabilities(kernel, {"gqa": 0})
    kernel.supports = None
    assert all(S.kernel_capabilities(kernel).values())
    assert set(S.CAPABILITIES) >= {"float16", "bfloat16", "float32", "float64", "lse"}


# --- the kernel contract ---------------------------------------------------------------


def test_load_kernel(tmp_path, monkeypatch):
    assert S.load_kernel("plsh_ref.testing.examples:numpy_alibi") is numpy_alibi
    for bad in ("nocolon", "a:b:c", ":f", "m:", 3):
        with pytest.raises(S.KernelContractError, match=r"^kernel: expected MODULE:FUNCTION, got "):
            S.load_kernel(bad)
    with pytest.raises(
        S.KernelContractError,
        match=r"^kernel: cannot import module 'no_such_mod_xyz': ModuleNotFoundError: No module named 'no_such_mod_xyz'$",
    ):
        S.load_kernel("no_such_mod_xyz:f")
    with pytest.raises(
        S.KernelContractError,
        match=r"^kernel: module 'plsh_ref.testing' has no attribute 'examples.nope'$",
    ):
        S.load_kernel("plsh_ref.testing:examples.nope")
    assert S.load_kernel("plsh_ref.testing:examples.numpy_alibi") is numpy_alibi
    with pytest.raises(
        S.KernelContractError,
        match=r"^kernel: plsh_ref.testing.suite:FRAMEWORKS is a tuple, not a function$",
    ):
        S.load_kernel("plsh_ref.testing.suite:FRAMEWORKS")
    (tmp_path / "my_kernel_in_cwd.py").write_text("def f(q, k, v, **kw):\n    return q\n")
    (tmp_path / "broken_kernel_mod.py").write_text("raise RuntimeError('boom\\nsecond line')\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(S.sys, "path", [p for p in S.sys.path if p not in ("", str(tmp_path))])
    assert S.load_kernel("my_kernel_in_cwd:f").__name__ == "f"
    with pytest.raises(
        S.KernelContractError,
        match=r"^kernel: cannot import module 'broken_kernel_mod': RuntimeError: boom$",
    ):
        S.load_kernel("broken_kernel_mod:f")


def test_check_signature_and_slope_mode():
    def good(query, key, value, *, slopes, causal, scale, query_positions, key_positions):
        return None

    def masked(
        query,
        key,
        value,
        *,
        slopes,
        causal,
        scale,
        query_positions,
        key_positions,
        attention_mask=None,
    ):
        return None

    def standard(query, key, value, *, causal, scale, query_positions, key_positions):
        return None

    assert S.check_signature(good, "alibi") is False  # no attention_mask argument
    assert S.check_signature(masked, "alibi") is True
    assert S.check_signature(standard, "alibi", "standard") is False
    assert S.check_signature(max, "alibi") is True  # a builtin without a signature
    with pytest.raises(
        S.KernelContractError,
        match=r"does not match the alibi contract f\(query, key, value, \*, slopes, causal, scale, query_positions, key_positions\[, attention_mask\]\)",
    ):
        S.check_signature(standard, "alibi")
    with pytest.raises(S.KernelContractError, match=r"; it takes slopes: use --slopes given$"):
        S.check_signature(lambda q, k, v, *, slopes: None, "alibi", "standard")
    with pytest.raises(
        S.KernelContractError,
        match=r"the plsh contract f\(query, key, value, \*, partition, causal",
    ):
        S.check_signature(good, "plsh")
    with pytest.raises(ValueError, match=r"^kind: must be one of \('alibi', 'plsh'\), got 'x'$"):
        S.check_signature(good, "x")
    with pytest.raises(
        ValueError, match=r"^slopes: must be one of \('given', 'standard'\), got 'x'$"
    ):
        S.check_signature(good, "alibi", "x")
    assert S.slope_mode(good) == "given"
    assert S.slope_mode(standard) == "standard"
    assert S.slope_mode(lambda q, k, v, **kw: None) == "given"
    assert S.slope_mode(max) == "given"


# --- check_case ------------------------------------------------------------------------


def _problem(**changes):
    fields = dict(dtype="float64", num_heads=2, num_heads_kv=2, n_q=4, n_k=4)
    return ProblemSpec(**(fields | changes)).build()


def test_check_case_passes_the_reference_kernel():
    res = S.check_case(numpy_alibi, _problem())
    assert res.passed and res.status == "pass" and res.message == ""
    assert res.lse_error is not None and res.lse_error <= res.lse_allowed
    assert res.error <= res.allowed and res.empty_rows == 0
    res = S.check_case(numpy_alibi_standard_slopes, _problem())
    assert res.passed
    longer = S.check_case(numpy_alibi, _problem(n_q=6, n_k=2))
    # n_q = 6 > n_k = 2: query positions -4..1, rows -4..-1 have no key, in each of 2 heads
    assert longer.passed and longer.empty_rows == 2 * 4


def test_unsupported_cases_are_skipped_with_the_reason():
    def no_mask(query, key, value, *, slopes, causal, scale, query_positions, key_positions):
        raise AssertionError("never called")

    padded = ProblemSpec(dtype="float64", positions="padded", pad=2, batch=2).build()
    res = S.check_case(no_mask, padded)
    assert res.skipped and res.status == "skip" and not res.passed
    assert (
        res.message == "unsupported: attention_mask (the kernel takes no attention_mask argument)"
    )
    res = S.check_case(numpy_alibi, _problem(), supports={"float64": False, "causal": False})
    assert res.skipped and res.message == "unsupported: float64, causal"
    assert math.isnan(res.error) and res.allowed == 0.0


def _with_lse(query, key, value, **kw):
    from plsh_ref.testing.reference import alibi_reference

    return alibi_reference(query, key, value, **kw)


def _kernel(transform):
    def kernel(
        query,
        key,
        value,
        *,
        slopes,
        causal,
        scale,
        query_positions,
        key_positions,
        attention_mask=None,
    ):
        out, lse = _with_lse(
            query,
            key,
            value,
            slopes=slopes,
            causal=causal,
            scale=scale,
            query_positions=query_positions,
            key_positions=key_positions,
            attention_mask=attention_mask,
        )
        return transform(out.astype(query.dtype), lse)

    return kernel


def test_output_errors_are_located():
    def shifted(out, lse):
        out = out.copy()
        out[0, 1, 2, 3] += 1.0
        return out, lse

    res = S.check_case(_kernel(shifted), _problem())
    assert not res.passed and res.worst_index == (0, 1, 2, 3)
    assert res.message.startswith("output error 1 > allowed ") and res.message.endswith(
        " at (0, 1, 2, 3)"
    )
    assert res.error == pytest.approx(1.0, abs=1e-12)


def test_errors_on_rows_without_keys_are_named():
    def nonzero_empty(out, lse):
        out = out.copy()
        out[0, 0, 0] = 0.5  # n_q > n_k: row 0 has no admissible key
        return out, lse

    res = S.check_case(_kernel(nonzero_empty), _problem(n_q=6, n_k=2))
    assert "(a row without admissible keys: expected output 0)" in res.message

    def nan_empty(out, lse):
        out = out.copy()
        out[0, :, :4] = np.nan  # rows 0..3 have no key (n_k = 2, positions -4..1)
        return out, lse

    res = S.check_case(_kernel(nan_empty), _problem(n_q=6, n_k=2))
    assert res.message == (
        "output contains NaN at 32 entries, first (0, 0, 0, 0), (0, 0, 0, 1), (0, 0, 0, 2)"
        " (all on rows without admissible keys: expected output 0)"
    )
    assert res.ratio == INF

    def nan_mixed(out, lse):
        out = out.copy()
        out[0, 0, 3:5, 0] = np.nan  # row 3 empty, row 4 not
        return out, lse

    res = S.check_case(_kernel(nan_mixed), _problem(n_q=6, n_k=2))
    assert res.message.endswith(" (1 of 2 rows without admissible keys)")

    def nan_full(out, lse):
        out = out.copy()
        out[0, 0, 1, 0] = np.nan
        return out, lse

    res = S.check_case(_kernel(nan_full), _problem())
    assert res.message.endswith(" (on rows with admissible keys)")


def test_lse_checks():
    def finite_lse_on_empty_row(out, lse):
        lse = lse.copy()
        lse[0, 1, 0] = 0.0
        return out, lse

    res = S.check_case(_kernel(finite_lse_on_empty_row), _problem(n_q=6, n_k=2))
    assert (
        "lse must be -inf on rows without admissible keys (1 of them are not; first at (0, 1, 0): got 0.0)"
        in res.message
    )
    assert "have admissible keys" not in res.message and not res.passed

    def neginf_lse_on_a_row_with_keys(out, lse):
        lse = lse.copy()
        lse[0, 1, 5] = -np.inf  # query 5 of 6 sees both keys
        return out, lse

    # the opposite case reads as itself, not as "must be -inf on rows without keys"
    res = S.check_case(_kernel(neginf_lse_on_a_row_with_keys), _problem(n_q=6, n_k=2))
    ref_lse = _problem(n_q=6, n_k=2).reference()[1]
    assert res.message.startswith(
        "lse is -inf on rows that have admissible keys (1 of them; first at (0, 1, 5): "
        f"expected {ref_lse[0, 1, 5]})"
    )
    assert "without admissible keys" not in res.message and not res.passed

    def bad_lse(out, lse):
        return out, lse + 1.0

    res = S.check_case(_kernel(bad_lse), _problem())
    assert res.message.startswith("lse error 1 > allowed ") and not res.passed
    # declaring lse unsupported skips the LSE comparison only
    res = S.check_case(_kernel(bad_lse), _problem(), supports={"lse": False})
    assert res.passed and res.lse_error is None

    def out_only(out, lse):
        return out

    res = S.check_case(_kernel(out_only), _problem())
    assert res.passed and res.lse_error is None and res.lse_allowed is None


def test_contract_violations_raise():
    for transform, message in [
        (
            lambda o, l: (o, l, l),
            r"^kernel: returned a tuple of length 3; expected output or \(output, lse\)$",
        ),
        (
            lambda o, l: {"out": o},
            r"^kernel: returned output of type dict; expected numpy.ndarray$",
        ),
        (
            lambda o, l: (o, l.tolist()),
            r"^kernel: returned lse of type list; expected numpy.ndarray$",
        ),
        (
            lambda o, l: o[..., :1],
            r"^kernel: output has shape \(1, 2, 4, 1\), expected \(1, 2, 4, 4\) \(batch, num_heads, n_q, head_dim_v\)$",
        ),
        (
            lambda o, l: o.astype(np.float32),
            r"^kernel: output has dtype float32, expected the input dtype float64$",
        ),
        (
            lambda o, l: (o, l[..., :2]),
            r"^kernel: lse has shape \(1, 2, 2\), expected \(1, 2, 4\) \(batch, num_heads, n_q\)$",
        ),
        (lambda o, l: (o, l.astype(np.int64)), r"^kernel: lse has dtype int64, expected floating$"),
    ]:
        with pytest.raises(S.KernelContractError, match=message):
            S.check_case(_kernel(transform), _problem())
    res = S.check_case(_kernel(lambda o, l: [o, l]), _problem())
    assert res.passed  # a list of two is (output, lse)


def test_exceptions_and_timeouts_are_reported():
    def raising(query, key, value, **kw):
        raise RuntimeError("first line\nsecond line")

    res = S.check_case(raising, _problem())
    assert not res.passed and res.message == "raised RuntimeError: first line"
    assert "RuntimeError" in res.traceback and math.isnan(res.error)

    def silent(query, key, value, **kw):
        raise KeyError()

    assert S.check_case(silent, _problem()).message == "raised KeyError: "

    def slow(query, key, value, **kw):
        time.sleep(2.0)
        return numpy_alibi(query, key, value, **kw)

    res = S.check_case(slow, _problem(), timeout=0.05)
    assert res.message == "timed out: no result after 0.05 s (--timeout)" and res.traceback == ""

    def raises_timeout(query, key, value, **kw):
        raise TimeoutError("own timeout")

    res = S.check_case(raises_timeout, _problem(), timeout=5.0)
    assert res.message == "raised TimeoutError: own timeout"  # the kernel's own, with a traceback
    res = S.check_case(numpy_alibi, _problem(), timeout=30.0)
    assert res.passed


def test_detect_framework():
    assert S.detect_framework(numpy_alibi, "alibi", "given", True) == "numpy"

    def lists(query, key, value, **kw):
        return [1.0]

    with pytest.raises(
        S.KernelContractError,
        match=r"^framework: cannot tell what the kernel takes \(with numpy inputs it returned a float",
    ):
        S.detect_framework(lists, "alibi", "given", True)

    def raising(query, key, value, **kw):
        raise ValueError("nope\nmore")

    with pytest.raises(
        S.KernelContractError, match=r"with numpy inputs it raised ValueError: nope[;)]"
    ):
        S.detect_framework(raising, "alibi", "given", True)


# --- check_case's own arguments ----------------------------------------------------------


def test_check_case_refuses_its_arguments_naming_them():
    """Each refusal names the argument, before the kernel runs (the kernel here raises if
    called), and the accepted values on each side of a refusal are accepted."""
    p = _problem()
    for framework in ("jax ", "Numpy", "tensorflow"):
        with pytest.raises(ValueError, match=r"^framework: must be one of \('numpy', 'torch', "):
            S.check_case(numpy_alibi, p, framework=framework)
    for framework, device in (("numpy", "cuda"), ("jax", "cuda:0"), ("numpy", "meta")):
        with pytest.raises(
            ValueError, match=rf"^device: {framework} kernels run on 'cpu', got '{device}'$"
        ):
            S.check_case(numpy_alibi, p, framework=framework, device=device)
    with pytest.raises(ValueError, match=r"^slopes: must be one of \('given', 'standard'\)"):
        S.check_case(numpy_alibi, p, slopes="x")
    random = ProblemSpec(dtype="float64", slopes="random").build()
    with pytest.raises(
        ValueError, match=r"^slopes: standard-slopes mode needs problems with standard slopes$"
    ):
        S.check_case(numpy_alibi_standard_slopes, random)
    assert S.check_case(numpy_alibi, random).passed  # given slopes: the random ones are fine
    bf16 = ProblemSpec(dtype="bfloat16").build()
    with pytest.raises(S.KernelContractError, match=r"^dtypes: bfloat16 needs --framework torch"):
        S.check_case(numpy_alibi, bf16)
    assert S.check_case(numpy_alibi, p, slopes="given").passed
    assert S.check_case(numpy_alibi_standard_slopes, p, slopes="standard").passed


# --- loading a kernel from a file --------------------------------------------------------


def test_load_kernel_from_a_file_path(tmp_path, monkeypatch):
    """A ``.py`` path (or one with a folder separator) is loaded as a file: registered in
    ``sys.modules`` under its base name, its folder on the import path (a sibling module
    imports), and every failure one line naming the file or module."""
    sub = tmp_path / "kernels"
    sub.mkdir()
    (sub / "helper_mod_for_file_kernel.py").write_text("VALUE = 7\n")
    (sub / "file_kernel_mod.py").write_text(
        "import helper_mod_for_file_kernel as h\nANSWER = h.VALUE\nCOUNT = 3\n"
        "class Opaque:\n    pass\nTHING = Opaque()\n"
        "def f(q, k, v, **kw):\n    return q\n"
    )
    (sub / "exits_at_import.py").write_text("import sys\nsys.exit(3)\n")
    (sub / "silent_error_mod.py").write_text("raise RuntimeError()\n")
    (sub / "interrupts_mod.py").write_text("raise KeyboardInterrupt\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(S.sys, "path", list(S.sys.path))
    monkeypatch.setattr(S.sys, "modules", dict(S.sys.modules))
    f = S.load_kernel("kernels/file_kernel_mod.py:f")
    assert f.__name__ == "f"
    module = S.sys.modules["file_kernel_mod"]
    assert module.ANSWER == 7 and module.f is f
    assert S.sys.path[0] == str(sub)
    assert S.load_kernel("./kernels/file_kernel_mod.py:f").__module__ == "file_kernel_mod"
    with pytest.raises(
        S.KernelContractError, match=r"^kernel: kernels/file_kernel_mod.py:COUNT is an int, "
    ):
        S.load_kernel("kernels/file_kernel_mod.py:COUNT")
    with pytest.raises(S.KernelContractError, match=r"THING is an Opaque, not a function$"):
        S.load_kernel("kernels/file_kernel_mod.py:THING")
    with pytest.raises(S.KernelContractError, match=r"^function: no file 'kernels/missing\.py'$"):
        S.load_kernel("kernels/missing.py:f", label="function")
    with pytest.raises(S.KernelContractError, match=r"^kernel: no file 'kernels/file_kernel_mod'$"):
        S.load_kernel("kernels/file_kernel_mod:f")  # a separator: a path, not a module name
    with pytest.raises(
        S.KernelContractError,
        match=r"^kernel: module 'kernels/exits_at_import.py' called sys.exit\(3\) at import time$",
    ):
        S.load_kernel("kernels/exits_at_import.py:f")
    with pytest.raises(
        S.KernelContractError,
        match=r"^kernel: cannot import module 'kernels/silent_error_mod.py': RuntimeError: $",
    ):
        S.load_kernel("kernels/silent_error_mod.py:f")
    with pytest.raises(KeyboardInterrupt):
        S.load_kernel("kernels/interrupts_mod.py:f")
    with pytest.raises(
        S.KernelContractError,
        match=r"^function: module 'plsh_ref.testing' has no attribute 'nope'$",
    ):
        S.load_kernel("plsh_ref.testing:nope", label="function")
    with pytest.raises(
        S.KernelContractError, match=r"^function: expected MODULE:FUNCTION, got 'x'$"
    ):
        S.load_kernel("x", label="function")


def test_load_kernel_puts_the_current_folder_on_the_path_once(tmp_path, monkeypatch):
    (tmp_path / "cwd_kernel_once.py").write_text("def f(q, k, v, **kw):\n    return q\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(S.sys, "path", [p for p in S.sys.path if p not in ("", str(tmp_path))])
    S.load_kernel("cwd_kernel_once:f")
    assert S.sys.path[0] == str(tmp_path)
    S.load_kernel("cwd_kernel_once:f")
    assert S.sys.path.count(str(tmp_path)) == 1
    # "" (the interpreter's current folder) already stands for it: nothing added
    monkeypatch.setattr(S.sys, "path", ["", *S.sys.path[1:]])
    S.load_kernel("cwd_kernel_once:f")
    assert str(tmp_path) not in S.sys.path


def test_load_kernel_names_the_type_with_its_article():
    with pytest.raises(
        S.KernelContractError,
        match=r"^kernel: plsh_ref.testing.suite:PRECISION_FINDING is a str, not a function$",
    ):
        S.load_kernel("plsh_ref.testing.suite:PRECISION_FINDING")
    with pytest.raises(
        S.KernelContractError, match=r"^kernel: plsh_ref.testing.suite:_KWARGS is a dict, not "
    ):
        S.load_kernel("plsh_ref.testing.suite:_KWARGS")
    with pytest.raises(
        S.KernelContractError, match=r"^kernel: plsh_ref.testing.suite:os is a module, not a "
    ):
        S.load_kernel("plsh_ref.testing.suite:os")
    with pytest.raises(
        S.KernelContractError,
        match=r"^kernel: plsh_ref.testing.suite:__spec__ is a ModuleSpec, not a function$",
    ):
        S.load_kernel("plsh_ref.testing.suite:__spec__")


# --- frameworks: torch and jax inputs --------------------------------------------------


def _recording(framework, seen):
    """A correct kernel taking and returning ``framework``'s arrays, recording what it got."""

    def kernel(query, key, value, **kw):
        seen.append((query, kw))
        args = {n: (x if x is None or np.isscalar(x) else np.asarray(x)) for n, x in kw.items()}
        out, lse = _with_lse(np.asarray(query), np.asarray(key), np.asarray(value), **args)
        if framework == "torch":
            import torch

            return torch.from_numpy(out).to(query.dtype), torch.from_numpy(lse)
        import jax.numpy as jnp

        return jnp.asarray(out, dtype=query.dtype), jnp.asarray(lse)

    return kernel


def test_torch_inputs_and_results():
    torch = pytest.importorskip("torch")
    seen = []
    padded = ProblemSpec(
        dtype="float64", positions="padded", pad=2, batch=2, offset=3, n_q=4, n_k=4
    ).build()
    res = S.check_case(_recording("torch", seen), padded, framework="torch")
    assert res.passed, res.message
    query, kw = seen[0]
    assert isinstance(query, torch.Tensor) and query.dtype == torch.float64
    np.testing.assert_array_equal(query.numpy(), padded.query)
    for name in ("query_positions", "key_positions", "attention_mask"):
        assert isinstance(kw[name], torch.Tensor), name
        np.testing.assert_array_equal(kw[name].numpy(), padded.kernel_kwargs()[name])
    assert kw["slopes"].dtype == torch.float64
    np.testing.assert_array_equal(kw["slopes"].numpy(), padded.slopes)
    assert kw["scale"] is None and kw["causal"] is True
    seen.clear()
    p32 = _problem(dtype="float32")
    res = S.check_case(_recording("torch", seen), p32, framework="torch")
    assert res.passed and seen[0][0].dtype == torch.float32 and res.lse_error is not None
    assert res.error <= res.allowed and res.error < 1e-6
    # a wrong output is measured in float64 on CPU
    wrong = S.check_case(
        lambda q, k, v, **kw: torch.zeros(1, 2, 4, 4, dtype=torch.float32), p32, framework="torch"
    )
    ref = p32.reference()[0]
    assert wrong.error == pytest.approx(np.abs(ref).max(), rel=1e-12) and not wrong.passed
    with pytest.raises(
        S.KernelContractError,
        match=r"^kernel: returned output of type ndarray; expected torch.Tensor$",
    ):
        S.check_case(
            lambda q, k, v, **kw: np.zeros((1, 2, 4, 4), np.float32), p32, framework="torch"
        )
    with pytest.raises(
        S.KernelContractError,
        match=r"^kernel: output has dtype float64, expected the input dtype float32$",
    ):
        S.check_case(
            lambda q, k, v, **kw: torch.zeros(1, 2, 4, 4, dtype=torch.float64),
            p32,
            framework="torch",
        )
    with pytest.raises(S.KernelContractError, match=r"^kernel: output is on meta, inputs on cpu$"):
        S.check_case(
            lambda q, k, v, **kw: torch.zeros(1, 2, 4, 4, device="meta"), p32, framework="torch"
        )

    def bf16_lse(query, key, value, **kw):
        args = {n: (x.numpy() if isinstance(x, torch.Tensor) else x) for n, x in kw.items()}
        q, k, v = (x.float().numpy() for x in (query, key, value))
        out, lse = _with_lse(q, k, v, **args)
        return torch.from_numpy(out).to(torch.bfloat16), torch.from_numpy(lse).to(torch.bfloat16)

    res = S.check_case(bf16_lse, ProblemSpec(dtype="bfloat16").build(), framework="torch")
    assert res.lse_error is not None  # a bfloat16 lse is a floating lse: compared, no refusal


def test_detect_framework_tries_numpy_then_torch():
    torch = pytest.importorskip("torch")

    def torch_only(query, key, value, **kw):
        if not isinstance(query, torch.Tensor):
            raise TypeError("tensors please\nsecond line")
        return torch.zeros(1)

    assert S.detect_framework(torch_only, "alibi", "given", True) == "torch"
    assert S.probe_framework(torch_only, "alibi", "given", True, "numpy") == (
        None,
        "with numpy inputs it raised TypeError: tensors please",
    )
    assert S.probe_framework(torch_only, "alibi", "given", True, "torch") == ("torch", "")

    def lists(query, key, value, **kw):
        return [1.0]

    with pytest.raises(
        S.KernelContractError,
        match=r"^framework: cannot tell what the kernel takes \(with numpy inputs it returned a "
        r"float; with torch inputs it returned a float\); pass --framework numpy, torch or jax$",
    ):
        S.detect_framework(lists, "alibi", "given", True)

    def nothing(query, key, value, **kw):
        return ()

    assert S.probe_framework(nothing, "alibi", "given", True, "numpy") == (
        None,
        "with numpy inputs it returned a tuple",
    )

    def silent(query, key, value, **kw):
        raise KeyError()

    assert S.probe_framework(silent, "alibi", "given", True, "numpy") == (
        None,
        "with numpy inputs it raised KeyError: ",
    )
    calls = []

    def shapes(query, key, value, **kw):
        calls.append((query.shape, key.shape, query.dtype, sorted(kw)))
        return np.zeros(1)

    assert S.detect_framework(shapes, "plsh", "given", False) == "numpy"
    assert calls == [
        (
            (1, 2, 4, 4),
            (1, 2, 4, 4),
            np.float32,
            ["causal", "key_positions", "partition", "query_positions", "scale"],
        )
    ]
    calls.clear()
    S.probe_framework(shapes, "alibi", "standard", True, "numpy")
    assert calls[0][3] == ["attention_mask", "causal", "key_positions", "query_positions", "scale"]

    def slow(query, key, value, **kw):
        time.sleep(2.0)
        return np.zeros(1)

    assert S.probe_framework(slow, "alibi", "given", True, "numpy", timeout=0.05) == (
        None,
        "with numpy inputs it raised TimeoutError: no result after 0.05 s (--timeout)",
    )


def test_jax_x64_enabled_without_jax(monkeypatch):
    monkeypatch.setitem(S.sys.modules, "jax", None)  # import jax raises ImportError
    assert S.jax_x64_enabled() is False


# --- precision findings ------------------------------------------------------------------


def _expected_row_constant(problem):
    """``m_h (p_j - p_0)`` written out per element (``p_0``: first real key)."""
    qpos, kpos, q_keep, k_keep = problem.positions_and_keep()
    spec = problem.spec
    out = np.full((spec.batch, spec.num_heads, spec.n_q, spec.n_k), -np.inf)
    for b in range(spec.batch):
        real = [int(p) for p, keep in zip(kpos[b], k_keep[b]) if keep]
        p0 = real[0] if real else 0
        for h in range(spec.num_heads):
            for i in range(spec.n_q):
                for j in range(spec.n_k):
                    if q_keep[b, i] and k_keep[b, j] and kpos[b, j] <= qpos[b, i]:
                        out[b, h, i, j] = problem.slopes[h] * (int(kpos[b, j]) - p0)
    return out


def test_row_constant_bias():
    for spec in (
        ProblemSpec(dtype="float32", n_q=3, n_k=5, offset=7),
        ProblemSpec(dtype="float32", positions="padded", pad=2, batch=3, n_q=4, n_k=4, offset=5),
        ProblemSpec(dtype="float32", positions="left_padding", pad=2, n_q=4, n_k=4),
    ):
        problem = spec.build()
        got = S.row_constant_bias(problem)
        assert got.shape == (spec.batch, spec.num_heads, spec.n_q, spec.n_k)
        np.testing.assert_array_equal(got, _expected_row_constant(problem), err_msg=str(spec))
        # the same softmax as the ALiBi bias: a constant per query row apart
        w = problem.log_weight()
        real = ~np.isneginf(w)
        diff = np.where(real, got - np.where(real, w, 0.0), 0.0)
        row = np.where(real.any(-1), diff.max(-1), 0.0)
        np.testing.assert_allclose(
            np.where(real, diff, row[..., None]), np.broadcast_to(row[..., None], diff.shape)
        )
    with pytest.raises(
        ValueError, match=r"^problem: the row-constant form holds for causal ALiBi problems only$"
    ):
        S.row_constant_bias(ProblemSpec(causal=False).build())
    with pytest.raises(ValueError, match=r"^problem: the row-constant form"):
        S.row_constant_bias(ProblemSpec(kind="plsh").build())


def _expected_rounded(problem):
    from plsh_ref.testing.problems import round_to_dtype

    qpos, kpos, q_keep, k_keep = problem.positions_and_keep()
    spec = problem.spec
    out = np.full((spec.batch, spec.num_heads, spec.n_q, spec.n_k), -np.inf)
    for b in range(spec.batch):
        qp = round_to_dtype(qpos[b].astype(np.float64), spec.dtype).astype(np.float64)
        kp = round_to_dtype(kpos[b].astype(np.float64), spec.dtype).astype(np.float64)
        for h in range(spec.num_heads):
            for i in range(spec.n_q):
                for j in range(spec.n_k):
                    if not (q_keep[b, i] and k_keep[b, j]):
                        continue
                    if spec.causal and kp[j] > qp[i]:
                        continue
                    out[b, h, i, j] = -problem.slopes[h] * abs(qp[i] - kp[j])
    return out


def test_rounded_positions_bias():
    for spec in (
        # float16 positions near 4100 are multiples of 4: query and key positions merge
        ProblemSpec(dtype="float16", n_q=3, n_k=6, offset=4097, num_heads=3, num_heads_kv=3),
        ProblemSpec(dtype="float16", n_q=5, n_k=5, offset=2046, causal=False),
        ProblemSpec(
            dtype="bfloat16", positions="padded", pad=2, batch=3, n_q=4, n_k=4, offset=1023
        ),
    ):
        problem = spec.build()
        got = S._rounded_positions_bias(problem)
        np.testing.assert_array_equal(got, _expected_rounded(problem), err_msg=str(spec))


def _position_rounding_kernel(query, key, value, *, query_positions, key_positions, **kw):
    """Broken in half precision: positions rounded to the input dtype, then exact ALiBi."""
    from plsh_ref.testing.problems import round_to_dtype

    def r(p):
        return round_to_dtype(p.astype(np.float64), str(query.dtype)).astype(np.int64)

    out, lse = _with_lse(
        query, key, value, query_positions=r(query_positions), key_positions=r(key_positions), **kw
    )
    return out.astype(query.dtype)


def test_precision_findings_name_the_rounding():
    import _alibi_kernels as K

    row_constant = K.mj_bias_in_input_dtype
    long32 = ProblemSpec(dtype="float32", n_q=300, n_k=300, num_heads=8, num_heads_kv=8).build()
    res = S.check_case(row_constant, long32)
    assert res.passed and res.error > res.allowed and res.message == ""
    assert res.finding.startswith(S.PRECISION_FINDING + " (output error ")
    assert res.finding.endswith("; passes: float32 rounding, see the growth with n)")
    assert f"> allowed {res.allowed:.3g} at {res.worst_index}" in res.finding
    strict = S.check_case(row_constant, long32, strict_precision=True)
    assert not strict.passed and strict.finding == S.PRECISION_FINDING
    assert strict.message.startswith(S.PRECISION_FINDING + ": output error ")
    long16 = ProblemSpec(dtype="float16", n_q=300, n_k=300, num_heads=8, num_heads_kv=8).build()
    res = S.check_case(row_constant, long16)
    half = (
        "half-precision position arithmetic (row-constant bias (m * p_j) rounding or "
        "positions held in float16)"
    )
    assert not res.passed and res.finding == half and res.message.startswith(half + ": output ")
    # positions far from 0 rounded in float16: only the rounded-positions yardstick explains
    far = ProblemSpec(dtype="float16", n_q=6, n_k=6, offset=8193, num_heads=8, num_heads_kv=8)
    res = S.check_case(_position_rounding_kernel, far.build())
    assert res.error > res.allowed and res.finding == half, res
    # the same kernel is not explained in float32 (no rounded-positions yardstick there)
    res = S.check_case(
        _position_rounding_kernel, far.replace(dtype="float32", offset=2**25 + 1).build()
    )
    assert not res.passed and res.finding == "" and res.message.startswith("output error ")


def test_precision_finding_only_for_causal_alibi_problems():
    """Called with the error of a correct result (0): explained by any yardstick, so the
    only "" answers are the problems the row-constant form does not hold for."""

    def finding(spec):
        problem = spec.build()
        ref = problem.reference()[0]
        keep = np.ones(ref.shape[:3], dtype=bool)
        return S._precision_finding(problem, ref, keep, 0.0, "numpy", "cpu")

    assert finding(ProblemSpec(dtype="float32")) == S.PRECISION_FINDING
    assert finding(ProblemSpec(dtype="float64")) == S.PRECISION_FINDING
    assert finding(ProblemSpec(dtype="float16")).startswith("half-precision position arithmetic")
    assert finding(ProblemSpec(dtype="float32", causal=False)) == ""
    assert finding(ProblemSpec(dtype="float32", kind="plsh")) == ""
    assert finding(ProblemSpec(dtype="float32", positions="packed", pad=2)) == ""


# --- more of the contract: arrays of the framework, the tolerance on the compared rows ---


def test_only_the_frameworks_own_arrays_are_accepted():
    torch = pytest.importorskip("torch")

    class Detachable:  # has detach, but is no torch tensor
        shape = (1, 2, 4, 4)

        def detach(self):
            return self

    p32 = _problem(dtype="float32")
    for result, kind in ((Detachable(), "Detachable"), (torch.float32, "dtype")):
        with pytest.raises(
            S.KernelContractError,
            match=rf"^kernel: returned output of type {kind}; expected torch.Tensor$",
        ):
            S.check_case(lambda q, k, v, r=result, **kw: r, p32, framework="torch")


def test_allowed_error_is_the_rule_on_the_compared_rows():
    """``allowed`` is exactly ``2 max|plain - ref| + floor`` with the problem's own scale and
    dtype, numpy and torch, and pad query rows are not compared."""
    torch = pytest.importorskip("torch")
    from plsh_ref.testing.baseline import plain_attention_numpy, plain_attention_torch
    from plsh_ref.testing.tolerance import allowed_error

    spec = ProblemSpec(dtype="float32", positions="padded", pad=3, batch=2, n_q=5, n_k=5, scale=0.3)
    problem = spec.build()
    q_keep = problem.positions_and_keep()[2][:, None, :, None]
    assert not q_keep.all()  # some pad query rows
    ref = np.where(q_keep, problem.reference()[0], 0.0)
    for framework, plain in (
        ("numpy", lambda *a, **k: plain_attention_numpy(*a, **k)),
        ("torch", lambda *a, **k: plain_attention_torch(*a, **k, device="cpu")),
    ):
        base = plain(
            problem.query,
            problem.key,
            problem.value,
            problem.log_weight(),
            scale=0.3,
            dtype="float32",
        )[0]
        want = allowed_error(ref, np.where(q_keep, base, 0.0), "float32")

        def kernel(query, key, value, fw=framework, **kw):
            if fw == "torch":
                out = _with_lse(
                    *(x.numpy() for x in (query, key, value)),
                    **{n: (x.numpy() if isinstance(x, torch.Tensor) else x) for n, x in kw.items()},
                )[0]
                out = np.where(q_keep, out, 5.0)  # pad query rows: don't care
                return torch.from_numpy(out.astype(np.float32))
            out = _with_lse(query, key, value, **kw)[0]
            return np.where(q_keep, out, 5.0).astype(np.float32)

        res = S.check_case(kernel, problem, framework=framework)
        assert res.passed and res.finding == "" and res.message == "", (framework, res)
        assert res.allowed == want, framework
        assert res.allowed < 1e-5

        def off(query, key, value, fw=framework, **kw):
            out = kernel(query, key, value, **kw)
            out[1, 0, 4, 0] += 0.5  # a real query row of the second sequence
            return out

        res = S.check_case(off, problem, framework=framework)
        assert not res.passed and res.worst_index == (1, 0, 4, 0), (framework, res)
        assert res.error == pytest.approx(0.5, abs=1e-6) and res.allowed == want


def test_rows_without_keys_are_skipped_for_kernels_declaring_empty_rows_false():
    p = _problem(n_q=6, n_k=2)  # query rows 0..3 have no admissible key

    def garbage_on_empty(out, lse):
        out = out.copy()
        out[0, :, :4] = 3.0
        return out

    kernel = _kernel(garbage_on_empty)
    assert not S.check_case(kernel, p).passed
    res = S.check_case(kernel, p, supports={"empty_rows": False})
    assert res.passed and res.error < 1e-12 and res.empty_rows == 8, res

    def wrong_real_row(out, lse):
        out = out.copy()
        out[0, 1, 5, 2] += 0.25  # query 5 sees both keys
        return out

    res = S.check_case(_kernel(wrong_real_row), p, supports={"empty_rows": False})
    assert not res.passed and res.worst_index == (0, 1, 5, 2)
    assert res.error == pytest.approx(0.25, abs=1e-12)
    # pad query slots of a padded batch are never compared, with empty_rows False too
    padded = ProblemSpec(dtype="float64", positions="padded", pad=2, batch=2, n_q=4, n_k=4)
    problem = padded.build()
    q_keep = problem.positions_and_keep()[2]

    def garbage_on_pads(out, lse):
        return np.where(q_keep[:, None, :, None], out, 7.0)

    res = S.check_case(_kernel(garbage_on_pads), problem, supports={"empty_rows": False})
    assert res.passed and res.error < 1e-12, res


def test_the_lse_is_not_compared_on_rows_that_are_not_compared():
    """The LSE of a pad query slot (and, for a kernel declaring ``empty_rows`` False, of a
    row without keys) is "don't care", as its output is: any value passes there, while a
    wrong LSE on a real row still fails."""
    padded = ProblemSpec(dtype="float64", positions="padded", pad=2, batch=2, n_q=4, n_k=4)
    problem = padded.build()
    q_keep = problem.positions_and_keep()[2][:, None, :]
    ref_lse = problem.reference()[1]
    pads = np.broadcast_to(~q_keep, ref_lse.shape)
    assert pads.any() and np.isneginf(ref_lse[pads]).all()  # the reference: -inf there

    def garbage_on_pads(out, lse):
        return np.where(q_keep[..., None], out, 5.0), np.where(q_keep, lse, 7.0)

    res = S.check_case(_kernel(garbage_on_pads), problem)
    assert res.passed and res.message == "" and res.lse_error < 1e-12, res

    def wrong_real_row(out, lse):
        lse = np.where(q_keep, lse, 7.0)
        lse[1, 0, 3] += 0.5  # sequence 1, query slot 3: a real token
        return out, lse

    res = S.check_case(_kernel(wrong_real_row), problem)
    assert not res.passed and res.message.startswith("lse error 0.5 > allowed "), res

    empty = _problem(n_q=6, n_k=2)  # query rows 0..3 have no admissible key

    def finite_on_empty(out, lse):
        return out, np.where(np.isneginf(lse), 7.0, lse)

    assert not S.check_case(_kernel(finite_on_empty), empty).passed
    res = S.check_case(_kernel(finite_on_empty), empty, supports={"empty_rows": False})
    assert res.passed and res.lse_error < 1e-12 and res.empty_rows == 8, res


def test_a_raising_kernel_fails_with_nothing_allowed():
    def raising(query, key, value, **kw):
        raise RuntimeError("no")

    res = S.check_case(raising, _problem())
    assert res.passed is False and res.allowed == 0.0 and math.isnan(res.error)
    assert res.status == "FAIL" and res.ratio == INF


def test_the_standard_contract_message_has_no_slopes():
    def no_causal(query, key, value, *, scale, query_positions, key_positions):
        return None

    with pytest.raises(
        S.KernelContractError,
        match=r"does not match the alibi contract f\(query, key, value, \*, causal, scale, "
        r"query_positions, key_positions\[, attention_mask\]\) \(",
    ):
        S.check_signature(no_causal, "alibi", "standard")


def test_detect_framework_passes_the_mask_and_the_timeout():
    calls = []

    def masked(query, key, value, **kw):
        calls.append(sorted(kw))
        return np.zeros(1)

    assert S.detect_framework(masked, "alibi", "given", True) == "numpy"
    assert "attention_mask" in calls[0] and "slopes" in calls[0]

    def slow(query, key, value, **kw):
        time.sleep(2.0)
        return np.zeros(1)

    start = time.perf_counter()
    with pytest.raises(
        S.KernelContractError,
        match=r"^framework: cannot tell what the kernel takes \(with numpy inputs it raised "
        r"TimeoutError: no result after 0.05 s \(--timeout\); with torch inputs",
    ):
        S.detect_framework(slow, "alibi", "given", True, timeout=0.05)
    assert time.perf_counter() - start < 1.5

    def scalar(query, key, value, **kw):
        return 3.0

    assert S.probe_framework(scalar, "alibi", "given", True, "numpy") == (
        None,
        "with numpy inputs it returned a float",
    )
    seen = []

    def varlen(query, key, value, *, cu_seqlens="not passed", **kw):
        seen.append(cu_seqlens)
        return np.zeros(1)

    assert S.probe_framework(varlen, "alibi", "given", True, "numpy") == ("numpy", "")
    assert seen == [None]  # the kernel takes cu_seqlens: it is passed (None: one sequence)


def test_row_constant_bias_without_keys():
    p = ProblemSpec(dtype="float32", n_q=3, n_k=0).build()
    assert S.row_constant_bias(p).shape == (1, 2, 3, 0)
    # a batch with one sequence of pad keys only: its rows are all masked
    padded = ProblemSpec(dtype="float32", positions="padded", pad=4, batch=2, n_q=4, n_k=4)
    problem = padded.build()
    assert not problem.positions_and_keep()[3].any(axis=1).all()
    np.testing.assert_array_equal(S.row_constant_bias(problem), _expected_row_constant(problem))


def test_an_error_equal_to_the_allowed_one_passes_without_a_finding():
    """Zero values: the reference, the yardstick and the kernel's output are exactly 0, so
    error == allowed == 0; not an excess (no precision finding is looked for)."""
    import dataclasses

    p = _problem()
    zero = dataclasses.replace(p, value=np.zeros_like(p.value))
    res = S.check_case(numpy_alibi, zero)
    assert res.error == 0.0 and res.allowed == 0.0
    assert res.passed and res.finding == "" and res.message == ""


def test_load_kernel_from_a_py_file_in_the_current_folder(tmp_path, monkeypatch):
    """``name.py:f`` (no folder separator) is a file too, not a module ``name.py``."""
    (tmp_path / "bare_file_kernel.py").write_text("def f(q, k, v, **kw):\n    return q\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(S.sys, "path", list(S.sys.path))
    monkeypatch.setattr(S.sys, "modules", dict(S.sys.modules))
    f = S.load_kernel("bare_file_kernel.py:f")
    assert f.__module__ == "bare_file_kernel" and S.sys.modules["bare_file_kernel"].f is f
    with pytest.raises(S.KernelContractError, match=r"^kernel: no file 'absent_kernel\.py'$"):
        S.load_kernel("absent_kernel.py:f")


# --- the optional signature inputs, declared capabilities and the arguments' own say ------


def test_packed_and_head_slice_problems_need_their_signature_inputs():
    """A packed problem needs ``cu_seqlens``, a head slice in standard-slopes mode
    ``head_start, num_heads_total``: a kernel without them is skipped with the reason, one
    with them gets them (keyword-only and required: the signature check accepts them)."""
    import _alibi_kernels as K

    packed = ProblemSpec(dtype="float64", positions="packed", pad=2, n_q=6, n_k=6).build()
    res = S.check_case(numpy_alibi, packed)
    assert res.skipped and res.passed is False
    assert res.message == "unsupported: varlen (the kernel takes no cu_seqlens argument)"
    assert S.check_signature(K.correct_varlen, "alibi") is False  # binds, takes no mask
    res = S.check_case(K.correct_varlen, packed)
    assert res.passed and not res.skipped and res.lse_error is not None, res
    tp = _problem(head_start=2, num_heads_total=4)
    res = S.check_case(numpy_alibi_standard_slopes, tp)
    assert res.skipped and res.message == (
        "unsupported: head_slice (the kernel takes no head_start, num_heads_total arguments)"
    )
    assert S.check_case(numpy_alibi, tp).passed  # given slopes: no slice to know about
    assert S.check_signature(K.correct_tensor_parallel, "alibi", "standard") is True
    res = S.check_case(K.correct_tensor_parallel, tp)
    assert res.passed and not res.skipped, res


def test_the_declared_mask_and_supports_are_the_kernels_own():
    """``attention_mask=False`` skips padded problems for a kernel whose signature takes a
    mask; without ``supports`` the kernel's own ``supports`` attribute decides."""
    import _alibi_kernels as K

    padded = ProblemSpec(dtype="float64", positions="padded", pad=2, batch=2, n_q=4, n_k=4)
    res = S.check_case(numpy_alibi, padded.build(), attention_mask=False)
    assert res.skipped and res.passed is False
    assert (
        res.message == "unsupported: attention_mask (the kernel takes no attention_mask argument)"
    )
    assert S.check_case(numpy_alibi, padded.build()).passed
    res = S.check_case(K.correct_causal_only, _problem(causal=False))
    assert res.skipped and res.message == "unsupported: bidirectional"
    assert S.check_case(K.correct_causal_only, _problem()).passed

    # a kernel without attention_mask in its signature is not given one
    def no_mask(query, key, value, *, slopes, causal, scale, query_positions, key_positions):
        return numpy_alibi(
            query,
            key,
            value,
            slopes=slopes,
            causal=causal,
            scale=scale,
            query_positions=query_positions,
            key_positions=key_positions,
        )

    assert S.check_case(no_mask, _problem()).passed


def test_the_lse_of_rows_without_keys_is_compared_as_minus_inf():
    """Zero queries, one key at position 0 and four queries at -3..0: three rows without a
    key (lse -inf) and one whose lse is exactly 0 (one key, logit 0), in the reference, the
    yardstick and a correct kernel alike: lse error and allowed are exactly 0 (the rows
    without keys are no error, a 0 error is within a 0 allowance)."""
    import dataclasses

    p = _problem(n_q=4, n_k=1)
    p = dataclasses.replace(p, query=np.zeros_like(p.query))
    ref_lse = p.reference()[1]
    np.testing.assert_array_equal(ref_lse, np.array([[[-INF, -INF, -INF, 0.0]] * 2]))
    res = S.check_case(_kernel(lambda o, l: (o, l)), p)
    assert res.passed and res.message == "", res
    assert res.lse_error == 0.0 and res.lse_allowed == 0.0 and res.empty_rows == 6

    def finite_on_empty(out, lse):
        return out, np.where(np.isneginf(lse), 0.0, lse)

    res = S.check_case(_kernel(finite_on_empty), p)
    assert res.message == (
        "lse must be -inf on rows without admissible keys (6 of them are not; first at "
        "(0, 0, 0): got 0.0)"
    )
    assert res.lse_error == 0.0 and res.lse_allowed == 0.0  # the rows themselves: no error


def test_the_lse_allowance_is_the_rule_in_the_problems_dtype():
    """``lse_allowed`` is exactly ``2 max|plain_lse - ref_lse| + floor(float32)`` over the
    rows with keys (float32: its floor is not float64's)."""
    from plsh_ref.testing.baseline import plain_attention_numpy
    from plsh_ref.testing.tolerance import allowed_error

    p = _problem(dtype="float32", n_q=6, n_k=3)
    ref_lse = p.reference()[1]
    neg = np.isneginf(ref_lse)
    assert neg.any() and not neg.all()
    plain_lse = plain_attention_numpy(
        p.query, p.key, p.value, p.log_weight(), scale=None, dtype="float32"
    )[1]
    want = allowed_error(np.where(neg, 0.0, ref_lse), np.where(neg, 0.0, plain_lse), "float32")
    res = S.check_case(_kernel(lambda o, l: (o, l.astype(np.float32))), p)
    assert res.passed and res.lse_allowed == want, (res, want)


def test_judge_messages_in_full():
    """The located message of an error on a row without keys, and two findings joined."""
    p = _problem(n_q=6, n_k=2)

    def nonzero_empty(out, lse):
        out = out.copy()
        out[0, 0, 0] = 0.5  # no admissible key: expected 0
        return out, lse

    res = S.check_case(_kernel(nonzero_empty), p)
    assert res.message == (
        f"output error 0.5 > allowed {res.allowed:.3g} at (0, 0, 0, 0)"
        " (a row without admissible keys: expected output 0)"
    )

    def nan_and_bad_lse(out, lse):
        out = out.copy()
        out[0, 1, 5, 0] = np.nan  # a row with keys
        return out, lse + np.where(np.isneginf(lse), 0.0, 1.0)

    res = S.check_case(_kernel(nan_and_bad_lse), p)
    first, second = res.message.split("; ")
    assert first == (
        "output contains NaN at 1 entries, first (0, 1, 5, 0) (on rows with admissible keys)"
    )
    assert second == f"lse error 1 > allowed {res.lse_allowed:.3g}"


def test_a_float64_precision_finding_passes():
    """float64: the row-constant bias ``m * p_j`` rounded in float64 over 128 positions of
    16 heads (slopes up to 2^-0.5) exceeds the rule (2.3 times) and is explained (the
    strict verdict is the float32 test's)."""
    import _alibi_kernels as K

    p = ProblemSpec(dtype="float64", n_q=128, n_k=128, num_heads=16, num_heads_kv=16).build()
    res = S.check_case(K.mj_bias_in_input_dtype, p)
    assert res.passed and res.error > res.allowed and res.message == ""
    assert res.finding.startswith(S.PRECISION_FINDING + " (output error ")


@functools.lru_cache(maxsize=1)
def _yardsticks():
    """A float32 problem (32 positions, 8 heads), its reference output and the row-constant
    yardstick's allowance in numpy and in torch, on all rows."""
    from plsh_ref.testing.tolerance import allowed_error

    problem = ProblemSpec(dtype="float32", n_q=32, n_k=32, num_heads=8, num_heads_kv=8).build()
    ref = problem.reference()[0]
    bias = S.row_constant_bias(problem)
    return (
        problem,
        ref,
        {
            fw: allowed_error(ref, S._plain(problem, bias, fw, "cpu")[0], problem.spec.dtype)
            for fw in ("numpy", "torch")
        },
    )


def test_the_precision_yardstick_is_the_frameworks_at_its_bound():
    """An error equal to the yardstick's allowance is explained, the next float is not;
    a torch kernel is measured against the torch yardstick (numpy and torch round
    differently: an error between their two allowances is explained by one only)."""
    pytest.importorskip("torch")
    p, ref, yard = _yardsticks()
    keep = np.ones(ref.shape[:3], dtype=bool)
    for fw in ("numpy", "torch"):
        at = S._precision_finding(p, ref, keep, yard[fw], fw, "cpu")
        assert at == S.PRECISION_FINDING, fw
        assert S._precision_finding(p, ref, keep, np.nextafter(yard[fw], INF), fw, "cpu") == ""
    lo, hi = sorted(yard.values())
    assert lo < hi, yard  # else nothing tells the two apart
    between = (lo + hi) / 2
    explained = between <= yard["torch"]
    got = S._precision_finding(p, ref, keep, between, "torch", "cpu")
    assert got == (S.PRECISION_FINDING if explained else ""), (yard, got)


def test_a_torch_kernels_finding_uses_the_torch_yardstick():
    """check_case with a torch kernel whose one wrong element puts the error between the
    numpy and the torch yardstick's allowances (above the rule's): the finding is the torch
    yardstick's verdict."""
    torch = pytest.importorskip("torch")
    p, ref, yard = _yardsticks()
    lo, hi = sorted(yard.values())
    between = (lo + hi) / 2
    out = ref.astype(np.float32)
    worst = np.unravel_index(np.argmin(np.abs(ref)), ref.shape)  # finest float32 spacing
    out[worst] = np.float32(ref[worst] + between)

    def kernel(query, key, value, **kw):
        return torch.from_numpy(out.copy())

    res = S.check_case(kernel, p, framework="torch")
    assert res.error > res.allowed and abs(res.error - between) < 1e-3 * (hi - lo), res
    if between <= yard["torch"]:
        assert res.passed and res.finding.startswith(S.PRECISION_FINDING + " (output error")
    else:
        assert not res.passed and res.finding == "" and res.message.startswith("output error")


def test_a_bfloat16_finding_is_a_half_precision_one():
    pytest.importorskip("torch")
    p = ProblemSpec(dtype="bfloat16").build()
    ref = p.reference()[0]
    keep = np.ones(ref.shape[:3], dtype=bool)
    assert S._precision_finding(p, ref, keep, 0.0, "torch", "cpu") == (
        "half-precision position arithmetic (row-constant bias (m * p_j) rounding or "
        "positions held in bfloat16)"
    )


def test_far_positions_in_float16_are_judged_without_warnings():
    """Positions near 70000 overflow float16 (its largest value is 65504): the rounded
    positions are inf, their differences NaN; the judge and its yardsticks say so without a
    numpy RuntimeWarning (each such computation is under np.errstate)."""
    import warnings

    far = ProblemSpec(dtype="float16", n_q=4, n_k=4, offset=70000).build()

    def wrong(query, key, value, **kw):
        return np.full(query.shape, 0.5, query.dtype)

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        bias = S._rounded_positions_bias(far)
        res = S.check_case(wrong, far)
    assert np.isnan(bias).any()
    assert not res.passed and res.message.startswith("half-precision position arithmetic")


def test_as_float64_returns_float64():
    for dtype in (np.float16, np.float32, np.float64):
        x = np.array([[1.5, -0.25]], dtype=dtype)
        got = S._as_float64(x, "numpy")
        assert got.dtype == np.float64 and got.tolist() == [[1.5, -0.25]]


def test_signature_refusals_name_the_kernel_and_hint_only_for_standard_slopes():
    """The refusal names the kernel by ``__qualname__`` (a callable object without one by
    its repr) with its signature, and ends with the binding error; only a standard-slopes
    ALiBi kernel that takes ``slopes`` gets the ``--slopes given`` hint."""
    import inspect

    def takes_slopes(query, key, value, *, slopes):
        return None

    for kind, slopes in (("alibi", "given"), ("plsh", "given"), ("plsh", "standard")):
        with pytest.raises(S.KernelContractError) as info:
            S.check_signature(takes_slopes, kind, slopes)
        text = str(info.value)
        assert text.startswith(
            f"kernel: {takes_slopes.__qualname__}{inspect.signature(takes_slopes)} does not "
            f"match the {kind} contract {S._contract(kind, slopes)} ("
        ), text
        assert text.endswith(")") and "--slopes" not in text, text

    class KernelObject:
        def __call__(self, query, key, value):
            return None

    obj = KernelObject()
    with pytest.raises(S.KernelContractError) as info:
        S.check_signature(obj, "alibi")
    assert str(info.value).startswith(f"kernel: {obj!r}(query, key, value) does not match")


def test_a_result_type_from_the_jax_package_is_a_jax_result():
    """The framework of a result is the top package of its type's module: ``jax`` or
    ``jaxlib`` for JAX (jax < 0.4 defined its arrays in ``jax.interpreters.xla``), from
    numpy or jax inputs; anything else is not an answer (no JAX needed here)."""
    old = type("DeviceArray", (), {"__module__": "jax.interpreters.xla"})
    new = type("ArrayImpl", (), {"__module__": "jaxlib.xla_extension"})
    other = type("Tensor", (), {"__module__": "jaxlike.core"})
    for cls in (old, new):
        kernel = lambda q, k, v, cls=cls, **kw: cls()  # noqa: E731
        assert S.probe_framework(kernel, "alibi", "given", True, "numpy") == ("jax", "")
        kernel2 = lambda q, k, v, cls=cls, **kw: (cls(), cls())  # noqa: E731
        assert S.detect_framework(kernel2, "alibi", "given", True) == "jax"
    assert S.probe_framework(lambda q, k, v, **kw: other(), "alibi", "given", True, "numpy") == (
        None,
        "with numpy inputs it returned a Tensor",
    )
    torch = pytest.importorskip("torch")
    # a torch kernel given torch inputs is torch; jax arrays from torch inputs are no answer
    assert S.probe_framework(lambda q, k, v, **kw: old(), "alibi", "given", True, "torch") == (
        None,
        "with torch inputs it returned a DeviceArray",
    )
    assert S.probe_framework(
        lambda q, k, v, **kw: torch.zeros(1), "alibi", "given", True, "torch"
    ) == ("torch", "")


def test_contract_kwargs_default_to_given_slopes_and_a_mask():
    padded = ProblemSpec(dtype="float64", positions="padded", pad=2, batch=2, n_q=4, n_k=4).build()
    kw = S.contract_kwargs(padded)
    assert sorted(kw) == [
        "attention_mask",
        "causal",
        "key_positions",
        "query_positions",
        "scale",
        "slopes",
    ]
    np.testing.assert_array_equal(kw["attention_mask"], padded.attention_mask)


def test_torch_kernels_get_cu_seqlens_as_a_tensor():
    torch = pytest.importorskip("torch")
    packed = ProblemSpec(dtype="float32", positions="packed", pad=2, n_q=6, n_k=6).build()
    seen = []

    def varlen(query, key, value, *, cu_seqlens, **kw):
        seen.append(cu_seqlens)
        return torch.zeros(1, 2, 6, 4)

    S.check_case(varlen, packed, framework="torch")
    assert isinstance(seen[0], torch.Tensor) and seen[0].dtype == torch.int64
    np.testing.assert_array_equal(seen[0].numpy(), packed.cu_seqlens)


def test_a_timed_out_kernel_is_left_in_a_named_daemon_thread():
    """The thread of a kernel still running at the timeout is a daemon (it cannot hold the
    interpreter's exit) named ``plsh-verify-kernel`` (for thread dumps)."""
    import threading

    release = threading.Event()

    def blocked(query, key, value, **kw):
        release.wait(5.0)
        return np.zeros((1, 2, 4, 4))

    before = set(threading.enumerate())
    try:
        res = S.check_case(blocked, _problem(), timeout=0.02)
        assert res.message.startswith("timed out: ")
        left = [t for t in threading.enumerate() if t not in before]
        assert [(t.name, t.daemon) for t in left] == [("plsh-verify-kernel", True)]
    finally:
        release.set()
    left[0].join(5.0)
