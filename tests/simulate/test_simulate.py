"""`fasync simulate`: exact timelines of the simulated drivers, the rules they keep, calibration and the CLI."""

import itertools
import json
import time
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from paths import REPO
from typer.testing import CliRunner

from fasync.cli import app
from fasync.commands.simulate import pareto_front
from fasync.config.derived import derive
from fasync.config.loader import load_config
from fasync.simulate.calibrate import calibrate
from fasync.simulate.costs import Costs, weight_bytes
from fasync.simulate.drivers import Simulation
from fasync.simulate.lengths import build_lengths
from fasync.simulate.predict import simulate
from fasync.simulate.state import Group, finish_call, plan_call

runner = CliRunner()
QUICKSTART = REPO / "configs" / "quickstart.yaml"

# One decode step is a second and nothing else costs anything, unless a test says so: every time below is
# countable by hand.
STEPS_ONLY = Costs(engine_call=0.0, engine_prefill_token=0.0, engine_step=1.0, engine_row=0.0, trainer_call=0.0,
                   trainer_step=2.0, trainer_micro_batch=0.0, trainer_token=0.0, weight_sync=0.5,
                   source="test")


def config(tmp_path: Path, *overrides: str):
    """Two prompts of one sample each per rollout, every completion 4 tokens long, one engine."""
    base = tmp_path / "base.yaml"
    base.write_text(yaml.safe_dump({
        "rollout": {"batch_size": 2, "n_samples_per_prompt": 1, "max_new_tokens": 8},
        "train": {"global_batch_size": 2, "micro_batch_size": 2, "num_rollouts": 4},
        "simulate": {"lengths": [4]},
    }))
    loaded = load_config(base, list(overrides))
    assert loaded.config is not None, loaded.diagnostics
    return loaded.config


def run(cfg, costs: Costs = STEPS_ONLY):
    sim = Simulation(cfg, derive(cfg), costs, build_lengths(cfg), weight_bytes(cfg, 16))
    return sim.run(), sim


def record_times(recorder) -> list[float]:
    return [round(time, 6) for time, _, _ in recorder.records]


def test_sync_timeline(tmp_path):
    # Each rollout: generate (4 steps), train (one 2 s step), wait for the 0.5 s weight sync.
    recorder, _ = run(config(tmp_path, "mode=sync"))
    assert record_times(recorder) == [6.5, 13.0, 19.5, 26.0]
    assert recorder.generate_s == [4.0] * 4
    assert recorder.trainer_busy == [(4.0, 6.0), (10.5, 12.5), (17.0, 19.0), (23.5, 25.5)]
    assert dict(recorder.staleness) == {0: 8}


def test_async_timeline(tmp_path):
    # Rollout 1 generates with version 0 while rollout 0 trains. The push after each train call queues on
    # the engine behind the generation in progress, so from rollout 2 on each rollout waits for a 0.5 s load.
    recorder, _ = run(config(tmp_path, "mode=async", "async.max_weight_staleness=1"))
    assert record_times(recorder) == [6.0, 10.0, 14.5, 19.0]
    assert recorder.engine_busy[0] == [(0.0, 4.0), (4.0, 8.0), (8.5, 12.5), (13.0, 17.0)]
    assert dict(recorder.staleness) == {0: 2, 1: 6}


def test_fully_async_timeline_waits_for_calls_without_partial_rollout(tmp_path):
    # A sync issued at the end of a train call waits for the engine's call in flight, then loads (0.5 s).
    recorder, _ = run(config(tmp_path, "mode=fully_async", "async.max_weight_staleness=1"))
    assert record_times(recorder) == [6.0, 10.0, 14.5, 19.0]
    assert recorder.engine_busy[0] == [(0.0, 4.0), (4.0, 8.0), (8.5, 12.5), (13.0, 17.0)]
    assert dict(recorder.staleness) == {0: 2, 1: 6}


