"""The lint engine and the `check`, `rules`, `rule`, `config show` and `schema` commands.

Probe rules (codes Z...) are registered for the duration of a test, so that these tests do not
depend on the real rule families; `--select Z` keeps the real ones out of the way.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from paths import LOADER_CONFIGS, REPO
from typer.testing import CliRunner

from fasync.cli import app
from fasync.config.loader import load_config
from fasync.diagnostics import Code, Location, Severity
from fasync.lint.engine import lint, matches, rules
from fasync.lint.registry import RULES, Finding

runner = CliRunner()

CLEAN = """\
mode: sync
rollout:
  batch_size: 4
  n_samples_per_prompt: 4
train:
  global_batch_size: 16
  micro_batch_size: 16
"""


def _big_batch(cfg, derived):
    if derived.effective_global_batch_size > 100:
        yield Finding("train.global_batch_size", f"global batch of {derived.effective_global_batch_size} samples",
                      "use at most 100")


def _kl_without_reference(cfg, derived):
    if cfg.train.kl_coef > 0:
        yield Finding("train.kl_coef", "KL to a reference model", None)


def _crash_on_seed_13(cfg, derived):
    if cfg.train.seed == 13:
        raise RuntimeError("unlucky")
    return ()


PROBES = [("ZW901", "probe-big-batch", Severity.WARNING, _big_batch),
          ("ZE902", "probe-kl", Severity.ERROR, _kl_without_reference),
          ("ZC903", "probe-crash", Severity.INFO, _crash_on_seed_13)]


@pytest.fixture
def probes():
    rules()  # register the real families first, so that removing the probes leaves them intact
    for code, name, severity, check in PROBES:
        RULES[code] = Code(code, name, severity, f"{name} summary", "what", "why", check)
    yield
    for code, *_ in PROBES:
        RULES.pop(code)


@pytest.fixture
def clean(tmp_path) -> Path:
    path = tmp_path / "clean.yaml"
    path.write_text(CLEAN)
    return path


def check(*args: str):
    return runner.invoke(app, ["check", *map(str, args)])


def test_rule_findings_are_located_where_the_value_was_set(probes, clean):
    result = load_config(clean, ["train.kl_coef=0.1", "train.global_batch_size=128"])
    found = {d.code: d for d in lint(result, select=["Z"])}
    assert set(found) == {"ZW901", "ZE902"}
    assert found["ZW901"].severity is Severity.WARNING
    assert found["ZW901"].location == Location("<cli>", 2, 1)
    assert found["ZW901"].message == "global batch of 128 samples" and found["ZW901"].help == "use at most 100"
    assert found["ZE902"].location == Location("<cli>", 1, 1)


def test_a_default_value_finding_points_at_the_nearest_parent(probes, tmp_path):
    path = tmp_path / "big.yaml"
    path.write_text("mode: sync\ntrain:\n  micro_batch_size: 8\n")  # global_batch_size: derived, 256
    (diagnostic,) = lint(load_config(path), select=["ZW"])
    assert diagnostic.location == Location(str(path), 2, 1)


def test_select_ignore_prefixes_and_lint_ignore(probes, clean):
    result = load_config(clean, ["train.kl_coef=0.1", "train.global_batch_size=128"])
    assert {d.code for d in lint(result, select=["ZW", "ZE902"])} == {"ZW901", "ZE902"}
    assert {d.code for d in lint(result, select=["Z"], ignore=["ZE"])} == {"ZW901"}
    silenced = load_config(clean, ["train.kl_coef=0.1", "train.global_batch_size=128", "lint.ignore=[ZW9]"])
    assert {d.code for d in lint(silenced, select=["Z"])} == {"ZE902"}
    assert matches("W101", ["ALL"]) and not matches("W101", ["W2"])


def test_a_crashing_rule_is_reported_and_the_others_still_run(probes, clean):
    result = load_config(clean, ["train.seed=13", "train.kl_coef=0.1"])
    found = {d.code: d for d in lint(result, select=["Z"])}
    assert set(found) == {"F000", "ZE902"}
    assert "ZC903" in found["F000"].message and "unlucky" in found["F000"].message


def test_load_diagnostics_cannot_be_ignored(probes, tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("train:\n  lr: fast\n")
    assert [d.code for d in lint(load_config(path), ignore=["F", "Z"])] == ["F007"]


def test_exit_codes(probes, clean, tmp_path):
    assert check(clean, "--select", "Z").exit_code == 0
    warning = ("train.global_batch_size=128",)
    assert check(clean, *warning, "--select", "Z").exit_code == 0
    assert check(clean, *warning, "--select", "Z", "--strict").exit_code == 1
    assert check(clean, "train.kl_coef=0.1", "--select", "Z").exit_code == 1
    assert check(clean, "train.kl_coef=0.1", "--select", "Z", "--exit-zero").exit_code == 0
    # As ruff: a problem found in a config exits 1, whatever stage found it; 2 means the check could not run.
    broken = {"syntax": "train: {lr: [1e-3\n", "duplicate": "train: {lr: 1, lr: 2}\n",
              "unknown": "train:\n  global_batchsize: 8\n", "type": "train:\n  lr: fast\n",
              "base": "extends: nowhere.yaml\n", "cycle": "extends: cycle.yaml\n"}
    for name, text in broken.items():
        (tmp_path / f"{name}.yaml").write_text(text)
        assert check(tmp_path / f"{name}.yaml").exit_code == 1, name
    assert check(clean, "train.lr=fast", "--exit-zero").exit_code == 0
    assert check(tmp_path / "missing.yaml").exit_code == 2
    assert check(clean, tmp_path / "missing.yaml").exit_code == 2
    assert check(clean, "train.seed=13", "--select", "Z").exit_code == 2  # a rule crashed: an internal error
    assert check("train.lr=1").exit_code == 2  # overrides but no file
    assert check(clean, "--format", "xml").exit_code == 2


def test_text_output_and_summary(probes, clean):
    result = check(clean, "train.global_batch_size=128", "--select", "Z")
    assert result.stdout == ("<cli>:1:1: ZW901 warning: global batch of 128 samples\n"
                             "  help: use at most 100\n\nFound 0 errors, 1 warning, 0 info in 1 file.\n")
    assert check(clean, "--select", "Z").stdout == "All checks passed!\n"
    assert check(clean, "--select", "Z", "--quiet").stdout == ""


def test_overrides_apply_to_every_file(clean, tmp_path):
    other = tmp_path / "other.yaml"
    other.write_text("mode: async\n")
    result = check(clean, other, "train.lr=-1", "--format", "json")
    records = json.loads(result.stdout)
    assert [(r["code"], r["file"], r["line"]) for r in records] == [("F007", "<cli>", 1)] * 2
    assert result.exit_code == 1


def test_summary_counts_files(clean, tmp_path):
    broken = tmp_path / "broken.yaml"
    broken.write_text("train: {lr: 1e-3, lr: 2e-3}\n")
    result = check(clean, broken, "--select", "Z")
    assert result.stdout.endswith("Found 1 error, 0 warnings, 0 info in 2 files.\n")
    assert f"{broken}:1:19: F003 error: duplicate key `lr`" in result.stdout


def test_rules_lists_the_catalogue(probes):
    table = runner.invoke(app, ["rules"]).stdout.splitlines()
    assert table[0].split() == ["CODE", "NAME", "SEVERITY", "SUMMARY"]
    assert any(line.split()[:3] == ["ZW901", "probe-big-batch", "warning"] for line in table)
    assert any(line.split()[:2] == ["F006", "unknown-key"] for line in table)
    records = json.loads(runner.invoke(app, ["rules", "--format", "json"]).stdout)
    assert {"code": "ZE902", "name": "probe-kl", "severity": "error", "summary": "probe-kl summary"} in records
    assert [r["code"] for r in records] == sorted(r["code"] for r in records)


def test_rule_explains_one_code():
    result = runner.invoke(app, ["rule", "f008"])
    assert result.exit_code == 0
    for part in ("## F008 `foreign-key` (error)", "**What it does.**", "**Why it matters.**", "ppo_mini_batch_size"):
        assert part in result.stdout
    assert runner.invoke(app, ["rule", "NOPE1"]).exit_code == 2


def test_config_show_prints_values_origins_and_derived(clean):
    result = runner.invoke(app, ["config", "show", str(clean), "train.lr=0.5"])
    assert result.exit_code == 0
    lines = {line.split()[0]: line.split()[1:] for line in result.stdout.splitlines() if line and line[0] != "#"}
    assert lines["train.global_batch_size"] == ["16", f"{clean}:6"]
    assert lines["train.lr"] == ["0.5", "<cli>:1"]
    assert lines["rollout.top_p"] == ["1.0", "default"]
    assert lines["samples_per_rollout"] == ["16"] and lines["num_steps_per_rollout"] == ["1"]
    data = json.loads(runner.invoke(app, ["config", "show", str(clean), "--format", "json"]).stdout)
    assert data["config"]["async"]["max_weight_staleness"] == 1
    assert data["origins"]["rollout.batch_size"] == f"{clean}:3"
    assert data["derived"]["samples_per_rollout"] == 16
    yaml_text = runner.invoke(app, ["config", "show", str(clean), "--format", "yaml"]).stdout
    assert "samples_per_rollout: 16" in yaml_text


def test_config_show_of_a_broken_config_exits_1(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("train:\n  lr: fast\n")
    result = runner.invoke(app, ["config", "show", str(path)])
    assert result.exit_code == 1 and "F007" in result.stderr
    assert runner.invoke(app, ["config", "show", str(tmp_path / "missing.yaml")]).exit_code == 2


def test_schema_is_draft_07_and_self_contained():
    schema = json.loads(runner.invoke(app, ["schema"]).stdout)
    assert schema["$schema"] == "http://json-schema.org/draft-07/schema#"
    text = json.dumps(schema)
    assert "$defs" not in text and "prefixItems" not in text
    refs = [part.split('"')[0] for part in text.split('"$ref": "#/definitions/')[1:]]
    assert refs and all(ref in schema["definitions"] for ref in refs)
    assert {"extends", "mode", "async", "train"} <= set(schema["properties"])
    assert schema["definitions"]["TrainConfig"]["additionalProperties"] is False


def test_editors_accept_valid_configs_and_flag_unknown_keys():
    jsonschema = pytest.importorskip("jsonschema")
    import yaml

    validator = jsonschema.Draft7Validator(json.loads(runner.invoke(app, ["schema"]).stdout))
    jsonschema.Draft7Validator.check_schema(validator.schema)
    here = LOADER_CONFIGS
    assert list(validator.iter_errors(yaml.safe_load((here / "child.yaml").read_text()))) == []
    assert list(validator.iter_errors({"correction": {"reject_token_ratio": [0.5, 2.0]}})) == []
    assert [e.validator for e in validator.iter_errors({"train": {"global_batchsize": 1}})] == ["additionalProperties"]
    assert list(validator.iter_errors({"correction": {"reject_token_ratio": [0.5, 2.0, 3.0]}}))


def test_config_show_states_the_worst_lag_in_optimizer_steps():
    config = REPO / "configs" / "diagnostic-multi-step-staleness.yaml"
    text = runner.invoke(app, ["config", "show", str(config)]).stdout
    assert [line.split(None, 1)[1] for line in text.splitlines() if line.startswith("max_lag ")] == [
        "11 optimizer steps (2.75 versions)"]
    data = json.loads(runner.invoke(app, ["config", "show", str(config), "--format", "json"]).stdout)
    assert data["derived"]["max_lag"] == {"steps": 11, "versions": 2.75, "steps_per_version": 4}


@pytest.mark.parametrize("args", [["check", "configs/quickstart.yaml"], ["check", "configs/quickstart.yaml", "--exit-zero"],
                                  ["schema"], ["config", "show", "configs/quickstart.yaml"], ["rules"]])
def test_output_onto_a_full_disk_is_one_line_and_exit_2(args):
    with open("/dev/full", "w") as full:
        result = subprocess.run([sys.executable, "-m", "fasync.cli", *args], stdout=full, stderr=subprocess.PIPE,
                                text=True, timeout=120, cwd=REPO)
    assert result.returncode == 2, result.stderr
    assert result.stderr == "fasync: cannot write the output: stdout: no space left on device (the disk is full)\n"
