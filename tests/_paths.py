"""Paths the tests share: the repository root and the tests folder, whatever the test's depth."""

from pathlib import Path

#: the tests folder (this file's folder)
TESTS = Path(__file__).resolve().parent
#: the repository root
ROOT = TESTS.parent
