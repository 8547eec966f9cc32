"""`fasync import` on the corpus of real, unmodified launch scripts and configs (tests/import_corpus, issue 30):
every file imports to a config that loads with the geometry, the kept values and the findings that
expected.yaml states by hand from each framework's own code, or, where expected.yaml marks it `unsupported`,
fails with exit 1 and one line saying what is not supported.

The files that do not yet import right are listed in KNOWN_FAILING with the reason; the test fails when one of
them starts passing (remove it from the list) and when any other file fails, and prints a table of every file."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from paths import TESTS
from typer.testing import CliRunner

from fasync.cli import app
from fasync.config.derived import derive
from fasync.config.loader import load_config
from fasync.lint.engine import check_files, exit_code, lint

CORPUS = TESTS / "import_corpus"
EXPECTED: dict[str, dict] = yaml.safe_load((CORPUS / "expected.yaml").read_text(encoding="utf-8"))

KNOWN_FAILING: dict[str, str] = {}
"""Corpus file → why it does not import right yet."""

TARGET_SHARE = 0.9
"""Issue 30's bar: at least 90% of the corpus imports to a config that loads with everything expected.yaml states
right. A file marked `unsupported` fails as it should, but it does not load: it counts against the bar."""


def _env_options(env: dict | None) -> list[str]:
    """`--env NAME=VALUE` for each variable expected.yaml assumes; a positional argument (`1`) too."""
    options = []
    for name, value in (env or {}).items():
        if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*|[0-9]+", str(name)):
            options += ["--env", f"{name}={'' if value is None else value}"]
    return options


def _same(found, wanted) -> bool:
    """Values as YAML reads them back; a tuple field (a rejection interval) reads as a list."""
    if isinstance(found, tuple):
        found = list(found)
    if isinstance(wanted, (int, float)) and not isinstance(wanted, bool) and isinstance(found, (int, float)):
        return float(found) == float(wanted)  # exact: both are the same decimal literal read as a double
    return found == wanted


def _lookup(config, dotted: str):
    section, _, name = dotted.partition(".")
    node = getattr(config, "async_" if section == "async" else section)
    return getattr(node, name) if name else node


def _problems(name: str, tmp_path: Path) -> list[str]:
    """What differs between the import of corpus file `name` and expected.yaml; empty when it is right."""
    spec = EXPECTED[name]
    out = tmp_path / (name.replace("/", "__") + ".yaml")
    result = CliRunner().invoke(app, ["import", spec["framework"], str(CORPUS / name), "-o", str(out),
                                      *_env_options(spec.get("env"))])
    output = result.output
    if "Traceback" in output or result.exception is not None and not isinstance(result.exception, SystemExit):
        return [f"crashed: {result.exception!r}"]
    if "unsupported" in spec:
        lines = [line for line in output.splitlines() if line.strip()]
        problems = []
        if result.exit_code != 1:
            problems.append(f"exit {result.exit_code}, not 1")
        if len(lines) != 1 or "not supported" not in lines[0]:
            problems.append(f"not one line saying what is not supported: {output.strip()[:160]!r}")
        return problems
    if not out.exists():
        return [f"no config written (exit {result.exit_code}): {output.strip()[-160:]!r}"]
    loaded = load_config(out)
    if loaded.config is None:
        return ["does not load: " + "; ".join(d.message for d in loaded.diagnostics if d.severity.value == "error")[:200]]
    config = loaded.config
    derived = derive(config)
    sync = config.mode == "sync"
    found = {
        "mode": config.mode,
        "prompts_per_rollout": config.rollout.batch_size,
        "samples_per_prompt": config.rollout.n_samples_per_prompt,
        "global_batch": derived.effective_global_batch_size,
        "steps_per_rollout": derived.num_steps_per_rollout,
        "staleness": None if sync else config.async_.max_weight_staleness,
        "sync_interval": 1 if sync else config.async_.update_weights_interval,
        "worst_lag": derived.max_lag.steps,
    }
    problems = [f"{key} {found[key]!r} (expected {spec[key]!r})" for key in found
                if key in spec and not _same(found[key], spec[key])]
    for key, wanted in (spec.get("keep") or {}).items():
        # A clip left null is the importance ratio's default: compare the clip in effect (Derived.clip_eps).
        value = derived.clip_eps[key.endswith("high")] if key.startswith("train.clip_eps_") else _lookup(config, key)
        if key == "logging.backends":  # the trackers; fasync always writes metrics.jsonl too
            value = [backend for backend in value if backend != "jsonl"]
        if not _same(value, wanted):
            problems.append(f"{key} {value!r} (expected {wanted!r})")
    resources = dict(spec.get("resources") or {})
    nodes = resources.pop("nodes", None)
    for key, wanted in resources.items():
        value = getattr(config.resources, key)
        if not _same(value, wanted):
            problems.append(f"resources.{key} {value!r} (expected {wanted!r})")
    if nodes is not None and config.resources.num_gpus:
        per_node = config.resources.gpus_per_node or config.resources.num_gpus
        found_nodes = -(-config.resources.num_gpus // per_node)
        if found_nodes != nodes:
            problems.append(f"nodes {found_nodes} (expected {nodes})")
    problems += _asks(spec, result, out)
    text = out.read_text(encoding="utf-8") + output
    problems += [f"does not name the {what.replace('_', ' ')} {path}" for what, path in (spec.get("paths") or {}).items()
                 if str(path) not in text]
    codes = {d.code for d in lint(loaded)}
    rules = spec.get("rules") or {}
    problems += [f"{code} not reported" for code in rules.get("fire", []) if code not in codes]
    problems += [f"{code} reported" for code in rules.get("not", []) if code in codes]
    if spec.get("not_supported_yet") and "not supported yet" not in out.read_text(encoding="utf-8") + output:
        problems.append("does not name what is not supported yet")
    return problems


ASKED = re.compile(r"(?:: set | and )([a-z_]+\.[a-z_]+) \(")
"""A fasync key the import's last line asks for: `fasync import: set data.path (...) and reward.function (...)`."""


