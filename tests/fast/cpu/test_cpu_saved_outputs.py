"""The CPU path reproduces its saved outputs, LSE and gradients bit for bit.

``data/cpu_saved_outputs.npz`` holds the forward ``out``/``lse`` and the query/key/value
gradients of :func:`plsh_fast.cpu.plsh_forward_cpu` / :func:`plsh_fast.cpu.plsh_backward_cpu`
on the fixed problems of ``tests/_cpu_problems.py`` (``SAVED_RUNS``: band heads and tile
groups, per-row and cell-pattern biases, empty rows, GQA, cross-attention, unsorted
positions; the fused and the plain tile kernels, small chunks, two worker threads), in
float32 and float64, with the torch version and CPU capability they were made with
(``data/save_cpu_outputs.py``). A refactoring of the CPU path must not change a bit.

Bit equality is only promised by the same kernels: torch's CPU kernels are chosen by the
CPU capability (AVX2 / AVX512...) and change between torch releases. On a machine whose
torch version, CPU capability, fused-operator and per-thread-limit availability match the
file's, every array must be equal bit for bit; elsewhere each array is checked under the
SPEC section 6 rule against the float64 reference instead (the message says which check
ran), so that the test asserts something real on any machine.
"""

from __future__ import annotations

import json

import _cpu_problems as P
import numpy as np
import pytest
import torch
from _paths import ROOT

import plsh_fast.cpu as cpu
from plsh_fast.peers import dense_attention
from plsh_ref.testing.baseline import plain_attention_torch
from plsh_ref.testing.tolerance import assert_close_to_reference

DATA = ROOT / "tests" / "fast" / "cpu" / "data" / "cpu_saved_outputs.npz"


@pytest.fixture(scope="module")
def saved():
    with np.load(DATA) as data:
        arrays = {name: data[name] for name in data.files}
    return json.loads(str(arrays.pop("machine"))), arrays


def this_machine() -> dict:
    return {
        "torch": torch.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "fused_tiles": cpu.fused_tiles_available(),
        "per_thread_limits": cpu.per_thread_limits_available(),
    }


def run(monkeypatch, case: str, variant: str, dtype: str) -> dict:
    settings = dict(P.SAVED_VARIANTS[variant])
    previous = torch.get_num_threads()
    torch.set_num_threads(settings.pop("threads", 1))
    try:
        for name, value in settings.items():
            monkeypatch.setattr(cpu, name, value)
        cpu.clear_plan_cache()
        return P.cpu_outputs(P.saved_problem(case, dtype), cpu)
    finally:
        torch.set_num_threads(previous)
        monkeypatch.undo()


def dense(problem, dtype, grad_out, grad_lse) -> dict:
    """Dense autograd of ``softmax(scale q k^T + log M~) v`` and its LSE in ``dtype``,
    the same seeded cotangents (the float64 reference and the plain-dtype yardstick)."""
    q, k, v = (torch.from_numpy(x).to(dtype).requires_grad_() for x in problem.numpy64())
    out, lse = dense_attention(
        q, k, v, bias=problem.log_weight(), scale=problem.scale, return_lse=True
    )
    finite = torch.isfinite(lse)
    loss = (out * grad_out.to(dtype)).sum() + (torch.where(finite, lse, 0.0) * grad_lse).sum()
    loss.backward()
    return {"grad_query": q.grad, "grad_key": k.grad, "grad_value": v.grad}


def check_under_rule(case: str, dtype: str, got: dict, why: str) -> None:
    """Each array of ``got`` against the float64 reference under SPEC section 6."""
    problem = P.saved_problem(case, dtype)
    ref_out, ref_lse = problem.reference()
    base_out, base_lse = plain_attention_torch(
        *problem.numpy64(), problem.log_weight(), scale=problem.scale, dtype=dtype
    )
    assert_close_to_reference(got["out"], ref_out, base_out, dtype, name=f"out ({why})")
    assert_close_to_reference(got["lse"], ref_lse, base_lse, dtype, name=f"lse ({why})")
    lse64 = torch.from_numpy(np.asarray(ref_lse))
    grad_out, grad_lse = P.saved_gradients(problem, lse64)
    ref = dense(problem, torch.float64, grad_out, grad_lse)
    base = dense(problem, P.DTYPES[dtype], grad_out, grad_lse.to(P.DTYPES[dtype]))
    scale = max(float(g.abs().max()) for g in ref.values())
    for name in ("grad_query", "grad_key", "grad_value"):
        assert_close_to_reference(
            got[name], ref[name], base[name], dtype, name=f"{name} ({why})", floor_scale=scale
        )