def test_fully_async_timeline_aborts_and_resumes_with_partial_rollout(tmp_path):
    # The sync at t=6 aborts the call started at 4 after its second step; the load takes until 6.5 and the two
    # groups resume from their prefix for their last 2 tokens, done at 8.5: drain 1 trains 8.5-10.5, and so on.
    recorder, _ = run(config(tmp_path, "mode=fully_async", "async.max_weight_staleness=1",
                             "async.partial_rollout=true"))
    assert record_times(recorder) == [6.0, 10.5, 15.0, 19.5]
    assert recorder.engine_busy[0][:4] == [(0.0, 4.0), (4.0, 6.0), (6.5, 8.5), (8.5, 10.5)]
    assert recorder.resumed_groups >= 4
    assert dict(recorder.staleness) == {0: 2, 1: 6}


def test_sliced_calls_finish_their_slice_at_a_sync(tmp_path):
    # Two-token slices: a call never runs past 2 s, and a sync waits for the slice instead of aborting it.
    recorder, _ = run(config(tmp_path, "mode=fully_async", "async.max_weight_staleness=1",
                             "async.partial_rollout=true", "async.tokens_per_call=2"))
    calls = recorder.engine_busy[0]
    assert all(round(end - start, 6) == 2.0 for start, end in calls)
    assert all(later[0] >= earlier[1] for earlier, later in zip(calls, calls[1:]))


def test_the_recompute_anchor_costs_a_forward_pass_for_every_step_after_the_first():
    # As the trainer does: the first step's anchor is its own forward (the weights have not moved yet), so a
    # one-step call pays nothing for it, and each later step a third of its forward and backward.
    costs = Costs(trainer_call=1.0, trainer_step=2.0, trainer_micro_batch=3.0, trainer_token=0.0)
    one_batch = [[(10, 4)]]  # one micro batch: 4 samples of length 10, micro batch size 4
    assert costs.optimizer_steps(one_batch, 4, 1) == 2.0 + 3.0
    assert costs.train_call(one_batch, 4, 1, recompute=True) == costs.train_call(one_batch, 4, 1, recompute=False) == 6.0
    assert costs.train_call(one_batch * 3, 4, 1, recompute=True) == pytest.approx(1.0 + 3 * 5.0 + 2 * 3.0 / 3)


@pytest.mark.parametrize("mode,records,staleness,lag", [
    # sync: each rollout generates (4 s), trains two passes of one 2 s step and waits for the 0.5 s sync; the
    # second pass trains on samples one step old: lag N × E − 1 = 1.
    ("sync", [8.5, 17.0, 25.5, 34.0], {0: 16}, {0: 8, 1: 8}),
    # async and fully_async at a bound of 1: the 4 s train call keeps pace with the 4 s generation; the
    # samples one version old reach the bound's (s + 1) × N × E − 1 = 3 steps in their second pass.
    ("async", [8.0, 12.0, 16.5, 21.0], {0: 4, 1: 12}, {0: 2, 1: 2, 2: 6, 3: 6}),
    ("fully_async", [8.0, 12.0, 16.5, 21.0], {0: 4, 1: 12}, {0: 2, 1: 2, 2: 6, 3: 6}),
])
def test_each_ppo_epoch_is_another_pass_of_optimizer_steps(tmp_path, mode, records, staleness, lag):
    bound = [] if mode == "sync" else ["async.max_weight_staleness=1"]
    one, _ = run(config(tmp_path, f"mode={mode}", "train.ppo_epochs=1", *bound))
    cfg = config(tmp_path, f"mode={mode}", "train.ppo_epochs=2", *bound)
    two, _ = run(cfg)
    assert one.train_calls == [(2.0, 2.0)] * 4
    assert two.train_calls == [(4.0, 4.0)] * 4
    assert record_times(two) == records
    # Every pass trains each sample (and the step records count it) once more, a step later.
    assert dict(two.staleness) == staleness
    assert dict(two.lag_steps) == lag
    assert max(lag) == derive(cfg).max_lag.steps


