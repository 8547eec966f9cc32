"""The check path never imports torch, ray, vllm or peft, nor the report's and trackers' packages (it must start fast
and run in CI without them)."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest
from paths import LOADER_CONFIGS, REPO, TESTS

HEAVY = {"torch", "ray", "vllm", "peft", "matplotlib", "tensorboard", "wandb", "mlflow"}
CONFIG = LOADER_CONFIGS / "grandchild.yaml"


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
    ("check", str(CONFIG), "logging.backends=[jsonl,tensorboard,wandb,mlflow]"),  # E007 only looks packages up
    ("config", "show", str(CONFIG)),
    ("rules",),
    ("schema",),
    ("simulate", str(CONFIG), "train.num_rollouts=5"),
    ("import", "verl", str(TESTS / "import_corpus" / "verl" / "dapo_7b_math_fsdp2_8_8.sh")),  # tree-sitter-bash
], ids=lambda a: " ".join(a[:2]))
def test_no_heavy_imports(args):
    assert imported_modules(*args) & HEAVY == set()


def fasync_imports(package: Path) -> set[str]:
    """The fasync modules that the files under `package` import (at any depth, deferred imports included)."""
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
    root = REPO / "fasync"
    assert fasync_imports(root / "diagnostics") == set()
    assert fasync_imports(root / "exit_codes.py") == set()
    assert {name for name in fasync_imports(root / "config") if name.startswith("fasync.lint")} == set()


def module_graph(root: Path) -> dict[str, set[str]]:
    """Each fasync module and the fasync modules it imports (deferred imports included): a name imported
    from a package counts as its submodule when one of that name exists."""
    files = {".".join(file.relative_to(root.parent).with_suffix("").parts).removesuffix(".__init__"): file
             for file in root.rglob("*.py")}
    graph = {}
    for name, file in files.items():
        deps = set()
        for node in ast.walk(ast.parse(file.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                deps.update(f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in files else node.module
                            for alias in node.names)
            elif isinstance(node, ast.Import):
                deps.update(alias.name for alias in node.names)
        graph[name] = {dep for dep in deps if dep in files and dep != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    found, state, path = [], {}, []

    def visit(module: str) -> None:
        state[module] = "open"
        path.append(module)
        for dep in sorted(graph[module]):
            if state.get(dep) == "open":
                found.append(path[path.index(dep):] + [dep])
            elif dep not in state:
                visit(dep)
        path.pop()
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module)
    return found


def test_cycle_finder_sees_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles():
    """No module reaches back to one that imports it, even through a deferred import: the engine interface
    does not import its implementations, the memory estimate does not import the linter."""
    graph = module_graph(REPO / "fasync")
    assert "fasync.rollout.hf_engine" in graph["fasync.rollout.build"]  # the graph sees deferred imports
    assert cycles(graph) == []
