"""`fasync train`: a new run of a config, or with `--resume` the run in a directory continued from its newest
checkpoint. `run` reads top to bottom:

load → lint → resolve → plan → build data → start Ray → driver → summarize.

`resolve` (fasync.launch.plan) works out once what follows from the config: the derived quantities, the model's
dimensions and the plan of the actors. That one `Resolved` value is what the run's driver, rollouter and trainer
are given, so that none of them derives the config or reads the model's files again.
"""

from __future__ import annotations

import logging
import os
import shlex
import signal
import time
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple, Sequence

import yaml

from fasync.atomic import RunFileError, write_atomic, write_json_atomic
from fasync.config.derived import Derived
from fasync.config.schema import FasyncConfig
from fasync.diagnostics import Severity
from fasync.exit_codes import ExitCode
from fasync.killpoints import kill_point
from fasync.launch import rundir
from fasync.launch.plan import Resolved, ResourcePlan, resolve
from fasync.memory import ModelDims, derive_with_model


def _echo(text: str = "") -> None:
    print(text, flush=True)


def run(config_path: str | None, overrides: Sequence[str] = (), run_dir: str | None = None, dry_run: bool = False,
        resume: str | None = None, allow_config_change: Sequence[str] = (), verbose: bool = False) -> int:
    """`fasync train`: a new run of `config_path`, or with `resume` the run in that directory, continued from its
    newest checkpoint (`config_path` is then optional: the run's own config.yaml). `verbose`: the live display
    shows the latest generation too."""
    if resume is not None:
        return resume_run(Path(resume).expanduser().resolve(), config_path, overrides, allow_config_change, verbose)
    cfg, raw, model, failed = load_and_lint(config_path, overrides)
    if failed is not None:
        return failed
    resolved = resolve(cfg, model)
    if dry_run:
        _echo(resolved.plan.summary())
        return ExitCode.OK
    config_dir = Path(config_path).parent
    data = build_data(resolved, config_dir)
    if data is None:
        return ExitCode.FAILED
    directory = rundir.choose(cfg.logging.run_dir, config_path, run_dir)

    def start() -> int:
        write_atomic(directory / "config.yaml", yaml.safe_dump(raw, sort_keys=False))
        write_atomic(directory / "plan.txt", resolved.plan.summary() + "\n")
        return train(resolved, data[0], directory, eval_prompts=data[1], verbose=verbose)

    return _holding_lock(lambda: rundir.prepare_new(directory, config_dir, _echo), start, refused=ExitCode.FAILED)


class Linted(NamedTuple):
    config: FasyncConfig | None
    raw: dict | None
    """The resolved dict written as the run's config.yaml."""
    model: tuple[ModelDims | None, Derived] | None
    """The model's dimensions and the config derived with them: derived once, for the lint and the run."""
    failed: int | None
    """The exit code when the run must not go on."""


def load_and_lint(path: str, overrides: Sequence[str], config_dir: Path | None = None) -> Linted:
    """Load, derive and lint; the config's own modules are looked for in `config_dir` (default: beside `path`)."""
    from fasync.config.loader import load_config
    from fasync.lint.engine import lint
    from fasync.lint.formats import render

    loaded = load_config(path, overrides)
    model = derive_with_model(loaded.config) if loaded.config is not None else None
    diagnostics = lint(loaded, derived=model[1], config_dir=config_dir) if model is not None else loaded.diagnostics
    if diagnostics:
        _echo(render(diagnostics, "text", summary=False))
    if loaded.config is None:
        return Linted(None, None, None, ExitCode.FAILED if Path(path).is_file() else ExitCode.USAGE)
    if any(d.severity is Severity.ERROR for d in diagnostics):
        _echo("fasync train: the config has errors; nothing was started.")
        return Linted(None, None, None, ExitCode.FAILED)
    return Linted(loaded.config, loaded.raw, model, None)


