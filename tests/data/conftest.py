"""What the data tests share: a user's reward module, written for one test and importable by its name."""

import sys

import pytest


@pytest.fixture
def user_modules(tmp_path, monkeypatch):
    """`write(name, source)` puts module `name` in the test's directory, importable for the test (its directory
    on `sys.path`, as a config's directory is for a run); every module written is forgotten afterwards, so the
    next test imports its own."""
    written = []

    def write(name: str, source: str) -> None:
        (tmp_path / f"{name}.py").write_text(source)
        written.append(name)

    monkeypatch.syspath_prepend(str(tmp_path))
    yield write
    for name in written:
        sys.modules.pop(name, None)
