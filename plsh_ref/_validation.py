"""Deprecated alias of :mod:`plsh_ref.validation` (kept for one release; import that instead).

Nothing in ``plsh_ref`` or ``plsh_fast`` imports this module (``tests/project/test_private_imports.py``
enforces it).
"""

from .validation import *  # noqa: F403
from .validation import __all__  # noqa: F401