def build_data(resolved: Resolved, config_dir: Path):
    """(the run's prompts, tokenizer and reward: `fasync.rollout.groups.GroupFactory`; its eval set:
    `fasync.data.held_out.EvalPrompts` or None), a reward module looked for in the working directory and beside the
    config too; None, said in one line, when they cannot be built."""
    from fasync.data.rewards import reward_search_path
    from fasync.errors import ConfigurationError

    try:
        from fasync.data.held_out import build_eval_prompts
        from fasync.rollout.groups import build_factory

        factory = build_factory(resolved, reward_search_path(config_dir))
        dims = resolved.model_dims
        context = dims.max_context if dims is not None else None
        eval_prompts = build_eval_prompts(resolved.config, factory.tokenizer, context) \
            if resolved.config.eval.enabled else None
    except ConfigurationError as error:
        _echo(f"fasync train: {error}")
        return None
    dataset = factory.dataset
    if dataset.filtered:
        _echo(f"fasync train: data: {dataset.filtered} overlong prompt{'s' * (dataset.filtered != 1)} of "
              f"{dataset.filtered + len(dataset)} dropped (`data.overlong_prompts: filter`); {len(dataset)} remain")
    return factory, eval_prompts


def _holding_lock(acquire, body, refused: int) -> int:
    """`body()` while holding the run directory's lock that `acquire()` takes: a run directory that cannot be
    taken returns `refused`, one that another run is using fails (exit 1); a file error while running fails
    the run, in one line each."""
    try:
        lock = acquire()
    except rundir.RunDirectoryBusy as error:
        _echo(f"fasync train: {error}")
        return ExitCode.FAILED
    except RunFileError as error:
        _echo(f"fasync train: {error}")
        return refused
    try:
        return body()
    except RunFileError as error:
        _echo(f"fasync train: {error}")
        return ExitCode.FAILED
    finally:
        lock.release()


# -- resume ----------------------------------------------------------------------------------------------------


def resume_run(directory: Path, config_path: str | None, overrides: Sequence[str], allowed: Sequence[str],
               verbose: bool = False) -> int:
    """The run in `directory`, continued from its newest checkpoint with its own config (or `config_path`, which
    may differ from it only in the `allowed` keys)."""

    def resume() -> int:
        saved_config = directory / "config.yaml"
        if config_path is None:
            _work_where_started(directory)
        # Without a config, the reward is looked for beside the config the run started from.
        started_from = Path(config_path).parent if config_path else rundir.recorded_dir(directory, "config_dir")
        cfg, raw, model, failed = load_and_lint(config_path or str(saved_config), overrides, started_from)
        if failed is not None:
            return failed
        changes, failed = _allowed_changes(saved_config, cfg, allowed, started_from)
        if failed is not None:
            return failed
        found, failed = _checkpoint_to_resume(directory, changes)
        if failed is not None:
            return failed
        from fasync.checkpoint.driver_file import load_driver_state
        from fasync.checkpoint.state import check_trainer_files
        from fasync.drivers import driver_state_types

        # A crafted or damaged driver.pt, .metadata or rank-R.pt fails here, before Ray starts.
        state = load_driver_state(found, driver_state_types())
        check_trainer_files(found)
        resolved = resolve(cfg, model)
        data = build_data(resolved, started_from or directory)
        if data is None:
            return ExitCode.FAILED
        _echo(f"fasync train: resuming {directory} from {found.path.name} (step {found.step}, weight version "
              f"{found.record.weight_version}, rollout {found.record.rollout})")
        # The run's config.yaml takes the allowed changes once the run has taken up its checkpoint.
        accept = (lambda: write_atomic(saved_config, yaml.safe_dump(raw, sort_keys=False))) if changes else None
        return train(resolved, data[0], directory, resume=(found, state), on_resumed=accept, eval_prompts=data[1],
                     verbose=verbose)

    return _holding_lock(lambda: rundir.open_for_resume(directory, _echo), resume, refused=ExitCode.USAGE)


def _work_where_started(directory: Path) -> None:
    """Enter the directory the run started in: its own config's relative paths (model, data, a reward's helpers)
    meant what they meant there."""
    origin = rundir.recorded_dir(directory, "cwd")
    if origin is None or origin.resolve() == Path.cwd().resolve():
        return
    try:
        os.chdir(origin)
        _echo(f"fasync train: working in {origin}, where the run started, for its config's relative paths")
    except OSError as error:
        _echo(f"fasync train: cannot work in {origin}, where the run started ({error.strerror}), so its "
              "config's relative paths are taken from here; resume from that directory to keep them")


def config_changes(saved: dict, now: dict) -> dict[str, tuple]:
    """Dotted key → (the run's value, the new value), for every key that differs."""
    from fasync.config.fields import flatten

    before, after = flatten(saved), flatten(now)
    return {key: (before.get(key), after.get(key)) for key in sorted(before.keys() | after.keys())
            if before.get(key) != after.get(key)}


