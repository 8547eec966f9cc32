"""`fasync check --preflight` (fasync/preflight.py) against a live local Ray cluster (the session's, 4 CPUs
and no GPU), a saved tiny Hugging Face model and JSONL files: each check fails on a bad fixture with its
code at the key that asked for it, and passes on a good one."""

import json
import subprocess
import sys

import pytest
from paths import REPO
from tiny_models import write_tiny_llama

from fasync import preflight
from fasync.config.loader import load_config


def findings(tmp_path, text: str) -> list:
    path = tmp_path / "run.yaml"
    path.write_text(text)
    return preflight.preflight(load_config(path, []))


def codes(found) -> list[tuple[str, str]]:
    return [(d.code, d.key) for d in found]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    directory = tmp_path_factory.mktemp("llama")  # context: 64 positions
    write_tiny_llama(directory)
    return directory


def test_cluster_without_the_gpus_the_plan_reserves(ray_session, tmp_path):
    found = findings(tmp_path, "resources:\n  num_gpus: 1\n  gpus_per_trainer_rank: 1\n")
    assert codes(found) == [("E001", "resources.num_gpus")]
    assert "reserves 1 GPUs but the cluster has 0" in found[0].message
    assert found[0].location.line == 2
    assert findings(tmp_path, "resources:\n  trainer_ranks: 2\n") == []


def test_cluster_without_enough_cpus(ray_session, tmp_path):
    assert codes(findings(tmp_path, "resources:\n  trainer_ranks: 3\n  train_threads: 2\n")) == [
        ("E001", "resources.trainer_ranks")]


def test_vllm_and_torch_that_do_not_import_together(ray_session, tmp_path, model, monkeypatch):
    text = f"model:\n  path: {model}\nrollout:\n  engine: vllm\n  max_new_tokens: 8\n"
    monkeypatch.setattr(preflight, "IMPORT_PAIR", "import torch; import fasync_no_such_vllm")
    found = findings(tmp_path, text)
    assert codes(found) == [("E002", "rollout.engine")] and "fasync_no_such_vllm" in found[0].message
    monkeypatch.setattr(preflight, "IMPORT_PAIR", "import torch")  # a pair that imports
    assert findings(tmp_path, text) == []


def test_model_directory_without_a_tokenizer(ray_session, tmp_path, model):
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "config.json").write_text((model / "config.json").read_text())
    found = findings(tmp_path, f"model:\n  path: {bare}\nrollout:\n  max_new_tokens: 8\n")
    assert codes(found) == [("E003", "model.path")] and "has no tokenizer (" in found[0].message
    assert findings(tmp_path, f"model:\n  path: {model}\nrollout:\n  max_new_tokens: 8\n") == []


def test_context_shorter_than_the_longest_prompt_plus_new_tokens(ray_session, tmp_path, model):
    data = tmp_path / "data.jsonl"
    data.write_text(json.dumps({"prompt": "1" * 40, "label": "1"}) + "\n" + json.dumps({"prompt": "2", "label": "2"}) + "\n")
    text = f"model:\n  path: {model}\ndata:\n  path: {data}\nrollout:\n  max_new_tokens: {{new}}\n"
    found = findings(tmp_path, text.format(new=30))
    assert codes(found) == [("E004", "rollout.max_new_tokens"), ("E009", "data.path")]
    assert "above the model's context of 64" in found[0].message
    assert codes(findings(tmp_path, text.format(new=8))) == [("E009", "data.path")]


def test_dataset_missing_or_without_its_keys(ray_session, tmp_path):
    assert codes(findings(tmp_path, f"data:\n  path: {tmp_path / 'none.jsonl'}\n")) == [("E005", "data.path")]
    data = tmp_path / "data.jsonl"
    data.write_text(json.dumps({"question": "1+1", "label": "2"}) + "\n")
    found = findings(tmp_path, f"data:\n  path: {data}\n")
    assert codes(found) == [("E005", "data.prompt_key")] and ":1 has no key 'prompt'" in found[0].message
    (loaded,) = findings(tmp_path, f"data:\n  path: {data}\n  prompt_key: question\n")
    assert (loaded.code, loaded.key) == ("E009", "data.path") and loaded.severity.value == "info"
    assert loaded.message.startswith("1 records; the longest prompt is 4 tokens (") and '"1+1"' in loaded.message


def test_cli_without_a_running_cluster_says_fasync_will_start_one(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("mode: sync\n")
    run = subprocess.run([sys.executable, "-m", "fasync.cli", "check", "--preflight", str(path)], cwd=REPO,
                         capture_output=True, text=True, timeout=120, env={"PYTHONPATH": str(REPO),
                                                                           "PATH": "/usr/bin:/bin"})
    assert run.returncode == 0, run.stderr
    assert "E006 info: no running Ray cluster" in run.stdout


def test_dataset_that_is_not_utf8_is_a_finding_not_a_traceback(ray_session, tmp_path):
    data = tmp_path / "data.jsonl"
    data.write_bytes(b'{"prompt": "caf\xe9", "label": "2"}\n')
    found = findings(tmp_path, f"data:\n  path: {data}\n")
    assert codes(found) == [("E005", "data.path")] and f"{data}:1: not UTF-8 text" in found[0].message


def test_a_prompt_that_alone_fills_the_context_is_told_to_shorten_not_to_generate_0_tokens(tmp_path, model):
    data = tmp_path / "data.jsonl"
    data.write_text(json.dumps({"prompt": "1" * 80, "label": "1"}) + "\n")
    path = tmp_path / "run.yaml"
    path.write_text(f"model:\n  path: {model}\ndata:\n  path: {data}\nrollout:\n  max_new_tokens: 8\n")
    (found,) = preflight._model(load_config(path, []))
    assert found.code == "E004" and "at most 0" not in found.help
    assert "the longest prompt alone fills the model's context of 64 tokens: shorten or drop the longest prompts, " \
           "or use a model with a longer context" in found.help
