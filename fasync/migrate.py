"""`fasync import FRAMEWORK SOURCE...`: a fasync config from another framework's config, launch script,
hydra overrides, argparse flags or TRL `GRPOConfig(...)` keywords.

Keys are looked up in the table the loader's hints use (fasync.config.foreign_keys). A value that carries
over as it is is copied; a converted one is computed from the framework's own semantics, and the comment
next to it shows the arithmetic; a key with no equivalent is listed under the config.
"""

from __future__ import annotations

import ast
import math
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import yaml

from fasync.config.fields import flatten, show_value
from fasync.config.foreign_keys import CONVERTED, FRAMEWORKS, NONE, SAME, mappings_for, normalize


@dataclass
class Source:
    """A framework's settings, by the table's spelling of each key, with where each came from."""

    framework: str
    values: dict[str, Any] = field(default_factory=dict)
    written: dict[str, str] = field(default_factory=dict)
    """Table key → the key as written (`--rollout-batch-size`, `actor_rollout_ref.rollout.n`)."""
    script: str = ""
    """The Python entry point a launch script runs (slime's train_async.py), if any."""

    def get(self, key: str, default: Any = None) -> Any:
        return self.values.get(key, default)

    def cite(self, key: str, default: Any = None) -> str:
        """`actor_rollout_ref.rollout.n` 16, or "default 1" when the source does not set it."""
        if key in self.values:
            return f"{self.written.get(key, key)} {show_value(self.values[key])}"
        return f"{key} {show_value(default)} (the {FRAMEWORKS[self.framework]} default)"


@dataclass
class Imported:
    values: dict[str, tuple[Any, str]] = field(default_factory=dict)
    """fasync key → (value, where it came from: the source key and value, with any arithmetic)."""
    unmapped: list[tuple[str, Any, str]] = field(default_factory=list)
    """(key as written, value, why) for what has no fasync equivalent."""

    def set(self, key: str, value: Any, why: str) -> None:
        self.values[key] = (value, why)


# --- reading sources ---------------------------------------------------------------------------------------

def _scalar(text: str) -> Any:
    for number in (int, float):  # YAML 1.1 reads 1e-6 as a string
        try:
            return number(text)
        except ValueError:
            pass
    try:
        return yaml.safe_load(text) if text != "" else ""
    except yaml.YAMLError:
        return text


def _shell_words(text: str) -> tuple[list[str], str]:
    """The words of a launch script or command line, with `NAME=value` variables substituted, and the Python
    script it runs."""
    text = re.sub(r"\\\n", " ", text)
    variables: dict[str, str] = {}
    words: list[str] = []
    for line in text.splitlines():
        line = line.split(" #")[0] if not line.lstrip().startswith("#") else ""
        assignment = re.fullmatch(r"\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)=(\S*)\s*", line)
        if assignment:
            variables[assignment[1]] = _substitute(assignment[2].strip("\"'"), variables)
            continue
        try:
            words += [_substitute(word, variables) for word in shlex.split(line)]
        except ValueError:
            words += line.split()
    script = next((w for w in words if w.endswith(".py")), "")
    return words, script


