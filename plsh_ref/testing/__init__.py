"""Validation toolkit for other people's kernels (Hypothesis strategies, tolerance rule,
pytest plugin). See ``docs/validation.md``."""
