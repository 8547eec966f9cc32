"""`fasync train` with `rollout.engine: vllm` as a user runs it, for the tests of vLLM's CPU build: a tiny run's
config beside a reward module, the CLI in a process and session of its own, and its output."""

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import yaml
from paths import REPO
from sections import with_sections

# A reward the tiny Llama learns within a few rollouts: about one token in five of its vocabulary is a digit.
REWARD = """
def digit_first(completion, label):
    return float(completion[:1].isdigit())
"""


def write_run(directory: Path, model_dir: Path, rollouts: int, **sections) -> Path:
    """A run of `rollouts` rollouts on the model in `model_dir` with the vLLM engine, its reward module beside it;
    `sections` as `sections.with_sections` applies them (a mode, `async` keys, `model.lora`)."""
    (directory / "my_reward.py").write_text(textwrap.dedent(REWARD))
    config = with_sections({
        "model": {"path": str(model_dir)},
        "data": {"task": "copy", "length": 1},
        "reward": {"function": "my_reward:digit_first"},
        "rollout": {"engine": "vllm", "batch_size": 8, "n_samples_per_prompt": 8, "max_new_tokens": 2},
        "train": {"global_batch_size": 64, "micro_batch_size": 64, "num_rollouts": rollouts, "lr": 3e-2},
        "logging": {"progress": "none"},
    }, **sections)
    path = directory / "run.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def start_train(directory: Path, config: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(directory)])}
    # Output to a file (a pipe nobody reads while the other runs go on would fill and block the run), and a
    # session of its own: whatever happens to the test, the run and the Ray cluster it started can be ended.
    with open(directory / "output.txt", "w") as output:
        return subprocess.Popen([sys.executable, "-m", "fasync.cli", "train", str(config), "--run-dir",
                                 str(directory / "out")], cwd=directory, env=env, stdout=output,
                                stderr=subprocess.STDOUT, start_new_session=True)


def finish(process: subprocess.Popen, directory: Path, timeout: float) -> str:
    """The run's output once it exits; past `timeout` it is stopped (its whole process group) and the test fails."""
    try:
        process.wait(timeout=timeout)
    finally:
        stop(process)
    return (directory / "output.txt").read_text()


def stop(process: subprocess.Popen) -> None:
    """End a run `start_train` started, if it still runs: its whole session, with the Ray cluster it started."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
