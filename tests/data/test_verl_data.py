"""A verl user's own workload, unchanged: a verl-layout parquet of chat-message prompts, a local Hugging Face model
with a chat template, and verl's `compute_score(data_source, solution_str, ground_truth, extra_info)` reward."""

from __future__ import annotations

import json
import textwrap

import pytest
import yaml
from cli_runs import REPO, fasync
from sections import tiny_sections
from tiny_models import ROLE_TEMPLATE, write_tiny_llama
from verl_layout import write_verl_parquet

COMPUTE_SCORE = textwrap.dedent("""
    def compute_score(data_source, solution_str, ground_truth, extra_info=None):
        assert data_source == "digits" and extra_info["split"] == "train", (data_source, extra_info)
        return float(solution_str.strip()[:1] == ground_truth[:1])
""")


@pytest.fixture(scope="module")
def workload(tmp_path_factory):
    """The model directory, the parquet file (named without a suffix: the format comes from the file) and the
    reward module, as a verl user has them."""
    root = tmp_path_factory.mktemp("verl-user")
    write_tiny_llama(root / "model", chat_template=ROLE_TEMPLATE)
    write_verl_parquet(root / "train_data")
    (root / "my_score.py").write_text(COMPUTE_SCORE)
    return root


def sections(workload, mode: str) -> dict:
    raw = tiny_sections(
        model={"path": str(workload / "model")},
        data={"path": str(workload / "train_data"), "task": None},
        reward={"function": "my_score:compute_score"},
        rollout={"batch_size": 4, "n_samples_per_prompt": 4, "max_new_tokens": 3},
        train={"global_batch_size": 16, "micro_batch_size": 8, "num_rollouts": 2},
        eval={"held_out_prompts": 3, "every": 1, "samples_per_prompt": 2},
        mode=mode,
    )
    for key in ("n_layers", "d_model", "n_heads", "max_seq_len"):
        raw["model"].pop(key)
    if mode == "fully_async":
        raw.update({"async": {"max_weight_staleness": 2, "partial_rollout": True}, "correction": {"level": "token"}})
    return raw


def test_the_verl_layout_reads_as_it_is(workload):
    from fasync.config.schema import DataConfig
    from fasync.data.datasets import load_records
    from fasync.model.tokenizer import HFTokenizer, PromptStyle

    dataset = load_records(DataConfig(path=str(workload / "train_data"), task=None))
    first = dataset.problems[0]
    assert len(dataset) == 12 and first.label == "1" and first.record["data_source"] == "digits"
    assert first.prompt[0] == {"role": "system", "content": "answer with digits"}
    assert dataset.location(3) == f"{workload / 'train_data'} row 3"
    tokenizer = HFTokenizer(str(workload / "model"), PromptStyle())
    assert tokenizer.prompt_text(first.prompt) == "<s>s answer with digits u what is 0 plus one ="


@pytest.mark.parametrize("mode", ["sync", "fully_async"])
def test_a_verl_workload_trains_unchanged(workload, tmp_path, mode):
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(sections(workload, mode), sort_keys=False))
    out = tmp_path / "out"
    # From the user's directory, where the reward module sits beside the data; fasync hands it to the actors.
    result = fasync("train", str(config), "--run-dir", str(out), cwd=workload, env_extra={"PYTHONPATH": str(REPO)})
    assert result.returncode == 0, result.stdout + result.stderr
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(records) == 2 and all(0.0 <= r["reward_mean"] <= 1.0 for r in records)
    # Evaluated every optimizer step on the 3 held-out records, per data_source too (the record's own key).
    evaluated = [r for r in records if r.get("eval/pass@k") is not None]
    assert evaluated and all(0.0 <= r["eval/pass@k"] <= 1.0 and r["eval/prompts"] == 3 for r in evaluated)
    assert all(r["eval/digits/pass@k"] == r["eval/pass@k"] for r in evaluated)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["outcome"] == "finished" and not summary["ledger"]["dropped"].get("reward_failed")
