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


def _start_ray(cfg: FasyncConfig, plan) -> bool:
    """Join or start the cluster; False when this process was already connected (a caller that owns
    the session, such as a test suite, keeps it)."""
    import ray

    if ray.is_initialized():
        return False
    common = {"logging_level": "WARNING", "log_to_driver": True, "runtime_env": _worker_env()}
    if cfg.resources.ray_address:
        ray.init(address=cfg.resources.ray_address, **common)
    else:
        ray.init(num_cpus=plan.local_cluster_cpus(), num_gpus=cfg.resources.num_gpus or 0,
                 include_dashboard=False, **common)
    return True


def summarize(run, started: float, outcome: str) -> dict:
    """summary.json: the run's outcome and its metrics over the whole run, as `fasync.metrics.registry`
    combines them."""
    from fasync.metrics.registry import METRICS, over

    history = run.writer.history
    last = history[-1] if history else {}
    summary = {
        "outcome": outcome,
        "stop_reason": run.stop_reason,
        "mode": run.cfg.mode,
        "optimizer_steps": run.step,
        "weight_version": run.version,
        "final_rollout_reward_mean": last.get("rollout_reward_mean"),
        "best_rollout_reward_mean": over("rollout_reward_mean", history),
        "wall_time_s": round(time.monotonic() - started, 2),
        "staleness_max": over("staleness_max", history) or 0,
        "policy_lag_max": over("policy_lag_max", history) or 0,
        "ledger": run.ledger.as_dict(),
        "correction": {name: last[name] for name in METRICS if name.startswith("is/") and name in last},
        "warnings": run.signal.warnings,
    }
    for phase in ("generate_time_s", "train_time_s", "weight_sync_time_s", "trainer_wait_s", "rollouter_pause_s"):
        summary[f"total_{phase}"] = round(over(phase, history), 3)
    return summary


def _print_summary(summary: dict, run_dir: Path, ledger_text: str) -> None:
    _echo("")
    _echo(f"fasync train: {summary['outcome']} ({summary['stop_reason']}) in {summary['wall_time_s']} s")
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


def _train(cfg: FasyncConfig, plan, factory, directory: Path) -> int:
    import ray

    from fasync.drivers import driver_for
    from fasync.drivers.common import COMPLETED, Run
    from fasync.errors import ConfigurationError
    from fasync.metrics.progress import Progress

    started = time.monotonic()
    # Ctrl-C while Ray starts or the driver waits on an actor becomes a KeyboardInterrupt here.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    owns_ray = _start_ray(cfg, plan)
    run = None
    outcome, code = "finished", ExitCode.OK
    try:
        with Progress(cfg.train.num_rollouts, cfg.logging.progress, cfg.logging.log_every,
                      title=f"fasync train ({cfg.mode})") as progress:
            run = Run(cfg, derive(cfg), plan, factory, directory, progress)
            driver_for(run).train()
            if cfg.checkpoint.save_final:
                run.trainer.save(str(directory / "final.pt"))
    except KeyboardInterrupt:
        outcome, code = "interrupted", ExitCode.INTERRUPTED
        _echo("fasync train: interrupted, stopping all actors")
    except ConfigurationError as error:  # bad input met while running (a reward that is not a number), here or in
        outcome, code = "failed", ExitCode.FAILED  # an actor, whose RayTaskError is one too: print the original
        _echo(f"fasync train: the run failed: {getattr(error, 'cause', None) or error}")
    except Exception as error:  # noqa: BLE001 - any actor failure ends the run with its message
        outcome, code = "failed", ExitCode.FAILED
        _echo(f"fasync train: the run failed: {type(error).__name__}: {error}")
    finally:
        if run is not None:
            if outcome != "finished" and run.stop_reason == COMPLETED:
                run.stop_reason = f"{outcome} after {run.step} optimizer steps"
            summary = summarize(run, started, outcome)
            (directory / "summary.json").write_text(json.dumps(summary, indent=2))
            _print_summary(summary, directory, run.ledger.describe())
            run.close()
        if owns_ray:
            ray.shutdown()
    return code

