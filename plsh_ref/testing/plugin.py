"""pytest plugin registered through the ``pytest11`` entry point of positional-lsh.

It adds nothing unless a test suite asks for its fixtures, so installing the package
never changes the behaviour of an unrelated test suite.
"""
