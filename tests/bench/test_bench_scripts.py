"""bench/learning_quality.py and bench/peer_trl.py: what they count from run directories and processes, and
that every run they make is a config fasync accepts. Their timings are measurements, never asserted here."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest
import yaml
from paths import REPO

from fasync.config.derived import derive
from fasync.config.loader import load_config
from fasync.lint.engine import run_rules


def script(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", REPO / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


lq = script("learning_quality")
peer = script("peer_trl")
vllm_long_tail = script("vllm_long_tail")
algorithms = script("algorithms")


@pytest.mark.parametrize("mode", list(algorithms.CONFIGS))
@pytest.mark.parametrize("name", list(algorithms.ALGORITHMS))
def test_every_algorithm_run_is_a_config_without_lint_errors(mode, name):
    loaded = load_config(REPO / algorithms.CONFIGS[mode], algorithms.ALGORITHMS[name])
    assert loaded.config is not None, [d.message for d in loaded.diagnostics]
    found, crashed = run_rules(loaded.config)
    assert not crashed and not [rule.code for rule, _ in found if rule.severity.name == "ERROR"]


@pytest.mark.parametrize("task", list(lq.TASKS))
@pytest.mark.parametrize("correction", list(lq.CORRECTIONS))
def test_every_cell_is_a_config_without_lint_errors(task, correction):
    run = lq.Run(task, correction, staleness=8, seed=1)
    loaded = load_config(REPO / lq.CONFIG, run.overrides(rollouts=50))
    assert loaded.config is not None, [d.message for d in loaded.diagnostics]
    cfg = loaded.config
    assert cfg.mode == "fully_async" and cfg.async_.max_weight_staleness == 8 and cfg.train.seed == 1
    found, crashed = run_rules(cfg)
    assert not crashed and not [rule.code for rule, _ in found if rule.severity.name == "ERROR"]
    anchor = {"bypass": "behaviour"}.get(correction, "proximal")
    assert derive(cfg).ratio_anchor == anchor


def write_run(directory: Path, rewards: list[float], budget: int, outcome: str = "finished",
              stop_reason: str = "completed all rollouts", ess: float = 0.9) -> None:
    directory.mkdir(parents=True)
    (directory / "config.yaml").write_text(yaml.safe_dump({"train": {"num_rollouts": budget}}))
    records = [{"step": i, "rollout": i, "wall_time": 0.5 * (i + 1), "rollout_reward_mean": reward,
                "staleness_mean": 2.0, "is/ess_token": ess} for i, reward in enumerate(rewards)]
    (directory / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (directory / "summary.json").write_text(json.dumps({"outcome": outcome, "stop_reason": stop_reason}))


def test_a_cell_counts_complete_runs_and_takes_medians_over_those_that_reached_the_target(tmp_path):
    runs = [lq.Run("reverse6", "tis", 2, seed) for seed in range(4)]
    write_run(runs[0].directory(tmp_path), [0.1, 0.9, 0.9, 0.95], budget=10, stop_reason="reached target reward 0.9",
              ess=0.8)
    write_run(runs[1].directory(tmp_path), [0.1, 0.5, 0.9, 0.9, 0.9, 0.95], budget=10,
              stop_reason="reached target reward 0.9", ess=1.0)
    write_run(runs[2].directory(tmp_path), [0.2] * 10, budget=10)  # the whole budget, never reached
    write_run(runs[3].directory(tmp_path), [0.2] * 3, budget=10)  # stopped from outside after 3 drains
    assert [lq.complete(run.directory(tmp_path)) for run in runs] == [True, True, True, False]

    row = dict(zip(lq.HEADER, lq.cell_row(runs, tmp_path)))
    assert row["reached"] == "2/3"
    # Seed 0 reaches a 3-drain mean of 0.9 at drain 3 (step 3 of 4, counted from 1 as 4), seed 1 at drain 5.
    assert row["steps to target (median)"] == pytest.approx((4 + 5) / 2)
    assert row["time to target (s, median)"] == pytest.approx((2.0 + 2.5) / 2)
    finals = [(0.9 + 0.9 + 0.95) / 3, (0.9 + 0.9 + 0.95) / 3, 0.2]
    assert row["final reward (mean)"] == pytest.approx(sum(finals) / 3)
    assert row["is/ess_token (mean)"] == pytest.approx((4 * 0.8 + 6 * 1.0 + 10 * 0.9) / 20)


def test_a_cell_without_a_complete_run_has_no_row(tmp_path):
    run = lq.Run("sort10", "none", 0, 0)
    write_run(run.directory(tmp_path), [0.1], budget=10, outcome="failed")
    assert lq.cell_row([run], tmp_path) is None


def test_memory_is_summed_over_the_process_and_its_descendants():
    # The child says when its 64 MiB are allocated: polling for them gave up too soon on a loaded machine.
    child = subprocess.Popen([sys.executable, "-c", "import time; x = b'x' * (64 * 2**20); print('allocated', "
                              "flush=True); time.sleep(30)"], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "allocated\n"
        total, by_name, count = peer.tree_pss(os.getpid())
        alone, _, alone_count = peer.tree_pss(child.pid)
        assert alone >= 64 * 2**20 and total > alone
        assert sum(by_name.values()) == total
        assert alone_count == 1 and count >= 2
        assert peer.process_name(child.pid) == "python -c"
    finally:
        child.kill()
        child.wait()


def test_cpu_time_is_summed_over_the_process_and_the_children_it_waited_for():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert child.pid in peer.process_tree(os.getpid())
    finally:
        child.kill()
        child.wait()
    subprocess.run([sys.executable, "-c", "import time\nwhile time.process_time() < 0.3: pass"], check=True)
    mine = time.process_time()
    # /proc counts whole clock ticks (1/100 s on Linux) and rounds each of its four counters down.
    assert peer.tree_cpu_s(os.getpid()) >= mine + 0.3 - 4 / os.sysconf("SC_CLK_TCK")


def test_the_memory_watcher_keeps_the_highest_sample_and_its_own_cost_within_its_share(monkeypatch):
    """On a clock the test moves: a sample that costs 20 ms is taken only every 20 ms / WATCH_SHARE = 0.4 s, where
    sampling every SAMPLE_EVERY (0.1 s) would take a fifth of a core; one that costs 1 ms, every SAMPLE_EVERY."""
    clock = types.SimpleNamespace(now=0.0)
    monkeypatch.setattr(peer, "time", types.SimpleNamespace(monotonic=lambda: clock.now))
    sizes, taken = iter([3, 7, 5, 1] + [0] * 20), []

    def tree_pss(root: int) -> tuple[int, dict[str, int], int]:
        taken.append(clock.now)
        clock.now += cost
        size = next(sizes)
        return size, {"ray::TrainerActor": size}, 1

    monkeypatch.setattr(peer, "tree_pss", tree_pss)
    peak, cost = peer.PeakMemory(), 0.02
    while clock.now < 1.0:
        peak.sample(os.getpid())
        clock.now += 0.005
    assert taken == pytest.approx([0.0, 0.4, 0.8], abs=0.006)  # each one at the first poll it is due
    assert peak.spent_s == pytest.approx(3 * cost)
    assert (peak.total, peak.by_name, peak.processes) == (7, {"ray::TrainerActor": 7}, 1)
    taken.clear()
    cost = 0.001
    while clock.now < 2.0:
        peak.sample(os.getpid())
        clock.now += 0.005
    # the last 20 ms sample made the next due at 1.2 s; from then on, every SAMPLE_EVERY, at the first poll due
    # (polls come every 6 ms: 5 ms of sleep and the 1 ms sample): 8 samples before 2 s
    assert taken[0] == pytest.approx(1.2, abs=0.006) and len(taken) == 8
    assert all(0.1 - 1e-9 <= later - earlier <= 0.106 + 1e-9 for earlier, later in zip(taken, taken[1:]))


def test_the_medium_target_block_times_each_side_to_its_first_3_step_mean_at_the_target(monkeypatch):
    pytest.importorskip("transformers")
    monkeypatch.setattr(peer, "measured", lambda argv: "Measured")

    def run(series: list[list[float]], step_ms: float) -> dict:
        return {"exit": 0, "steps": len(series), "first_step_s": series[0][0], "series": series, "step_ms": step_ms,
                "step_cpu_s": 1.0, "peak_pss_gib": 1.0, "peak_processes": 1, "peak_by_process_mib": {"python": 1024},
                "generate_time_ms": 1.0}

    # TRL: the 3-step means are 0.57 at 30 s, then 0.8 at 40 s; fully_async: 0.8 at its third step, 16 s; sync never.
    saved = {"shape": "medium-target", "repeat": 1, "steps": 4, "vocabulary": 809, "seeded_rounds": True,
             "results": {"trl": [run([[10, 0.1], [20, 0.8], [30, 0.8], [40, 0.8]], 10_000)],
                         "sync": [run([[12, 0.1], [20, 0.1], [28, 0.1], [36, 0.1]], 8_000)],
                         "fully_async": [run([[6, 0.8], [11, 0.8], [16, 0.8]], 5_000)], "ray": []}}
    text = peer.render(peer.MEDIUM_TARGET, saved, 0.7)
    assert "(round r with seed r)" in text
    assert "| fully_async ≥ 2× faster than TRL to 0.7 | 0.40 | met |" in text  # 16 s / 40 s
    assert "| fasync sync ≥ 1.2× TRL's speed per step | 0.80 | met |" in text  # 8 s / 10 s
    assert "| sync | 0 | 0/1 | — |" in text and "| fully_async | 0 | 1/1 | 3 |" in text
    assert "| trl | 0 | 1/1 | 4 |" in text


@pytest.mark.parametrize("shape", [peer.MEDIUM, peer.MEDIUM_TARGET], ids=lambda shape: shape.name)
def test_both_sides_at_the_medium_shape_train_the_same_prompts_through_the_same_template(tmp_path, monkeypatch, shape):
    """Both medium shapes, the learnable task's warm start recorded instead of run (its training is the long tail's
    test's): it teaches each prompt both answers, and the throughput task has none."""
    pytest.importorskip("transformers")
    from fasync.bench import medium
    from fasync.model import build_tokenizer

    taught = []
    monkeypatch.setattr(medium, "fine_tune", lambda directory, examples, steps, **_: taught.append((examples, steps)))
    model = shape.write_files(tmp_path, 4)
    config, _ = shape.fasync_run(model)
    rows, reward = shape.trl_prompts(model, 0)
    settings = peer.trl_settings(shape, tmp_path, 4, 0)
    for mode in peer.MODES:
        loaded = load_config(config, peer.fasync_overrides(mode, model, 4, 0, shape))
        assert loaded.config is not None, [d.message for d in loaded.diagnostics]
        cfg = loaded.config
        found, crashed = run_rules(cfg)
        assert not crashed and not [rule.code for rule, _ in found if rule.severity.name == "ERROR"]
        assert cfg.mode == mode and cfg.model.path == str(model) and cfg.train.num_rollouts == 4
        assert (cfg.rollout.batch_size * cfg.rollout.n_samples_per_prompt, cfg.rollout.n_samples_per_prompt,
                cfg.rollout.max_new_tokens, cfg.train.lr, cfg.rollout.temperature) == (
            settings["per_device_train_batch_size"], settings["num_generations"], settings["max_completion_length"],
            settings["learning_rate"], settings["temperature"])
        assert cfg.train.global_batch_size == settings["per_device_train_batch_size"]
    assert reward.__name__ == cfg.reward.function.rsplit(":", 1)[1]
    fasync_rows = [json.loads(line) for line in Path(cfg.data.path).read_text().splitlines()]
    assert [row["label"] for row in rows] == [row["label"] for row in fasync_rows]
    if shape is peer.MEDIUM:
        assert taught == []
    else:
        [(examples, steps)] = taught
        assert steps == medium.CONTINUE.warm_start_steps
        assert len(examples) == 2 * len(fasync_rows)
        assert {(row["prompt"], row["label"]) for row in fasync_rows} < set(examples)  # and one other answer each
    assert [row["prompt"] for row in rows] == [[{"role": "user", "content": row["prompt"]}] for row in fasync_rows]

    from transformers import AutoTokenizer

    theirs = AutoTokenizer.from_pretrained(model)
    ours = build_tokenizer(cfg.model, cfg.data)
    for row in rows[:8]:
        assert theirs.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=True,
                                          return_dict=False) == ours.format_prompt(row["prompt"][0]["content"])


