"""Values `fasync check` used to pass and that then failed or hung a later command (issue 32 §5 #10, #16, #17,
#18): each is refused by check itself, one located diagnostic with a hint."""

from __future__ import annotations

import pytest
from paths import REPO
from typer.testing import CliRunner

from fasync.cli import app

runner = CliRunner()

QUICKSTART = REPO / "configs" / "quickstart.yaml"


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


def check(*args: str):
    result = runner.invoke(app, ["check", *args])
    assert isinstance(result.exception, SystemExit), result.output  # the command's own exit, no traceback
    return result


def test_an_endless_base_is_refused_before_it_is_read(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("extends: /dev/zero\nmode: sync\n")
    result = check(str(config))
    assert result.exit_code == 1
    assert f"{config}:1:" in result.output and "cannot read `/dev/zero`: it is a character device, not a regular " \
        "file" in result.output and "help: name a config file" in result.output


def test_a_pipe_as_config_or_base_is_refused_without_waiting_for_a_writer(tmp_path):
    import os

    pipe = tmp_path / "pipe.yaml"
    os.mkfifo(pipe)  # nothing ever writes to it: reading it would block forever
    config = tmp_path / "run.yaml"
    config.write_text("extends: pipe.yaml\n")
    based = check(str(config))
    assert based.exit_code == 1 and "it is a pipe, not a regular file" in based.output
    named = check(str(pipe))
    # The file named could not be checked: exit 2, and never "All checks passed!"
    assert named.exit_code == 2 and "it is a pipe, not a regular file" in named.output
    assert "write it to a file first" in named.output and "All checks passed" not in named.output


def test_a_config_larger_than_any_config_is_refused_unread(tmp_path):
    from fasync.config.yaml_source import MAX_CONFIG_BYTES

    huge = tmp_path / "huge.yaml"
    with huge.open("wb") as file:
        file.truncate(MAX_CONFIG_BYTES + 1)  # sparse: no disk used
    result = check(str(huge))
    assert result.exit_code == 1 and f"more than the {MAX_CONFIG_BYTES >> 20} MiB a config may be" in result.output


@pytest.mark.parametrize("override, message", [
    ("rollout.batch_size=99999999999999999999999999", "`rollout.batch_size`: Input should be less than or equal to "
     "65536"),
    ("rollout.over_sampling_batch_size=100000", "`rollout.over_sampling_batch_size`: Input should be less than or "
     "equal to 65536"),
    ("rollout.n_samples_per_prompt=1000000", "`rollout.n_samples_per_prompt`: Input should be less than or equal to "
     "4096"),
], ids=["batch", "over-sampling", "group"])
def test_a_batch_no_run_could_generate_is_refused_by_check_before_simulate_spins_on_it(override, message):
    checked = check(str(QUICKSTART), override)
    assert checked.exit_code == 1 and message in checked.output, checked.output
    simulated = runner.invoke(app, ["simulate", str(QUICKSTART), override])
    assert simulated.exit_code == 2 and message in simulated.output, simulated.output
