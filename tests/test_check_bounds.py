"""Values `fasync check` used to pass and that then failed or hung a later command (issue 32 §5 #10, #16, #17,
#18): each is refused by check itself, one located diagnostic with a hint."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from fasync.cli import app

runner = CliRunner()

QUICKSTART = Path(__file__).resolve().parent.parent / "configs" / "quickstart.yaml"


@pytest.mark.parametrize("override, message", [
    ("simulate.lengths=[]", "`simulate.lengths`: List should have at least 1 item"),
    ("simulate.lengths={median: 1000000000.0, sigma: 1000000000.0}",
     "`simulate.lengths.sigma`: Input should be less than or equal to 10"),
    ("simulate.lengths={median: .inf}", "`simulate.lengths.median`: Input should be a finite number"),
], ids=["empty-list", "huge-tail", "infinite-median"])
def test_simulated_lengths_check_cannot_simulate_are_refused_by_check_and_simulate(override, message):
    checked = runner.invoke(app, ["check", str(QUICKSTART), override])
    assert checked.exit_code == 1, checked.output
    assert message in checked.output and "F007" in checked.output
    # Only the branch of the union the value was written in speaks: not also "should be 'data' or 'run'".
    assert checked.output.count("F007") == 1, checked.output
    simulated = runner.invoke(app, ["simulate", str(QUICKSTART), override])
    assert simulated.exit_code == 2 and message in simulated.output, simulated.output
    assert isinstance(simulated.exception, SystemExit)


def test_a_misspelt_key_of_the_length_tail_is_named_with_its_fix():
    result = runner.invoke(app, ["check", str(QUICKSTART), "simulate.lengths={median: 5, sgma: 1}"])
    assert result.exit_code == 1
    assert "unknown key `simulate.lengths.sgma`" in result.output
    assert "did you mean `simulate.lengths.sigma`?" in result.output
