"""`fasync train`: check the config, plan the actors, start Ray, run the driver, summarise."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Sequence

import yaml

from fasync.atomic import RunFileError, write_atomic, write_json_atomic
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
        "last_checkpoint": run.last_checkpoint,
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


def train(config_path: str | None, overrides: Sequence[str] = (), run_dir: str | None = None, dry_run: bool = False,
          resume: str | None = None, allow_config_change: Sequence[str] = ()) -> int:
    """`fasync train`: a new run of `config_path`, or with `resume` the run in that directory, continued from its
    newest checkpoint (`config_path` is then optional: the run's own config.yaml)."""
    from fasync.launch import rundir

    if resume is not None:
        return _resume(Path(resume).expanduser().resolve(), config_path, overrides, allow_config_change)
    cfg, resolved, failed = _check(config_path, overrides)
    if failed is not None:
        return failed
    from fasync.launch.plan import plan_resources

    plan = plan_resources(cfg)
    if dry_run:
        _echo(plan.describe())
        return ExitCode.OK
    factory = _factory(cfg, config_path)
    if factory is None:
        return ExitCode.FAILED
    directory = rundir.choose(cfg.logging.run_dir, config_path, run_dir)
    try:
        lock = rundir.prepare_new(directory, _echo)
    except RunFileError as error:
        _echo(f"fasync train: {error}")
        return ExitCode.FAILED
    try:
        write_atomic(directory / "config.yaml", yaml.safe_dump(resolved, sort_keys=False))
        write_atomic(directory / "plan.txt", plan.describe() + "\n")
        return _train(cfg, plan, factory, directory)
    except RunFileError as error:
        _echo(f"fasync train: {error}")
        return ExitCode.FAILED
    finally:
        lock.release()


def _factory(cfg: FasyncConfig, config_path: str):
    from fasync.data.rewards import extend_import_path
    from fasync.errors import ConfigurationError

    extend_import_path(Path(config_path).parent)
    try:
        from fasync.drivers.common import build_factory

        return build_factory(cfg)
    except ConfigurationError as error:
        _echo(f"fasync train: {error}")
        return None


def _flatten(value, prefix: str = "") -> dict:
    if isinstance(value, dict):
        return {key: leaf for name, item in value.items() for key, leaf in _flatten(item, f"{prefix}{name}.").items()}
    return {prefix.rstrip("."): value}


def config_changes(saved: dict, now: dict) -> dict[str, tuple]:
    """Dotted key → (the run's value, the new value), for every key that differs."""
    before, after = _flatten(saved), _flatten(now)
    return {key: (before.get(key), after.get(key)) for key in sorted(before.keys() | after.keys())
            if before.get(key) != after.get(key)}


def _resume(directory: Path, config_path: str | None, overrides: Sequence[str], allowed: Sequence[str]) -> int:
    from fasync import checkpoint
    from fasync.launch import rundir

    try:
        lock = rundir.open_for_resume(directory, _echo)
    except RunFileError as error:
        _echo(f"fasync train: {error}")
        return ExitCode.USAGE
    try:
        saved_config = directory / "config.yaml"
        cfg, resolved, failed = _check(config_path or str(saved_config), overrides)
        if failed is not None:
            return failed
        saved, _, failed = _check(str(saved_config), ())
        if failed is not None:
            _echo(f"fasync train: {saved_config}: the run's own config no longer loads")
            return failed
        changes = config_changes(saved.model_dump(mode="json", by_alias=True),
                                 cfg.model_dump(mode="json", by_alias=True))
        refused = {key: change for key, change in changes.items() if key not in allowed}
        if refused:
            listed = "; ".join(f"{key}: {old!r} -> {new!r}" for key, (old, new) in refused.items())
            _echo(f"fasync train: the config differs from the run's in {listed}. Nothing was started: resume with "
                  f"the run's config, or allow the change with --allow-config-change {','.join(refused)}")
            return ExitCode.FAILED
        found = checkpoint.latest(directory)
        if found is None:
            _echo(f"fasync train: {directory} holds no checkpoint to resume from (the run stopped before its first; "
                  "`checkpoint.every` sets how often they are taken)")
            return ExitCode.FAILED
        if found.finished and not changes:
            _echo(f"fasync train: the run in {directory} already finished ({found.meta.get('stop_reason')}, "
                  f"{found.step} optimizer steps); nothing to resume")
            return ExitCode.OK
        from fasync.checkpoint.state import load_driver_state
        from fasync.launch.plan import plan_resources

        state = load_driver_state(found)  # a corrupt driver.pt fails here, before Ray starts
        plan = plan_resources(cfg)
        factory = _factory(cfg, config_path or str(saved_config))
        if factory is None:
            return ExitCode.FAILED
        _echo(f"fasync train: resuming {directory} from {found.path.name} (step {found.step}, weight version "
              f"{found.meta['weight_version']}, rollout {found.meta['rollout']})")
        # The run's config.yaml takes the allowed changes once the run has taken up its checkpoint.
        accept = (lambda: write_atomic(saved_config, yaml.safe_dump(resolved, sort_keys=False))) if changes else None
        return _train(cfg, plan, factory, directory, resume=(found, state), on_resumed=accept)
    except RunFileError as error:
        _echo(f"fasync train: {error}")
        return ExitCode.FAILED
    finally:
        lock.release()


def _train(cfg: FasyncConfig, plan, factory, directory: Path, resume: tuple | None = None,
           on_resumed=None) -> int:
    """Run the driver; `resume` is (checkpoint, its driver state) to continue from, and `on_resumed` is called
    once the run has taken it up."""
    import ray

    from fasync.drivers import driver_for
    from fasync.drivers.common import Run
    from fasync.errors import ConfigurationError
    from fasync.metrics.progress import Progress

    started = time.monotonic()
    run = None

    def on_interrupt(signum, frame):
        # The first Ctrl-C of a started run stops it after the rollout in progress, with a checkpoint; a
        # second one, or one before the run exists, interrupts at once.
        if run is None or run.stop_requested is not None:
            raise KeyboardInterrupt
        run.request_stop("interrupted", "interrupted (Ctrl-C)")
        _echo("fasync train: interrupted; stopping after this rollout with a checkpoint (Ctrl-C again to stop now)")

    signal.signal(signal.SIGINT, on_interrupt)
    owns_ray = _start_ray(cfg, plan)
    outcome, code = "finished", ExitCode.OK
    try:
        with Progress(cfg.train.num_rollouts, cfg.logging.progress, cfg.logging.log_every,
                      title=f"fasync train ({cfg.mode})") as progress:
            found, state = resume if resume is not None else (None, None)
            run = Run(cfg, derive(cfg), plan, factory, directory, progress, resume=found, resume_state=state)
            if on_resumed is not None:
                on_resumed()
            driver_for(run).train()
            if run.stop_requested == "interrupted":
                outcome, code = "interrupted", ExitCode.INTERRUPTED
            if cfg.checkpoint.save_final:
                from fasync.checkpoint import latest
                from fasync.checkpoint.state import export_policy

                export_policy(cfg, latest(directory), directory / "export")
    except KeyboardInterrupt:
        outcome, code = "interrupted", ExitCode.INTERRUPTED
        _echo("fasync train: interrupted, stopping all actors")
    except RunFileError as error:
        outcome, code = "failed", ExitCode.FAILED
        _echo(f"fasync train: the run failed: {error}")
    except ConfigurationError as error:  # bad input met while running (a reward that is not a number), here or in
        outcome, code = "failed", ExitCode.FAILED  # an actor, whose RayTaskError is one too: print the original
        _echo(f"fasync train: the run failed: {getattr(error, 'cause', None) or error}")
    except Exception as error:  # noqa: BLE001 - any actor failure ends the run with its message
        outcome, code = "failed", ExitCode.FAILED
        _echo(f"fasync train: the run failed: {type(error).__name__}: {error}")
    finally:
        if run is not None:
            summary = summarize(run, started, outcome)
            try:
                write_json_atomic(directory / "summary.json", summary)
            except RunFileError as error:
                _echo(f"fasync train: {error}")
                code = code or ExitCode.FAILED
            _print_summary(summary, directory, run.ledger.describe())
            run.close()
        if owns_ray:
            ray.shutdown()
    return code
