"""Reading one YAML file into plain data plus the line and column of every key.

The value tree is built from PyYAML's composed node tree rather than `safe_load`, because
the nodes carry marks (positions) and because `safe_load` silently keeps the last of two
equal keys.
"""

from __future__ import annotations

import re
import stat
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from fasync.config import problems
from fasync.config.problems import report
from fasync.config.provenance import KeyPath, format_key
from fasync.diagnostics import Diagnostic, Location

# Alias expansion can grow a small file exponentially ("billion laughs"); no config needs this many nodes.
MAX_NODES = 20_000
_MERGE_TAG = "tag:yaml.org,2002:merge"
_TOML_TABLE = re.compile(rb"^\[\[?[A-Za-z0-9_.\-]+\]\]?\s*$", re.MULTILINE)
_TOML_HELP = ("this looks like TOML (prime-rl's config format); fasync configs are YAML: "
              "`fasync import prime-rl FILE -o config.yaml` converts it")


class _Loader(yaml.SafeLoader):
    """SafeLoader whose timestamps stay strings: a config holds no dates."""


_Loader.add_constructor("tag:yaml.org,2002:timestamp", yaml.SafeLoader.construct_yaml_str)


@dataclass
class Layer:
    file: str
    data: dict
    positions: dict[KeyPath, Location] = field(default_factory=dict)


class _Unreadable(Exception):
    """A construct a config cannot hold; becomes an F002 diagnostic at `mark`."""

    def __init__(self, message: str, mark):
        super().__init__(message)
        self.mark = mark


class _Builder:
    def __init__(self, file: str, loader: _Loader):
        self.file = file
        self.loader = loader
        self.positions: dict[KeyPath, Location] = {}
        self.duplicates: list[Diagnostic] = []
        self._open: set[int] = set()
        self._nodes = 0

    def at(self, node: Node) -> Location:
        return Location(self.file, node.start_mark.line + 1, node.start_mark.column + 1)

    def scalar(self, node: ScalarNode):
        try:
            return _plain(self.loader.construct_object(node))
        except (ValueError, LookupError, TypeError, OverflowError) as exc:
            # PyYAML lets explicit tags it cannot honour (`!!int abc`, `!!bool maybe`) escape as plain errors.
            raise _Unreadable(f"cannot read {node.value!r} as {node.tag}", node.start_mark) from exc

    def build(self, node: Node, path: KeyPath, positions: dict[KeyPath, Location]):
        self._nodes += 1
        if self._nodes > MAX_NODES:
            raise _Unreadable(f"the document expands to more than {MAX_NODES} values (aliases?)", node.start_mark)
        if isinstance(node, ScalarNode):
            return self.scalar(node)
        if id(node) in self._open:
            raise _Unreadable("a recursive alias: this value contains itself", node.start_mark)
        self._open.add(id(node))
        try:
            if isinstance(node, SequenceNode):
                items = []
                for index, item in enumerate(node.value):
                    positions[path + (index,)] = self.at(item)
                    items.append(self.build(item, path + (index,), positions))
                return items
            return self._mapping(node, path, positions)
        finally:
            self._open.discard(id(node))

    def _mapping(self, node: MappingNode, path: KeyPath, positions: dict[KeyPath, Location]) -> dict:
        out: dict = {}
        first_seen: dict[str, Location] = {}
        merges: list[Node] = []
        for key_node, value_node in node.value:
            if key_node.tag == _MERGE_TAG:
                merges.extend(value_node.value if isinstance(value_node, SequenceNode) else [value_node])
                continue
            if not isinstance(key_node, ScalarNode):
                raise _Unreadable("a key must be a plain scalar, not a list or mapping", key_node.start_mark)
            key = str(self.scalar(key_node))
            location = self.at(key_node)
            if key in first_seen:
                self.duplicates.append(report(
                    problems.DUPLICATE_KEY, f"duplicate key `{key}`: this value replaces the one on line "
                    f"{first_seen[key].line}", location,
                    help="delete one of the two; YAML keeps only the last", key=format_key(path + (key,))))
            first_seen[key] = location
            positions[path + (key,)] = location
            out[key] = self.build(value_node, path + (key,), positions)
        # `<<: *base` merge keys: explicit keys win, then earlier merge sources over later ones.
        for source in merges:
            if not isinstance(source, MappingNode):
                raise _Unreadable("a `<<` merge key needs a mapping or a list of mappings", source.start_mark)
            source_positions: dict[KeyPath, Location] = {}
            merged = self._mapping(source, path, source_positions)
            for key, value in merged.items():
                if key not in out:
                    out[key] = value
                    prefix = path + (key,)
                    positions.update({p: loc for p, loc in source_positions.items() if p[: len(prefix)] == prefix})
        return out


def _plain(value):
    """Scalars other than str/int/float/bool/null (binary, odd tags) become strings."""
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def _mark_location(file: str, mark) -> Location:
    return Location(file, mark.line + 1, mark.column + 1) if mark is not None else Location(file, 1, 1)


