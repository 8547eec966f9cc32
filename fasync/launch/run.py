"""`fasync train`: check the config, plan the actors, start Ray, run the driver, summarise."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Sequence

import yaml

from fasync.config.derived import derive
from fasync.config.schema import FasyncConfig
from fasync.diagnostics import Severity
from fasync.exit_codes import ExitCode


def _echo(text: str = "") -> None:
    print(text, flush=True)


def _check(path: str, overrides: Sequence[str]):
    """Load and lint; returns (config, resolved dict, exit code or None to go on)."""
    from fasync.config.loader import load_config
    from fasync.lint.engine import lint
    from fasync.lint.formats import render

    loaded = load_config(path, overrides)
    diagnostics = lint(loaded) if loaded.config is not None else loaded.diagnostics
    if diagnostics:
        _echo(render(diagnostics, "text", summary=False))
    if loaded.config is None:
        return None, None, ExitCode.FAILED if Path(path).is_file() else ExitCode.USAGE
    if any(d.severity is Severity.ERROR for d in diagnostics):
        _echo("fasync train: the config has errors; nothing was started.")
        return None, None, ExitCode.FAILED
    return loaded.config, loaded.raw, None


def _run_dir(cfg: FasyncConfig, config_path: str, run_dir: str | None) -> Path:
    chosen = run_dir or cfg.logging.run_dir
    if chosen is None:
        chosen = f"runs/{Path(config_path).stem}-{time.strftime('%Y%m%d-%H%M%S')}"
    path = Path(chosen).absolute()  # checkpoints are written by trainer rank 0, wherever it runs
    if path.is_dir() and any(path.iterdir()):
        # A rerun into the same directory must not mix with, or overwrite, the earlier run's files.
        stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(path.stat().st_mtime))
        kept = path.with_name(f"{path.name}-{stamp}")
        while kept.exists():
            kept = kept.with_name(kept.name + "_")
        path.rename(kept)
        _echo(f"fasync train: the previous run in {path} was moved to {kept}")
    path.mkdir(parents=True, exist_ok=True)
    return path


def _worker_env() -> dict:
    """The driver's import path for every worker, so that a `module:function` reward or a dataset
    module found from the current directory is found by the actors too."""
    paths = [os.getcwd(), *os.environ.get("PYTHONPATH", "").split(os.pathsep)]
    # Absolute: a worker on another node (or in another directory) resolves them the same way; on a
    # multi-node cluster they must also be on storage every node shares (docs/gpu.md).
    return {"env_vars": {"PYTHONPATH": os.pathsep.join(os.path.abspath(p) for p in paths if p)}}


def _init_ray(cfg: FasyncConfig, plan) -> None:
    """Join `resources.ray_address`, or start a local cluster of this run's own: never a cluster that
    `ray start` or RAY_ADDRESS left around, which `ray.init` would join and then refuse the CPU count for."""
    import ray

    common = {"logging_level": "WARNING", "log_to_driver": True, "runtime_env": _worker_env()}
    if cfg.resources.ray_address:
        ray.init(address=cfg.resources.ray_address, **common)
    else:
        ray.init(address="local", num_cpus=plan.local_cluster_cpus(), num_gpus=cfg.resources.num_gpus or 0,
                 include_dashboard=False, **common)


def summarize(run, started: float, outcome: str, stop_reason: str, mode: str) -> dict:
    """summary.json: the run's outcome, why it stopped, and its metrics over the whole run, as
    `fasync.metrics.registry` combines them. `run` is None when the run stopped before its actors started."""
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
        "ledger": run.ledger.as_dict() if run is not None else None,
        "correction": {name: last[name] for name in METRICS if name.startswith("is/") and name in last},
        "warnings": run.signal.warnings if run is not None else [],
    }
    for phase in ("generate_time_s", "train_time_s", "weight_sync_time_s", "trainer_wait_s", "rollouter_pause_s"):
        summary[f"total_{phase}"] = round(over(phase, history), 3)
    return summary


def _print_summary(summary: dict, run_dir: Path, ledger_text: str | None) -> None:
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
    for warning in summary["warnings"]:
        _echo(f"  warning: {warning}")
    if ledger_text is not None:
        _echo(f"  samples: {ledger_text}")
    _echo(f"  run directory: {run_dir}")


def train(config_path: str, overrides: Sequence[str] = (), run_dir: str | None = None, dry_run: bool = False) -> int:
    cfg, resolved, failed = _check(config_path, overrides)
    if failed is not None:
        return failed
    from fasync.launch.plan import plan_resources

    plan = plan_resources(cfg)
    if dry_run:
        _echo(plan.describe())
        return ExitCode.OK

    from fasync.data.rewards import extend_import_path
    from fasync.errors import ConfigurationError

    extend_import_path(Path(config_path).parent)
    try:
        from fasync.drivers.common import build_factory

        factory = build_factory(cfg)
    except ConfigurationError as error:
        _echo(f"fasync train: {error}")
        return ExitCode.FAILED

    directory = _run_dir(cfg, config_path, run_dir)
    (directory / "config.yaml").write_text(yaml.safe_dump(resolved, sort_keys=False))
    (directory / "plan.txt").write_text(plan.describe() + "\n")
    return _train(cfg, plan, factory, directory)


def _train(cfg: FasyncConfig, plan, factory, directory: Path, engines: list | None = None) -> int:
    """Start Ray and the actors, run the driver, and stop: every way a run ends (finished, Ctrl-C, SIGTERM,
    a failure) goes through the one stop path below, which writes the summary and leaves no process behind.
    `engines`: engine actors the caller started (tests), used instead of starting them."""
    import ray

    from fasync.drivers import driver_for
    from fasync.drivers.common import Run
    from fasync.errors import ConfigurationError
    from fasync.launch import reaper
    from fasync.launch.faults import describe_failure
    from fasync.launch.signals import OUTCOMES, Stop, StopSignals
    from fasync.metrics.progress import Progress

    started = time.monotonic()
    signals = StopSignals(_echo)
    signals.install()
    owns_ray = not ray.is_initialized()
    cluster_reaper = reaper.start() if owns_ray else None
    run = None
    outcome, code, reason = "finished", ExitCode.OK, None
    try:
        if owns_ray:
            _echo("fasync train: starting a local Ray cluster" if not cfg.resources.ray_address
                  else f"fasync train: joining the Ray cluster at {cfg.resources.ray_address}")
            _init_ray(cfg, plan)
            signals.install()  # ray.init replaced the SIGTERM handler with one that exits 15
        with Progress(cfg.train.num_rollouts, cfg.logging.progress, cfg.logging.log_every,
                      title=f"fasync train ({cfg.mode})") as progress:
            run = Run(cfg, derive(cfg), plan, factory, directory, progress, engines=engines)
            driver_for(run).train()
            reason = run.stop_reason or f"completed all {cfg.train.num_rollouts} rollouts"
            if cfg.checkpoint.save_final:
                run.trainer.save(str(directory / "final.pt"))
    except (Stop, KeyboardInterrupt, SystemExit) as stop:
        # A bare KeyboardInterrupt: Ctrl-C before our handler was in; SystemExit(15): a SIGTERM while ray.init's
        # own handler was in place.
        signum = getattr(stop, "signum", None) or signals.first or signal.SIGINT
        if isinstance(stop, SystemExit):
            signum = signal.SIGTERM if stop.code == signal.SIGTERM else None
        if signum is None:
            outcome, code, reason = "failed", ExitCode.FAILED, f"failed: exited with code {stop.code}"
        else:
            outcome, code, reason = OUTCOMES[signum]
            reason += " while Ray was starting" if run is None else f" at optimizer step {run.step}"
            _echo(f"fasync train: {reason}; stopping ({signal.Signals(signum).name} again skips the clean stop)")
    except ConfigurationError as error:  # bad input met while running (a reward that is not a number), here or in
        outcome, code = "failed", ExitCode.FAILED  # an actor, whose RayTaskError is one too: print the original
        reason = f"failed: {getattr(error, 'cause', None) or error}"
        _echo(f"fasync train: the run {reason}")
    except Exception as error:  # noqa: BLE001 - any failure ends the run with its message
        outcome, code, reason = "failed", ExitCode.FAILED, f"failed: {describe_failure(error)}"
        _echo(f"fasync train: the run {reason}")
    finally:
        # From here a signal only skips the graceful steps (`signals.graceful`); the summary is always written
        # and the cluster always shut down. A clean stop's checkpoint (finished, interrupted, terminated; a
        # failed run keeps its last good one) belongs first among the graceful steps.
        signals.begin_stop()
        summary = summarize(run, started, outcome, reason, cfg.mode)
        _write_summary(directory, summary)
        _print_summary(summary, directory, _ledger_text(run, outcome) if run is not None else None)
        if run is not None:
            signals.graceful("ending the actors", run.close)
        if owns_ray:
            ray.shutdown()
        reaper.finish(cluster_reaper)
        signals.restore()
    return code


def _write_summary(directory: Path, summary: dict) -> None:
    temporary = directory / "summary.json.tmp"
    temporary.write_text(json.dumps(summary, indent=2))
    os.replace(temporary, directory / "summary.json")


def _ledger_text(run, outcome: str) -> str:
    """The ledger line, and for a run that did not finish, what it left untrained."""
    ledger = run.ledger
    text = ledger.describe()
    if outcome != "finished" and (ledger.in_flight or ledger.queued):
        text += (f"\n  at the stop {ledger.in_flight} samples were in flight and {ledger.queued} queued: "
                 "none of them was trained")
    return text
