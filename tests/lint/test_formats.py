"""Rendering: text, concise, json, github annotations and SARIF."""

import json

from fasync.diagnostics import Diagnostic, Location, Severity
from fasync.lint.formats import JSON_FIELDS, render, summary_line

DIAGNOSTICS = [
    Diagnostic("F007", Severity.ERROR, "`train.lr`: Input should be greater than 0 (got -1)", "train.lr",
               Location("configs/run.yaml", 4, 3), "train.lr: AdamW learning rate. Default: 0.001."),
    Diagnostic("F006", Severity.WARNING, "50%, a: b\nsecond line", "train.x", Location("configs/run.yaml", 9, 1)),
    Diagnostic("F011", Severity.INFO, "override", None, Location("<cli>", 2, 1), "write key=value"),
]


def test_text_is_ruff_like_with_help_lines_and_a_summary():
    assert render(DIAGNOSTICS, "text", files=1) == (
        "configs/run.yaml:4:3: F007 error: `train.lr`: Input should be greater than 0 (got -1)\n"
        "  help: train.lr: AdamW learning rate. Default: 0.001.\n"
        "\n"
        "configs/run.yaml:9:1: F006 warning: 50%, a: b\nsecond line\n"
        "\n"
        "<cli>:2:1: F011 info: override\n"
        "  help: write key=value\n"
        "\n"
        "Found 1 error, 1 warning, 1 info in 1 file."
    )


def test_text_without_summary_and_when_clean():
    assert render([], "text", files=3) == "All checks passed!"
    assert render([], "text", summary=False) == ""
    assert render(DIAGNOSTICS[:1], "text", summary=False).endswith("Default: 0.001.")


def test_colour_only_when_asked():
    assert "\x1b[" not in render(DIAGNOSTICS, "text")
    coloured = render(DIAGNOSTICS, "text", color=True)
    assert "\x1b[31merror\x1b[0m" in coloured and "\x1b[33mwarning\x1b[0m" in coloured


def test_summary_counts_and_plurals():
    two_errors = [DIAGNOSTICS[0], DIAGNOSTICS[0]]
    assert summary_line(two_errors, 2) == "Found 2 errors, 0 warnings, 0 info in 2 files."


def test_concise_is_one_line_per_diagnostic():
    lines = render(DIAGNOSTICS[:1] + DIAGNOSTICS[2:], "concise", files=1).splitlines()
    assert lines == [
        "configs/run.yaml:4:3: F007 error: `train.lr`: Input should be greater than 0 (got -1)",
        "<cli>:2:1: F011 info: override",
        "",
        "Found 1 error, 0 warnings, 1 info in 1 file.",
    ]


def test_json_has_exactly_the_documented_fields():
    records = json.loads(render(DIAGNOSTICS, "json"))
    assert [list(r) for r in records] == [list(JSON_FIELDS)] * 3
    assert list(JSON_FIELDS) == ["code", "severity", "message", "key", "file", "line", "column", "help"]
    assert records[0] == {"code": "F007", "severity": "error", "message": DIAGNOSTICS[0].message,
                          "key": "train.lr", "file": "configs/run.yaml", "line": 4, "column": 3,
                          "help": DIAGNOSTICS[0].help}
    assert records[1]["help"] is None


def test_github_annotations_escape_and_map_severities():
    lines = render(DIAGNOSTICS, "github").splitlines()
    assert lines[0] == ("::error file=configs/run.yaml,line=4,col=3,title=F007::`train.lr`: Input should be "
                        "greater than 0 (got -1)%0Ahelp: train.lr: AdamW learning rate. Default: 0.001.")
    assert lines[1] == "::warning file=configs/run.yaml,line=9,col=1,title=F006::50%25, a: b%0Asecond line"
    # An override has no file in the repository: a run-level notice.
    assert lines[2] == "::notice title=F011::override%0Ahelp: write key=value"


def test_sarif_is_2_1_0_with_rules_and_relative_locations(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    absolute = Diagnostic("F003", Severity.ERROR, "dup", "a", Location(str(tmp_path / "my configs" / "a.yaml"), 2, 5))
    log = json.loads(render(DIAGNOSTICS + [absolute], "sarif"))
    assert log["version"] == "2.1.0" and "sarif" in log["$schema"]
    driver = log["runs"][0]["tool"]["driver"]
    assert driver["name"] == "fasync" and driver["informationUri"].startswith("https://")
    rules = driver["rules"]
    for rule in rules:
        assert set(rule) >= {"id", "name", "shortDescription", "fullDescription", "help", "defaultConfiguration"}
        assert rule["defaultConfiguration"]["level"] in {"error", "warning", "note"}
    results = log["runs"][0]["results"]
    assert [r["level"] for r in results] == ["error", "warning", "note", "error"]
    for result in results:
        assert rules[result["ruleIndex"]]["id"] == result["ruleId"]
    location = results[0]["locations"][0]["physicalLocation"]
    assert location == {"artifactLocation": {"uri": "configs/run.yaml", "uriBaseId": "%SRCROOT%"},
                        "region": {"startLine": 4, "startColumn": 3}}
    assert results[3]["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] == "my%20configs/a.yaml"
    assert "locations" not in results[2]  # the override
