"""What every framework module is made of: its key table's rows, the source settings its importer reads, the
fasync values it sets, and the settings its expresser writes.

Below `fasync.config`, whose loader hints read the key tables: nothing here imports the config package.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

from fasync.diagnostics import show_value

SAME, CONVERTED, NONE, ADAPT = "same", "converted", "none", "adapt"
"""The value carries over as it is; it is converted (arithmetic, units, other keys); fasync has no equivalent; it
names the framework's own function or class, whose signature differs from what fasync calls: the note says how to
adapt it, and `fasync import` asks for the fasync key (`rollout.env`, `rollout.function`, `reward.function`)."""


@dataclass(frozen=True)
class KeyMapping:
    framework: str
    """The framework's id (`prime-rl`)."""
    display: str
    """Its name as its authors write it (`prime-rl`, `AReaL`)."""
    source: str
    """The key in the framework's spelling, normalised (`--rollout-batch-size` is `rollout_batch_size`); a
    trailing `.*` covers a whole section."""
    targets: tuple[str, ...]
    kind: str
    note: str = ""


NO_CRITIC = ("fasync has no critic: its advantages (grpo, rloo, the REINFORCE variants) need no value model, so "
             "the critic's settings have no equivalent.")
NESTED = ("a section of {source}'s nested layout; fasync has flat sections (model, data, reward, rollout, "
          "train, async, correction, resources, logging, checkpoint, lint): each key that has a fasync equivalent "
          "maps on its own (docs/migrate.md lists them).")
ALGORITHM_SETTINGS = ("train.advantage_estimator", "train.normalize_advantage_std", "train.loss_aggregation",
                      "train.importance_ratio", "train.ppo_epochs", "train.lr_warmup_steps", "train.lr_schedule",
                      "rollout.top_k", "reward.overlong_buffer", "reward.overlong_penalty", "model.lora")
"""The settings of docs/algorithms.md, which each expresser writes or names as missing."""
TRACKERS = ("tensorboard", "wandb", "mlflow")
"""The experiment trackers fasync logs to besides metrics.jsonl."""


