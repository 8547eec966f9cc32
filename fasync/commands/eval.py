"""`fasync eval`: a finished (or stopped) run's checkpoint evaluated on its eval set, or on another file, without
training: one torch engine in this process generates, the run's reward scores, and the `eval/` metrics are
printed and written to RUN_DIR/eval/step_<step>[-<file>].json."""

from __future__ import annotations

from pathlib import Path

import typer

from fasync.commands import usage_error
from fasync.exit_codes import ExitCode


def _echo(text: str) -> None:
    typer.echo(text)


def run(run_dir: str, step: int | None, data: str | None) -> int:
    """0: evaluated, 1: the run's checkpoint, config, reward or eval set cannot be used, 2: no run directory."""
    from fasync.atomic import RunFileError, describe_os_error, write_json_atomic
    from fasync.errors import ConfigurationError

    directory = Path(run_dir)
    if not (directory / "config.yaml").is_file():
        return usage_error(f"fasync eval: {run_dir}: not a fasync run directory (no config.yaml)")
    try:
        found, cfg, metrics, groups = evaluate_run(directory, step, data)
        written = directory / "eval" / (f"step_{found.step:06d}" + (f"-{Path(data).stem}" if data else "") + ".json")
        written.parent.mkdir(exist_ok=True)
        write_json_atomic(written, metrics)
    except (RunFileError, ConfigurationError) as error:
        _echo(f"fasync eval: {error}")
        return ExitCode.FAILED
    except OSError as error:
        _echo(f"fasync eval: cannot write {describe_os_error(directory / 'eval', error)}")
        return ExitCode.FAILED
    _print(found, metrics, groups, cfg.eval.k, written)
    return ExitCode.OK


def evaluate_run(directory: Path, step: int | None, data: str | None):
    """(the checkpoint, the config evaluated with, its `eval/` metrics, the scored eval groups) of the run in `directory` at `step` (None: the
    newest), on `data` (None: the run's own eval set)."""
    from fasync import checkpoint
    from fasync.checkpoint.state import load_policy
    from fasync.config.loader import load_config
    from fasync.data.rewards import build_reward, extend_import_path
    from fasync.errors import ConfigurationError
    from fasync.eval.evaluation import Evaluator
    from fasync.eval.prompts import build_eval_prompts
    from fasync.launch import rundir
    from fasync.launch.plan import resolve
    from fasync.rollout.build import build_engine

    loaded = load_config(str(directory / "config.yaml"))
    if loaded.config is None:
        raise ConfigurationError(f"{directory}/config.yaml: does not load as a fasync config")
    cfg = loaded.config
    if data is not None:
        cfg = cfg.model_copy(update={"eval": cfg.eval.model_copy(update={"path": data, "held_out_prompts": 0})})
    # One torch engine in this process: it loads the checkpoint's weights as the trainer holds them.
    cfg = cfg.model_copy(update={"rollout": cfg.rollout.model_copy(update={"engine": "hf"})})
    found = checkpoint.at_step(directory, step)
    extend_import_path(rundir.recorded_dir(directory, "config_dir") or directory)
    model, tokenizer = load_policy(cfg, found)
    dims = resolve(cfg).model_dims
    prompts = build_eval_prompts(cfg, tokenizer, dims.max_context if dims is not None else None)
    if prompts is None:
        raise ConfigurationError(f"{directory}: the run has no eval set (eval.path, eval.held_out_prompts); "
                                 "name one with --data FILE")
    engine = build_engine(cfg, tokenizer)
    engine.load_weights(model.state_dict(), found.record.weight_version)

    def generate(groups, params) -> None:
        by_id = {gen.request_id: gen for gen in engine.generate([r for g in groups for r in g.requests], params)}
        for group in groups:
            group.requests = [by_id[req.request_id] for req in group.requests]

    evaluator = Evaluator(cfg, tokenizer, build_reward(cfg.reward), prompts, generate)
    metrics = evaluator.evaluate()
    return found, cfg, metrics, evaluator.last_groups


def _print(found, metrics: dict, groups, k: int, written: Path) -> None:
    _echo(f"fasync eval: {found.path.name} (step {found.step}, weight version {metrics['eval/weight_version']}), "
          f"{metrics['eval/prompts']} prompts in {metrics['eval/time_s']:.1f} s")
    sources = sorted({key.split("/")[1] for key in metrics if key.count("/") == 2})
    for prefix, label in [("eval/", "all"), *((f"eval/{source}/", source) for source in sources)]:
        _echo(f"  {label:<16} prompts {metrics[prefix + 'prompts']:>4}  reward {metrics[prefix + 'reward_mean']:.3f}"
              f"  mean@{k} {metrics[prefix + 'mean@k']:.3f}  pass@{k} {metrics[prefix + 'pass@k']:.3f}")
    if groups:
        sample = groups[0].samples[0]
        _echo(f"  a sample: {groups[0].prompt!r} -> {sample.completion!r} (label {sample.label!r}, reward "
              f"{sample.reward:g})")
    _echo(f"  written to {written}")