def _asks(spec: dict, result, out: Path) -> list[str]:
    """The import asks (exit 1, one line) for exactly the keys expected.yaml's `asks` lists; asking for none, it
    exits as `fasync check` does on the config it wrote."""
    if "asks" not in spec:
        return []
    lines = result.output.strip().splitlines()
    last = lines[-1] if lines else ""
    asked = ASKED.findall(last) if last.startswith("fasync import: set ") else []
    if sorted(asked) != sorted(spec["asks"]):
        return [f"asks for {asked or 'nothing'} (expected {spec['asks'] or 'nothing'}): {last[:200]!r}"]
    wanted = 1 if asked else exit_code(check_files([out]))
    return [] if result.exit_code == wanted else [f"exit {result.exit_code} (expected {wanted})"]


def test_the_corpus_imports_as_expected(tmp_path):
    results = {name: _problems(name, tmp_path) for name in EXPECTED}
    passing = [name for name, problems in results.items() if not problems]
    width = max(map(len, results))
    table = "\n".join(f"{name:<{width}}  {'pass' if not problems else 'FAIL: ' + '; '.join(problems)}"
                      for name, problems in results.items())
    summary = f"{len(passing)} of {len(results)} corpus files import as expected\n{table}"
    unexpected = [name for name in results if results[name] and name not in KNOWN_FAILING]
    fixed = [name for name in KNOWN_FAILING if name in results and not results[name]]
    assert not unexpected and not fixed, (
        f"failing and not in KNOWN_FAILING: {unexpected}; passing but listed in KNOWN_FAILING: {fixed}\n{summary}")
    print(summary)


def test_the_corpus_meets_issue_30s_bar(tmp_path):
    loading = [name for name in EXPECTED if "unsupported" not in EXPECTED[name] and not _problems(name, tmp_path)]
    assert len(loading) >= TARGET_SHARE * len(EXPECTED), (
        f"{len(loading)} of {len(EXPECTED)} corpus files import to a config that loads as expected; not: "
        f"{sorted(set(EXPECTED) - set(loading))}")


def test_every_corpus_file_has_its_source_and_an_expectation():
    listed = {line.split("\t")[0].removeprefix("tests/import_corpus/")
              for line in (CORPUS / "SOURCES").read_text(encoding="utf-8").splitlines()
              if line and not line.startswith("#")}
    files = {str(path.relative_to(CORPUS)) for path in CORPUS.glob("*/*")}
    assert files == set(EXPECTED) == listed


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_expected_geometry_is_consistent(name):
    """prompts × samples = global batch × steps, and the worst lag follows from the bound (docs/fully-async.md);
    a file whose fasync geometry trims samples (B004) is exempt from the first."""
    spec = EXPECTED[name]
    if not {"prompts_per_rollout", "global_batch", "steps_per_rollout"} <= spec.keys():
        return
    if "B004" not in (spec.get("rules") or {}).get("fire", []):
        assert spec["prompts_per_rollout"] * spec["samples_per_prompt"] == spec["global_batch"] * spec["steps_per_rollout"]
    steps = spec["steps_per_rollout"]
    if spec["mode"] == "sync":
        assert spec["worst_lag"] == steps - 1
    elif spec["staleness"] is None:
        assert spec["worst_lag"] is None
    else:
        assert spec["worst_lag"] == (spec["staleness"] + 1) * spec["sync_interval"] * steps - 1


def test_sections_besides_the_policys_training_are_reported_as_ignored(tmp_path):
    """Issue 30 §1: eval, vLLM, perf-tracer and reference settings are listed as ignored, never mapped."""
    out = tmp_path / "areal.yaml"
    CliRunner().invoke(app, ["import", "areal", str(CORPUS / "areal" / "gsm8k_grpo.yaml"), "-o", str(out)])
    text = out.read_text(encoding="utf-8")
    for key in ("vllm.seed", "perf_tracer.experiment_name", "ref.path", "evaluator.freq_epochs"):
        line = next(line for line in text.splitlines() if line.startswith(f"#   {key}:"))
        assert "ignored:" in line, line
    out = tmp_path / "openrlhf.yaml"
    CliRunner().invoke(app, ["import", "openrlhf", str(CORPUS / "openrlhf" / "train_prorlv2_math_hybrid_engine.sh"),
                             "-o", str(out)])
    text = out.read_text(encoding="utf-8")
    assert "#   eval_n_samples_per_prompt: 4  (ignored:" in text and load_config(out).config.rollout.n_samples_per_prompt == 16
