"""Validation toolkit: check your own ALiBi or positional-LSH kernel against the reference.

* Hypothesis strategies for attention problems: :func:`attention_problems`,
  :func:`problem_specs`, :func:`dtypes`, :func:`slopes`, :func:`positions`,
  :func:`partition_samples` (:mod:`plsh_ref.testing.strategies`);
* the reference callables with the kernel contracts: :func:`alibi_reference`,
  :func:`plsh_reference` (:mod:`plsh_ref.testing.reference`);
* the property suite: :func:`check_case` (one problem), :func:`make_property_suite`
  (a pytest test in one line), and the pytest fixtures of :mod:`plsh_ref.testing.plugin`;
* the ``plsh verify MODULE:FUNCTION`` command (:mod:`plsh_ref.testing.verify`).

Everything here is numpy only; torch is imported only to run a torch kernel. See the
validation guide in the documentation.
"""

from .problems import AttentionProblem, ProblemSpec
from .property_suite import make_property_suite
from .reference import alibi_reference, plsh_reference, reference_for
from .strategies import (attention_problems, dtypes, partition_samples, positions,
                         problem_specs, sample_specs, slopes)
from .suite import CaseResult, KernelContractError, check_case, check_signature, load_kernel

__all__ = [
    "AttentionProblem",
    "CaseResult",
    "KernelContractError",
    "ProblemSpec",
    "alibi_reference",
    "attention_problems",
    "check_case",
    "check_signature",
    "dtypes",
    "load_kernel",
    "make_property_suite",
    "partition_samples",
    "plsh_reference",
    "positions",
    "problem_specs",
    "reference_for",
    "sample_specs",
    "slopes",
]
