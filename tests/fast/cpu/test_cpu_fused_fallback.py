"""The CPU path's private fused operator is used only behind a version check and a
self-check, with the plain torch implementation as the tested fallback."""

import pytest
import torch

from plsh_fast import cpu, plsh_attention
from plsh_ref.alibi import alibi_slopes
from plsh_ref.partition import draw_partition


def _problem(n=200, heads=2, d=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, heads, n, d, generator=g, requires_grad=True) for _ in range(3))
    return q, k, v, draw_partition(1.0 / alibi_slopes(heads), 8, seed=1)


def _run(q, k, v, partition):
    out = plsh_attention(q, k, v, partition=partition, check_finite=False)
    grads = torch.autograd.grad(out.square().sum(), (q, k, v))
    return out.detach(), grads


@pytest.fixture
def fresh_check(monkeypatch):
    """Forget the process's cached decision so that the check runs again."""
    monkeypatch.setattr(cpu._tiles, "_FUSED_OK", None)
    return monkeypatch


def test_pinned_torch_uses_fused(fresh_check):
    low, high = cpu.FUSED_TORCH_VERSIONS
    major, minor = (int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
    assert low <= (major, minor) < high  # the pinned torch is a verified release
    assert cpu.fused_tiles_available()


def _plain_reference(monkeypatch, problem):
    monkeypatch.setattr(cpu, "USE_FUSED_TILES", False)
    assert not cpu.fused_tiles_available()
    result = _run(*problem)
    monkeypatch.setattr(cpu, "USE_FUSED_TILES", True)
    return result


def _assert_same(a, b):
    assert torch.equal(a[0], b[0])
    for x, y in zip(a[1], b[1]):
        assert torch.equal(x, y)


def test_unverified_torch_version_falls_back(fresh_check):
    problem = _problem()
    plain = _plain_reference(fresh_check, problem)
    fresh_check.setattr(cpu._tiles, "_FUSED_OK", None)
    fresh_check.setattr(cpu, "FUSED_TORCH_VERSIONS", ((99, 0), (100, 0)))
    assert not cpu.fused_tiles_available()
    _assert_same(_run(*problem), plain)


def test_wrong_operator_is_caught_by_the_self_check(fresh_check):
    # An operator whose output is off by 1% (a changed convention in a future release)
    # must not be used: without the self-check the outputs below would differ.
    fused = cpu._tiles._FUSED

    def wrong(*args, **kwargs):
        out, lse = fused(*args, **kwargs)
        return out * 1.01, lse

    problem = _problem()
    plain = _plain_reference(fresh_check, problem)
    fresh_check.setattr(cpu._tiles, "_FUSED_OK", None)
    fresh_check.setattr(cpu._tiles, "_FUSED", wrong)
    assert not cpu.fused_tiles_available()
    _assert_same(_run(*problem), plain)


def test_operator_that_raises_is_not_used(fresh_check):
    def broken(*args, **kwargs):
        raise RuntimeError("changed signature")

    fresh_check.setattr(cpu._tiles, "_FUSED", broken)
    assert not cpu.fused_tiles_available()
    out, _ = _run(*_problem())
    assert torch.isfinite(out).all()


def test_missing_operator_is_not_used(fresh_check):
    fresh_check.setattr(cpu._tiles, "_FUSED", None)
    assert not cpu.fused_tiles_available()


def test_self_check_leaves_global_rng_alone(fresh_check):
    state = torch.get_rng_state()
    assert cpu.fused_tiles_available()
    assert torch.equal(state, torch.get_rng_state())
