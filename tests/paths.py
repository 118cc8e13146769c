"""Where the tests find the repository: a test module's own `__file__` depends on the folder it sits in."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parent  # tests/: the rigs, apps/ and stubs/
ROOT = TESTS.parent  # the repository's root
