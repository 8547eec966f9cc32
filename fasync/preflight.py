"""`fasync check --preflight`: the live environment against the config, before a run starts.

Where `fasync check` reads only the config, these checks look at what the run will meet: the Ray
cluster, the installed packages, the model directory and the dataset. Each finding is an ordinary
diagnostic located at the key that asked for it. They import Ray only to look at a cluster that is
running (`resources.ray_address`, or the one this process is connected to), and test vLLM and torch
in a subprocess, so a broken install is a finding, not a crash.

| code | severity | what |
|---|---|---|
| E001 | error | the cluster has fewer GPUs or CPUs than the plan (fasync/launch/plan.py) reserves |
| E002 | error | `rollout.engine: vllm`, but vLLM and torch do not import together |
| E003 | error | `model.path` lacks a config.json or a tokenizer |
| E004 | error | the model's context is shorter than the longest prompt + `rollout.max_new_tokens` |
| E005 | error | `data.path` is missing or unreadable, or a record lacks the prompt or label or has one of the wrong shape |
| E006 | info  | no running cluster to compare: fasync will start a local one |
| E007 | error | a tracker in `logging.backends` whose package is not installed (every check, not only --preflight) |
| E008 | error | `rollout.function` or `rollout.env` does not import from the working directory, the config's directory or PYTHONPATH |
| E009 | info  | the dataset as loaded: its size, its longest prompt in tokens and one prompt as the model is fed it |
| E010 | error | `reward.function`'s module is not found (every check, without importing it); with --preflight, it cannot be imported or called, or `reward.url` does not answer |
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from fasync.config.loader import LoadResult
from fasync.diagnostics import Diagnostic
from fasync.errors import ConfigurationError
from fasync.lint.environment import finding
from fasync.memory import DATASET_PROMPT_TOKENS

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")
IMPORT_PAIR = "import torch, vllm; print(torch.__version__, vllm.__version__)"


def _cluster(result: LoadResult) -> list[Diagnostic]:
    from fasync.launch.plan import resolve

    cfg = result.config
    plan = resolve(cfg).plan
    import ray

    if not ray.is_initialized():
        if cfg.resources.ray_address is None:
            return [finding(result, "E006", "resources.ray_address", "no running Ray cluster to compare with the plan: "
                            "`fasync train` starts a local one with `resources.num_gpus` GPUs")]
        ray.init(address=cfg.resources.ray_address, logging_level="ERROR", log_to_driver=False)
    total = ray.cluster_resources()
    nodes = [node for node in ray.nodes() if node.get("Alive")]
    gpus, cpus = total.get("GPU", 0.0), total.get("CPU", 0.0)
    found = []
    if plan.gpus_needed > gpus:
        found.append(finding(result, "E001", "resources.num_gpus",
                             f"the plan reserves {plan.gpus_needed:g} GPUs but the cluster has {gpus:g} "
                             f"on {len(nodes)} nodes",
                             "add GPU nodes, or ask for fewer GPUs (`resources.num_rollout_engines`, "
                             "`resources.gpus_per_engine`, `resources.trainer_ranks`)"))
    if plan.cpus_needed > cpus:
        found.append(finding(result, "E001", "resources.trainer_ranks",
                             f"the plan reserves {plan.cpus_needed:g} CPUs but the cluster has {cpus:g}",
                             "fewer actors, or fewer `resources.rollout_threads` / `resources.train_threads`"))
    widest = max((node.get("Resources", {}).get("GPU", 0.0) for node in nodes), default=0.0)
    if cfg.resources.gpus_per_engine > widest and cfg.rollout.engine == "vllm":
        found.append(finding(result, "E001", "resources.gpus_per_engine",
                             f"an engine's {cfg.resources.gpus_per_engine} tensor-parallel GPUs must share a node, "
                             f"but no node has more than {widest:g}"))
    return found


def _packages(result: LoadResult) -> list[Diagnostic]:
    if result.config.rollout.engine != "vllm":
        return []
    run = subprocess.run([sys.executable, "-c", IMPORT_PAIR], capture_output=True, text=True, timeout=300)
    if run.returncode == 0:
        return []
    error = (run.stderr.strip().splitlines() or ["no output"])[-1]
    return [finding(result, "E002", "rollout.engine", f"`rollout.engine` vllm, but vLLM and torch do not import "
                    f"together here: {error}", "install the `gpu` extra's pinned pair (README), or use "
                    "`rollout.engine: hf`")]


def _longest_prompt(cfg, tokenizer) -> int | None:
    """Tokens of the longest prompt as the tokenizer feeds it: over the dataset, or a built-in task's pool."""
    from fasync.data.datasets import build_dataset, prompt_tokens

    if cfg.data.path is None and cfg.data.task is None:
        return None
    dataset = build_dataset(cfg.data)
    return max(prompt_tokens(dataset, index, tokenizer) for index in range(len(dataset)))