FIXED_ON_RESUME = {
    "mode": "the checkpoint's ledger, queue and groups in flight are its mode's",
    **{f"model.{key}": "the checkpoint's weights and optimizer state have the run's model's shapes"
       for key in ("n_layers", "d_model", "n_heads", "max_seq_len")},
}
"""Config keys a resumed run keeps whatever --allow-config-change says, and why. (`model.path` may change: the same
model moved elsewhere.)"""


def _allowed_changes(saved_config: Path, cfg: FasyncConfig, allowed: Sequence[str], config_dir: Path | None
                     ) -> tuple[dict[str, tuple], int | None]:
    """The config's changes from the run's own (whose modules are in `config_dir`), or the exit code when that no
    longer loads or a change is not in `allowed`."""
    saved, _, _, failed = load_and_lint(str(saved_config), (), config_dir)
    if failed is not None:
        _echo(f"fasync train: {saved_config}: the run's own config no longer loads")
        return {}, failed
    changes = config_changes(saved.model_dump(mode="json", by_alias=True), cfg.model_dump(mode="json", by_alias=True))
    fixed = {key: change for key, change in changes.items() if key in FIXED_ON_RESUME}
    if fixed:
        listed = "; ".join(f"{key}: {old!r} -> {new!r} ({FIXED_ON_RESUME[key]})" for key, (old, new) in fixed.items())
        _echo(f"fasync train: {saved_config.parent} cannot resume with {listed}. Nothing was started and the run "
              "is as it was: resume with the run's value, or start a new run (--run-dir) from its config")
        return changes, ExitCode.FAILED
    refused = {key: change for key, change in changes.items() if key not in allowed}
    if refused:
        listed = "; ".join(f"{key}: {old!r} -> {new!r}" for key, (old, new) in refused.items())
        _echo(f"fasync train: the config differs from the run's in {listed}. Nothing was started: resume with "
              f"the run's config, or allow the change with --allow-config-change {','.join(refused)}")
        return changes, ExitCode.FAILED
    return changes, None


def _checkpoint_to_resume(directory: Path, changes: dict[str, tuple]):
    """(the newest checkpoint, None), or (None, the exit code) when there is none or the run already finished
    (and the config is unchanged: a changed one may train further)."""
    from fasync import checkpoint

    found = checkpoint.latest(directory)
    if found is None:
        _echo(f"fasync train: {directory} holds no checkpoint to resume from (the run stopped before its first; "
              "`checkpoint.every` sets how often they are taken)")
        return None, ExitCode.FAILED
    if found.finished and not changes:
        _echo(f"fasync train: the run in {directory} already finished ({found.record.stop_reason}, "
              f"{found.step} optimizer steps); nothing to resume")
        return None, ExitCode.OK
    return found, None


# -- start Ray, run the driver, stop -----------------------------------------------------------------------------


def _worker_env() -> dict[str, str]:
    """What every worker's environment takes from the driver's: its PYTHONPATH (a `module:function` reward
    brings its own directories, `fasync.data.rewards.Reward`), and no Hugging Face progress bars, whose
    weight loading would draw them into the console (unless the driver's environment asks for them)."""
    env = {"HF_HUB_DISABLE_PROGRESS_BARS": os.environ.get("HF_HUB_DISABLE_PROGRESS_BARS", "1")}
    paths = [path for path in os.environ.get("PYTHONPATH", "").split(os.pathsep) if path]
    if paths:
        # Absolute: a worker on another node (or in another directory) resolves them the same way; on a
        # multi-node cluster they must also be on storage every node shares (docs/gpu.md).
        env["PYTHONPATH"] = os.pathsep.join(os.path.abspath(path) for path in paths)
    return env


