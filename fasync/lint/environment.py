"""The environment checks' diagnostics (E001-E010): their severities and how a finding is located, shared by
`fasync check --preflight` (fasync/preflight.py, which looks at the cluster, the packages, the model, the
dataset, the rollout module and the reward) and the two environment checks every lint runs, which only look
packages and modules up: E007 (a tracker's package) and E010 (the reward's module)."""

from __future__ import annotations

import sys
from pathlib import Path

from fasync.config.loader import LoadResult
from fasync.diagnostics import Diagnostic, Severity

SEVERITIES = {"E001": Severity.ERROR, "E002": Severity.ERROR, "E003": Severity.ERROR, "E004": Severity.ERROR,
              "E005": Severity.ERROR, "E006": Severity.INFO, "E007": Severity.ERROR, "E008": Severity.ERROR,
              "E009": Severity.INFO, "E010": Severity.ERROR}


def finding(result: LoadResult, code: str, key: str, message: str, help: str | None = None) -> Diagnostic:
    return Diagnostic(code, SEVERITIES[code], message, key, result.provenance.origin(key), help)


def missing_trackers(result: LoadResult) -> list[Diagnostic]:
    """E007 for each tracker `logging.backends` asks for whose package is not installed. It costs a package
    lookup (nothing is imported), so `fasync check` and `fasync train` run it on every config: a run must not
    start only to fail at its first metrics row."""
    from fasync.metrics.trackers import BACKENDS, missing

    if result.config is None:
        return []
    return [finding(result, "E007", "logging.backends", f"`logging.backends` asks for {name}, but the "
                    f"`{BACKENDS[name].module}` package is not installed here",
                    f"{BACKENDS[name].install}, or remove {name} from `logging.backends`")
            for name in missing(result.config.logging.backends)]


def unresolved_reward(result: LoadResult) -> list[Diagnostic]:
    """E010 for a `reward.function` that names no built-in and no module fasync could import: looked up where
    `fasync train` looks (the import path, then the working directory and the config's directory) without
    importing anything (a reward module may import torch), so `fasync check` and `fasync train` run it on every
    config. `--preflight` imports it."""
    from importlib.machinery import PathFinder

    from fasync.data.rewards import BUILTIN_REWARDS, build_reward
    from fasync.errors import ConfigurationError

    cfg = result.config
    if cfg is None or cfg.reward.url is not None or cfg.reward.function in BUILTIN_REWARDS:
        return []
    module, _, attribute = cfg.reward.function.partition(":")
    if not module or not attribute:
        try:
            build_reward(cfg.reward)  # says what is wrong with the name without importing anything
        except ConfigurationError as error:
            return [finding(result, "E010", "reward.function", str(error).removeprefix("reward.function: "))]
    top = module.split(".")[0]
    places = [*sys.path, str(Path.cwd()), str(Path(result.provenance.top_file).resolve().parent)]
    if top in sys.modules or top in sys.builtin_module_names or PathFinder.find_spec(top, places) is not None:
        return []
    return [finding(result, "E010", "reward.function", f"`reward.function` {cfg.reward.function}: no module "
                    f"{top!r} on the import path, in the working directory or in the config's directory",
                    "check the module's name, or put it beside the config or on PYTHONPATH")]
