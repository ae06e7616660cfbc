"""One-line property suites for pytest: :func:`make_property_suite`.

In a kernel author's repository::

    # tests/test_my_kernel.py
    from plsh_ref.testing import make_property_suite

    test_my_alibi_kernel = make_property_suite("mypkg.attention:alibi_forward", kind="alibi")

pytest collects ``test_my_alibi_kernel`` as a Hypothesis test: every drawn problem
(:func:`plsh_ref.testing.strategies.problem_specs`) is run through
:func:`plsh_ref.testing.suite.check_case`, and a failure is shrunk to the smallest problem
and reported with its spec and worst element.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hypothesis import assume, given, settings

from .reference import KINDS
from .strategies import problem_specs
from .suite import FRAMEWORKS, SLOPES, check_case, check_signature, load_kernel, slope_mode

__all__ = ["make_property_suite"]


def make_property_suite(
    kernel: Callable[..., Any] | str,
    *,
    kind: str = "alibi",
    framework: str = "numpy",
    device: str = "cpu",
    slopes: str | None = None,
    max_examples: int | None = None,
    **bounds: Any,
) -> Callable[..., None]:
    """Build a pytest test function that runs the property suite against ``kernel``.

    Parameters
    ----------
    kernel : callable or str
        The kernel, or ``"MODULE:FUNCTION"`` imported when the test runs (so an import
        error fails that test instead of the collection).
    kind : {"alibi", "plsh"}
        Its contract (:mod:`plsh_ref.testing.reference`).
    framework : {"numpy", "torch", "jax"}
        What it takes and returns.
    device : str
        torch device for ``framework="torch"``.
    slopes : {"given", "standard"}, optional
        Slope mode (:func:`~plsh_ref.testing.suite.check_case`); default from the
        kernel's signature. ``standard`` draws problems with Press et al.'s slopes only.
    max_examples : int, optional
        Hypothesis examples; default: the active settings profile.
    **bounds
        Keyword arguments of :func:`~plsh_ref.testing.strategies.problem_specs`
        (``max_seq_len``, ``dtypes``, ``causal``, ...). Problems needing an input the
        kernel declares unsupported (its ``supports`` attribute) are rejected
        (``hypothesis.assume``), never passed. A ``"MODULE:FUNCTION"`` kernel is imported
        with the current folder on the import path.

    Returns
    -------
    callable
        A test function without arguments, decorated with ``hypothesis.given``; assign it
        to a module-level name starting with ``test_``.

    Raises
    ------
    ValueError, TypeError
        On an unknown ``kind`` or ``framework`` or invalid bounds (at once, not in the test).

    Examples
    --------
    >>> from plsh_ref.testing import examples, make_property_suite
    >>> test_numpy_alibi = make_property_suite(examples.numpy_alibi, max_examples=5)
    >>> test_numpy_alibi()  # passes silently; a broken kernel raises AssertionError

    References
    ----------
    ``docs/validation.md``, "In your pytest suite"; Hypothesis ``given`` and ``assume``.
    """
    if kind not in KINDS:
        raise ValueError(f"kind: must be one of {KINDS}, got {kind!r}")
    if framework not in FRAMEWORKS:
        raise ValueError(f"framework: must be one of {FRAMEWORKS}, got {framework!r}")
    if not (callable(kernel) or isinstance(kernel, str)):
        raise TypeError(
            f"kernel: must be callable or 'MODULE:FUNCTION', got {type(kernel).__name__}"
        )
    if slopes is not None and slopes not in SLOPES:
        raise ValueError(f"slopes: must be one of {SLOPES}, got {slopes!r}")
    if slopes == "standard" and kind == "alibi":
        bounds.setdefault("slopes", ["standard"])
    standard_only = bounds.get("slopes") == ["standard"]
    strategy = problem_specs(kind, **bounds)

    def run_one(spec):
        fn = load_kernel(kernel) if isinstance(kernel, str) else kernel
        mode = "given" if kind == "plsh" else (slopes or slope_mode(fn))
        takes_mask = check_signature(fn, kind, mode)
        if mode == "standard" and kind == "alibi" and not standard_only:
            spec = spec.replace(slopes="standard")
        result = check_case(
            fn,
            spec.build(),
            framework=framework,
            device=device,
            slopes=mode,
            attention_mask=takes_mask,
        )
        assume(not result.skipped)
        assert result.passed, f"{result.message} [{spec.summary()}]"

    name = kernel if isinstance(kernel, str) else getattr(kernel, "__qualname__", "kernel")
    run_one.__name__ = "test_plsh_property_suite"
    run_one.__doc__ = f"Property suite ({kind}, {framework}) for {name}."
    test = given(strategy)(run_one)
    overrides: dict[str, Any] = {"deadline": None}
    if max_examples is not None:
        overrides["max_examples"] = max_examples
    return settings(**overrides)(test)