def _model(result: LoadResult) -> list[Diagnostic]:
    cfg = result.config
    if cfg.model.path is None:
        return []
    directory = Path(cfg.model.path)
    missing = [name for name in ("config.json",) if not (directory / name).is_file()]
    if not any((directory / name).is_file() for name in TOKENIZER_FILES):
        missing.append("tokenizer (" + ", ".join(TOKENIZER_FILES) + ")")
    if missing:
        return [finding(result, "E003", "model.path", f"`model.path` {directory} has no {' and no '.join(missing)}",
                        "point `model.path` at a Hugging Face model directory saved with save_pretrained")]
    config = json.loads((directory / "config.json").read_text())
    context = config.get("text_config", config).get("max_position_embeddings")
    if context is None:
        return []
    from fasync.model.tokenizer import HFTokenizer

    try:
        measured = _longest_prompt(cfg, HFTokenizer(cfg.model.path))
    except (OSError, ValueError, KeyError, TypeError, ConfigurationError):
        measured = None  # E005 reports the dataset
    prompt = measured or cfg.data.max_prompt_tokens or DATASET_PROMPT_TOKENS
    source = "the longest prompt" if measured else "`data.max_prompt_tokens` (or its default)"
    if prompt + cfg.rollout.max_new_tokens <= context:
        return []
    room = context - prompt
    if room > 0:
        hint = f"set `rollout.max_new_tokens` to at most {room}"
    else:  # no setting of max_new_tokens helps: the prompt alone fills the context
        shorten = "shorten or drop the longest prompts" if measured else "lower `data.max_prompt_tokens`"
        hint = (f"{source} alone fills the model's context of {context} tokens: {shorten}, or use a model with a "
                "longer context")
    return [finding(result, "E004", "rollout.max_new_tokens",
                    f"{source} is {prompt} tokens; with `rollout.max_new_tokens` {cfg.rollout.max_new_tokens} that "
                    f"is {prompt + cfg.rollout.max_new_tokens}, above the model's context of {context}", hint)]


def _dataset(result: LoadResult) -> list[Diagnostic]:
    """E005 for a dataset that cannot be read or has a record of the wrong shape (every record is read);
    else E009: its size, longest prompt and one prompt as built."""
    from fasync.data.datasets import MissingKey, build_dataset, prompt_tokens
    from fasync.model.tokenizer import build_tokenizer

    cfg = result.config
    if cfg.data.path is None:
        return []
    try:
        dataset = build_dataset(cfg.data)
    except MissingKey as error:
        key = error.setting.removeprefix("data.")
        return [finding(result, "E005", error.setting, f"{error.where} has no key {error.key!r}",
                        f"set `data.{key}` to the field that holds it")]
    except ConfigurationError as error:
        return [finding(result, "E005", "data.path", str(error).removeprefix("data.path: "))]
    try:
        tokenizer = build_tokenizer(cfg.model, cfg.data, chat=cfg.rollout.agentic)
        lengths = [prompt_tokens(dataset, index, tokenizer) for index in range(len(dataset))]
    except (OSError, ValueError, ConfigurationError) as error:
        return [finding(result, "E005", "data.path", str(error).removeprefix("data.path: "))]
    longest = max(range(len(dataset)), key=lengths.__getitem__)
    built = json.dumps(tokenizer.prompt_text(dataset.problems[0].prompt))
    return [finding(result, "E009", "data.path", f"{len(dataset):,} records; the longest prompt is {lengths[longest]} "
                    f"tokens ({dataset.location(longest)}); the first as built ({lengths[0]} tokens): "
                    f"{built[:300]}{'...' if len(built) > 300 else ''}", "`fasync data show` prints built prompts whole")]


def _reward(result: LoadResult) -> list[Diagnostic]:
    """E010 when the reward cannot be resolved: its module does not import, lacks the function, or the function
    takes what fasync cannot give; for `reward.url`, a server that does not answer."""
    from fasync.data.rewards import build_reward, reward_search_path
    from fasync.lint.environment import unresolved_reward

    cfg = result.config
    if unresolved_reward(result):
        return []  # every check reported it already
    key = "reward.url" if cfg.reward.url is not None else "reward.function"
    try:
        if cfg.reward.url is not None:
            from fasync.data.remote import probe

            probe(cfg.reward)
        else:  # imported as `fasync train` imports it
            build_reward(cfg.reward, reward_search_path(Path(result.provenance.top_file).parent))
    except ConfigurationError as error:
        return [finding(result, "E010", key, str(error).removeprefix(f"{key}: "))]
    return []


def _rollout_module(result: LoadResult) -> list[Diagnostic]:
    """E008: the rollout function or environment, imported in a subprocess (it may import torch, and a module that
    hangs or crashes at import must not take the check down) from where `fasync train` looks for it."""
    rollout = result.config.rollout
    key = "rollout.function" if rollout.function is not None else "rollout.env" if rollout.env is not None else None
    if key is None:
        return []
    spec = rollout.function or rollout.env
    origin = result.provenance.origin(key)
    directories = [str(Path.cwd())] + ([str(Path(origin.file).resolve().parent)] if origin is not None else [])
    code = (f"import sys; sys.path[:0] = {directories!r}; from fasync.rollout.agent import import_object; "
            f"import_object({spec!r}, {key!r})")
    try:
        run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return [finding(result, "E008", key, f"`{key}` {spec} did not finish importing in 120 s")]
    if run.returncode == 0:
        return []
    error = (run.stderr.strip().splitlines() or ["no output"])[-1].removeprefix("fasync.errors.ConfigurationError: ")
    return [finding(result, "E008", key, f"`{key}` {spec} does not import: {error}",
                    "put the module beside the config or in the working directory, or add its directory to "
                    "PYTHONPATH")]


def preflight(result: LoadResult) -> list[Diagnostic]:
    """Every preflight finding for a loaded config (none when it did not load)."""
    if result.config is None:
        return []
    return [*_cluster(result), *_packages(result), *_model(result), *_dataset(result), *_rollout_module(result),
            *_reward(result)]
