"""`fasync import FRAMEWORK SOURCE...`: a fasync config from another framework's config, launch script,
hydra overrides, argparse flags or TRL `GRPOConfig(...)` keywords.

Here: reading the sources, and writing the results. What each framework's keys mean, how they convert and
how a fasync config is written back in its terms is its module's (fasync.frameworks), whose key table the
loader's hints use too. A value that carries over as it is is copied; a converted one is computed from the
framework's own semantics, and the comment next to it shows the arithmetic; a key with no equivalent is listed
under the config.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from fasync import python_launcher, shell
from fasync.diagnostics import show_value
from fasync.frameworks import FRAMEWORKS, normalize, row_for
from fasync.frameworks.common import ADAPT, CONVERTED, NONE, SAME, Expressed, Imported, ImportFailure, Source

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


def _words_to_settings(words: list[str], hydra: bool) -> dict[str, Any]:
    """`--flag value`, `--flag v1 v2` (a list), `--flag=value`, `--flag` (true), hydra's `key=value`,
    `+key=value`, `~key`."""
    out: dict[str, Any] = {}
    index = 0
    while index < len(words):
        word = words[index]
        index += 1
        if word.startswith("--") and len(word) > 2:
            name, eq, value = word[2:].partition("=")
            if eq:
                out[name] = _scalar(value)
                continue
            values = []
            while index < len(words) and not words[index].startswith("--") and not (
                    hydra and "=" in words[index]):
                values.append(_scalar(words[index]))
                index += 1
            out[name] = True if not values else values[0] if len(values) == 1 else values
        elif word.startswith("~"):
            out.pop(word[1:], None)
        elif "=" in word and re.match(r"\+{0,2}[A-Za-z_][\w.\-]*=", word):
            name, _, value = word.lstrip("+").partition("=")
            out[name] = _scalar(value)
    return out


def _trl_settings(text: str, source: Source, environment: dict[str, str]) -> dict[str, Any]:
    """The keywords of a `GRPOConfig(...)` / `AsyncGRPOConfig(...)` call, or, for a script driven by TrlParser
    that sets none, the command line its docstring gives."""
    source.script, keywords = python_launcher.config_keywords(text, environment)
    if keywords:
        return keywords
    script = shell.evaluate(python_launcher.docstring(text), environment)
    command = script.training_command()
    if command is None:
        return {}
    source.script = command.program
    return _words_to_settings(command.words, hydra=False)


def read(framework: str, sources: list[str], environment: dict[str, str] | None = None) -> Source:
    """Every SOURCE in order, later ones overriding earlier ones: files (YAML, TOML, a launch script, Python
    with a GRPOConfig), else command-line words; `environment` holds the variables (`--env`) a launch script
    expects. Raises ImportFailure for a SOURCE that cannot be read."""
    settings: dict[str, Any] = {}
    source = Source(FRAMEWORKS[framework])
    words: list[str] = []
    for item in sources:
        path = Path(item)
        if path.is_dir():
            raise ImportFailure(f"{item}: a directory; give a config file, a launch script or flags")
        if path.exists():
            settings.update(_read_file(path, source, environment or {}))
        elif not item.startswith(("-", "+", "~")) and "=" not in item and (
                "/" in item or path.suffix in (".sh", ".yaml", ".yml", ".json", ".toml", ".py", ".bash")):
            raise ImportFailure(f"{item}: no such file")
        else:
            words.append(item)
    if words:
        settings.update(_words_to_settings(words, source.framework.hydra))
    for written, value in settings.items():
        unknown = shell.unknown_in(value)
        if unknown:
            source.unresolved[written] = value
            continue
        row = row_for(framework, written)
        key = row.source if row is not None and not row.source.endswith("*") else \
            ".".join(normalize(part) for part in written.split("."))
        source.values[key] = value
        source.written[key] = written
    return source


LARGEST_SOURCE = 10 * 1024 * 1024
"""Bytes: no config or launch script is larger; a bigger file (or /dev/zero) is refused, not read."""
MOST_SETTINGS = 100_000
"""Flattened keys: more is a YAML alias bomb, not a config."""


def _read_file(path: Path, source: Source, environment: dict[str, str]) -> dict[str, Any]:
    try:
        if not path.is_file():
            raise ImportFailure(f"{path}: not a regular file (a device or a pipe); give a config file or a script")
        if path.stat().st_size > LARGEST_SOURCE:
            raise ImportFailure(f"{path}: {path.stat().st_size} bytes, larger than any config or launch script")
        raw = path.read_bytes()
    except OSError as error:
        raise ImportFailure(f"{path}: cannot be read ({error.strerror or error})") from None
    if b"\0" in raw[:65536]:
        raise ImportFailure(f"{path}: a binary file, not a config or a launch script")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ImportFailure(f"{path}: not UTF-8 text (byte {error.start})") from None
    if path.suffix == ".toml":
        import tomllib

        try:
            settings = _flatten(tomllib.loads(text))
        except tomllib.TOMLDecodeError as error:
            raise ImportFailure(f"{path}: not valid TOML ({error})") from None
        if source.framework.id == "prime-rl" and "batch_size" in settings and not any(
                key.startswith("orchestrator.") for key in settings):
            source.orchestrator_file = True  # the older orchestrator-only file: its keys are the orchestrator's
            return {key if key in ("max_steps", "seq_len") or key.startswith("model.") else f"orchestrator.{key}":
                    value for key, value in settings.items()}
        return settings
    if path.suffix in (".yaml", ".yml", ".json"):
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as error:
            mark = getattr(error, "problem_mark", None)
            where = f":{mark.line + 1}" if mark is not None else ""
            problem = getattr(error, "problem", None) or str(error).splitlines()[0]
            kind = "JSON" if path.suffix == ".json" else "YAML"
            raise ImportFailure(f"{path}{where}: not valid {kind} ({problem})") from None
        if data is None:
            return {}
        if not isinstance(data, dict):
            raise ImportFailure(f"{path}: holds a {type(data).__name__}, not a mapping of settings")
        return _resolve_references(_flatten(data))
    source.variables.update(environment)
    if path.suffix == ".py" or "GRPOConfig(" in text:
        try:
            if source.framework.id == "trl":
                return _trl_settings(text, source, environment)
            words, source.script = python_launcher.command_line(text, environment)
            return _words_to_settings(words, source.framework.hydra)
        except SyntaxError as error:
            raise ImportFailure(f"{path}:{error.lineno}: not valid Python ({error.msg})") from None
    script = shell.evaluate(text, environment, origin=str(path))
    source.notes += script.notes
    source.variables.update({name: value for name, value in script.variables.items() if isinstance(value, str)})
    command = script.training_command()
    if command is None:
        return {}
    source.script = command.program
    return _words_to_settings(command.words, source.framework.hydra)


def _flatten(data: dict, prefix: str = "", out: dict[str, Any] | None = None) -> dict[str, Any]:
    """Dotted keys; an empty section (prime-rl's `[ckpt]`) is kept as its name with an empty mapping."""
    out = {} if out is None else out
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            _flatten(value, f"{name}.", out)
        else:
            out[name] = value
            if len(out) > MOST_SETTINGS:
                raise ImportFailure(f"more than {MOST_SETTINGS} settings: nested YAML aliases, not a config")
    return out


def _resolve_references(settings: dict[str, Any]) -> dict[str, Any]:
    """A YAML value that is exactly `${other.key}` (OmegaConf, as AReaL writes) takes that key's value."""
    resolved = dict(settings)
    for key, value in settings.items():
        seen = set()
        while isinstance(value, str) and (match := re.fullmatch(r"\$\{([\w.]+)\}", value)) and match[1] in settings \
                and match[1] not in seen:
            seen.add(match[1])
            value = settings[match[1]]
        resolved[key] = value
    return resolved


# --- translating -------------------------------------------------------------------------------------------

def translate(source: Source) -> Imported:
    out = Imported()
    framework = source.framework
    converted = framework.import_into(source, out)
    by_hand = []
    from_pairs: set[str] = set()
    for key, value in source.values.items():
        row = row_for(framework.id, key)
        written = source.written.get(key, key)
        if key in converted:
            continue
        if row is None or row.kind == NONE:
            out.unmapped.append((written, value, row.note if row else _not_in_table(written)))
        elif row.kind == SAME and not _fits(row.targets, value):
            out.unmapped.append((written, value, f"not one value fasync can hold: {row.note or 'set it by hand'}"))
        elif row.kind == SAME:
            for target in row.targets:
                # A row naming one key (eps_clip_high) is more specific than one naming a pair (eps_clip).
                if target not in out.values or (len(row.targets) == 1 and target in from_pairs):
                    out.set(target, value, f"{framework.display} {written}: {show_value(value)}")
                    from_pairs.discard(target)
                    if len(row.targets) > 1:
                        from_pairs.add(target)
        elif row.kind == CONVERTED:
            by_hand.append((key, written, value, row.note))
        elif row.kind == ADAPT and value not in (None, False, ""):  # a flag that is off names nothing
            out.need(row.targets[0], f"{framework.display}'s {written} {show_value(value)}: {row.note.rstrip('.')}")
            out.unmapped.append((written, value, f"adapt it: {row.note}"))
    model_unresolved = any("model.path" in getattr(row_for(framework.id, key), "targets", ())
                           for key in source.unresolved)
    if out.values.get("rollout.engine", (None,))[0] == "vllm" and "model.path" not in out.values \
            and not model_unresolved:
        engine_why = out.values.pop("rollout.engine")[1]
        out.unmapped.append(("rollout.engine", "vllm", f"{engine_why}; vLLM loads a Hugging Face model: set "
                             "model.path, then rollout.engine: vllm"))
    for written, value in source.unresolved.items():  # a function or a file the script's variables hide
        row = row_for(framework.id, written)
        task = [t for t in TASK_KEYS if t in row.targets and t not in out.values] if row is not None else []
        if task:
            unknown = ", ".join(map(shell.shown, shell.unknown_in(value)))
            out.need(task[0], f"{framework.display}'s {written} {_shown(value)} depends on {unknown}, which the script "
                     "does not set")
    # Last: the interval's conversion needs the geometry every other key has set.
    converted |= _checkpoint_interval(source, out)
    out.unmapped += [(written, value, f"converted by hand: {note}")
                     for key, written, value, note in by_hand if key not in converted]
    return out


TASK_KEYS = ("data.path", "reward.function", "reward.url", "rollout.function", "rollout.env")
"""What the source's task is: without these a config trains the built-in reverse task with exact_match."""


_NOT_TRAINING = ("eval", "val", "valid", "validation", "test", "critic", "judge", "reward_model", "ref",
                 "teacher", "vllm", "sglang", "perf_tracer", "evaluator", "valid_dataset")
"""Sections (and flag prefixes) that configure something besides the policy's training: reported as ignored."""


def _not_in_table(written: str) -> str:
    head = re.split(r"[.\-_]", normalize(written), maxsplit=1)[0]
    section = normalize(written).split(".")[0]
    for name in (section, head):
        if name in _NOT_TRAINING:
            return f"ignored: `{name}` configures something besides the policy's training"
    return "not in fasync's table"


def _fits(targets: tuple[str, ...], value: Any) -> bool:
    """A list (verl's several train_files) or a mapping cannot be a scalar key's value."""
    scalar_lists = {"logging.backends", "correction.reject_token_ratio", "correction.reject_sequence_ratio"}
    return not isinstance(value, (list, dict)) or all(target in scalar_lists for target in targets)


def _checkpoint_interval(source: Source, out: Imported) -> set[str]:
    """`checkpoint.every` from an interval counted in rollouts: × the imported config's optimizer steps per rollout
    (`fasync.config.derived`, with fasync's defaults for what the source does not set)."""
    key = next((k for k in source.framework.rollout_checkpoint_keys if k in source.values), None)
    steps = _steps_per_rollout(out) if key is not None else None
    if steps is None:
        return set()
    interval = source.get(key)
    if interval is not None and not isinstance(interval, int):
        return set()
    if interval is None or interval <= 0:
        out.set("checkpoint.every", 0, f"{source.cite(key)}: never")
        return {key}
    every = interval * steps
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
        return derive(FasyncConfig.model_validate(nested)).optimizer_steps_per_rollout
    except (ValidationError, ValueError, ZeroDivisionError):
        return None


# --- writing -----------------------------------------------------------------------------------------------

def _yaml(value: Any) -> str:
    """A value as a YAML flow scalar that reads back as the same type (1.0e-06, not 1e-06, which is a string)."""
    return yaml.safe_dump(value, default_flow_style=True, width=10_000).strip().removesuffix("...").strip()


def _comment(text: Any) -> str:
    """Foreign text made safe for a YAML comment: a line break in a key or value must not start a live line."""
    return "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in str(text))


def render(framework: str, sources: list[str], imported: Imported, source: Source | None = None) -> str:
    """The fasync config as YAML, each value with a comment naming where it came from."""
    lines = [_comment(f"# Imported by `fasync import {framework} {' '.join(sources)}`: each value names the "
                      f"{FRAMEWORKS[framework].display} setting it came from.")]
    if source is not None:
        lines += [f"# {_comment(note)}" for note in source.notes]
        if source.unresolved:
            lines.append(_comment(f"# Not imported: their values depend on what the script does not say"
                                  f"{_unknown_hint(source)}:"))
            lines += [f"#   {_comment(key)}: {_comment(_shown(value))}" for key, value in source.unresolved.items()]
    values = dict(sorted(imported.values.items(), key=lambda kv: (kv[0] != "mode", kv[0])))
    section = None
    for key, (value, why) in values.items():
        head, _, name = key.partition(".")
        if not name:
            lines.append(f"{head}: {_yaml(value)}  # {_comment(why)}")
            continue
        if head != section:
            lines.append(f"{head}:")
            section = head
        lines.append(f"  {name}: {_yaml(value)}  # {_comment(why)}")
    if imported.unmapped:
        lines += ["", f"# No fasync equivalent ({len(imported.unmapped)}):"]
        lines += [_comment(f"#   {key}: {show_value(value)}  ({why})") for key, value, why in imported.unmapped]
    return "\n".join(lines) + "\n"


def import_config(framework: str, sources: list[str],
                  environment: dict[str, str] | None = None) -> tuple[str, Imported]:
    """The config's text and what it holds; ImportFailure when nothing in SOURCE is recognised."""
    source = read(framework, sources, environment)
    imported = translate(source)
    recognised = [key for key in source.values if (row := row_for(framework, key)) and row.kind != NONE]
    if not recognised:
        looked = ", ".join(row.source for row in FRAMEWORKS[framework].keys if row.kind != NONE)[:200]
        raise ImportFailure(f"{' '.join(sources)}: no {FRAMEWORKS[framework].display} setting found "
                            f"(looked for {looked}, ...)" + _unknown_hint(source))
    return render(framework, sources, imported, source), imported


def missing_task(framework: str, imported: Imported) -> str | None:
    """What the imported config lacks to train the source's task, as one sentence naming where the import
    looked, or how to adapt the source's own function; None when it has data and a reward (a reward function
    or server, or an environment's) and every rollout function the source names. (Without them it would train
    fasync's built-in reverse task, or single completions, scored by exact_match.)"""
    display, frameworks = FRAMEWORKS[framework].display, FRAMEWORKS[framework]
    values, needs = imported.values, dict(imported.needs)
    needed, data_need = [], needs.pop("data.path", None)
    if "data.path" not in values:
        why = data_need or (f"looked for {', '.join(frameworks.data_keys)}" if frameworks.data_keys
                                               else f"no {display} setting names a dataset file")
        needed.append(f"data.path ({why})")
    rewarded = "reward.function" in values or "reward.url" in values or "rollout.env" in values
    reward_need = needs.pop("reward.function", None)
    if not rewarded and not needs.keys() & {"rollout.env", "reward.url"}:  # an environment's steps give the reward
        looked = ", ".join(frameworks.reward_keys)
        needed.append(f"reward.function ({reward_need or f'no {display} reward found: looked for {looked}'})")
    needed += [f"{key} ({why})" for key, why in needs.items()]
    if not needed:
        return None
    trains = "fasync's built-in reverse task" if "data.path" not in values else "its data"
    how = [] if rewarded else ["scored by exact_match"]
    if needs.keys() & {"rollout.env", "rollout.function"}:
        how.insert(0, "one completion per prompt instead of the source's rollouts")
    return f"set {' and '.join(needed)}: as written, the config trains {trains}{' ' if how else ''}{', '.join(how)}"


def _shown(value: Any) -> str:
    """A value that depends on unknown variables, as the script writes it (`${WORK_DIR}/reward.py`)."""
    return shell.shown(" ".join(map(str, value)) if isinstance(value, list) else str(value))


def _unknown_hint(source: Source) -> str:
    names = sorted({shell.shown(part) for value in source.unresolved.values() for part in shell.unknown_in(value)})
    variables = [name[2:-1] for name in names if re.fullmatch(r"\$\{\w+\}", name)]
    if not names:
        return ""
    hint = f"; unknown: {', '.join(names)}"
    return hint + (f" (set with {' '.join(f'--env {v}=VALUE' for v in variables)})" if variables else "")


# --- the other way: a fasync config in a framework's terms --------------------------------------------------

def express(framework: str, cfg, derived) -> Expressed:
    """`cfg` (a FasyncConfig) in `framework`'s terms (`Framework.express`)."""
    return FRAMEWORKS[framework].express(cfg, derived)


def render_expressed(out: Expressed, config_name: str) -> str:
    """The settings in the framework's own syntax (hydra overrides, argparse flags, YAML, TOML or a
    `GRPOConfig(...)`), which `fasync import` reads back."""
    name, framework = out.framework.display, out.framework.id
    head = [f"# {config_name} in {name}'s terms (`fasync config show --as {framework}`); "
            f"`fasync import {framework}` reads it back."]
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
        module = "trl.experimental.async_grpo" if out.config_class != "GRPOConfig" else "trl"
        body = [f"from {module} import {out.config_class}", f"args = {out.config_class}(output_dir='out', {arguments})"]
    else:
        hydra = out.framework.hydra
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
