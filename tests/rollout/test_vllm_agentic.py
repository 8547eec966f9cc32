"""Multi-turn rollouts with the vLLM engine on vLLM's CPU build (`make test-vllm`): a tiny local Llama whose chat
template renders tool results, an environment of three turns, the trajectories' masks and versions checked in
process, and a fully_async `fasync train` run that completes. Not expected to learn. Skipped where vllm is not
installed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import yaml
from paths import REPO
from tiny_models import skip_unless_vllm_cpu, write_vllm_chat_llama

from fasync.config.schema import FasyncConfig
from fasync.launch.plan import resolve
from fasync.rollout.build import build_engine
from fasync.rollout.groups import build_factory
from fasync.wire import pack, unpack

pytest.importorskip("vllm")
pytestmark = pytest.mark.vllm

TURNS = 3
ENVIRONMENT = """
from fasync.rollout.env_loop import Step


class Repeat:
    \"\"\"Three turns: the model is asked for the label, then told to say it again; 1 for each turn that starts
    with it. Its `get` tool returns the label.\"\"\"

    def __init__(self):
        self.tools = {"get": self.get}

    async def get(self):
        return self.label

    async def reset(self, task):
        self.label, self.turns = task.label, 0
        return [{"role": "user", "content": "say " + task.label}]

    async def step(self, model_text):
        self.turns += 1
        reward = float(model_text.strip()[:1] == self.label)
        return Step([{"role": "user", "content": "again"}], reward, done=self.turns == %d)
""" % TURNS
# A turn takes at most 3 tokens (2, and the turn's end where cut) and an observation 13 (`user again<eot>a `):
# three turns fit the 64-token context after the 14-token prompt.
ROLLOUT = {"engine": "vllm", "env": "repeat_env:Repeat", "max_turns": TURNS, "max_new_tokens": 2,
           "max_observation_tokens": 14, "batch_size": 4, "n_samples_per_prompt": 4}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    skip_unless_vllm_cpu()
    directory = tmp_path_factory.mktemp("tiny-llama-agentic")
    write_vllm_chat_llama(directory / "model")
    (directory / "repeat_env.py").write_text(textwrap.dedent(ENVIRONMENT))
    return directory


class InProcess:
    """The engine's methods as the agent runner calls an actor's: `.remote(...)` returns something to await."""

    def __init__(self, engine):
        self.generate = self
        self.engine = engine

    def remote(self, packed, params, token_budget=None):
        async def call():
            return pack(self.engine.generate(unpack(packed), params, token_budget))
        return call()


def test_vllm_trajectories_carry_their_turns_masks_and_versions(run_dir, monkeypatch):
    monkeypatch.syspath_prepend(str(run_dir))
    cfg = FasyncConfig.model_validate({"model": {"path": str(run_dir / "model")}, "data": {"task": "copy", "length": 1},
                                       "rollout": ROLLOUT})
    factory = build_factory(resolve(cfg))
    engine = build_engine(cfg, factory.tokenizer)
    groups = factory.agent.generate([InProcess(engine)], factory.new_groups(2), factory.params)
    end = factory.tokenizer.stop_token_ids[-1]
    for group in groups:
        factory.score(group)
        for sample, outcome in zip(group.samples, group.outcomes):
            assert outcome.stats.turns == TURNS and not outcome.stats.truncated
            trained = sample.trained
            assert len(sample.output_ids) == len(trained) == len(sample.behaviour_logprobs) == len(sample.token_versions)
            # Three runs of trained model tokens, with the observations between them masked out.
            runs = sum(1 for i, keep in enumerate(trained) if keep and (i == 0 or not trained[i - 1]))
            assert runs == TURNS and not all(trained)
            assert all(logprob == 0.0 for logprob, keep in zip(sample.behaviour_logprobs, trained) if not keep)
            assert set(sample.token_versions) == {0}
            # The observation after each model turn is what the template renders: `user again<eot>a `.
            observation = [t for t, keep in zip(sample.output_ids, trained) if not keep and t != end]
            assert factory.tokenizer.decode(observation).count("again") == TURNS - 1
            assert 0.0 <= sample.reward <= TURNS


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_a_fully_async_multi_turn_run_with_the_vllm_engine_completes(run_dir):
    config = {
        "mode": "fully_async",
        "model": {"path": str(run_dir / "model")},
        "data": {"task": "copy", "length": 1},
        "rollout": ROLLOUT,
        "train": {"global_batch_size": 16, "micro_batch_size": 16, "num_rollouts": 3, "lr": 1e-2},
        "async": {"max_weight_staleness": 2, "partial_rollout": True},
        "correction": {"level": "token"},
        "logging": {"progress": "none"},
    }
    path = run_dir / "run.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(run_dir)])}
    result = subprocess.run([sys.executable, "-m", "fasync.cli", "train", str(path), "--run-dir", str(run_dir / "out")],
                            cwd=run_dir, env=env, capture_output=True, text=True, timeout=1100)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    records = [json.loads(line) for line in (run_dir / "out" / "metrics.jsonl").read_text().splitlines()]
    assert len(records) == 3 and all(r["ledger_balanced"] for r in records)
    assert all(r["agent/turns_mean"] == TURNS and 0 < r["agent/masked_token_fraction"] < 1 for r in records)
    summary = json.loads((run_dir / "out" / "summary.json").read_text())
    assert summary["outcome"] == "finished"