def test_the_peer_bench_without_trl_says_how_to_install_it():
    pytest.importorskip("torch")
    if importlib.util.find_spec("trl") is not None:
        pytest.skip("trl is installed here")
    result = subprocess.run([sys.executable, "bench/peer_trl.py", "--no-write"], cwd=REPO, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 2
    assert "make venv-peer" in result.stderr and "Traceback" not in result.stderr


def lint_clean_runs(config, scenario):
    """Each variant's run of `scenario` on `config`, as the bench trains it: (variant, its config), every one loaded
    and free of lint errors."""
    from fasync.bench.modes import COMMON, variant_overrides

    for variant in scenario.variants:
        loaded = load_config(config, [*COMMON, *variant_overrides(scenario, variant, vllm_long_tail.EXAMPLES)])
        assert loaded.config is not None, [d.message for d in loaded.diagnostics]
        found, crashed = run_rules(loaded.config)
        assert not crashed and not [rule.code for rule, _ in found if rule.severity.name == "ERROR"]
        yield variant, loaded.config


def test_the_vllm_long_tail_runs_are_configs_without_lint_errors_and_fully_async_streams(tmp_path):
    pytest.importorskip("transformers")
    bench = vllm_long_tail
    dataset = bench.LONG_TAIL.write_dataset(tmp_path / "long-tail.jsonl")
    config = bench.base_config(tmp_path / "base.yaml", bench.write_model(tmp_path / "model"), dataset, 10, 1e-3)
    scenario = bench.scenario(dataset, 10)
    lags: dict[int, set[str]] = {}
    for variant, cfg in lint_clean_runs(config, scenario):
        assert cfg.mode == variant.mode and cfg.rollout.engine == "vllm"
        assert derive(cfg).streams_requests == (variant.mode == "fully_async")
        assert derive(cfg).keeps_kv_at_sync == ("kept KV" in variant.label)
        assert cfg.train.target_reward is None  # every run trains all its rollouts
        bound = re.search(r"bound (\d+)", variant.label)
        if bound:  # the label says the bound the run has
            assert cfg.async_.max_weight_staleness == int(bound.group(1))
        every_other = "a sync every 2 drains" in variant.label
        assert cfg.async_.update_weights_interval == (2 if every_other else 1)
        if every_other:
            lags.setdefault(derive(cfg).max_lag.steps, set()).add(cfg.mode)
        wide = f"{bench.WIDE_IN_FLIGHT} in flight" in variant.label
        assert derive(cfg).max_concurrent_samples == (bench.WIDE_IN_FLIGHT if wide else 64)
    assert any("kept KV" in variant.label for variant in scenario.variants)
    # async and streamed fully_async compared at the same worst lag: (b + 1) × 2 − 1 steps for bounds 1 and 2
    assert lags == {3: {"async", "fully_async"}, 5: {"async", "fully_async"}}


def test_the_vllm_medium_runs_are_configs_without_lint_errors_and_differ_in_what_a_sync_does(tmp_path):
    from fasync.bench import medium

    pytest.importorskip("transformers")
    config = medium.write_files(tmp_path, 3).config
    modes = {}
    for variant, cfg in lint_clean_runs(config, vllm_long_tail.medium_scenario(3)):
        assert cfg.rollout.engine == "vllm" and cfg.train.target_reward is None
        modes[variant.label] = (cfg.mode, derive(cfg).streams_requests, derive(cfg).keeps_kv_at_sync)
    assert sorted(modes.values()) == [("async", False, False), ("fully_async", True, False),
                                      ("fully_async", True, True)]


def test_the_vllm_interruptions_table_counts_resumed_groups_and_pauses_per_drain(tmp_path):
    from fasync.bench.modes import ScenarioResult

    scenario = vllm_long_tail.medium_scenario(2)
    run_dirs = {}
    for index, variant in enumerate(scenario.variants):
        run = tmp_path / str(index)
        run.mkdir()
        rows = [{"step": drain, "rollout": drain, "wall_time": drain, "resumed_groups": 3 * drain, "rollouter_pause_s": 0.05}
                for drain in range(4)]  # a running total of resumed groups: 9 after the 4th drain
        (run / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
        run_dirs[variant.label] = [run]
    text = vllm_long_tail.interruptions(ScenarioResult(scenario, 0.5, [], run_dirs))
    assert "| async | — | — |" in text
    assert "| fully_async (partial rollout, kept KV, streamed) | 2.25 | 50.0 |" in text  # 9 / 4; 4 × 50 ms / 4


def test_the_vllm_long_tail_warm_start_trains_the_answers_and_the_bench_checks_where_they_end(tmp_path):
    """The warm start trains the model on the answers and saves it. Whether its 301 steps teach the model to end a
    short answer where the data does (what makes the runs' lengths follow the data), the bench checks on every
    run, before it measures (`answer_lengths`), so that this test need not train for that minute: here, that a
    random model fails the check."""
    pytest.importorskip("transformers")
    import torch
    import transformers

    bench = vllm_long_tail
    dataset = bench.LONG_TAIL.write_dataset(tmp_path / "long-tail.jsonl")
    model = bench.write_model(tmp_path / "model")
    before = transformers.LlamaForCausalLM.from_pretrained(model).state_dict()
    assert set(bench.answer_lengths(model, dataset, bench.LONG_TAIL.short)) != {bench.LONG_TAIL.short}
    losses = bench.warm_start(model, dataset, 3)
    assert len(losses) == 1 and losses[0] > 0
    after = transformers.LlamaForCausalLM.from_pretrained(model).state_dict()
    assert any(not torch.equal(before[name], after[name]) for name in before)


def test_the_vllm_step_cost_line_splits_a_step_into_its_fixed_and_per_request_parts():
    line = vllm_long_tail.step_cost_line({1: 1.55, 8: 1.9, 64: 4.7})
    assert "1.55 ms at 1 requests" in line and "4.70 ms at 64 requests" in line
    assert "1.50 ms per step and 0.050 ms per request" in line  # (4.7 − 1.55) / 63 = 0.05; 1.55 − 0.05


def test_the_startup_bench_compares_the_checkouts_and_shows_a_killed_run(monkeypatch):
    startup = script("startup")
    monkeypatch.setattr(startup, "measured", lambda argv: "Measured")

    def run(first: float, peak: float, exit_code: int = 0) -> dict:
        return {"exit": exit_code, "first_step_s": first, "before_metrics_s": first / 2, "peak_pss_gib": peak,
                "peak_processes": 11, "peak_by_process_mib": {"ray::TrainerActor": 380}, "ray_init_s": 3.0}

    data = {"data_s": 1.0, "loaded": [], "imports": {"typer": 0.1}}
    results = {"runs": {"before": {"ray": [run(0, 0.4)], "sync": [run(10.0, 1.2), run(12.0, 1.2, -9)]},
                        "after": {"ray": [run(0, 0.4)], "sync": [run(5.0, 0.9), run(6.0, 0.9)]}},
               "data": {"before": [data], "after": [data]}}
    text = startup.render(results, 2, 10, "main")
    before, after = (next(line for line in text.splitlines() if line.startswith(f"| sync | {name} "))
                     for name in ("before", "after"))
    assert before.split(" | ")[2] == "-9" and after.split(" | ")[2] == "0"
    assert after.split(" | ")[4] == "0.50" and after.split(" | ")[8] == "0.75"  # 5.5 / 11 s, 0.9 / 1.2 GiB


def test_the_vllm_rounds_table_pairs_each_run_with_the_references_run_of_its_round(tmp_path):
    from fasync.bench.modes import Scenario, ScenarioResult, Variant
    from fasync.metrics.measure import ModeReport

    variants = (Variant("async", "async"), Variant("fully_async, a sync every 2 drains", "fully_async"))
    scenario = Scenario("vllm-long-tail", "", variants, reference="async")
    bound = "async:\n  max_weight_staleness: 1\n"
    settings = {"async": bound, "fully_async, a sync every 2 drains": bound + "  update_weights_interval: 2\n"}
    run_dirs, reports = {}, []
    for variant, rates in zip(variants, ([400.0, 300.0], [500.0, 450.0])):
        run_dirs[variant.label] = []
        for round_ in range(2):
            run = tmp_path / f"{variant.mode}-{round_}"
            run.mkdir()
            (run / "config.yaml").write_text(f"mode: {variant.mode}\n{settings[variant.label]}")
            lags = [1, 3] if variant.mode == "fully_async" else [0, 1]
            rows = [{"step": step, "rollout": step, "wall_time": step, "policy_lag_max": lag}
                    for step, lag in enumerate(lags)]
            (run / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
            run_dirs[variant.label].append(run)
        reports.append(ModeReport(mode=variant.mode, exit_code=0, rollouts=2, samples_per_s=rates[0],
                                  time_to_target_s=None, staleness_mean=0.0, staleness_max=0, stale_dropped=0.0,
                                  trainer_idle=0.0, rollouter_idle=0.0, generate_s=0.0, train_s=0.0,
                                  train_call_s=0.0, weight_sync_s=0.0, window_s=0.0, runs_samples_per_s=rates))
    text = vllm_long_tail.rounds(ScenarioResult(scenario, 0.5, reports, run_dirs))
    assert "| async | 1 | 1 | 400 (1.00×) | 300 (1.00×) |" in text
    # (1 + 1) × 2 × 1 − 1 = 3 optimizer steps; each round's rate over async's of the same round, not the median's
    assert "| fully_async, a sync every 2 drains | 3 | 3 | 500 (1.25×) | 450 (1.50×) |" in text
