"""`fasync ledger` on a damaged run directory (issue 32 §5 #10): a journal line or summary count that is not what
fasync writes is one clear line naming the file and line, exit 2, never a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from fasync.cli import app

runner = CliRunner()

EVENTS = [
    {"event": "produced", "ids": ["0.0", "1.0"]},
    {"event": "queued", "ids": ["0.0", "1.0"]},
    {"event": "trained", "ids": ["0.0", "1.0"], "lengths": [3, 4]},
    {"event": "checkpoint", "draws": 2},
    {"event": "end", "draws": 2},
]
SUMMARY = {"outcome": "finished", "ledger": {"produced": 4, "consumed": 4, "dropped": {}, "queued": 0,
                                              "in_flight": 0, "balanced": True}}


def write_run(directory: Path, lines: list[str], summary: dict = SUMMARY) -> Path:
    directory.mkdir()
    (directory / "ledger.jsonl").write_bytes("".join(line + "\n" for line in lines).encode("utf-8", "surrogateescape"))
    (directory / "summary.json").write_text(json.dumps(summary))
    (directory / "config.yaml").write_text(yaml.safe_dump({"rollout": {"n_samples_per_prompt": 2}}))
    return directory


def good_lines() -> list[str]:
    return [json.dumps(event) for event in EVENTS]


def test_an_intact_journal_passes(tmp_path):
    result = runner.invoke(app, ["ledger", str(write_run(tmp_path / "run", good_lines()))])
    assert result.exit_code == 0, result.output


def damaged(line: str, at: int = 2) -> list[str]:
    lines = good_lines()
    lines.insert(at, line)
    return lines


@pytest.mark.parametrize("lines, message", [
    (damaged("}{ garbage"), "ledger.jsonl:3: not a complete JSON object"),
    (damaged("\udcff\udcfe binary"), "ledger.jsonl:3: not UTF-8 text"),
    (damaged('"produced"'), "ledger.jsonl:3: an event must be a JSON object, not str"),
    (damaged("[1, 2]"), "ledger.jsonl:3: an event must be a JSON object, not list"),
    (damaged('{"ids": ["2.0"]}'), 'ledger.jsonl:3: the object has no "event" name'),
    (damaged('{"event": "produced", "ids": "2.0"}'), 'ledger.jsonl:3: the produced event\'s "ids" must be a list'),
    (damaged('{"event": "produced", "ids": [[2, 0]]}'), 'ledger.jsonl:3: the produced event\'s "ids" must be a list'),
    (damaged('{"event": "produced", "ids": ["x"]}'), 'ledger.jsonl:3: the produced event\'s "ids" must be a list'),
    (damaged('{"event": "trained", "ids": ["0.0"]}'), 'ledger.jsonl:3: the trained event\'s "lengths" must be a list'),
    (damaged('{"event": "dropped", "ids": ["0.0"], "lengths": [1], "reason": 3}'),
     'ledger.jsonl:3: a drop\'s "reason" must be one of'),
    (damaged('{"event": "checkpoint", "draws": "2"}'), 'ledger.jsonl:3: the checkpoint event\'s "draws" must be a whole'),
    (damaged('{"event": "end", "draws": [2]}'), 'ledger.jsonl:3: the end event\'s "draws" must be a whole'),
    (damaged("[" * 100_000 + "]" * 100_000), "ledger.jsonl:3: nested too deeply to read"),
], ids=["garbage", "binary", "string", "list", "no-event", "ids-string", "ids-lists", "ids-not-groups",
        "no-lengths", "bad-reason", "draws-string", "draws-list", "deeply-nested"])
def test_a_damaged_journal_is_one_line_with_file_and_line(tmp_path, lines, message):
    run = write_run(tmp_path / "run", lines)
    result = runner.invoke(app, ["ledger", str(run)])
    assert result.exit_code == 2, result.output
    assert f"fasync ledger: {run / 'ledger.jsonl'}:3:" in result.output and message in result.output
    assert "damaged" in result.output
    assert isinstance(result.exception, SystemExit)  # the command's own exit, not an escaped exception


@pytest.mark.parametrize("ledger, message", [
    ({**SUMMARY["ledger"], "consumed": "4"}, "'consumed' must be a whole number of samples, not \"4\""),
    ({**SUMMARY["ledger"], "queued": [0]}, "'queued' must be a whole number of samples, not [0]"),
    ({**SUMMARY["ledger"], "dropped": {"stale": "2"}}, "'dropped' must be an object of whole numbers"),
    ([4, 4, 0], "must be an object of sample counts, not list"),
], ids=["count-string", "count-list", "dropped-string", "ledger-list"])
def test_damaged_summary_counts_are_one_line(tmp_path, ledger, message):
    run = write_run(tmp_path / "run", good_lines(), {**SUMMARY, "ledger": ledger})
    result = runner.invoke(app, ["ledger", str(run)])
    assert result.exit_code == 2, result.output
    assert f"fasync ledger: {run / 'summary.json'}: its \"ledger\" {message}" in result.output
    assert isinstance(result.exception, SystemExit)


def test_a_last_line_a_kill_cut_short_is_left_out(tmp_path):
    run = write_run(tmp_path / "run", good_lines()[:3], {"outcome": "failed"})
    with (run / "ledger.jsonl").open("a") as journal:
        journal.write('{"event": "checkpoint", "dr')
    result = runner.invoke(app, ["ledger", str(run)])
    assert result.exit_code == 0, result.output
    assert "did not end cleanly" in result.output
