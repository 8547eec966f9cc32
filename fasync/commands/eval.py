"""`fasync eval`: a run's checkpoint, or the policy it exported, evaluated on its eval set or on another file,
without training: one torch engine in this process generates, the run's reward scores, and the `eval/` metrics
are printed and written to RUN_DIR/eval/step_<step>[-<file>].json (export[-<file>].json)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import typer

from fasync.commands import usage_error
from fasync.exit_codes import ExitCode


def _echo(text: str) -> None:
    typer.echo(text)


def run(run_dir: str, step: int | None, data: str | None, export: str | None = None) -> int:
    """0: evaluated, 1: the run's checkpoint (or `export`), config, reward or eval set cannot be used, 2: no run
    directory, or both `step` and `export`."""
    from fasync.atomic import RunFileError, describe_os_error, write_json_atomic
    from fasync.errors import ConfigurationError

    directory = Path(run_dir)
    if not (directory / "config.yaml").is_file():
        return usage_error(f"fasync eval: {run_dir}: not a fasync run directory (no config.yaml)")
    if step is not None and export is not None:
        return usage_error("fasync eval: --step names a checkpoint and --export an exported policy; give one")
    try:
        policy, cfg, metrics, groups = evaluate_run(directory, step, data, export)
        written = directory / "eval" / (policy.name + (f"-{Path(data).stem}" if data else "") + ".json")
        written.parent.mkdir(exist_ok=True)
        write_json_atomic(written, metrics)
    except (RunFileError, ConfigurationError) as error:
        _echo(f"fasync eval: {error}")
        return ExitCode.FAILED
    except OSError as error:
        _echo(f"fasync eval: cannot write {describe_os_error(directory / 'eval', error)}")
        return ExitCode.FAILED
    _print(policy, metrics, groups, cfg.eval.k, written)
    return ExitCode.OK


@dataclass(frozen=True)
class Policy:
    """The weights evaluated: a checkpoint's, or an export's."""

    name: str
    """The stem of the file the figures go to: `step_000008`, or `export`."""
    description: str
    weights: dict | None
    """The state dict to load into the engine; None: the engine builds the policy from `model.path`."""
    version: int | None


def _policy(cfg, directory: Path, step: int | None, export: str | None):
    """(the config to evaluate with, the tokenizer, the `Policy`) of the checkpoint at `step` or of `export`."""
    from fasync import checkpoint
    from fasync.checkpoint.state import ADAPTER_WEIGHTS, load_policy
    from fasync.errors import ConfigurationError
    from fasync.model import build_tokenizer, lora

    if export is None:
        found = checkpoint.at_step(directory, step)
        model, tokenizer = load_policy(cfg, found)
        # The engine loads the weights without adapters, as in training: a LoRA policy's merged.
        weights = model.state_dict() if cfg.model.lora is None else lora.merged_state_dict(model)
        return cfg, tokenizer, Policy(f"step_{found.step:06d}", f"{found.path.name} (step {found.step})",
                                      weights, found.record.weight_version)
    exported = Path(export)
    if (exported / ADAPTER_WEIGHTS).is_file():
        raise ConfigurationError(f"--export {export}: a LoRA adapter without its model; evaluate the run's "
                                 "checkpoint instead (leave out --export), or export it with --merge")
    if (exported / "fasync_model.json").is_file():  # the embedded model: model.safetensors
        from safetensors.torch import load_file

        record = json.loads((exported / "fasync_model.json").read_text())
        return cfg, build_tokenizer(cfg.model, cfg.data), Policy(
            "export", f"the export {exported} (step {record['step']})", load_file(str(exported / "model.safetensors")),
            record["weight_version"])
    if (exported / "config.json").is_file():  # a Hugging Face model, with its tokenizer
        cfg = cfg.model_copy(update={"model": cfg.model.model_copy(update={"path": str(exported)})})
        return cfg, build_tokenizer(cfg.model, cfg.data), Policy("export", f"the export {exported}", None, None)
    raise ConfigurationError(f"--export {export}: not a policy `fasync export` wrote (no fasync_model.json or "
                             "config.json)")


def evaluate_run(directory: Path, step: int | None, data: str | None, export: str | None = None):
    """(the `Policy` evaluated, the config evaluated with, its `eval/` metrics, the scored eval groups) of the run
    in `directory`: its checkpoint at `step` (None: the newest) or the policy it exported to `export`, on `data`
    (None: the run's own eval set)."""
    from fasync.config.loader import load_config
    from fasync.data.held_out import build_eval_prompts
    from fasync.data.rewards import reward_search_path
    from fasync.data.scoring import RewardRunner
    from fasync.errors import ConfigurationError
    from fasync.eval.evaluation import Evaluator
    from fasync.launch import rundir
    from fasync.launch.plan import resolve
    from fasync.rollout.build import build_engine

    loaded = load_config(str(directory / "config.yaml"))
    if loaded.config is None:
        raise ConfigurationError(f"{directory}/config.yaml: does not load as a fasync config")
    cfg = loaded.config
    if data is not None:
        cfg = cfg.model_copy(update={"eval": cfg.eval.model_copy(update={"path": data, "held_out_prompts": 0})})
    # One torch engine in this process: it loads the weights as the trainer holds them.
    cfg = cfg.model_copy(update={"rollout": cfg.rollout.model_copy(update={"engine": "hf"})})
    search_path = reward_search_path(rundir.recorded_dir(directory, "config_dir") or directory)
    cfg, tokenizer, policy = _policy(cfg, directory, step, export)
    dims = resolve(cfg).model_dims
    prompts = build_eval_prompts(cfg, tokenizer, dims.max_context if dims is not None else None)
    if prompts is None:
        raise ConfigurationError(f"{directory}: the run has no eval set (eval.path, eval.held_out_prompts); "
                                 "name one with --data FILE")
    engine = build_engine(cfg, tokenizer)
    if policy.weights is not None:
        engine.load_weights(policy.weights, policy.version)

    def generate(groups, params) -> None:
        by_id = {gen.request_id: gen for gen in engine.generate([r for g in groups for r in g.requests], params)}
        for group in groups:
            group.requests = [by_id[req.request_id] for req in group.requests]

    evaluator = Evaluator(cfg, tokenizer, RewardRunner(cfg.reward, search_path), prompts, generate)
    metrics = evaluator.evaluate()
    metrics["eval/weight_version"] = policy.version
    return policy, cfg, metrics, evaluator.last_groups


def _print(policy: Policy, metrics: dict, groups, k: int, written: Path) -> None:
    version = "" if policy.version is None else f", weight version {policy.version}"
    _echo(f"fasync eval: {policy.description}{version}: {metrics['eval/prompts']} prompts in "
          f"{metrics['eval/time_s']:.1f} s")
    sources = sorted({key.split("/")[1] for key in metrics if key.count("/") == 2})
    for prefix, label in [("eval/", "all"), *((f"eval/{source}/", source) for source in sources)]:
        _echo(f"  {label:<16} prompts {metrics[prefix + 'prompts']:>4}  reward {metrics[prefix + 'reward_mean']:.3f}"
              f"  mean@{k} {metrics[prefix + 'mean@k']:.3f}  pass@{k} {metrics[prefix + 'pass@k']:.3f}")
    if groups:
        sample = groups[0].samples[0]
        _echo(f"  a sample: {groups[0].prompt!r} -> {sample.completion!r} (label {sample.label!r}, reward "
              f"{sample.reward:g})")
    _echo(f"  written to {written}")
