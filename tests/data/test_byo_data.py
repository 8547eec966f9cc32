"""Bring your own data and reward (issue 28 §1, §2): dataset formats, chat prompts, nested keys, epochs, overlong
prompts, rewards by the fields they name, their concurrency, timeouts and failures, a remote reward server, and
what `fasync check`, `--preflight` and `fasync data show` say about them."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from cli_runs import fasync as fasync_in_this_environment
from paths import REPO
from sections import tiny_sections
from verl_layout import verl_rows

from fasync.config.schema import DataConfig, RewardConfig
from fasync.data.datasets import build_dataset, check_prompts, load_records
from fasync.data.rewards import Reward, RewardInput, math_verify
from fasync.data.scoring import RewardFailed, RewardRunner
from fasync.data.tasks import Problem
from fasync.errors import ConfigurationError
from fasync.model.tokenizer import TEXT_ALPHABET, CharTokenizer, PromptStyle

# -- formats ---------------------------------------------------------------------------------------


def write_parquet(path, rows) -> str:
    pq.write_table(pa.Table.from_pylist(rows), path)
    return str(path)


def test_every_format_reads_the_same_records(tmp_path):
    import datasets

    rows = verl_rows(5)
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    (tmp_path / "rows.json").write_text(json.dumps(rows))
    write_parquet(tmp_path / "rows.parquet", rows)
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "saved"))
    loaded = {name: build_dataset(DataConfig(path=str(tmp_path / name), task=None))
              for name in ("rows.jsonl", "rows.json", "rows.parquet", "saved")}
    first = loaded["rows.jsonl"]
    for dataset in loaded.values():
        assert dataset.problems == first.problems and [p.record for p in dataset.problems] == rows
    assert loaded["saved"].location(2) == f"{tmp_path / 'saved'} row 2"
    assert first.location(2) == f"{tmp_path / 'rows.jsonl'}:3"


def test_a_parquet_file_is_never_read_as_text_whatever_its_name(tmp_path):
    path = write_parquet(tmp_path / "train.jsonl", [{"prompt": "a", "label": "b"}])
    assert build_dataset(DataConfig(path=path, task=None)).problems == [Problem("a", "b")]
    with pytest.raises(ConfigurationError, match=r"train.jsonl is a parquet file \(it begins with PAR1\), but "
                       "`data.format` is jsonl: set `data.format: parquet`, or leave it null"):
        build_dataset(DataConfig(path=path, task=None, format="jsonl"))


def test_a_directory_that_is_not_a_saved_dataset_is_named(tmp_path):
    with pytest.raises(ConfigurationError, match="is a directory, but not a Hugging Face dataset"):
        build_dataset(DataConfig(path=str(tmp_path), task=None))


# -- prompts and labels ----------------------------------------------------------------------------


def test_nested_keys_and_verls_label_by_default(tmp_path):
    path = write_parquet(tmp_path / "d.parquet", [{"q": {"text": "hi"}, "reward_model": {"ground_truth": 7}}])
    (problem,) = build_dataset(DataConfig(path=path, task=None, prompt_key="q.text")).problems
    assert problem == Problem("hi", "7") and problem.ground_truth == 7
    named = build_dataset(DataConfig(path=path, task=None, prompt_key="q.text", label_key="reward_model.ground_truth"))
    assert named.problems == [problem]
    with pytest.raises(ConfigurationError, match=r"no key 'answer' \(data.label_key\)"):
        build_dataset(DataConfig(path=path, task=None, prompt_key="q.text", label_key="answer"))


@pytest.mark.parametrize("prompt", [[{"role": "user"}], [], {"role": "user", "content": "x"}, [["user", "x"]]])
def test_a_prompt_of_another_shape_is_refused_with_its_row(tmp_path, prompt):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"prompt": "ok", "label": "1"}) + "\n" + json.dumps({"prompt": prompt, "label": "1"}))
    with pytest.raises(ConfigurationError, match=r"d.jsonl:2: 'prompt' must be a string or a list of chat "
                       "messages") as info:
        build_dataset(DataConfig(path=str(path), task=None))
    assert "\n" not in str(info.value)


def test_prompt_styles_without_a_chat_template():
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "2+2"}]
    plain = CharTokenizer(TEXT_ALPHABET)
    assert plain.prompt_text("2+2") == "2+2" and plain.prompt_text(messages) == "be brief\n2+2"
    styled = CharTokenizer(TEXT_ALPHABET, PromptStyle(system_prompt="think"))
    assert styled.prompt_text("2+2") == "think\n2+2"
    assert styled.prompt_text(messages) == "be brief\n2+2"  # the record's own system prompt is kept


def test_prompt_styles_with_a_chat_template(tmp_path):
    from tiny_models import ROLE_TEMPLATE, write_tiny_llama

    from fasync.model.tokenizer import HFTokenizer

    template = ROLE_TEMPLATE.replace("={% endif %}", "={% if short %}s{% endif %}{% endif %}")
    write_tiny_llama(tmp_path, chat_template=template)
    assert HFTokenizer(str(tmp_path)).prompt_text("2+2") == "<s>u 2+2 ="
    system = HFTokenizer(str(tmp_path), PromptStyle(system_prompt="be brief"))
    assert system.prompt_text("2+2") == "<s>s be brief u 2+2 ="
    kwargs = HFTokenizer(str(tmp_path), PromptStyle(chat_template_kwargs={"short": True}))
    assert kwargs.prompt_text("2+2") == "<s>u 2+2 =s"
    untemplated = HFTokenizer(str(tmp_path), PromptStyle(chat_template=False))
    assert untemplated.format_prompt("2+2") == untemplated.hf.encode("2+2", add_special_tokens=True)
    assert untemplated.prompt_text("2+2") == "2+2"  # this tokenizer adds no BOS of its own


# -- epochs ----------------------------------------------------------------------------------------


def test_files_are_drawn_in_epochs_each_shuffled_and_a_resumed_cursor_draws_the_same(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"p{i}", "label": "x"}) + "\n" for i in range(10)))
    dataset = build_dataset(DataConfig(path=str(path), task=None))
    rng = random.Random(0)
    draws = dataset.draw(0, 30, rng)
    epochs = [draws[0:10], draws[10:20], draws[20:30]]
    assert all(sorted(epoch) == list(range(10)) for epoch in epochs)  # each prompt once per epoch
    assert len({tuple(epoch) for epoch in epochs}) == 3  # a new order each epoch
    assert dataset.draw(13, 9, random.Random(99)) == draws[13:22]  # the cursor alone decides
    assert dataset.draw(2, 3, random.Random(7)) == draws[2:5]  # back in an earlier epoch, its own order again
    replacement = build_dataset(DataConfig(path=str(path), task=None, sampling="replacement"))
    assert len(set(replacement.draw(0, 10, random.Random(0)))) < 10  # repeats within ten draws of ten (seeded)
    assert not replacement.epochs and build_dataset(DataConfig(task="reverse", sampling="epoch")).epochs


def test_the_group_factorys_state_resumes_the_epoch_order(tmp_path):
    from fasync.config.schema import FasyncConfig
    from fasync.launch.plan import resolve
    from fasync.rollout.groups import build_factory

    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"p{i}", "label": "x"}) + "\n" for i in range(7)))
    cfg = FasyncConfig.model_validate({"data": {"path": str(path), "task": None}})
    original = build_factory(resolve(cfg))
    original.new_groups(5)
    state = original.state_dict()
    later = [g.prompt for g in original.new_groups(9)]
    resumed = build_factory(resolve(cfg))
    resumed.load_state_dict(state)
    assert [g.prompt for g in resumed.new_groups(9)] == later


# -- overlong prompts ------------------------------------------------------------------------------


def test_overlong_prompts_fail_or_are_filtered_with_a_count(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps({"prompt": "x" * n, "label": "x"}) + "\n" for n in (3, 30, 5, 70)))
    tokenizer = CharTokenizer(TEXT_ALPHABET)
    strict = DataConfig(path=str(path), task=None, max_prompt_tokens=20)
    with pytest.raises(ConfigurationError, match=r"d.jsonl:2: the prompt is 31 tokens, above `data.max_prompt_tokens` "
                       "20.*`data.overlong_prompts: filter`"):
        check_prompts(build_dataset(strict), tokenizer, 64, strict)
    lenient = strict.model_copy(update={"overlong_prompts": "filter"})
    kept = load_records(lenient, tokenizer, 64)
    assert [p.prompt for p in kept.problems] == ["xxx", "xxxxx"] and kept.filtered == 2
    assert kept.location(1) == f"{path}:3"
    with pytest.raises(ConfigurationError, match="every one of the 4 prompts"):
        load_records(lenient.model_copy(update={"max_prompt_tokens": 1}), tokenizer, 64)


# -- rewards by the fields they name ---------------------------------------------------------------


PROBLEM = Problem("q", "4", {"data_source": "gsm8k", "extra_info": {"id": 3}, "reward_model": {"ground_truth": 4}}, 4)


def test_a_reward_takes_the_fields_it_names():
    def compute_score(data_source, solution_str, ground_truth, extra_info=None):
        return (data_source, solution_str, ground_truth, extra_info)

    def shaped(record, completion, completion_tokens, finish_reason):
        return (record["data_source"], completion, completion_tokens, finish_reason)

    async def later(completion, label):
        return float(completion == label)

    item = RewardInput("4", PROBLEM, completion_tokens=2, finish_reason="length")
    assert Reward.of(compute_score, "m:f")(item) == ("gsm8k", "4", 4, {"id": 3})
    assert Reward.of(shaped, "m:f")(item) == ("gsm8k", "4", 2, "length")
    assert Reward.of(later, "m:f")(item) == 1.0
    with pytest.raises(ConfigurationError, match=r"m:f must accept \(completion, label\).*among completion"):
        Reward.of(lambda answer, truth, extra: 0.0, "m:f")


@pytest.mark.parametrize("completion, label, reward", [
    ("so the answer is \\boxed{\\frac{1}{2}}", "0.5", 1.0),
    ("48 + 24 = 72 clips.\n#### 72", "72", 1.0),
    ("#### 1,234", "1234", 1.0),
    ("\\boxed{15}", "14", 0.0),
    ("no answer here", "14", 0.0),
])
def test_math_verify_reads_boxed_gsm8k_and_equivalent_forms(completion, label, reward):
    assert math_verify(completion, label) == reward


def test_math_verify_scores_off_the_main_thread_too():
    runner = RewardRunner(RewardConfig(function="math_verify"))
    assert runner.score([RewardInput("#### 14", Problem("q", "14"))], ["p"]) == [1.0]


@pytest.mark.parametrize("function", ["exact_match", "partial_match", "boxed_math"])
def test_an_instant_reward_scores_in_the_callers_thread_as_the_pool_would(function):
    items = [RewardInput(text, Problem("q", "14")) for text in ("14", "41", "\\boxed{14}", "", "1")]
    inline = RewardRunner(RewardConfig(function=function))
    assert inline.instant
    scores = inline.score(items, ["p"] * len(items))
    assert inline._pool is None, "an instant reward started a worker thread"
    pooled = RewardRunner(RewardConfig(function=function))
    pooled.instant = False  # the path every other reward takes
    assert pooled.score(items, ["p"] * len(items)) == scores and pooled._pool is not None


@pytest.fixture
def slow_rewards(user_modules):
    user_modules("slow_rewards",
                 "import threading, time\n"
                 "together = threading.Barrier(4)\n"
                 "def four_at_once(completion, label):\n    together.wait(timeout=60)\n    return 1.0\n"
                 "def slow(completion, label):\n    time.sleep(float(completion))\n    return 1.0\n"
                 "def raises(completion, label):\n    raise ValueError('cannot parse')\n")


def test_rewards_run_concurrently_within_a_timeout_and_failures_drop_or_fail(slow_rewards):
    items = [RewardInput(text, Problem("q", "1")) for text in ("0.3", "0.3", "0.3", "0.3")]
    cfg = RewardConfig(function="slow_rewards:slow", concurrency=4, timeout_s=5)
    # Each call waits at a barrier for all four: they finish only if they run at once, not one after another.
    together = RewardRunner(cfg.model_copy(update={"function": "slow_rewards:four_at_once", "timeout_s": 120}))
    assert together.score(items, ["p"] * 4) == [1.0] * 4

    hanging = [RewardInput("3", Problem("q", "1")), RewardInput("0", Problem("q", "1"))]
    dropping = RewardRunner(cfg.model_copy(update={"timeout_s": 0.2, "on_error": "drop"}))
    late, on_time = dropping.score(hanging, ["prompt 0", "prompt 1"])
    assert isinstance(late, RewardFailed) and "took longer than 0.2 s" in str(late) and on_time == 1.0
    with pytest.raises(ConfigurationError, match="slow_rewards:slow took longer than 0.2 s .*for prompt 0"):
        RewardRunner(cfg.model_copy(update={"timeout_s": 0.2})).score(hanging, ["prompt 0", "prompt 1"])
    stuck = [RewardInput("3", Problem("q", "1"))] * 8
    four_rounds = RewardRunner(cfg.model_copy(update={"timeout_s": 0.2, "concurrency": 2, "on_error": "drop"}))
    failed = four_rounds.score(stuck, ["p"] * 8)
    # One deadline for the batch: 4 rounds of 2 calls × 0.2 s, not 8 × 0.2 s waited in turn.
    assert all(isinstance(r, RewardFailed) and "took longer than 0.8 s" in str(r) for r in failed), failed
    raising = RewardRunner(RewardConfig(function="slow_rewards:raises", on_error="drop"))
    (failed,) = raising.score(items[:1], ["prompt 5"])
    assert "raised ValueError: cannot parse" in str(failed) and "prompt 5" in str(failed)


@pytest.fixture
def batched_rewards(user_modules):
    user_modules("batched_rewards",
                 "calls = []\n"
                 "def scores(solution_str, ground_truth):\n"
                 "    calls.append(len(solution_str))\n"
                 "    return [float(s == g) for s, g in zip(solution_str, ground_truth)]\n"
                 "def short(completion, label):\n    return [1.0]\n")


def test_a_batched_reward_gets_lists_of_the_fields_it_names(batched_rewards):
    import batched_rewards

    items = [RewardInput(str(i % 2), Problem("q", "1")) for i in range(5)]
    runner = RewardRunner(RewardConfig(function="batched_rewards:scores", batched=True, batch_size=2))
    assert runner.score(items, ["p"] * 5) == [0.0, 1.0, 0.0, 1.0, 0.0]
    assert sorted(batched_rewards.calls) == [1, 2, 2]
    short = RewardRunner(RewardConfig(function="batched_rewards:short", batched=True, on_error="drop"))
    failed = short.score(items[:2], ["p"] * 2)
    assert all(isinstance(r, RewardFailed) and "returned list [1.0]; return a list of one reward" in str(r)
               for r in failed)


def test_a_group_whose_reward_failed_is_dropped_and_counted(slow_rewards, tmp_path):
    from fasync.config.schema import FasyncConfig
    from fasync.launch.plan import resolve
    from fasync.rollout.groups import build_factory

    cfg = FasyncConfig.model_validate({"data": {"task": "reverse", "length": 3, "num_prompts": 5},
                                       "reward": {"function": "slow_rewards:raises", "on_error": "drop"},
                                       "rollout": {"n_samples_per_prompt": 2}})
    factory = build_factory(resolve(cfg))
    group = factory.new_groups(1)[0]
    for request in group.requests:
        request.output_ids = factory.tokenizer.encode("12")
    factory.score(group)
    assert group.reward_failure.startswith("reward.function: slow_rewards:raises raised ValueError")


# -- a remote reward server ------------------------------------------------------------------------


class RewardServer(BaseHTTPRequestHandler):
    """Scores `{"items": [...]}` as exact matches; the path's mode misbehaves: `/slow` answers late, `/failing`
    with HTTP 503, `/flaky` with 503 to every third batch."""

    requests: list = []

    def do_POST(self):  # noqa: N802 - http.server's name
        items = json.loads(self.rfile.read(int(self.headers["content-length"])))["items"]
        RewardServer.requests.append((self.path, len(items)))
        flaky_turn = sum(1 for path, size in RewardServer.requests if path == "/flaky" and size) % 3 == 0
        if items and (self.path == "/failing" or self.path == "/flaky" and flaky_turn):
            self.send_response(503)
            self.end_headers()
            return
        if self.path == "/slow" and items:
            time.sleep(2)
        body = json.dumps({"rewards": [float(item["completion"] == item["label"]) for item in items]}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), RewardServer)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    RewardServer.requests = []
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_a_remote_reward_batches_within_its_concurrency(server):
    items = [RewardInput(str(i % 2), Problem("q", "1")) for i in range(10)]
    runner = RewardRunner(RewardConfig(url=f"{server}/", batch_size=4, concurrency=2))
    assert runner.score(items, ["p"] * 10) == [float(i % 2) for i in range(10)]
    posted = [size for path, size in RewardServer.requests if size]
    assert sorted(posted) == [2, 4, 4]


def test_a_slow_or_failing_server_drops_its_samples_never_stalls(server, monkeypatch):
    import fasync.data.remote as remote

    monkeypatch.setattr(remote, "BACKOFF_S", 0.01)
    items = [RewardInput("1", Problem("q", "1"))] * 3
    slow = RewardRunner(RewardConfig(url=f"{server}/slow", timeout_s=0.3, retries=1, on_error="drop"))
    # The request's own read timeout, or on a loaded machine the runner's deadline for it: dropped either way.
    assert all(isinstance(r, RewardFailed) and ("ReadTimeout" in str(r) or "took longer than" in str(r))
               for r in slow.score(items, ["p"] * 3))
    failing = RewardRunner(RewardConfig(url=f"{server}/failing", retries=2, on_error="drop"))
    results = failing.score(items, ["p"] * 3)
    assert all(isinstance(r, RewardFailed) and "after 3 attempts (HTTP 503)" in str(r) for r in results)
    assert [path for path, size in RewardServer.requests if path == "/failing" and size] == ["/failing"] * 3
    with pytest.raises(ConfigurationError, match=f"reward.url: {server}/failing failed a batch of 3"):
        RewardRunner(RewardConfig(url=f"{server}/failing", retries=0)).score(items, ["p"] * 3)


def test_a_run_drops_and_counts_what_its_reward_server_could_not_score(server, tmp_path):
    # A batch of 4 completions is one prompt's group (4 samples each); the server fails the 3rd and the 6th of the
    # 8 batches of two rollouts, so exactly 2 groups are dropped, whatever order the concurrent posts arrive in.
    raw = tiny_sections(reward={"url": f"{server}/flaky", "batch_size": 4, "retries": 0, "on_error": "drop"},
                        train={"global_batch_size": 4, "micro_batch_size": 4, "num_rollouts": 2})
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(raw, sort_keys=False))
    run = fasync_in_this_environment("train", str(config), "--run-dir", str(tmp_path / "run"))
    assert run.returncode == 0, run.stdout + run.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["ledger"]["dropped"]["reward_failed"] == 8, summary["ledger"]
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    per_rollout = {row["rollout"]: row.get("dropped_reward_failed", 0) for row in rows}  # a rollout-scope metric
    assert sum(per_rollout.values()) == 8, per_rollout
    assert fasync_in_this_environment("ledger", str(tmp_path / "run")).returncode == 0  # every group accounted for


def test_an_unreachable_reward_server_is_named_at_start():
    with pytest.raises(ConfigurationError, match=r"reward.url: nothing answers at http://127.0.0.1:9/ \(Connect"):
        RewardRunner(RewardConfig(url="http://127.0.0.1:9/", timeout_s=2))


# -- check, --preflight and data show --------------------------------------------------------------


def fasync(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fasync.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})


def test_check_finds_a_misspelt_reward_module_without_importing_it(tmp_path):
    (tmp_path / "my_score.py").write_text("import torch_is_not_imported_by_check\ndef compute_score(solution_str, "
                                          "ground_truth):\n    return 0.0\n")
    config = tmp_path / "run.yaml"
    config.write_text("reward:\n  function: my_scor:compute_score\n")
    run = fasync("check", "--format", "concise", str(config))
    assert run.returncode == 1 and run.stdout.count("E010") == 1, run.stdout
    assert "no module 'my_scor' on the import path, in the working directory or in the config's directory" in run.stdout
    config.write_text("reward:\n  function: my_score:compute_score\n")
    assert fasync("check", str(config)).returncode == 0  # found beside the config, not imported


def test_preflight_imports_the_reward_and_says_what_is_wrong_in_one_line(tmp_path):
    from fasync import preflight
    from fasync.config.loader import load_config

    (tmp_path / "wrong_args.py").write_text("def score(answer, truth, extra):\n    return 0.0\n")
    config = tmp_path / "run.yaml"
    config.write_text("reward:\n  function: wrong_args:score\n")
    (found,) = [d for d in preflight.preflight(load_config(config, [])) if d.code == "E010"]
    assert found.key == "reward.function" and "must accept (completion, label)" in found.message
    assert "\n" not in found.message


def test_data_show_prints_built_prompts_with_their_tokens_and_labels(tmp_path):
    data = write_parquet(tmp_path / "train", [{"prompt": [{"role": "user", "content": "2+2"}],
                                               "reward_model": {"ground_truth": "4"}}] * 3)
    config = tmp_path / "run.yaml"
    config.write_text(f"data:\n  path: {data}\n  system_prompt: be brief\n")
    run = fasync("data", "show", str(config), "-n", "2")
    assert run.returncode == 0, run.stderr
    assert f"{data}: 3 prompts, drawn by epoch; the first 2 as built:" in run.stdout
    assert f"── prompt 2 · {data} row 1 · 13 tokens · label '4'\nbe brief\n2+2\n" in run.stdout


def test_the_readme_example_of_your_own_data_runs(tmp_path):
    example = "configs/own_data.yaml"
    assert fasync("check", "--preflight", example).returncode == 0
    shown = fasync("data", "show", example, "-n", "1")
    assert shown.returncode == 0 and "configs/own_data/sums.jsonl:1 · 5 tokens · label '12'\n6+6=\n" in shown.stdout
    trained = fasync("train", example, "train.num_rollouts=2", "--run-dir", str(tmp_path / "run"))
    assert trained.returncode == 0, trained.stdout + trained.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["outcome"] == "finished" and summary["optimizer_steps"] == 2
