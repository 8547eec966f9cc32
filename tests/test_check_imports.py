"""The check path never imports torch, ray or vllm (it must start fast and run in CI without them)."""

import subprocess
import sys
from pathlib import Path

import pytest

HEAVY = {"torch", "ray", "vllm"}
CONFIG = Path(__file__).parent / "configs" / "loader" / "grandchild.yaml"


def imported_modules(*args: str) -> set[str]:
    run = subprocess.run([sys.executable, "-X", "importtime", "-m", "fasync.cli", *args],
                         capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode in (0, 1), run.stdout + run.stderr
    names = {line.split("|")[-1].strip() for line in run.stderr.splitlines() if line.startswith("import time:")}
    assert "fasync.config.schema" in names  # the command really ran
    return {name.split(".")[0] for name in names}


@pytest.mark.parametrize("args", [
    ("check", str(CONFIG)),
    ("check", "--format", "sarif", str(CONFIG), "train.lr=1e-2"),
    ("config", "show", str(CONFIG)),
    ("rules",),
    ("schema",),
    ("simulate", str(CONFIG), "train.num_rollouts=5"),
], ids=lambda a: " ".join(a[:2]))
def test_no_heavy_imports(args):
    assert imported_modules(*args) & HEAVY == set()


def fasync_imports(package: Path) -> set[str]:
    """The fasync modules that the files under `package` import (at any depth, deferred imports included)."""
    import ast

    names = set()
    for file in [package] if package.is_file() else package.rglob("*.py"):
        for node in ast.walk(ast.parse(file.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("fasync"):
                names.add(node.module)
            elif isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names if alias.name.startswith("fasync"))
    return names


def test_layers():
    """The diagnostics and exit codes are leaves; config (the loader) never reaches up into lint."""
    root = Path(__file__).resolve().parent.parent / "fasync"
    assert fasync_imports(root / "diagnostics") == set()
    assert fasync_imports(root / "exit_codes.py") == set()
    assert {name for name in fasync_imports(root / "config") if name.startswith("fasync.lint")} == set()
