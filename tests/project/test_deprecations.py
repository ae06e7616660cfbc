"""Every deprecated spelling still works for one release, warns, and gives the same result.

Each shim goes through :func:`plsh_ref.validation.warn_deprecated`; each test below calls
the old spelling under ``pytest.warns(DeprecationWarning)`` and compares with the new one,
so a shim that stops warning, stops working or changes the result fails here.
"""

from __future__ import annotations

import numpy as np
import pytest

from plsh_ref.alibi import alibi_slopes
from plsh_ref.partition import PartitionSample

# ------------------------------------------------------------- plsh_ref.validation


def test_validation_check_slopes_moved_to_alibi():
    import plsh_ref.alibi
    import plsh_ref.validation

    with pytest.warns(DeprecationWarning, match="plsh_ref.alibi.check_slopes"):
        old = plsh_ref.validation.check_slopes
    assert old is plsh_ref.alibi.check_slopes
    np.testing.assert_array_equal(old(None, 4), alibi_slopes(4))


def test_validation_check_partition_moved_to_partition():
    import plsh_ref.partition

    with pytest.warns(DeprecationWarning, match="plsh_ref.partition.check_partition"):
        from plsh_ref.validation import check_partition
    part = PartitionSample(np.ones((2, 3)), np.zeros((2, 3)))
    assert check_partition is plsh_ref.partition.check_partition
    assert check_partition(part, 2) is part


def test_validation_unknown_name_still_raises_attribute_error():
    import plsh_ref.validation

    with pytest.raises(AttributeError, match="no attribute 'no_such_check'"):
        plsh_ref.validation.no_such_check  # noqa: B018
