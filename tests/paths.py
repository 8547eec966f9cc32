"""Where the tests find the repository and their own data, whichever folder a test lives in."""

from pathlib import Path

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
LOADER_CONFIGS = TESTS / "configs" / "loader"
"""The loader's fixture configs (bases, cycles, bad files)."""
