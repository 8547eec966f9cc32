"""The example environments trained end to end in each mode on the shared Ray session, with the embedded model:
short runs that check the mechanics (trajectories reach the trainer with their masks, the agent metrics are
written, the ledger balances). Whether they learn is bench/agentic.py's to measure (docs/agentic.md)."""

from __future__ import annotations

import pytest
from driver_runs import assert_ledger_balanced, run_mode
from sections import tiny_config

pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("agentic_examples")]


def agentic_config(mode: str, env: str, model=None, **rollout):
    sections = {"async": {"max_weight_staleness": 1, "partial_rollout": True}} if mode == "fully_async" else {}
    return tiny_config(mode=mode, model=model or {"max_seq_len": 64}, data={"task": "reverse", "length": 1},
                       rollout={"batch_size": 4, "n_samples_per_prompt": 4, "env": env, "max_observation_tokens": 8,
                                **rollout},
                       train={"global_batch_size": 16, "micro_batch_size": 8, "num_rollouts": 3}, **sections)


@pytest.mark.parametrize("mode", ["sync", "async", "fully_async"])
def test_guess_the_number_trains_in_every_mode(ray_session, tmp_path, mode):
    cfg = agentic_config(mode, "guess_number:GuessNumber", max_turns=4, max_new_tokens=2)
    driver = run_mode(cfg, tmp_path)
    assert_ledger_balanced(driver)
    rows = driver.run.writer.history
    assert len(rows) == cfg.train.num_rollouts
    for row in rows:
        assert 1 <= row["agent/turns_mean"] <= row["agent/turns_max"] <= 4
        assert 0 < row["agent/masked_token_fraction"] < 1 or row["agent/turns_max"] == 1
        assert row["agent/tool_calls"] == 0


@pytest.mark.parametrize("added_tokens", [[], ['<tool_call>{"name": "get"}</tool_call>']],
                         ids=["built-in-vocabulary", "the-example-s-call-token"])
def test_the_lookup_task_trains_and_counts_its_tool_calls(ray_session, tmp_path, added_tokens):
    # With `model.added_tokens` (as lookup.yaml), the engines and the trainer build the same grown vocabulary: the
    # weight syncs between them load.
    cfg = agentic_config("sync", "lookup:Lookup", max_turns=2, max_new_tokens=24 if not added_tokens else 1,
                         model={"max_seq_len": 64, "added_tokens": added_tokens})
    driver = run_mode(cfg, tmp_path)
    assert_ledger_balanced(driver)
    for row in driver.run.writer.history:
        assert row["agent/tool_calls"] >= row["agent/tool_errors"] >= 0
        assert set(row) >= {"agent/tool_errors_bad_call", "agent/tool_errors_unknown_tool", "agent/env_time_s"}
