"""pytest plugin registered through the ``pytest11`` entry point of positional-lsh.

It adds nothing unless a test suite asks for it, so installing the package never changes
the behaviour of an unrelated test suite: importing it imports only pytest, it defines
fixtures that run only when requested, and options under the ``plsh`` group whose
defaults do nothing.

Fixtures
--------
``plsh_reference``
    The reference callables: ``plsh_reference.alibi(...)`` and ``plsh_reference.plsh(...)``
    (:mod:`plsh_ref.testing.reference`).
``plsh_check``
    ``plsh_check(kernel, problem, framework=None, device=None)`` runs one problem and fails
    the test (with the worst element) unless the kernel meets the tolerance rule; framework
    and device default to ``--plsh-framework`` and ``--plsh-device``.
``plsh_kernel``
    The kernel named by ``--plsh-kernel MODULE:FUNCTION`` (the test is skipped without it).

Options: ``--plsh-kernel``, ``--plsh-kind``, ``--plsh-framework``, ``--plsh-device``.
:func:`plsh_ref.testing.make_property_suite` builds a complete Hypothesis test from a
kernel in one line.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

__all__ = ["plsh_check", "plsh_kernel", "plsh_reference", "pytest_addoption"]


def pytest_addoption(parser: pytest.Parser) -> None:
    """Register the ``plsh`` option group (all defaults are inert).

    References
    ----------
    The ``pytest_addoption`` hook of pytest;
    ``docs/validation.md``, "In your pytest suite".
    """
    group = parser.getgroup("plsh", "positional-lsh kernel validation")
    group.addoption(
        "--plsh-kernel",
        default=None,
        metavar="MODULE:FUNCTION",
        help="kernel returned by the plsh_kernel fixture",
    )
    group.addoption(
        "--plsh-kind",
        default="alibi",
        choices=("alibi", "plsh"),
        help="contract of --plsh-kernel (default: alibi)",
    )
    group.addoption(
        "--plsh-framework",
        default="numpy",
        choices=("numpy", "torch"),
        help="arrays the kernel takes and returns, for plsh_check (default: numpy)",
    )
    group.addoption(
        "--plsh-device",
        default="cpu",
        help="torch device for --plsh-framework torch, for plsh_check (default: cpu)",
    )


class _References:
    """The reference callables as attributes ``alibi`` and ``plsh``."""

    def __init__(self):
        from .reference import alibi_reference, plsh_reference

        self.alibi = alibi_reference
        self.plsh = plsh_reference


@pytest.fixture
def plsh_reference() -> Any:
    """Reference callables: ``.alibi`` (exact ALiBi) and ``.plsh`` (PLSH), float64.

    References
    ----------
    A ``pytest`` fixture (``docs/validation.md``, "In your pytest suite"); exact ALiBi of
    SPEC section 1 and PLSH attention of SPEC section 3.
    """
    return _References()


@pytest.fixture
def plsh_check(request: pytest.FixtureRequest) -> Callable[..., Any]:
    """``check(kernel, problem, framework=None, device=None)``: assert that one case passes.

    ``framework`` and ``device`` default to ``--plsh-framework`` and ``--plsh-device``.

    References
    ----------
    ``docs/validation.md``, "In your pytest suite"; SPEC section 6 (the rule it asserts).
    """
    from .suite import check_case

    def check(kernel, problem, framework=None, device=None):
        framework = framework or request.config.getoption("--plsh-framework")
        device = device or request.config.getoption("--plsh-device")
        result = check_case(kernel, problem, framework=framework, device=device)
        assert result.passed, f"{result.message} [{problem.spec.summary()}]"
        return result

    return check


@pytest.fixture
def plsh_kernel(request: pytest.FixtureRequest) -> Callable[..., Any]:
    """The kernel named by ``--plsh-kernel`` (skips the test when the option is absent).

    References
    ----------
    ``docs/validation.md``, "In your pytest suite" (``--plsh-kernel MODULE:FUNCTION``).
    """
    target = request.config.getoption("--plsh-kernel")
    if target is None:
        pytest.skip("no --plsh-kernel MODULE:FUNCTION given")
    from .suite import KernelContractError, check_signature, load_kernel, slope_mode

    try:
        kernel = load_kernel(target)
        check_signature(kernel, request.config.getoption("--plsh-kind"), slope_mode(kernel))
    except KernelContractError as exc:
        pytest.fail(str(exc), pytrace=False)
    return kernel
