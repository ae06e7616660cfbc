"""Validation toolkit: check your own ALiBi or positional-LSH kernel against the reference.

* Hypothesis strategies for attention problems: :func:`attention_problems`,
  :func:`problem_specs`, :func:`dtypes`, :func:`slopes`, :func:`positions`,
  :func:`partition_samples` (:mod:`plsh_ref.testing.strategies`);
* the reference callables with the kernel contracts: :func:`alibi_reference`,
  :func:`plsh_reference` (:mod:`plsh_ref.testing.reference`);
* the property suite: :func:`check_case` (one problem), :func:`make_property_suite`
  (a pytest test in one line), and the pytest fixtures of :mod:`plsh_ref.testing.plugin`;
* the tolerance rule of SPEC section 6: :func:`assert_close_to_reference`,
  :func:`allowed_error`, :func:`max_error` (:mod:`plsh_ref.testing.tolerance`), measured
  against plain attention in the kernel's dtype, :func:`plain_attention_numpy` and
  :func:`plain_attention_torch` (:mod:`plsh_ref.testing.baseline`);
* the deterministic edge battery, one named case per known bug class
  (:func:`plsh_ref.testing.battery.battery`);
* adapters for bias builders, FlexAttention score_mods and HF attention functions
  (:func:`from_bias_builder`, :func:`from_score_mod`, :func:`from_hf_attention`,
  :mod:`plsh_ref.testing.adapters`);
* the ``plsh verify MODULE:FUNCTION`` command (:mod:`plsh_ref.testing.verify`) and
  ``plsh verify-slopes MODULE:FUNCTION`` for a slope function alone
  (:func:`check_slopes_function`, :mod:`plsh_ref.testing.verify_slopes`).

Everything here is numpy only; torch is imported only to run a torch kernel. The names
below are imported lazily (on first use), so that the pytest plugin, which pytest loads
in every session of an environment where positional-lsh is installed, costs nothing.
"""

from __future__ import annotations

import importlib
from typing import Any

#: public name -> submodule defining it
_EXPORTS = {
    "AttentionProblem": "problems",
    "ProblemSpec": "problems",
    "make_property_suite": "property_suite",
    "alibi_reference": "reference",
    "plsh_reference": "reference",
    "reference_for": "reference",
    "reference_precision": "reference",
    "attention_problems": "strategies",
    "dtypes": "strategies",
    "partition_samples": "strategies",
    "positions": "strategies",
    "problem_specs": "strategies",
    "sample_specs": "strategies",
    "slopes": "strategies",
    "allowed_error": "tolerance",
    "assert_close_to_reference": "tolerance",
    "max_error": "tolerance",
    "plain_attention_numpy": "baseline",
    "plain_attention_torch": "baseline",
    "CaseResult": "suite",
    "KernelContractError": "suite",
    "check_case": "suite",
    "check_signature": "suite",
    "load_kernel": "suite",
    "from_bias_builder": "adapters",
    "from_hf_attention": "adapters",
    "from_score_mod": "adapters",
    "check_slopes_function": "verify_slopes",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    """A name of ``__all__``, imported from its submodule on first use.

    References
    ----------
    PEP 562 (module ``__getattr__`` and ``__dir__``).
    """
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    """The module's names, those imported lazily included.

    References
    ----------
    PEP 562 (module ``__getattr__`` and ``__dir__``).
    """
    return sorted(set(globals()) | set(_EXPORTS))
