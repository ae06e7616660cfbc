"""plsh_ref: exact, high-precision reference for ALiBi and positional-LSH attention.

Wolfson & Wagner, *Positional LSH: Binary Block Matrix Approximation for Attention with
Linear Biases* (arXiv 2605.09472, 2026). Depends on numpy, scipy and mpmath only.
"""

from . import alibi, attention, bounds, expectation, partition, toeplitz
from .alibi import alibi_bias, alibi_slopes, default_positions, kernel_matrix, sigma_from_slopes
from .attention import (
    alibi_attention,
    biased_attention,
    fixed_block_attention,
    no_bias_attention,
    plsh_attention,
)
from .partition import PartitionSample, bins, counts, draw_partition, empirical_mean, masks

__version__ = "0.1.0"

__all__ = [
    "PartitionSample",
    "alibi",
    "attention",
    "bounds",
    "expectation",
    "partition",
    "toeplitz",
    "alibi_attention",
    "alibi_bias",
    "alibi_slopes",
    "biased_attention",
    "bins",
    "counts",
    "default_positions",
    "draw_partition",
    "empirical_mean",
    "fixed_block_attention",
    "kernel_matrix",
    "masks",
    "no_bias_attention",
    "plsh_attention",
    "sigma_from_slopes",
]