def test_ppo_epochs_double_the_optimizer_steps_time_at_the_default_costs():
    # The optimizer steps' time (`train_time_s`) is exactly twice: the same steps again, so every term of
    # the cost doubles (a float times 2 is exact). The samples trained, and so the ledger, stay as they were.
    runs = {}
    for epochs in (1, 2):
        cfg = load_config(QUICKSTART, ["mode=sync", f"train.ppo_epochs={epochs}", "train.num_rollouts=3"]).config
        runs[epochs] = run(cfg, Costs())
    (one, one_sim), (two, two_sim) = runs[1], runs[2]
    assert [steps for _, steps in two.train_calls] == [2 * steps for _, steps in one.train_calls]
    assert [(samples, 2 * steps) for _, samples, steps in one.records] == [(samples, steps) for _, samples, steps
                                                                           in two.records]
    assert two_sim.ledger.as_dict() == one_sim.ledger.as_dict()
    assert two_sim.ledger.balanced


def test_a_weight_sync_costs_its_bytes_over_the_bandwidth(tmp_path):
    # The embedded model's parameters at 4 bytes: a bandwidth that moves them in 1 s makes each sync 0.5 + 1 s,
    # so a sync rollout takes 4 + 2 + 1.5 s.
    cfg = config(tmp_path, "mode=sync")
    size = weight_bytes(cfg, 16)
    model = cfg.model
    assert size == 4 * (model.n_layers * 12 * model.d_model ** 2 + (16 + model.max_seq_len) * model.d_model)
    cfg = config(tmp_path, "mode=sync", f"simulate.costs.weight_sync_gb_per_s={size / 1e9}")
    costs = Costs.from_config(cfg.simulate.costs, STEPS_ONLY)
    assert costs.sync(size) == pytest.approx(1.5)
    recorder, _ = run(cfg, costs)
    assert record_times(recorder) == [7.5, 15.0, 22.5, 30.0]
    # A Hugging Face model's size from its config.json (attention and a gated MLP per layer, untied
    # embeddings), in its dtype: 2 × (2 × (4 × 64² + 3 × 64 × 128) + 2 × 100 × 64) bytes.
    directory = tmp_path / "hf"
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(
        {"hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 128, "vocab_size": 100}))
    cfg = load_config(QUICKSTART, [f"model.path={directory}", "model.dtype=bfloat16"]).config
    assert weight_bytes(cfg, 16) == 2 * (2 * (4 * 64 * 64 + 3 * 64 * 128) + 2 * 100 * 64)


def test_lengths_from_a_run_are_drawn_from_its_step_means():
    cfg = load_config(QUICKSTART, ["simulate.lengths=run", "rollout.max_new_tokens=24"]).config
    lengths = build_lengths(cfg, [5.6, 2.2, 9.0])
    assert lengths.values == [6, 2, 9]
    drawn = {length for _ in range(50) for length in lengths.group(0)[1]}
    assert drawn == {6, 2, 9}


def test_static_batch_counts_finished_rows_and_continuous_does_not():
    # Rows of 2 and 6 tokens from a 3-token prompt: 6 decode steps either way; the static batch computes both
    # rows in all 6 (12 row-steps), continuous batching 2 + 6 = 8. The static batch (the torch engine) prefills
    # the group's prompt once for both rows, 3 tokens; continuous batching (vLLM) 2 × 3.
    costs = replace(STEPS_ONLY, engine_prefill_token=0.5, engine_row=0.25)
    for static, row_steps, prefill in ((True, 12, 3), (False, 8, 6)):
        call = plan_call([Group(0, 3, [2, 6])], None, 0, 0, 0, 0.0, costs, static)
        assert (call.steps, call.row_steps, call.prefill_tokens) == (6, row_steps, prefill)
        assert call.duration == prefill * 0.5 + 6 * 1.0 + row_steps * 0.25
    # A 4-token slice, then the rest: the cached row sends only its newest token through the model.
    group = Group(0, 3, [2, 6])
    first = plan_call([group], 4, 0, 0, 0, 0.0, costs, True)
    finish_call(first, None, 0, 0)
    assert (group.progress, group.finished, group.oldest_version) == (4, False, 0)
    second = plan_call([group], 4, 1, 0, 0, 0.0, costs, True)
    assert (second.rows, second.steps, second.prefill_tokens) == (1, 2, 1)
    finish_call(second, None, 0, 0)
    assert (group.finished, group.oldest_version, group.newest_version) == (True, 0, 1)


VARIANTS = list(itertools.product(
    ["async", "fully_async"],
    [0, 1, 2],
    [(), ("async.partial_rollout=true",), ("async.partial_rollout=true", "async.tokens_per_call=3")],
    [("simulate.lengths={median: 6, sigma: 1.2}",), ("simulate.lengths=[2, 2, 2, 24]", "simulate.per=prompt")],
    [("resources.num_rollout_engines=1",), ("resources.num_rollout_engines=3", "async.update_weights_interval=2",
                                           "async.stale_policy=regenerate"),
     ("resources.num_rollout_engines=2", "async.stale_policy=wait")],
))


@pytest.mark.parametrize("mode,bound,partial,lengths,engines", VARIANTS[::4])  # every value of each axis
def test_staleness_stays_within_the_bound_and_the_ledger_balances(mode, bound, partial, lengths, engines):
    cfg = load_config(QUICKSTART, [f"mode={mode}", f"async.max_weight_staleness={bound}", *partial, *lengths,
                                   *engines, "rollout.max_new_tokens=24", "train.num_rollouts=40",
                                   "rollout.batch_size=8", "train.global_batch_size=64",
                                   "train.micro_batch_size=32"]).config
    prediction = simulate(cfg, Costs(), build_lengths(cfg))
    assert prediction.rollouts == 40
    assert prediction.staleness_max <= bound
    assert prediction.lag_max_steps <= derive(cfg).max_lag.steps
    ledger = prediction.ledger
    assert prediction.ledger_balanced
    assert ledger["produced"] == (ledger["consumed"] + sum(ledger["dropped"].values()) + ledger["queued"]
                                  + ledger["in_flight"])
    assert ledger["consumed"] == 40 * 64


@pytest.mark.parametrize("tokens_per_call,long_dropped", [(4, True), (12, False)])
def test_short_slices_drop_long_completions_as_stale(tokens_per_call, long_dropped):
    # Generation-bound (slow decode rows): ⌈24 / 4⌉ = 6 calls outlive a bound of 1 and the long groups go
    # stale while the short ones do not (S008); two calls of 12 tokens fit.
    slow_rows = replace(Costs(), engine_row=Costs().engine_row * 8)
    cfg = load_config(QUICKSTART, ["mode=fully_async", "async.max_weight_staleness=1", "async.partial_rollout=true",
                                   f"async.tokens_per_call={tokens_per_call}", "rollout.max_new_tokens=24",
                                   "simulate.lengths=[3, 3, 3, 3, 3, 3, 3, 3, 24]", "simulate.per=prompt",
                                   "train.num_rollouts=60"]).config
    by_length = simulate(cfg, slow_rows, build_lengths(cfg)).stale_dropped_by_length
    assert by_length["1-6"] == 0.0
    assert (by_length["19-24"] > 0.5) is long_dropped


def test_under_stale_policy_wait_the_drains_wait_for_the_long_completions_instead():
    """The first case above (6 calls of 4 tokens outlive a bound of 1) under `async.stale_policy: wait`: nothing is
    dropped, and the run takes longer, its trainer waiting for the long groups."""
    slow_rows = replace(Costs(), engine_row=Costs().engine_row * 8)
    overrides = ["mode=fully_async", "async.max_weight_staleness=1", "async.partial_rollout=true",
                 "async.tokens_per_call=4", "rollout.max_new_tokens=24", "simulate.lengths=[3, 3, 3, 3, 3, 3, 3, 3, 24]",
                 "simulate.per=prompt", "train.num_rollouts=60"]
    drop, wait = (simulate(cfg, slow_rows, build_lengths(cfg)) for cfg in (
        load_config(QUICKSTART, overrides).config, load_config(QUICKSTART, [*overrides, "async.stale_policy=wait"]).config))
    assert drop.ledger["dropped"].get("stale", 0) > 0
    assert wait.ledger["dropped"].get("stale", 0) == 0 and wait.staleness_max <= 1 and wait.ledger_balanced
    assert wait.rollouts == 60


def test_pareto_front():
    assert pareto_front([(10, 1.0), (12, 2.0), (9, 2.0), (12, 1.0)]) == [False, False, False, True]
    assert pareto_front([(10, 0.0), (20, 1.0)]) == [True, True]


def write_run(run_dir: Path, cfg_path: Path, overrides: list[str], costs: Costs,
              mean_lengths: list[float] | None = None) -> None:
    """A synthetic run directory: what `fasync train` writes, with phase times from a simulation (and each
    rollout's mean completion length from `mean_lengths`, else 6)."""
    loaded = load_config(cfg_path, overrides)
    cfg = loaded.config
    recorder, _ = run(cfg, costs)
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(loaded.raw, sort_keys=False))
    generate_s = recorder.generate_s
    if cfg.mode == "fully_async":
        # Engine time in the calls that ended since the previous drain's record, as the rollouter reports it.
        ends = [0.0] + [at for at, _, _ in recorder.records]
        generate_s = [sum(end - start for busy in recorder.engine_busy for start, end in busy if low < end <= high)
                      for low, high in zip(ends, ends[1:])]
    lines = []
    for rollout, ((at, samples, _), generate, (call, steps)) in enumerate(
            zip(recorder.records, generate_s, recorder.train_calls)):
        lines.append(json.dumps({"step": rollout, "rollout": rollout, "generate_time_s": generate,
                                 "train_time_s": steps, "train_call_time_s": call, "num_samples": samples,
                                 "weight_sync_time_s": recorder.sync_held_s[rollout] if recorder.sync_held_s else 0,
                                 "response_length_mean": mean_lengths[rollout] if mean_lengths else 6.0,
                                 "wall_time": at}))
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")


def test_calibration_round_trip(tmp_path):
    truth = Costs()
    truth = replace(truth, **{name: getattr(truth, name) * 3 for name in
                              ("engine_call", "engine_prefill_token", "engine_step", "engine_row")},
                    **{name: getattr(truth, name) * 0.5 for name in
                       ("trainer_step", "trainer_micro_batch", "trainer_token")},
                    trainer_call=0.05, weight_sync=0.02)
    write_run(tmp_path / "run", QUICKSTART, ["train.num_rollouts=20"], truth)
    fitted = calibrate([tmp_path / "run"]).costs
    for name, value in truth.as_dict().items():
        if name != "source":
            assert getattr(fitted, name) == pytest.approx(value, rel=1e-6), name


def test_calibration_tells_the_call_cost_from_runs_of_two_shapes(tmp_path):
    # A sync run makes one call per rollout; a fully_async run with 2-token slices many short ones. Together they
    # fix a call's own cost, which the sync run alone leaves at its default share of the generation.
    truth = Costs()
    truth = replace(truth, engine_call=truth.engine_call * 8,
                    **{name: getattr(truth, name) * 2 for name in ("engine_prefill_token", "engine_step", "engine_row")})
    write_run(tmp_path / "sync", QUICKSTART, ["train.num_rollouts=20"], truth)
    write_run(tmp_path / "sliced", QUICKSTART, ["mode=fully_async", "async.partial_rollout=true",
                                                "async.tokens_per_call=2", "train.num_rollouts=30"], truth)
    alone = calibrate([tmp_path / "sync"]).costs
    assert alone.engine_call < truth.engine_call / 2
    both = calibrate([tmp_path / "sync", tmp_path / "sliced"]).costs
    for name in ("engine_call", "engine_prefill_token", "engine_step", "engine_row"):
        assert getattr(both, name) == pytest.approx(getattr(truth, name), rel=0.1), name


def test_calibration_replays_a_run_still_learning_to_stop_at_its_own_lengths(tmp_path):
    # The run's policy ran its completions to the 24-token limit at first (a share falling over 10 steps),
    # which its mean lengths record; the replay generates as much, so the fitted costs are the true ones.
    truth = Costs()
    truth = replace(truth, **{name: getattr(truth, name) * 3 for name in
                              ("engine_call", "engine_prefill_token", "engine_step", "engine_row")},
                    **{name: getattr(truth, name) * 2 for name in ("trainer_step", "trainer_micro_batch", "trainer_token")})
    overrides = ["train.num_rollouts=20", "rollout.max_new_tokens=24", "simulate.lengths=[3]",
                 "simulate.learning={steps: 10}"]
    shares = [1 - step / 10 for step in range(10)] + [0.0] * 10
    write_run(tmp_path / "run", QUICKSTART, overrides, truth, [24 * share + 3 * (1 - share) for share in shares])
    # A real run's config says nothing of how it learned: only its metrics do.
    written = tmp_path / "run" / "config.yaml"
    raw = yaml.safe_load(written.read_text())
    del raw["simulate"]["learning"]
    written.write_text(yaml.safe_dump(raw, sort_keys=False))
    fitted = calibrate([tmp_path / "run"]).costs
    for name in ("engine_call", "engine_step", "engine_row", "trainer_token", "trainer_step"):
        assert getattr(fitted, name) == pytest.approx(getattr(truth, name), rel=1e-6), name


def test_cli_text_json_and_sweep(tmp_path):
    result = runner.invoke(app, ["simulate", str(QUICKSTART), "train.num_rollouts=30"])
    assert result.exit_code == 0, result.output
    for mode in ("sync", "async", "fully_async"):
        assert f"\n{mode} " in result.output
    result = runner.invoke(app, ["simulate", str(QUICKSTART), "train.num_rollouts=30", "--format", "json",
                                 "--sweep", "async.max_weight_staleness=0,1,2", "--sweep", "mode=async,fully_async"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert len(report["variants"]) == 6
    assert report["sweep_keys"] == ["async.max_weight_staleness", "mode"]
    assert any(v["pareto"] for v in report["variants"])
    assert all(v["staleness_max"] <= int(v["settings"]["async.max_weight_staleness"]) for v in report["variants"])


def test_cli_calibrate(tmp_path):
    write_run(tmp_path / "run", QUICKSTART, ["train.num_rollouts=10"], Costs())
    result = runner.invoke(app, ["simulate", str(QUICKSTART), "train.num_rollouts=10", "--calibrate",
                                 str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    assert f"calibrated from {tmp_path / 'run'}" in result.output


def test_a_model_that_is_not_on_this_machine_can_be_planned(tmp_path):
    # A planning config names the cluster's model directory; the simulation needs no weights, and counts the
    # prompts in characters instead of failing.
    config = REPO / "configs" / "simulate" / "7b-8gpu.yaml"
    result = runner.invoke(app, ["simulate", str(config), f"model.path={tmp_path / 'not-here'}",
                                 "train.num_rollouts=5"])
    assert result.exit_code == 0, result.output
    assert "prompts counted in characters" in result.output


@pytest.mark.parametrize("args,message", [
    (["--sweep", "async.max_weight_staleness"], "write KEY=V1,V2"),
    (["--sweep", "async.max_weight_stalenes=1,2"], "max_weight_stalenes"),
    (["--calibrate", "/nonexistent/run"], "no config.yaml"),
    (["simulate.lengths=run"], "--calibrate"),
    (["simulate.learning=run"], "--calibrate"),
    (["simulate.learning=run", "simulate.lengths=run"], "use data, a list"),
    (["simulate.learning={steps: 0}"], "simulate.learning"),
])
def test_cli_bad_input_is_a_message(args, message):
    result = runner.invoke(app, ["simulate", str(QUICKSTART), *args])
    assert result.exit_code == 2
    assert message in result.output
    assert "Traceback" not in result.output


class Scripted:
    """Completion lengths in a given order, one prompt group at a time (a 3-token prompt each)."""

    answers = None

    def __init__(self, lengths: list[int], then: int):
        self.lengths, self.then = list(lengths), then

    def group(self, policy_steps: int) -> tuple[int, list[int]]:
        return 3, [self.lengths.pop(0) if self.lengths else self.then]


def test_fully_async_without_partial_rollout_locks_two_versions_behind(tmp_path):
    # Generation (4 s a call) bounds the run; a bound of 2. Drain 1's call is short (1 s), so the sync after
    # drain 0 (sent at 6) finds drain 2's call already running under version 0 and loads only after it, at
    # 9-9.5; the trainer, done with drain 1 at 8, waits for that load before it sends the next sync. The
    # driver hears of the load's end through a round trip, and by then the engine loop, inside the rollouter,
    # has started drain 3's call under version 1 (9.5-13.5): the next sync loads after it, and so on. From
    # drain 2 on every drain trains on groups two versions old, as the real driver does (docs/simulate.md).
    cfg = config(tmp_path, "mode=fully_async", "async.max_weight_staleness=2", "train.num_rollouts=5")
    sim = Simulation(cfg, derive(cfg), STEPS_ONLY, Scripted([4, 4, 1, 1], then=4), weight_bytes(cfg, 16))
    recorder = sim.run()
    assert recorder.engine_busy[0] == [(0.0, 4.0), (4.0, 5.0), (5.0, 9.0), (9.5, 13.5), (14.0, 18.0), (18.5, 22.5)]
    assert recorder.trainer_busy == [(4.0, 6.0), (6.0, 8.0), (9.5, 11.5), (14.0, 16.0), (18.5, 20.5)]
    assert record_times(recorder) == [6.0, 9.5, 14.0, 18.5, 23.0]
    assert dict(recorder.staleness) == {0: 2, 1: 2, 2: 6}


def learning_config(*overrides: str):
    return load_config(QUICKSTART, ["rollout.max_new_tokens=24", "simulate.lengths=[3]", *overrides]).config


def test_a_learning_phase_runs_early_completions_to_the_limit():
    # `{steps: 4}`: shares 1, 0.75, 0.5, 0.25 at the limit for weights after 0-3 optimizer steps, none after.
    lengths = build_lengths(learning_config("simulate.learning={steps: 4}"))
    assert lengths.full_shares == [1.0, 0.75, 0.5, 0.25, 0.0]
    assert all(lengths.group(0)[1] == [24] * 8 for _ in range(20))
    assert all(lengths.group(steps)[1] == [3] * 8 for steps in (4, 100) for _ in range(20))
    drawn = [length for _ in range(400) for length in lengths.group(2)[1]]
    # 3,200 seeded draws at probability 0.5: a standard deviation of 0.009, so 0.05 is over 5 of them.
    assert drawn.count(24) / len(drawn) == pytest.approx(0.5, abs=0.05)
    # In a sync run (one optimizer step per rollout) the first rollout, from the initial weights, is all at
    # the limit, and the rollouts from step 4 on are all learned.
    for rollouts, at_limit in ((1, 256), (12, 256 * (1 + 0.75 + 0.5 + 0.25))):
        cfg = learning_config("simulate.learning={steps: 4}", f"train.num_rollouts={rollouts}")
        recorder, _ = run(cfg, Costs())
        assert sum(recorder.taken.values()) == 256 * rollouts
        assert recorder.taken[3] == pytest.approx(at_limit, rel=0.1)  # 19-24 tokens
        assert recorder.taken[3] + recorder.taken[0] == 256 * rollouts


def test_the_learning_phase_of_a_run_is_read_from_its_mean_lengths():
    # Learned lengths average 3 tokens and the limit is 24: a step of mean length 24 had all its completions at
    # the limit, one of 13.5 half of them, one of 3 (or less) none; past the run's last step its last share holds.
    lengths = build_lengths(learning_config("simulate.learning=run"), [24.0, 13.5, 3.0, 2.0])
    assert lengths.full_shares == [1.0, 0.5, 0.0, 0.0]
    assert lengths.full_share(10) == 0.0
    assert build_lengths(learning_config("simulate.learning=run"), [24.0, 13.5]).full_share(10) == 0.5


def test_slices_drop_answers_that_the_learned_policy_keeps_short_while_it_learns():
    # Four-token slices under a bound of 1 with slow decode rows drop the long answers (see
    # `test_short_slices_drop_long_completions_as_stale`) and never the 3-token ones: one slice. A policy still
    # learning to stop runs some of those to 24 tokens too, in six slices, and loses some of them as well.
    slow_rows = replace(Costs(), engine_row=Costs().engine_row * 8)
    short_dropped = []
    for learning in ("null", "{steps: 30}"):
        cfg = load_config(QUICKSTART, ["mode=fully_async", "async.max_weight_staleness=1", "async.partial_rollout=true",
                                       "async.tokens_per_call=4", "rollout.max_new_tokens=24",
                                       "simulate.lengths=[3, 3, 3, 3, 3, 3, 3, 3, 3, 24]", "simulate.per=prompt",
                                       f"simulate.learning={learning}", "train.micro_batch_size=32",
                                       "train.num_rollouts=100"]).config
        short_dropped.append(simulate(cfg, slow_rows, build_lengths(cfg)).stale_dropped_by_length["1-6"])
    assert short_dropped[0] == 0.0
    assert short_dropped[1] > 0.0


@pytest.mark.ray
def test_fully_async_without_partial_rollout_staleness_as_the_real_driver(ray_session, tmp_path, monkeypatch):
    # The real driver and rollouter on the shared Ray session, against the simulation of the same config. Every
    # generate call sleeps 0.3 s, so generation bounds the run, and the first train call 2 s more (a trainer's
    # warm-up, with room for a loaded machine), so that the rollouter runs to the bound at version 0 first:
    # drains 1 and 2 come from version 0. From then on each drain's call starts under the weights of two syncs back, because the
    # trainer's next push reaches the rollouter only after its engine has resumed: staleness 0, 1, then 2.
    import ray
    from driver_runs import run_mode
    from sections import tiny_config

    from fasync.launch import actors

    delay, warm_up = 0.3, 2.0
    cfg = tiny_config(mode="fully_async", train={"num_rollouts": 8},
                      **{"async": {"max_weight_staleness": 2, "partial_rollout": False}})

    @ray.remote(concurrency_groups={"control": 1})
    class FixedDelayEngine(actors.EngineActor.__ray_actor_class__):
        def generate(self, requests, params, token_budget=None):
            time.sleep(delay)
            return super().generate(requests, params, token_budget)

    class WarmingTrainer(actors.TrainerActor.__ray_actor_class__):
        calls = 0

        def train_rollout(self, samples, current_version):
            self.calls += 1
            if self.calls == 1:
                time.sleep(warm_up)
            return super().train_rollout(samples, current_version)

    monkeypatch.setattr(actors, "TrainerActor", ray.remote(WarmingTrainer))
    real = run_mode(cfg, tmp_path, [FixedDelayEngine.options(num_cpus=0).remote(cfg)])
    by_drain = {record["rollout"]: record["staleness_max"] for record in real.run.writer.history}
    assert [by_drain[drain] for drain in range(8)] == [0, 1, 2, 2, 2, 2, 2, 2]

    costs = replace(STEPS_ONLY, engine_step=0.0, engine_call=delay, trainer_step=0.01, weight_sync=0.005)
    sim = Simulation(cfg, derive(cfg), costs, build_lengths(cfg), weight_bytes(cfg, 16))
    train = sim._train

    def warming(groups, version, start, slowdown):
        return train(groups, version, start + (warm_up if not sim.recorder.trainer_busy else 0.0), slowdown)

    sim._train = warming
    simulated = sim.run()
    per_drain = 16  # rollout.batch_size 4 × n_samples_per_prompt 4
    assert dict(simulated.staleness) == {0: per_drain, 1: per_drain, 2: 6 * per_drain}
