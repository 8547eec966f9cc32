"""Datasets as other projects write them, read unmodified (tests/data_corpus/SOURCES): verl's GSM8K parquet with
chat-message prompts, `reward_model.ground_truth`, `data_source` and nested `extra_info`."""

from paths import TESTS

from fasync.config.schema import DataConfig, RewardConfig
from fasync.data.datasets import load_records
from fasync.data.rewards import RewardInput, build_reward

VERL_GSM8K = TESTS / "data_corpus" / "verl" / "gsm8k_test.parquet"


def test_verls_gsm8k_parquet_reads_as_it_is_and_its_reference_answers_score_1():
    dataset = load_records(DataConfig(path=str(VERL_GSM8K), task=None))
    assert len(dataset) == 1319 and dataset.epochs
    first = dataset.problems[0]
    assert [message["role"] for message in first.prompt] == ["system", "user"]
    assert first.prompt[1]["content"].startswith("Janet’s ducks lay 16 eggs per day.")
    assert first.label == "18" and first.ground_truth == "18"  # verl's reward_model.ground_truth, no label_key set
    assert first.record["data_source"] == "openai/gsm8k"
    assert first.record["extra_info"]["tools_kwargs"]["calc_gsm8k_reward"]["create_kwargs"] == {"ground_truth": "18"}
    assert dataset.location(1318) == f"{VERL_GSM8K} row 1318"
    # Every reference solution of the first 50 (GSM8K's "#### 18" ending) is right by math_verify.
    reward = build_reward(RewardConfig(function="math_verify"))
    scores = [reward(RewardInput(problem.record["extra_info"]["answer"], problem)) for problem in dataset.problems[:50]]
    assert scores == [1.0] * 50