def _substitute(word: str, variables: dict[str, str]) -> str:
    word = re.sub(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", lambda m: variables.get(m[1], m[0]), word)
    arithmetic = re.fullmatch(r"\$\(\(([0-9+\-*/() ]+)\)\)", word)
    return str(eval(arithmetic[1].replace("/", "//"), {"__builtins__": {}})) if arithmetic else word  # noqa: S307


def _words_to_settings(words: list[str]) -> dict[str, Any]:
    """`--flag value`, `--flag=value`, `--flag` (true), hydra's `key=value`, `+key=value`, `~key`."""
    out: dict[str, Any] = {}
    index = 0
    while index < len(words):
        word = words[index]
        index += 1
        if word.startswith("--") and len(word) > 2:
            name, eq, value = word[2:].partition("=")
            if not eq:
                if index < len(words) and not words[index].startswith("--") and "=" not in words[index]:
                    value = words[index]
                    index += 1
                else:
                    value = "true"
            out[name] = _scalar(value)
        elif word.startswith("~"):
            out.pop(word[1:], None)
        elif "=" in word and re.match(r"\+{0,2}[A-Za-z_][\w.\-]*=", word):
            name, _, value = word.lstrip("+").partition("=")
            out[name] = _scalar(value)
    return out


def _grpo_config_keywords(text: str) -> dict[str, Any]:
    """The literal keywords of a `GRPOConfig(...)` call, or of a bare `key=value, ...` list."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        tree = ast.parse(f"GRPOConfig({text})")
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")).endswith("Config"):
            out = {}
            for keyword in node.keywords:
                try:
                    out[keyword.arg] = ast.literal_eval(keyword.value)
                except ValueError:
                    continue
            return out
    return {}


def read(framework: str, sources: list[str]) -> Source:
    """Every SOURCE in order, later ones overriding earlier ones: files (YAML, TOML, a launch script, Python
    with a GRPOConfig), else command-line words."""
    settings: dict[str, Any] = {}
    script = ""
    words: list[str] = []
    for item in sources:
        path = Path(item)
        if path.is_file():
            text = path.read_text(encoding="utf-8")
            if path.suffix == ".toml":
                import tomllib

                settings.update(flatten(tomllib.loads(text)))
            elif path.suffix in (".yaml", ".yml", ".json"):
                settings.update(flatten(yaml.safe_load(text) or {}))
            elif path.suffix == ".py" or "GRPOConfig(" in text:
                settings.update(_grpo_config_keywords(text))
            else:
                found, script = _shell_words(text)
                settings.update(_words_to_settings(found))
        else:
            words.append(item)
    if words:
        found, named = _shell_words(shlex.join(words) if len(words) > 1 else words[0])
        settings.update(_words_to_settings(found))
        script = script or named
    source = Source(framework, script=script)
    for written, value in settings.items():
        rows = mappings_for(written.split("."), framework)
        key = next((row.source for row in rows if row.framework == framework and not row.source.endswith("*")),
                   normalize(written))
        source.values[key] = value
        source.written[key] = written
    return source


# --- translating -------------------------------------------------------------------------------------------

def translate(source: Source) -> Imported:
    out = Imported()
    converted = _CONVERTERS[source.framework](source, out) | _trackers(source, out)
    by_hand = []
    for key, value in source.values.items():
        rows = [r for r in mappings_for(key.split("."), source.framework) if r.framework == source.framework]
        written = source.written.get(key, key)
        if not rows or rows[0].kind == NONE:
            out.unmapped.append((written, value, rows[0].note if rows else "not in fasync's table"))
        elif rows[0].kind == SAME:
            for target in rows[0].targets:
                if target not in out.values:
                    out.set(target, value, f"{FRAMEWORKS[source.framework]} {written}: {show_value(value)}")
        elif rows[0].kind == CONVERTED and key not in converted:
            by_hand.append((key, written, value, rows[0].note))
    # Last: the interval's conversion needs the geometry every other key has set.
    converted |= _checkpoint_interval(source, out)
    out.unmapped += [(written, value, f"converted by hand: {note}")
                     for key, written, value, note in by_hand if key not in converted]
    return out


ROLLOUT_INTERVALS = {"verl": ("trainer.save_freq",), "slime": ("save_interval",), "miles": ("save_interval",),
                     "areal": ("saver.freq_steps",), "openrlhf": ("ckpt.save_steps", "save_steps")}
"""Checkpoint intervals a framework counts in rollouts (its training or global steps); fasync's `checkpoint.every`
counts optimizer steps."""


def _checkpoint_interval(source: Source, out: Imported) -> set[str]:
    """`checkpoint.every` from an interval counted in rollouts: × the imported config's optimizer steps per rollout
    (`fasync.config.derived`, with fasync's defaults for what the source does not set)."""
    key = next((k for k in ROLLOUT_INTERVALS.get(source.framework, ()) if k in source.values), None)
    steps = _steps_per_rollout(out) if key is not None else None
    if steps is None:
        return set()
    every = source.get(key) * steps
    out.set("checkpoint.every", every, f"{source.cite(key)} rollouts × {steps} optimizer "
            f"step{'s' * (steps != 1)} per rollout = {every} optimizer steps")
    return {key}


def _steps_per_rollout(out: Imported) -> int | None:
    """The imported config's optimizer steps per rollout; None when its geometry does not validate (the linter
    then says why, and the interval is left to convert by hand)."""
    from pydantic import ValidationError

    from fasync.config.derived import derive
    from fasync.config.schema import FasyncConfig

    nested: dict = {}
    for key, (value, _) in out.values.items():
        head, _, name = key.partition(".")
        if name:
            nested.setdefault(head, {})[name] = value
        else:
            nested[head] = value
    try:
        return derive(FasyncConfig.model_validate(nested)).num_steps_per_rollout
    except (ValidationError, ValueError, ZeroDivisionError):
        return None


TRACKERS = ("tensorboard", "wandb", "mlflow")


def _trackers(source: Source, out: Imported) -> set[str]:
    """`logging.backends` (and W&B's mode) from the experiment trackers the source logs to; jsonl is always on."""
    found: dict[str, str] = {}
    framework = source.framework
    if framework == "verl" and "trainer.logger" in source.values:
        loggers = source.get("trainer.logger")
        loggers = yaml.safe_load(loggers) if isinstance(loggers, str) else loggers
        for name in [loggers] if isinstance(loggers, str) else loggers or []:
            if name in TRACKERS:
                found[name] = source.cite("trainer.logger")
    if framework == "trl" and "report_to" in source.values:
        wanted = source.get("report_to")
        wanted = TRACKERS if wanted == "all" else [wanted] if isinstance(wanted, str) else wanted or []
        found.update({name: source.cite("report_to") for name in wanted if name in TRACKERS})
    if framework in ("slime", "miles", "openrlhf") and source.get("use_wandb"):
        found["wandb"] = source.cite("use_wandb")
    if framework == "openrlhf" and source.get("use_tensorboard"):
        found["tensorboard"] = source.cite("use_tensorboard")
    if framework == "areal":
        mode = source.get("stats_logger.wandb.mode")
        if mode in ("online", "offline"):
            found["wandb"] = source.cite("stats_logger.wandb.mode")
            out.set("logging.wandb_mode", mode, source.cite("stats_logger.wandb.mode"))
        if source.get("stats_logger.tensorboard.path"):
            found["tensorboard"] = source.cite("stats_logger.tensorboard.path")
    if found:
        out.set("logging.backends", ["jsonl", *found], "; ".join(dict.fromkeys(found.values())))
    return {"trainer.logger", "report_to", "use_wandb", "use_tensorboard", "stats_logger.wandb.mode",
            "stats_logger.tensorboard.path"}


def _ceil_staleness(source: Source, key: str, out: Imported) -> None:
    if key in source.values:
        threshold = float(source.get(key))
        out.set("async.max_weight_staleness", math.ceil(threshold),
                f"ceil({source.cite(key)}) = {math.ceil(threshold)}: verl's threshold is a fraction of extra samples "
                "per sync, trained up to one sync later")


def _verl(source: Source, out: Imported) -> set[str]:
    fully_async = any(k.startswith("async_training.") for k in source.values)
    out.set("mode", "fully_async" if fully_async else "sync",
            "verl's fully-async recipe (async_training.*)" if fully_async else "verl's PPO trainer is synchronous")
    n = source.get("actor_rollout_ref.rollout.n", 1)
    mini = source.get("actor_rollout_ref.actor.ppo_mini_batch_size")
    if mini is not None:
        out.set("train.global_batch_size", mini * n, f"{source.cite('actor_rollout_ref.actor.ppo_mini_batch_size')} "
                f"prompts × {source.cite('actor_rollout_ref.rollout.n', 1)} = {mini * n} samples")
    if fully_async and mini is not None:
        batches = source.get("async_training.require_batches", 1)
        out.set("rollout.batch_size", batches * mini,
                f"{source.cite('async_training.require_batches', 1)} × ppo_mini_batch_size {mini} = {batches * mini} "
                f"prompts per drain, {batches} optimizer step{'s' * (batches != 1)}")
        total = source.get("rollout.total_rollout_steps")
        if total is not None:
            out.set("train.num_rollouts", max(total // (batches * mini), 1),
                    f"{source.cite('rollout.total_rollout_steps')} prompts / {batches * mini} per drain")
        out.set("correction.ratio_anchor", *_verl_anchor(source))
    _ceil_staleness(source, "async_training.staleness_threshold", out)
    if source.get("actor_rollout_ref.actor.use_kl_loss"):
        coef = source.get("actor_rollout_ref.actor.kl_loss_coef", 0.001)
        out.set("train.kl_coef", coef, f"use_kl_loss with {source.cite('actor_rollout_ref.actor.kl_loss_coef', 0.001)}")
    return {"actor_rollout_ref.actor.ppo_mini_batch_size", "async_training.require_batches",
            "async_training.staleness_threshold", "rollout.total_rollout_steps", "async_training.use_rollout_log_probs",
            "async_training.compute_prox_log_prob", "actor_rollout_ref.actor.use_kl_loss",
            "actor_rollout_ref.actor.kl_loss_coef"}


def _verl_anchor(source: Source) -> tuple[str, str]:
    if source.get("async_training.compute_prox_log_prob"):
        return "proximal", f"{source.cite('async_training.compute_prox_log_prob')}: decoupled PPO"
    if source.get("async_training.use_rollout_log_probs", True):
        return "behaviour", f"{source.cite('async_training.use_rollout_log_probs', True)}: the rollout's logprobs"
    return "recompute", f"{source.cite('async_training.use_rollout_log_probs')}: recomputed logprobs"


def _slime(source: Source, out: Imported) -> set[str]:
    if source.get("fully_async"):
        out.set("mode", "fully_async", f"{source.cite('fully_async')}")
    elif source.script.endswith("train_async.py"):
        out.set("mode", "async", f"{source.script} overlaps the next rollout with training (one step off)")
        if "async.max_weight_staleness" not in out.values:
            out.set("async.max_weight_staleness", 1, f"{source.script}: one rollout ahead")
    else:
        out.set("mode", "sync", f"{source.script or 'train.py'} trains each rollout before the next")
    if source.get("use_kl_loss"):
        out.set("train.kl_coef", source.get("kl_loss_coef", 0.0), f"use_kl_loss with {source.cite('kl_loss_coef', 0.0)}")
    if source.get("use_tis"):
        out.set("correction.level", "token", f"{source.cite('use_tis')}: truncated importance sampling per token")
    return {"fully_async", "use_kl_loss", "kl_loss_coef", "use_tis"}


def _areal(source: Source, out: Imported) -> set[str]:
    out.set("mode", "fully_async", "AReaL streams rollouts and syncs weights after every step")
    decoupled = source.get("actor.use_decoupled_loss")
    if decoupled:
        out.set("correction.ratio_anchor", "proximal", f"{source.cite('actor.use_decoupled_loss')}: decoupled PPO")
        out.set("correction.level", "token", "decoupled PPO's behaviour importance weight")
    elif source.get("actor.recompute_logprob"):
        out.set("correction.ratio_anchor", "recompute", source.cite("actor.recompute_logprob"))
    concurrent = source.get("rollout.max_concurrent_rollouts")
    if concurrent is not None:
        n = source.get("gconfig.n_samples", 1)
        out.set("async.max_concurrent_samples", concurrent * n,
                f"{source.cite('rollout.max_concurrent_rollouts')} episodes × {source.cite('gconfig.n_samples', 1)}")
    upper = source.get("actor.rejection_sampling.upper")
    if upper is not None:
        out.set("correction.reject_token_ratio", [0.0, upper], f"{source.cite('actor.rejection_sampling.upper')}: "
                "tokens whose ratio exceeds it are masked")
    return {"actor.use_decoupled_loss", "actor.recompute_logprob", "rollout.max_concurrent_rollouts",
            "actor.rejection_sampling.upper"}


def _prime_rl(source: Source, out: Imported) -> set[str]:
    out.set("mode", "fully_async", "prime-rl's orchestrator streams rollouts to the trainer")
    batch, group = source.get("orchestrator.batch_size"), source.get("orchestrator.group_size", 1)
    if batch is not None:
        out.set("train.global_batch_size", batch, f"{source.cite('orchestrator.batch_size')} samples per step")
        out.set("rollout.batch_size", max(batch // group, 1),
                f"{source.cite('orchestrator.batch_size')} / {source.cite('orchestrator.group_size', 1)} prompts")
    if "orchestrator.max_off_policy_steps" not in source.values:
        out.set("async.max_weight_staleness", 8, "orchestrator.max_off_policy_steps 8 (the prime-rl default)")
    return {"orchestrator.batch_size"}


def _openrlhf(source: Source, out: Imported) -> set[str]:
    partial = source.get("train.partial_rollout_enable") or source.get("partial_rollout_enable")
    asynchronous = source.get("train.async_enable") or source.get("async_train")
    if partial:
        out.set("mode", "fully_async", "partial rollout: fasync resumes generations across a sync only in fully_async")
        out.set("async.partial_rollout", True, "train.partial_rollout_enable")
    else:
        out.set("mode", "async" if asynchronous else "sync",
                "train.async_enable: whole rollouts overlap training" if asynchronous else "OpenRLHF trains synchronously")
    if asynchronous or partial:
        queue = source.get("train.async_queue_size", 1)
        out.set("async.max_weight_staleness", queue, f"{source.cite('train.async_queue_size', 1)} rollouts ahead")
    return {"train.partial_rollout_enable", "partial_rollout_enable", "train.async_enable", "async_train",
            "train.async_queue_size"}


def _trl(source: Source, out: Imported) -> set[str]:
    per_device = source.get("per_device_train_batch_size", 8)
    accumulation = source.get("gradient_accumulation_steps", 1)
    processes = source.get("num_processes", 1)
    generations = source.get("num_generations", 8)
    steps_per_generation = source.get("steps_per_generation", accumulation)
    samples = source.get("generation_batch_size", per_device * processes * steps_per_generation)
    out.set("rollout.n_samples_per_prompt", generations, source.cite("num_generations", 8))
    out.set("train.global_batch_size", per_device * processes * accumulation,
            f"{source.cite('per_device_train_batch_size', 8)} × {source.cite('num_processes', 1)} processes × "
            f"{source.cite('gradient_accumulation_steps', 1)} = {per_device * processes * accumulation} samples")
    out.set("rollout.batch_size", max(samples // generations, 1),
            f"{per_device} × {processes} × {source.cite('steps_per_generation', accumulation)} = {samples} samples per "
            f"generation / {generations} generations = {samples // generations} prompts")
    if processes > 1:
        out.set("resources.trainer_ranks", processes, source.cite("num_processes"))
    if "max_staleness" in source.values:
        out.set("mode", "fully_async", f"{source.cite('max_staleness')}: TRL's async GRPO")
    else:
        out.set("mode", "sync", "TRL's GRPOTrainer generates, then trains")
    if "weight_sync_steps" in source.values:
        steps_per_drain = max(samples // (per_device * processes * accumulation), 1)
        interval = max(source.get("weight_sync_steps") // steps_per_drain, 1)
        out.set("async.update_weights_interval", interval,
                f"{source.cite('weight_sync_steps')} optimizer steps / {steps_per_drain} per generation = {interval}")
    return {"gradient_accumulation_steps", "steps_per_generation", "generation_batch_size", "num_processes",
            "weight_sync_steps"}


_CONVERTERS: dict[str, Callable[[Source, Imported], set[str]]] = {
    "verl": _verl, "slime": _slime, "miles": _slime, "areal": _areal, "prime-rl": _prime_rl,
    "openrlhf": _openrlhf, "trl": _trl}


# --- writing -----------------------------------------------------------------------------------------------

def _yaml(value: Any) -> str:
    """A value as a YAML flow scalar that reads back as the same type (1.0e-06, not 1e-06, which is a string)."""
    return yaml.safe_dump(value, default_flow_style=True, width=10_000).strip().removesuffix("...").strip()


def render(framework: str, sources: list[str], imported: Imported) -> str:
    """The fasync config as YAML, each value with a comment naming where it came from."""
    lines = [f"# Imported by `fasync import {framework} {' '.join(sources)}`: each value names the "
             f"{FRAMEWORKS[framework]} setting it came from."]
    values = dict(sorted(imported.values.items(), key=lambda kv: (kv[0] != "mode", kv[0])))
    section = None
    for key, (value, why) in values.items():
        head, _, name = key.partition(".")
        if not name:
            lines.append(f"{head}: {_yaml(value)}  # {why}")
            continue
        if head != section:
            lines.append(f"{head}:")
            section = head
        lines.append(f"  {name}: {_yaml(value)}  # {why}")
    if imported.unmapped:
        lines += ["", f"# No fasync equivalent ({len(imported.unmapped)}):"]
        lines += [f"#   {key}: {show_value(value)}  ({why})" for key, value, why in imported.unmapped]
    return "\n".join(lines) + "\n"


def import_config(framework: str, sources: list[str]) -> tuple[str, Imported]:
    imported = translate(read(framework, sources))
    return render(framework, sources, imported), imported


# --- the other way: a fasync config in a framework's terms --------------------------------------------------

@dataclass
class Expressed:
    """A fasync config's geometry, mode and staleness as one framework writes them."""

    framework: str
    entry: str
    """What a launch script runs (`python3 train_async.py`), or the file kind (yaml, toml, python)."""
    settings: list[tuple[str, Any, str]] = field(default_factory=list)
    """(key as the framework writes it, value, the fasync quantity it carries)."""
    missing: list[str] = field(default_factory=list)
    """What the framework cannot say of this config: reading it back with `fasync import` gives another run."""

    def put(self, key: str, value: Any, why: str) -> None:
        self.settings.append((key, value, why))


def express(framework: str, cfg, derived) -> Expressed:
    """`cfg` (a FasyncConfig) as `framework`'s settings, computed by that framework's semantics, which
    `fasync import` reads back to the same derived quantities; what it cannot express is listed."""
    return _EXPRESSERS[framework](cfg, derived)


def _geometry(cfg, derived) -> tuple[int, int, int, int, Any, int]:
    """(prompts, samples per prompt, samples per step, steps per drain, staleness bound, sync interval)."""
    return (cfg.rollout.batch_size, cfg.rollout.n_samples_per_prompt, derived.effective_global_batch_size,
            derived.num_steps_per_rollout, cfg.async_.max_weight_staleness, cfg.async_.update_weights_interval)


def _untrimmed(out: Expressed, derived) -> None:
    if derived.trimmed_samples_per_rollout:
        out.missing.append(f"{derived.trimmed_samples_per_rollout} samples per rollout that fasync trims: "
                           f"{FRAMEWORKS[out.framework]} trains every sample it generates")


def _prompts_per_step(out: Expressed, samples_per_step: int, n: int) -> int:
    if samples_per_step % n:
        out.missing.append(f"a step of {samples_per_step} samples with {n} per prompt: {FRAMEWORKS[out.framework]} "
                           "counts whole prompts per mini-batch")
    return max(samples_per_step // n, 1)


def _no_interval(out: Expressed, interval: int) -> None:
    if interval != 1:
        out.missing.append(f"async.update_weights_interval {interval}: {FRAMEWORKS[out.framework]} syncs the "
                           "weights after every training step")


def _as_verl(cfg, derived) -> Expressed:
    prompts, n, per_step, steps, bound, interval = _geometry(cfg, derived)
    fully_async = cfg.mode != "sync"
    out = Expressed("verl", "python3 -m verl.experimental.fully_async_policy.fully_async_main" if fully_async
                    else "python3 -m verl.trainer.main_ppo")
    mini = _prompts_per_step(out, per_step, n)
    out.put("actor_rollout_ref.rollout.n", n, "rollout.n_samples_per_prompt")
    out.put("actor_rollout_ref.actor.ppo_mini_batch_size", mini, f"{per_step} samples per step / {n}")
    _untrimmed(out, derived)
    if not fully_async:
        out.put("data.train_batch_size", prompts, "rollout.batch_size")
        out.put("trainer.total_training_steps", cfg.train.num_rollouts, "train.num_rollouts")
        return out
    if cfg.mode == "async":
        out.missing.append("mode async: verl's asynchronous recipe is the fully-async one (mode: fully_async)")
    if bound is None:
        out.missing.append("no staleness bound: verl's staleness_threshold is always a number")
    out.put("data.train_batch_size", 0, "the fully-async recipe fetches require_batches mini-batches instead")
    out.put("async_training.require_batches", steps, f"{steps} optimizer steps per drain of {prompts} prompts")
    out.put("async_training.staleness_threshold", float(bound or 0), f"async.max_weight_staleness {bound}")
    out.put("async_training.trigger_parameter_sync_step", interval, "async.update_weights_interval")
    out.put("async_training.partial_rollout", cfg.async_.partial_rollout, "async.partial_rollout")
    out.put("rollout.total_rollout_steps", cfg.train.num_rollouts * prompts,
            f"{cfg.train.num_rollouts} drains × {prompts} prompts")
    return out


def _as_slime(framework: str):
    def express_slime(cfg, derived) -> Expressed:
        prompts, n, per_step, steps, bound, interval = _geometry(cfg, derived)
        script = {"sync": "train.py", "async": "train_async.py", "fully_async": "train_async.py"}[cfg.mode]
        out = Expressed(framework, f"python3 {script}")
        out.put("rollout-batch-size", prompts, "rollout.batch_size")
        out.put("n-samples-per-prompt", n, "rollout.n_samples_per_prompt")
        out.put("global-batch-size", per_step, "samples per optimizer step")
        out.put("num-steps-per-rollout", steps, "optimizer steps per rollout")
        out.put("num-rollout", cfg.train.num_rollouts, "train.num_rollouts")
        out.put("update-weights-interval", interval, "async.update_weights_interval")
        _untrimmed(out, derived)
        if cfg.mode == "async" and bound != 1:
            out.missing.append(f"async.max_weight_staleness {bound}: {FRAMEWORKS[framework]}'s train_async.py runs "
                               "exactly one rollout ahead")
        if cfg.mode == "fully_async":
            if framework == "slime":
                out.missing.append("mode fully_async: slime overlaps one rollout (train_async.py); miles streams")
            else:
                out.put("fully-async", True, "mode fully_async")
                if bound is None:
                    out.missing.append("no staleness bound: miles's max_weight_staleness is always a number")
                else:
                    out.put("max-weight-staleness", bound, "async.max_weight_staleness")
                if cfg.async_.partial_rollout:  # a store_true flag: absent is false
                    out.put("partial-rollout", True, "async.partial_rollout")
        return out
    return express_slime


def _streaming_bound(out: Expressed, cfg, key: str) -> None:
    """Frameworks that always stream (AReaL, prime-rl): the bound is a number, 0 their closest to sync."""
    name, bound = FRAMEWORKS[out.framework], cfg.async_.max_weight_staleness
    if cfg.mode != "fully_async":
        out.missing.append(f"mode {cfg.mode}: {name} always streams ({key} 0 is its closest to sync)")
    elif bound is None:
        out.missing.append(f"no staleness bound: {name}'s {key} is always a number")
    out.put(key, bound if bound is not None else 0, "async.max_weight_staleness")


def _as_areal(cfg, derived) -> Expressed:
    prompts, n, per_step, steps, bound, interval = _geometry(cfg, derived)
    out = Expressed("areal", "yaml")
    out.put("train_dataset.batch_size", prompts, "rollout.batch_size: prompts per training step")
    out.put("gconfig.n_samples", n, "rollout.n_samples_per_prompt")
    out.put("actor.ppo_n_minibatches", steps, "optimizer steps per drain")
    _streaming_bound(out, cfg, "rollout.max_head_offpolicyness")
    _untrimmed(out, derived)
    _no_interval(out, interval)
    return out


def _as_prime_rl(cfg, derived) -> Expressed:
    prompts, n, per_step, steps, bound, interval = _geometry(cfg, derived)
    out = Expressed("prime-rl", "toml")
    if steps != 1:
        out.missing.append(f"{steps} optimizer steps per drain: prime-rl takes one step per batch")
    out.put("max_steps", cfg.train.num_rollouts, "train.num_rollouts")
    out.put("orchestrator.batch_size", prompts * n, f"{prompts} prompts × {n} samples per step")
    out.put("orchestrator.group_size", n, "rollout.n_samples_per_prompt")
    _streaming_bound(out, cfg, "orchestrator.max_off_policy_steps")
    _no_interval(out, interval)
    return out


def _as_openrlhf(cfg, derived) -> Expressed:
    prompts, n, per_step, steps, bound, interval = _geometry(cfg, derived)
    out = Expressed("openrlhf", "python3 -m openrlhf.cli.train_ppo_ray")
    out.put("rollout.batch_size", prompts, "rollout.batch_size")
    out.put("rollout.n_samples_per_prompt", n, "rollout.n_samples_per_prompt")
    out.put("train.batch_size", per_step, "samples per optimizer step")
    _untrimmed(out, derived)
    _no_interval(out, interval)
    if cfg.mode == "sync":
        return out
    if cfg.mode == "fully_async":
        out.put("train.partial_rollout_enable", True, "fully_async: OpenRLHF streams with partial rollout")
        if not cfg.async_.partial_rollout:
            out.missing.append("fully_async without partial rollout: OpenRLHF streams only with partial rollout")
    else:
        out.put("train.async_enable", True, "mode async")
    out.put("train.async_queue_size", bound if bound is not None else 1, "async.max_weight_staleness")
    if bound is None:
        out.missing.append("no staleness bound: OpenRLHF's queue always holds a number of rollouts")
    return out


def _as_trl(cfg, derived) -> Expressed:
    prompts, n, per_step, steps, bound, interval = _geometry(cfg, derived)
    out = Expressed("trl", "python")
    micro = derived.micro_batch_size if per_step % derived.micro_batch_size == 0 else per_step
    accumulation = per_step // micro
    out.put("per_device_train_batch_size", micro, "train.micro_batch_size")
    out.put("gradient_accumulation_steps", accumulation, f"{per_step} samples per step / {micro}")
    out.put("num_generations", n, "rollout.n_samples_per_prompt")
    out.put("steps_per_generation", steps * accumulation, f"{steps} optimizer steps × {accumulation} micro-steps each")
    _untrimmed(out, derived)
    if cfg.mode == "async":
        out.missing.append("mode async: TRL's asynchronous GRPO streams (mode: fully_async)")
    if cfg.mode != "sync":
        out.put("max_staleness", bound if bound is not None else 0, "async.max_weight_staleness")
        out.put("weight_sync_steps", interval * steps, f"{interval} drains × {steps} optimizer steps")
        if bound is None:
            out.missing.append("no staleness bound: TRL's max_staleness is always a number")
    return out


_EXPRESSERS: dict[str, Callable[[Any, Any], Expressed]] = {
    "verl": _as_verl, "slime": _as_slime("slime"), "miles": _as_slime("miles"), "areal": _as_areal,
    "prime-rl": _as_prime_rl, "openrlhf": _as_openrlhf, "trl": _as_trl}


def render_expressed(out: Expressed, config_name: str) -> str:
    """The settings in the framework's own syntax (hydra overrides, argparse flags, YAML, TOML or a
    `GRPOConfig(...)`), which `fasync import` reads back."""
    name = FRAMEWORKS[out.framework]
    head = [f"# {config_name} in {name}'s terms (`fasync config show --as {out.framework}`); "
            f"`fasync import {out.framework}` reads it back."]
    head += [f"# not expressible in {name}: {what}" for what in out.missing]
    if out.entry == "yaml":
        nested: dict = {}
        for key, value, _ in out.settings:
            *parents, leaf = key.split(".")
            node = nested
            for parent in parents:
                node = node.setdefault(parent, {})
            node[leaf] = value
        body = yaml.safe_dump(nested, sort_keys=False).rstrip().splitlines()
    elif out.entry == "toml":
        top = [f"{key} = {_toml(value)}" for key, value, _ in out.settings if "." not in key]
        sections: dict[str, list[str]] = {}
        for key, value, _ in out.settings:
            if "." in key:
                section, _, leaf = key.rpartition(".")
                sections.setdefault(section, []).append(f"{leaf} = {_toml(value)}")
        body = top + [line for section, lines in sections.items() for line in ("", f"[{section}]", *lines)]
    elif out.entry == "python":
        arguments = ", ".join(f"{key}={value!r}" for key, value, _ in out.settings)
        body = ["from trl import GRPOConfig", f"args = GRPOConfig(output_dir='out', {arguments})"]
    else:
        hydra = out.framework == "verl"
        words = [f"{key}={_hydra(value)}" if hydra else f"--{key} {_flag(value)}".rstrip()
                 for key, value, _ in out.settings]
        body = [f"{out.entry} \\"] + [f"    {word} \\" for word in words[:-1]] + [f"    {words[-1]}"]
    why = [f"#   {key}: {why}" for key, _, why in out.settings]
    return "\n".join(head + body + ["", "# where each value comes from:"] + why) + "\n"


def _toml(value: Any) -> str:
    return "true" if value is True else "false" if value is False else repr(value)


def _hydra(value: Any) -> str:
    return "True" if value is True else "False" if value is False else str(value)


def _flag(value: Any) -> str:
    """argparse: a store_true flag takes no value."""
    return "" if value is True else str(value)