def compare(saved, got: dict, key: str, case: str, dtype: str, here: dict | None = None) -> str:
    """Assert ``got`` matches the saved arrays of run ``key``; returns the check made.
    ``here``: the machine's description (default :func:`this_machine`)."""
    machine, arrays = saved
    here = this_machine() if here is None else here
    if here == machine:
        for field in P.SAVED_FIELDS:
            want = arrays[f"{key}/{field}"]
            assert got[field].dtype == want.dtype and got[field].shape == want.shape, field
            differ = got[field] != want
            assert not differ.any(), (
                f"{key}/{field}: {int(differ.sum())} of {want.size} elements differ from the "
                f"saved outputs (bit-for-bit check: this machine {here} matches the file's); "
                f"first at {np.argwhere(differ)[0].tolist()}"
            )
        return "bit-for-bit"
    why = f"SPEC section 6 rule, not bit-for-bit: saved on {machine}, this machine is {here}"
    check_under_rule(case, dtype, got, why)
    return why


@pytest.mark.parametrize("dtype", P.SAVED_DTYPES)
@pytest.mark.parametrize(("case", "variant"), P.SAVED_RUNS)
def test_cpu_outputs_equal_the_saved_ones(saved, monkeypatch, case, variant, dtype):
    got = run(monkeypatch, case, variant, dtype)
    compare(saved, got, f"{case}/{variant}/{dtype}", case, dtype)


def test_saved_file_is_complete_and_small(saved):
    machine, arrays = saved
    assert set(machine) == set(this_machine())
    expected = {
        f"{c}/{v}/{d}/{f}" for c, v in P.SAVED_RUNS for d in P.SAVED_DTYPES for f in P.SAVED_FIELDS
    }
    assert set(arrays) == expected
    assert DATA.stat().st_size < 1 << 20
    assert all(np.isfinite(a).all() for k, a in arrays.items() if not k.endswith("/lse"))


def test_one_ulp_off_fails_the_bit_for_bit_check(saved):
    """Negative control of the bit-for-bit check, on any machine (the check is forced by
    taking this machine for the file's): the saved arrays themselves pass, the same with
    one element one ulp off fail."""
    machine, arrays = saved
    case, variant, dtype = "mixed_pitches_causal", "fused", "float32"
    key = f"{case}/{variant}/{dtype}"
    exact = {field: arrays[f"{key}/{field}"] for field in P.SAVED_FIELDS}
    assert compare(saved, exact, key, case, dtype, here=machine) == "bit-for-bit"
    grad = exact["grad_key"].copy()
    flat = grad.reshape(-1)
    i = int(np.argmax(np.abs(flat)))
    flat[i] = np.nextafter(flat[i], np.inf, dtype=flat.dtype)
    with pytest.raises(AssertionError, match="grad_key: 1 of"):
        compare(saved, {**exact, "grad_key": grad}, key, case, dtype, here=machine)


def test_a_run_with_one_element_off_by_one_percent_fails(saved, monkeypatch):
    """Negative control of the check this machine makes (bit for bit where it matches the
    file, else the SPEC section 6 rule): the current run passes, the same run with its
    largest key gradient changed by 1% of the array's largest magnitude fails."""
    case, variant, dtype = "mixed_pitches_causal", "fused", "float32"
    key = f"{case}/{variant}/{dtype}"
    got = run(monkeypatch, case, variant, dtype)
    compare(saved, got, key, case, dtype)
    grad = got["grad_key"].copy()
    flat = grad.reshape(-1)
    flat[int(np.argmax(np.abs(flat)))] += 0.01 * np.abs(flat).max()
    with pytest.raises(AssertionError, match="grad_key"):
        compare(saved, {**got, "grad_key": grad}, key, case, dtype)


@pytest.mark.parametrize("dtype", P.SAVED_DTYPES)
def test_the_fallback_rule_check_passes_here_and_catches_a_perturbation(monkeypatch, dtype):
    """The check used on other machines (SPEC section 6 against the float64 reference) is
    exercised here too: the current outputs pass it, and a 1% change of one gradient
    element fails it (so the fallback is not an assert-nothing path)."""
    case = "mixed_pitches_causal"
    got = run(monkeypatch, case, "fused", dtype)
    check_under_rule(case, dtype, got, "forced here")
    grad = got["grad_value"].copy()
    flat = grad.reshape(-1)
    flat[int(np.argmax(np.abs(flat)))] *= 1.01
    with pytest.raises(AssertionError, match="grad_value"):
        check_under_rule(case, dtype, {**got, "grad_value": grad}, "forced here")
