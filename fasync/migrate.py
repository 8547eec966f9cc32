"""`fasync import FRAMEWORK SOURCE...`: a fasync config from another framework's config, launch script,
hydra overrides, argparse flags or TRL `GRPOConfig(...)` keywords.

Here: reading the sources, and writing the results. What each framework's keys mean, how they convert and
how a fasync config is written back in its terms is its module's (fasync.frameworks), whose key table the
loader's hints use too. A value that carries over as it is is copied; a converted one is computed from the
framework's own semantics, and the comment next to it shows the arithmetic; a key with no equivalent is listed
under the config.
"""

from __future__ import annotations

import ast
import re
import shlex
from pathlib import Path
from typing import Any

import yaml

from fasync.config.fields import flatten
from fasync.diagnostics import show_value
from fasync.frameworks import FRAMEWORKS, mappings_for, normalize
from fasync.frameworks.common import CONVERTED, NONE, SAME, Expressed, Imported, Source

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
    source = Source(FRAMEWORKS[framework], script=script)
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
    framework = source.framework
    converted = framework.import_into(source, out)
    by_hand = []
    for key, value in source.values.items():
        rows = [r for r in mappings_for(key.split("."), framework.id) if r.framework == framework.id]
        written = source.written.get(key, key)
        if not rows or rows[0].kind == NONE:
            out.unmapped.append((written, value, rows[0].note if rows else "not in fasync's table"))
        elif rows[0].kind == SAME:
            for target in rows[0].targets:
                if target not in out.values:
                    out.set(target, value, f"{framework.display} {written}: {show_value(value)}")
        elif rows[0].kind == CONVERTED and key not in converted:
            by_hand.append((key, written, value, rows[0].note))
    # Last: the interval's conversion needs the geometry every other key has set.
    converted |= _checkpoint_interval(source, out)
    out.unmapped += [(written, value, f"converted by hand: {note}")
                     for key, written, value, note in by_hand if key not in converted]
    return out


def _checkpoint_interval(source: Source, out: Imported) -> set[str]:
    """`checkpoint.every` from an interval counted in rollouts: × the imported config's optimizer steps per rollout
    (`fasync.config.derived`, with fasync's defaults for what the source does not set)."""
    key = next((k for k in source.framework.rollout_checkpoint_keys if k in source.values), None)
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


# --- writing -----------------------------------------------------------------------------------------------

def _yaml(value: Any) -> str:
    """A value as a YAML flow scalar that reads back as the same type (1.0e-06, not 1e-06, which is a string)."""
    return yaml.safe_dump(value, default_flow_style=True, width=10_000).strip().removesuffix("...").strip()


def render(framework: str, sources: list[str], imported: Imported) -> str:
    """The fasync config as YAML, each value with a comment naming where it came from."""
    lines = [f"# Imported by `fasync import {framework} {' '.join(sources)}`: each value names the "
             f"{FRAMEWORKS[framework].display} setting it came from."]
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
        body = ["from trl import GRPOConfig", f"args = GRPOConfig(output_dir='out', {arguments})"]
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