def _toml(path: Path, text: bytes) -> str | None:
    """The hint for a TOML file (prime-rl writes its configs in TOML), or None."""
    return _TOML_HELP if path.suffix == ".toml" or _TOML_TABLE.search(text) else None


def _syntax_error(file: str, text: bytes, exc: yaml.YAMLError, hint: str | None = None) -> Diagnostic:
    if isinstance(exc, yaml.MarkedYAMLError):
        location = _mark_location(file, exc.problem_mark or exc.context_mark)
        context = exc.context
        if context and exc.context_mark is not None and exc.context_mark is not exc.problem_mark:
            context += f" (line {exc.context_mark.line + 1}, column {exc.context_mark.column + 1})"
        message = "; ".join(p for p in (context, exc.problem) if p) or "invalid YAML"
    elif isinstance(exc, yaml.reader.ReaderError):
        before = text[: exc.position]
        location = Location(file, before.count(b"\n") + 1, len(before) - before.rfind(b"\n"))
        message = f"unreadable character: {exc.reason}"
    else:
        location, message = Location(file, 1, 1), str(exc)
    return report(problems.YAML_SYNTAX, f"YAML syntax error: {message}", location,
                  help=hint or "fix the YAML at this position; nothing in this file was loaded")


def _parse(text: bytes, file: str):
    loader = _Loader(text)
    try:
        builder = _Builder(file, loader)
        root = loader.get_single_node()
        return (builder.build(root, (), builder.positions) if root is not None else {}), builder
    finally:
        loader.dispose()


MAX_CONFIG_BYTES = 16 << 20
"""The largest config file read: 16 MiB, thousands of times any real config. A larger one is refused before it is
read (`extends: /dev/zero`-like mistakes would otherwise fill memory)."""

_NOT_REGULAR = ((stat.S_ISFIFO, "a pipe"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory"))


def _unreadable_reason(path: Path) -> tuple[str, str] | None:
    """(why, hint) when `path` is not a config file fasync reads: missing, not a regular file (a pipe such as
    `<(...)` blocks or can be read only once, a device never ends), or too large."""
    try:
        found = path.stat()
    except OSError as exc:
        reason = "no such file" if isinstance(exc, FileNotFoundError) else (exc.strerror or type(exc).__name__)
        return reason, "check the path; `extends` paths are relative to the file that names them"
    kind = next((name for test, name in _NOT_REGULAR if test(found.st_mode)), None)
    if kind is not None:
        generated = " (for a generated config, such as `<(...)`, write it to a file first)" if kind == "a pipe" else ""
        return f"it is {kind}, not a regular file", f"name a config file{generated}"
    if found.st_size > MAX_CONFIG_BYTES:
        return (f"it is {found.st_size >> 20} MiB, more than the {MAX_CONFIG_BYTES >> 20} MiB a config may be",
                "name the YAML config meant; a config is a few kilobytes")
    return None


def read_layer(path: Path, file: str, named_at: Location | None) -> tuple[Layer | None, list[Diagnostic]]:
    """Parse one file. `named_at` is where it was named (an `extends` entry), for file errors."""
    problem = _unreadable_reason(path)
    if problem is None:
        try:
            with path.open("rb") as stream:
                text = stream.read(MAX_CONFIG_BYTES + 1)  # the file may have grown since it was looked at
        except OSError as exc:
            problem = (exc.strerror or type(exc).__name__,
                       "check the path; `extends` paths are relative to the file that names them")
    if problem is None and len(text) > MAX_CONFIG_BYTES:
        problem = (f"it is more than the {MAX_CONFIG_BYTES >> 20} MiB a config may be",
                   "name the YAML config meant; a config is a few kilobytes")
    if problem is not None:
        reason, hint = problem
        return None, [report(problems.FILE_NOT_FOUND, f"cannot read `{file}`: {reason}", named_at or Location(file, 1, 1),
                             help=hint)]
    try:
        data, builder = _parse(text, file)
    except yaml.YAMLError as exc:
        return None, [_syntax_error(file, text, exc, _toml(path, text))]
    except _Unreadable as exc:
        return None, [report(problems.YAML_SYNTAX, f"unsupported YAML: {exc}", _mark_location(file, exc.mark),
                             help="write the value out plainly")]
    except RecursionError:
        return None, [report(problems.YAML_SYNTAX, "the document is nested too deeply", Location(file, 1, 1))]
    if not isinstance(data, dict):
        shown = repr(data)
        kind = "a list" if isinstance(data, list) else f"the scalar {shown}" if len(shown) <= 60 else \
            f"a scalar of {len(str(data))} characters ({shown[:40]}...)"  # not a whole file echoed back
        return None, [report(problems.NOT_A_MAPPING, f"the top level of `{file}` is {kind}, not a mapping",
                             Location(file, 1, 1), help=_toml(path, text) or "a config is `key: value` pairs, e.g. "
                             "`mode: sync`")]
    return Layer(file, data, builder.positions), builder.duplicates