@dataclass(frozen=True)
class Framework:
    """One framework fasync translates, both ways."""

    id: str
    """As `fasync import` and `config show --as` name it."""
    display: str
    rows: Sequence[tuple]
    """(key, fasync key(s), SAME/CONVERTED/NONE/ADAPT[, note]) for each key: see `keys`."""
    import_into: Callable[[Source, Imported], set[str]]
    """Sets what the table's SAME rows cannot (the mode, converted values, trackers); returns the source keys it
    converted."""
    express: Callable[[Any, Any], Expressed]
    """`(config, derived)` as this framework's settings, computed by its semantics, which `fasync import` reads back
    to the same derived quantities; what it cannot express is listed."""
    rollout_checkpoint_keys: tuple[str, ...] = ()
    """Checkpoint intervals the framework counts in rollouts (its training or global steps); fasync's
    `checkpoint.every` counts optimizer steps."""
    hydra: bool = False
    """Its command line takes hydra `key=value` overrides, not argparse `--flag value`."""
    data_keys: tuple[str, ...] = ()
    """Where its settings name the training data (what `fasync import` looks for, and says it looked for)."""
    modes: str = ""
    """How `fasync import` tells the mode from the entry point, the config class or the settings (docs/migrate.md)."""
    defaults: str = ""
    """The framework's defaults that differ from fasync's, which `fasync import` writes explicitly (docs/migrate.md)."""
    reward_keys: tuple[str, ...] = ()
    """Where its settings name the reward (what `fasync import` looks for, and says it looked for)."""
    rewards: str = ""
    """How `fasync import` carries its rewards and rollout functions (docs/migrate.md)."""
    keys: tuple[KeyMapping, ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        keys = []
        for source, targets, kind, *note in self.rows:
            targets = (targets,) if isinstance(targets, str) else tuple(targets)
            keys.append(KeyMapping(self.id, self.display, source, targets, kind, note[0] if note else ""))
        object.__setattr__(self, "keys", tuple(keys))


# --- importing -------------------------------------------------------------------------------------------

class ImportFailure(Exception):
    """`fasync import` cannot write a faithful config: a SOURCE it cannot read, a setting fasync does not
    support, or nothing it recognises. The message is one line, fit to print as is (exit 1)."""


@dataclass
class Source:
    """A framework's settings, by the table's spelling of each key, with where each came from."""

    framework: Framework
    values: dict[str, Any] = field(default_factory=dict)
    written: dict[str, str] = field(default_factory=dict)
    """Table key → the key as written (`--rollout-batch-size`, `actor_rollout_ref.rollout.n`)."""
    script: str = ""
    """The Python entry point a launch script runs (slime's train_async.py, verl.trainer.main_ppo), if any."""
    unresolved: dict[str, Any] = field(default_factory=dict)
    """Key as written → its value, which depends on unknown variables or command outputs (`shell.unknown_in`)."""
    notes: list[str] = field(default_factory=list)
    """What reading the source decided (the branch of an if), for the reader."""
    orchestrator_file: bool = False
    """prime-rl: an orchestrator-only file of the older layout, its keys at the top level."""
    variables: dict[str, str] = field(default_factory=dict)
    """A launch script's variables (its exports among them) where its training program reads them from the
    environment (OpenRLHF's OPENRLHF_ASYNC_QUEUE_SIZE)."""

    def get(self, key: str, default: Any = None) -> Any:
        return self.values.get(key, default)

    def cite(self, key: str, default: Any = None) -> str:
        """`actor_rollout_ref.rollout.n` 16, or "default 1" when the source does not set it."""
        if key in self.values:
            return f"{self.written.get(key, key)} {show_value(self.values[key])}"
        return f"{key} {show_value(default)} (the {self.framework.display} default)"


@dataclass
class Imported:
    values: dict[str, tuple[Any, str]] = field(default_factory=dict)
    """fasync key → (value, where it came from: the source key and value, with any arithmetic)."""
    unmapped: list[tuple[str, Any, str]] = field(default_factory=list)
    """(key as written, value, why) for what has no fasync equivalent."""
    needs: dict[str, str] = field(default_factory=dict)
    """fasync key → what the source names there that the import could not write (a function of another
    signature), and how to adapt it; `fasync import` exits 1 asking for each."""

    def set(self, key: str, value: Any, why: str) -> None:
        self.values[key] = (value, why)

    def need(self, key: str, why: str) -> None:
        """Ask for `key` (a reward or rollout function the import cannot write), saying why and how."""
        self.needs[key] = f"{self.needs[key]}; {why}" if key in self.needs else why

    def set_trackers(self, found: dict[str, str]) -> None:
        """`logging.backends` from the experiment trackers the source logs to (tracker → where the source says
        so); jsonl is always on."""
        if found:
            self.set("logging.backends", ["jsonl", *found], "; ".join(dict.fromkeys(found.values())))


def module_function(reference: str, function: str | None = None) -> str | None:
    """fasync's `module:function` for a framework's reference to a Python function: a file (`/x/my_reward.py`,
    with `function` its name) or a dotted path (`pkg.module.function`); None when it names no importable module
    (a file whose name is no Python identifier)."""
    if reference.endswith(".py"):
        module = reference.rsplit("/", 1)[-1].removesuffix(".py")
        return f"{module}:{function}" if module.isidentifier() and function else None
    module, _, name = reference.rpartition(".")
    if not module or not all(part.isidentifier() for part in [*module.split("."), name]):
        return None
    return f"{module}:{name}"


# --- expressing ------------------------------------------------------------------------------------------

@dataclass
class Expressed:
    """A fasync config's geometry, mode and staleness as one framework writes them."""

    framework: Framework
    entry: str
    """What a launch script runs (`python3 train_async.py`), or the file kind (yaml, toml, python)."""
    settings: list[tuple[str, Any, str]] = field(default_factory=list)
    """(key as the framework writes it, value, the fasync quantity it carries)."""
    missing: list[str] = field(default_factory=list)
    """What the framework cannot say of this config: reading it back with `fasync import` gives another run."""
    config_class: str = "GRPOConfig"
    """For a Python entry (TRL): the config class the settings are keywords of."""

    def put(self, key: str, value: Any, why: str) -> None:
        self.settings.append((key, value, why))

    def note_trimmed_samples(self, derived) -> None:
        if derived.trimmed_samples_per_rollout:
            self.missing.append(f"{derived.trimmed_samples_per_rollout} samples per rollout that fasync trims: "
                                f"{self.framework.display} trains every sample it generates")

    def prompts_per_step(self, samples_per_step: int, n: int) -> int:
        if samples_per_step % n:
            self.missing.append(f"a step of {samples_per_step} samples with {n} per prompt: "
                                f"{self.framework.display} counts whole prompts per mini-batch")
        return max(samples_per_step // n, 1)

    def note_sync_every_step(self, interval: int) -> None:
        """For a framework that syncs the weights after every training step."""
        if interval != 1:
            self.missing.append(f"async.update_weights_interval {interval}: {self.framework.display} syncs the "
                                "weights after every training step")

    def note_algorithm(self, cfg, expressed: Collection[str] = ()) -> None:
        """Names each algorithm setting away from fasync's default that the framework's expresser does not write
        (`expressed`: the fasync keys it does write, choices included: they name their own gaps)."""
        for key in ALGORITHM_SETTINGS:
            section, name = key.split(".")
            default = type(getattr(cfg, section)).model_fields[name].default
            if key not in expressed and setting(cfg, key) != default:
                self.missing.append(f"{key} {show_value(setting(cfg, key))}: {self.framework.display} has no "
                                    "equivalent")

    def put_streaming_bound(self, cfg, key: str) -> None:
        """Frameworks that always stream (AReaL, prime-rl): the bound is a number, 0 their closest to sync."""
        name, bound = self.framework.display, cfg.async_.max_weight_staleness
        if cfg.mode != "fully_async":
            self.missing.append(f"mode {cfg.mode}: {name} always streams ({key} 0 is its closest to sync)")
        elif bound is None:
            self.missing.append(f"no staleness bound: {name}'s {key} is always a number")
        self.put(key, bound if bound is not None else 0, "async.max_weight_staleness")


@dataclass(frozen=True)
class Choice:
    """A framework key whose values each stand for some fasync settings (verl's `adv_estimator: rloo` is
    `train.advantage_estimator: rloo`; OpenRLHF's `dr_grpo` is grpo without the std), read and written both ways."""

    key: str
    """As the key table spells it."""
    values: dict[Any, dict[str, Any]]
    """The framework's value → the fasync settings (dotted key → value) it stands for; when expressing, the first
    value whose settings the config holds is written."""

    def import_into(self, source: Source, out: Imported) -> bool:
        """Sets the settings the source's value stands for; False when the source does not set the key or sets a
        value without an equivalent (the table's note then says why)."""
        settings = self.values.get(source.get(self.key)) if self.key in source.values else None
        for target, value in (settings or {}).items():
            out.set(target, value, source.cite(self.key))
        return settings is not None

    def express(self, cfg, out: Expressed, written: str) -> None:
        """Writes the framework's value for `cfg`'s settings as `written` (the key as the framework's command
        line spells it), or says that the framework has none."""
        for value, settings in self.values.items():
            if all(setting(cfg, key) == wanted for key, wanted in settings.items()):
                out.put(written, value, ", ".join(f"{key} {show_value(wanted)}" for key, wanted in settings.items()))
                return
        targets = dict.fromkeys(key for settings in self.values.values() for key in settings)
        out.missing.append(", ".join(f"{key} {show_value(setting(cfg, key))}" for key in targets)
                           + f": {out.framework.display}'s {written} has no equivalent")


def import_choices(choices: Sequence[Choice], source: Source, out: Imported) -> set[str]:
    """Each choice the source sets with a value that has an equivalent; returns their keys."""
    return {choice.key for choice in choices if choice.import_into(source, out)}


def import_lora(source: Source, out: Imported, rank: str, alpha: str, targets: str) -> set[str]:
    """`model.lora` from a framework's rank (0: no adapters), alpha and target modules (`all-linear`: every linear
    layer but the head, fasync's null) keys; returns the keys read."""
    if source.get(rank, 0) > 0:
        modules = source.get(targets, "all-linear")
        modules = None if modules == "all-linear" else [modules] if isinstance(modules, str) else list(modules)
        out.set("model.lora", {"rank": source.get(rank), "alpha": source.get(alpha, 16),
                               **({"target_modules": modules} if modules else {})},
                f"{source.cite(rank)}, {source.cite(alpha, 16)}, {source.cite(targets, 'all-linear')}")
    return {rank, alpha, targets}


def express_lora(cfg, out: Expressed, rank: str, alpha: str, targets: str) -> None:
    """`model.lora` as a framework's rank, alpha and target modules keys."""
    lora = cfg.model.lora
    if lora is None:
        return
    out.put(rank, lora.rank, "model.lora.rank")
    out.put(alpha, lora.alpha, "model.lora.alpha")
    modules = lora.target_modules or ["all-linear"]
    if len(modules) > 1 and not out.framework.hydra:
        # A flag's several values are separate words, which a written value (one word) cannot be.
        out.missing.append(f"model.lora.target_modules {show_value(modules)}: write them after {targets} by hand")
        return
    out.put(targets, modules if out.framework.hydra and len(modules) > 1 else modules[0],
            "model.lora.target_modules")


def setting(cfg, key: str) -> Any:
    """A config's value at a dotted key (`async.max_weight_staleness`)."""
    section, name = key.split(".")
    return getattr(getattr(cfg, "async_" if section == "async" else section), name)


def geometry(cfg, derived) -> tuple[int, int, int, int, Any, int]:
    """(prompts, samples per prompt, samples per step, steps per drain, staleness bound, sync interval)."""
    return (cfg.rollout.batch_size, cfg.rollout.n_samples_per_prompt, derived.effective_global_batch_size,
            derived.num_steps_per_rollout, cfg.async_.max_weight_staleness, cfg.async_.update_weights_interval)