@contextmanager
def _environment(values: dict[str, str]):
    """`values` in os.environ while in effect, then the environment as it was."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def start_ray(cfg: FasyncConfig, plan: ResourcePlan) -> None:
    """Join `resources.ray_address`, or start a local cluster of this run's own: never a cluster that
    `ray start` or RAY_ADDRESS left around, which `ray.init` would join and then refuse the CPU count for."""
    import ray

    from fasync.launch import local_cluster

    common = {"logging_level": "WARNING", "log_to_driver": True}
    if cfg.resources.ray_address:
        ray.init(address=cfg.resources.ray_address, runtime_env={"env_vars": _worker_env()}, **common)
        return
    # Ray notes that a new local cluster takes token authentication, its default: not the user's to act on.
    logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(logging.ERROR)
    # The cluster's processes take the workers' environment from the driver's as ray.init starts them, rather
    # than from the job's runtime environment, whose agent sets up every actor's worker first: the actors were
    # ready in 3 s instead of 6-10 s (issue 31 §5, docs/benchmarks.md#start-up-and-footprint).
    with local_cluster.as_a_run_needs(), _environment(_worker_env()):
        ray.init(address="local", num_cpus=plan.local_cluster_cpus(), num_gpus=cfg.resources.num_gpus or 0,
                 include_dashboard=False, **common)
    kill_point("ray_start")


def train(resolved: Resolved, factory, directory: Path, engines: list | None = None, resume: tuple | None = None,
          on_resumed=None, eval_prompts=None, verbose: bool = False) -> int:
    """Start Ray and the actors, run the driver, and stop: every way a run ends (finished, Ctrl-C, SIGTERM,
    a failure) goes through the one stop path below, which writes the summary and leaves no process behind.
    `engines`: engine actors the caller started (tests), used instead of starting them. `resume` is
    (checkpoint, its driver state) to continue from, and `on_resumed` is called once the run has taken it up.
    `eval_prompts`: the eval set (`build_data`), or None. `verbose`: the display shows the latest generation."""
    import ray

    from fasync.launch import reaper
    from fasync.launch.signals import Stop, StopSignals

    training = _Training(resolved, directory, verbose)
    signals = StopSignals(_echo, cooperative=training.stop_after_rollout)
    signals.install()
    owns_ray = not ray.is_initialized()
    cluster_reaper = reaper.start() if owns_ray else None
    ending = ("finished", ExitCode.OK, None)
    try:
        if owns_ray:
            cfg = resolved.config
            _echo("fasync train: starting a local Ray cluster" if not cfg.resources.ray_address
                  else f"fasync train: joining the Ray cluster at {cfg.resources.ray_address}")
            start_ray(cfg, resolved.plan)
            signals.install()  # ray.init replaced the SIGTERM handler with one that exits 15
            signals.raise_swallowed()
        ending = training.drive(signals, factory, eval_prompts, engines, resume, on_resumed)
    except (Stop, KeyboardInterrupt, SystemExit) as stop:
        # A bare KeyboardInterrupt: Ctrl-C before our handler was in; SystemExit(15): a SIGTERM while ray.init's
        # own handler was in place.
        ending = _interrupted(stop, signals.first, training.run)
    except Exception as error:  # noqa: BLE001 - any failure ends the run with its message
        ending = _failed(error, training.run)
    finally:
        # From here a signal only skips the graceful steps (`signals.graceful`); the summary is always written
        # and the cluster always shut down. A clean stop's checkpoint was written by the driver at the end of
        # its last rollout; a failed run keeps its last good one.
        signals.begin_stop()
        code = training.end(*ending, signals)
        if owns_ray:
            ray.shutdown()
        reaper.finish(cluster_reaper)
        signals.restore()
    return code


class _Training:
    """One run from its start to its stop, with what the stop path reads however the run ends. `run` is None
    until the actors have started."""

    def __init__(self, resolved: Resolved, directory: Path, verbose: bool = False):
        self.resolved = resolved
        self.verbose = verbose
        self.directory = directory
        self.started = time.monotonic()
        self.run = None
        self.driver = None
        self.resuming = False
        """A resume: until the run has taken up its checkpoint (`run`), a failure leaves the run directory's
        summary.json as it was."""

    def stop_after_rollout(self, signum: int) -> bool:
        """The first Ctrl-C or SIGTERM of a started run stops it at the end of the rollout (drain) in progress,
        where it writes a checkpoint, so that the run can be resumed; before the run exists there is nothing
        to save and the signal stops at once."""
        from fasync.launch.signals import OUTCOMES

        if self.run is None:
            return False
        outcome, _, reason = OUTCOMES[signum]
        self.run.request_stop(outcome, reason)
        name = signal.Signals(signum).name
        _echo(f"fasync train: {reason}; stopping after this rollout with a checkpoint ({name} again stops now)")
        return True

    def drive(self, signals, factory, eval_prompts, engines: list | None, resume: tuple | None, on_resumed
              ) -> tuple[str, int, str]:
        """Start the actors and run the mode's driver to its end; (outcome, exit code, stop reason). A signal
        that came while they started stops the run before it takes its first step (`signals`: the run's
        StopSignals)."""
        from fasync.drivers import driver_for
        from fasync.drivers.common import Run
        from fasync.launch.signals import EXIT_CODE
        from fasync.metrics.progress import Progress

        cfg = self.resolved.config
        with Progress(cfg.train.num_rollouts, cfg.logging.progress, cfg.logging.log_every,
                      title=f"fasync train ({cfg.mode})", verbose=self.verbose) as progress:
            found, state = resume if resume is not None else (None, None)
            self.resuming = found is not None
            starting = Run(self.resolved, factory, self.directory, progress, engines=engines, resume=found,
                           resume_state=state, eval_prompts=eval_prompts)
            starting.start()
            signals.raise_swallowed()
            self.run = run = starting
            self.driver = driver_for(run)
            if on_resumed is not None:
                on_resumed()
            self.driver.train()
            outcome, code = "finished", ExitCode.OK
            if run.stop_requested is not None:
                outcome, code = run.stop_requested, EXIT_CODE[run.stop_requested]
                reason = f"{run.stop_reason} at optimizer step {run.step}"
            else:
                reason = run.stop_reason or completed(cfg.train.num_rollouts)
            if cfg.checkpoint.save_final:
                from fasync.checkpoint import latest
                from fasync.checkpoint.state import export_policy

                export_policy(cfg, latest(self.directory), self.directory / "export", force=True)
        return outcome, code, reason

    def end(self, outcome: str, code: int, reason: str, signals) -> int:
        """Write and print the summary and end the actors; the exit code (a summary that cannot be written fails
        a run that had not failed)."""
        ledger = self.driver.ledger if self.driver is not None else None
        summary = summarize(self.run, ledger, self.started, outcome, reason, self.resolved.config.mode)
        if self.resuming and self.run is None:
            _echo(f"fasync train: the resume stopped before it took up the checkpoint; {self.directory}/summary.json "
                  "is left as it was")
        else:
            try:
                write_json_atomic(self.directory / "summary.json", summary)
            except RunFileError as error:
                _echo(f"fasync train: {error}")
                code = code or ExitCode.FAILED
        run = self.run
        _print_summary(summary, self.directory, _ledger_text(ledger, outcome) if ledger is not None else None)
        if run is not None:
            signals.graceful("ending the actors", lambda: run.close(outcome))
        return code


def completed(rollouts: int) -> str:
    """The stop reason of a run that trained every rollout it was given."""
    return f"completed all {rollouts} rollouts" if rollouts != 1 else "completed its 1 rollout"


def _interrupted(stop: BaseException, first_signal: int | None, run) -> tuple[str, int, str]:
    """How a run ends that a signal stopped at once, or a SystemExit of its own."""
    from fasync.launch.signals import OUTCOMES

    signum = getattr(stop, "signum", None) or first_signal or signal.SIGINT
    if isinstance(stop, SystemExit):
        signum = signal.SIGTERM if stop.code == signal.SIGTERM else None
    if signum is None:
        return "failed", ExitCode.FAILED, f"failed: exited with code {stop.code}"
    outcome, code, reason = OUTCOMES[signum]
    reason += " while Ray was starting" if run is None else f" at optimizer step {run.step}"
    _echo(f"fasync train: {reason}; stopping now (the last checkpoint stands)")
    return outcome, code, reason


def _failed(error: Exception, run) -> tuple[str, int, str]:
    """How a run ends that raised `error`, said in one line."""
    from fasync.errors import ConfigurationError, describe_failure
    from fasync.launch.signals import EXIT_CODE

    if isinstance(error, RunFileError):
        reason = f"failed: {error}"
    elif isinstance(error, ConfigurationError):
        # Bad input met while running (a reward that is not a number), here or in an actor, whose RayTaskError
        # is one too: the original's message.
        reason = f"failed: {getattr(error, 'cause', None) or error}"
    elif run is not None and run.stop_requested is not None:
        # The stop signal came first. A SIGTERM to the whole process group (as schedulers send it) also reaches
        # Ray's own processes, which may end the actors before the clean stop has written its checkpoint: the
        # run still ends as the signal asked, and says what the stop could not do.
        reason = (f"{run.stop_reason} at optimizer step {run.step}; the clean stop could not finish "
                  f"({describe_failure(error)}), so the last checkpoint stands")
        _echo(f"fasync train: {reason}")
        return run.stop_requested, EXIT_CODE[run.stop_requested], reason
    else:
        reason = f"failed: {describe_failure(error)}"
    _echo(f"fasync train: the run {reason}")
    return "failed", ExitCode.FAILED, reason


# -- summarize ---------------------------------------------------------------------------------------------------


def summarize(run, ledger, started: float, outcome: str, stop_reason: str, mode: str) -> dict:
    """summary.json: the run's outcome, why it stopped, and its metrics over the whole run, as
    `fasync.metrics.registry` combines them. `run` and its driver's `ledger` are None when the run stopped
    before its actors started."""
    from fasync.metrics.registry import METRICS, over

    history = run.writer.history if run is not None else []
    last = history[-1] if history else {}
    summary = {
        "outcome": outcome,
        "stop_reason": stop_reason,
        "mode": mode,
        "optimizer_steps": run.step if run is not None else 0,
        "weight_version": run.version if run is not None else 0,
        "final_rollout_reward_mean": last.get("rollout_reward_mean"),
        "best_rollout_reward_mean": over("rollout_reward_mean", history),
        "wall_time_s": round(time.monotonic() - started, 2),
        "staleness_max": over("staleness_max", history) or 0,
        "policy_lag_max": over("policy_lag_max", history) or 0,
        "nonfinite_steps_skipped": int(over("nonfinite_skipped", history) or 0),
        "ledger": ledger.as_dict() if ledger is not None else None,
        "last_checkpoint": run.last_checkpoint if run is not None else None,
        "correction": {name: last[name] for name in METRICS if name.startswith("is/") and name in last},
        "warnings": run.signal.warnings if run is not None else [],
        "eval": next(({key: value for key, value in row.items() if key.startswith("eval/")}
                      for row in reversed(history) if "eval/pass@k" in row), None),
    }
    for phase in ("generate_time_s", "train_time_s", "weight_sync_time_s", "trainer_wait_s", "rollouter_pause_s"):
        summary[f"total_{phase}"] = round(over(phase, history), 3)
    return summary


def _print_summary(summary: dict, run_dir: Path, ledger_text: str | None) -> None:
    """The summary on the console; a run a stop signal ended (resumable) ends with the command that resumes it."""
    from fasync.launch.signals import EXIT_CODE

    _echo("")
    outcome, reason = summary["outcome"], summary["stop_reason"]
    headline = reason if reason.startswith(outcome) else f"{outcome} ({reason})"
    _echo(f"fasync train: {headline} in {summary['wall_time_s']} s")
    _echo(f"  optimizer steps {summary['optimizer_steps']}, weight version {summary['weight_version']}, "
          f"final rollout reward {summary['final_rollout_reward_mean']}")
    _echo(f"  staleness max {summary['staleness_max']}, policy lag max {summary['policy_lag_max']}")
    _echo(f"  time: generate {summary['total_generate_time_s']} s, train {summary['total_train_time_s']} s, "
          f"weight sync {summary['total_weight_sync_time_s']} s")
    if summary["correction"]:
        shown = ", ".join(f"{k} {v:.4g}" for k, v in sorted(summary["correction"].items()) if v is not None)
        _echo(f"  correction (last step): {shown}")
    evaluation = summary["eval"]
    if evaluation is not None:
        _echo(f"  last evaluation (weight version {evaluation['eval/weight_version']}): pass@k "
              f"{evaluation['eval/pass@k']:.3f}, mean@k {evaluation['eval/mean@k']:.3f}, reward "
              f"{evaluation['eval/reward_mean']:.3f} over {evaluation['eval/prompts']} prompts")
    for warning in summary["warnings"]:
        _echo(f"  warning: {warning}")
    if ledger_text is not None:
        _echo(f"  samples: {ledger_text}")
    _echo(f"  run directory: {run_dir}")
    if outcome in EXIT_CODE and summary["last_checkpoint"] is not None:
        _echo(f"  resume with: fasync train --resume {shlex.quote(str(run_dir))}")


def _ledger_text(ledger, outcome: str) -> str:
    """The ledger line, and for a run that did not finish, what it left untrained."""
    text = ledger.balance_sheet()
    if outcome != "finished" and (ledger.in_flight or ledger.queued):
        text += (f"\n  at the stop {ledger.in_flight} samples were in flight and {ledger.queued} queued: "
                 "none of them was trained")
    return text
