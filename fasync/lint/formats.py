"""Rendering diagnostics: text (ruff-like), concise, json, github annotations, SARIF 2.1.0."""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from urllib.parse import quote

from fasync import __version__
from fasync.config.provenance import CLI_FILE
from fasync.diagnostics import Diagnostic, Severity

FORMATS = ("text", "concise", "json", "github", "sarif")
INFORMATION_URI = "https://github.com/fasync/fasync"
SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
JSON_FIELDS = ("code", "severity", "message", "key", "file", "line", "column", "help")

_ANSI = {"bold": "1", "red": "31", "yellow": "33", "blue": "34", "cyan": "36", "dim": "2"}
_SEVERITY_STYLE = {Severity.ERROR: "red", Severity.WARNING: "yellow", Severity.INFO: "blue"}
_GITHUB_COMMAND = {Severity.ERROR: "error", Severity.WARNING: "warning", Severity.INFO: "notice"}
_SARIF_LEVEL = {Severity.ERROR: "error", Severity.WARNING: "warning", Severity.INFO: "note"}


def render(diagnostics: Sequence[Diagnostic], fmt: str = "text", *, summary: bool = True,
           files: int | None = None, color: bool = False) -> str:
    """The diagnostics in `fmt`. `files` is how many files were checked (for the summary line)."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
    if fmt in ("text", "concise"):
        return _text(diagnostics, with_help=fmt == "text", summary=summary, files=files, color=color)
    return {"json": _json, "github": _github, "sarif": _sarif}[fmt](diagnostics)


def summary_line(diagnostics: Sequence[Diagnostic], files: int) -> str:
    if not diagnostics:
        return "All checks passed!"
    counts = Counter(d.severity for d in diagnostics)
    errors, warnings = counts[Severity.ERROR], counts[Severity.WARNING]
    return (f"Found {errors} error{'s' * (errors != 1)}, {warnings} warning{'s' * (warnings != 1)}, "
            f"{counts[Severity.INFO]} info in {files} file{'s' * (files != 1)}.")


def _styler(color: bool) -> Callable[[str, str], str]:
    if not color:
        return lambda text, style: text
    return lambda text, style: f"\x1b[{_ANSI[style]}m{text}\x1b[0m"


def _where(d: Diagnostic) -> str:
    return f"{d.location.file}:{d.location.line}:{d.location.column}: " if d.location else ""


def _text(diagnostics: Sequence[Diagnostic], *, with_help: bool, summary: bool, files: int | None,
          color: bool) -> str:
    style = _styler(color)
    blocks = []
    for d in diagnostics:
        line = (f"{style(_where(d), 'bold')}{style(d.code, 'cyan')} "
                f"{style(d.severity.value, _SEVERITY_STYLE[d.severity])}: {d.message}")
        if with_help and d.help:
            line += f"\n  {style('help', 'dim')}: {d.help}"
        blocks.append(line)
    lines = ["\n\n".join(blocks) if with_help else "\n".join(blocks)] if blocks else []
    if summary:
        checked = files if files is not None else max(len({d.location.file for d in diagnostics if d.location}), 1)
        lines.append(summary_line(diagnostics, checked))
    return "\n\n".join(lines)


def _json(diagnostics: Sequence[Diagnostic]) -> str:
    return json.dumps([{k: d.as_dict()[k] for k in JSON_FIELDS} for d in diagnostics], indent=2, ensure_ascii=False)


def _escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


def _github(diagnostics: Sequence[Diagnostic]) -> str:
    lines = []
    for d in diagnostics:
        properties = []
        # An override has no file to annotate: it becomes a run-level annotation.
        if d.location and d.location.file != CLI_FILE:
            properties += [f"file={_escape_property(d.location.file)}", f"line={d.location.line}",
                           f"col={d.location.column}"]
        properties.append(f"title={_escape_property(d.code)}")
        message = d.message + (f"\nhelp: {d.help}" if d.help else "")
        lines.append(f"::{_GITHUB_COMMAND[d.severity]} {','.join(properties)}::{_escape_data(message)}")
    return "\n".join(lines)


def _relative_uri(file: str) -> str:
    path = Path(file)
    if path.is_absolute():
        path = Path(os.path.relpath(path))
    return quote(path.as_posix())


def _sarif(diagnostics: Sequence[Diagnostic]) -> str:
    from fasync.lint.engine import catalogue

    entries = catalogue()
    codes = list(entries)
    rules = [{
        "id": e.code,
        "name": e.name,
        "shortDescription": {"text": e.summary},
        "fullDescription": {"text": e.what},
        "help": {"text": f"{e.what}\n\nWhy: {e.why}", "markdown": e.as_markdown()},
        "defaultConfiguration": {"level": _SARIF_LEVEL[e.severity]},
    } for e in entries.values()]
    results = []
    for d in diagnostics:
        result = {"ruleId": d.code, "level": _SARIF_LEVEL[d.severity],
                  "message": {"text": d.message + (f"\nhelp: {d.help}" if d.help else "")}}
        if d.code in entries:
            result["ruleIndex"] = codes.index(d.code)
        if d.location and d.location.file != CLI_FILE:
            result["locations"] = [{"physicalLocation": {
                "artifactLocation": {"uri": _relative_uri(d.location.file), "uriBaseId": "%SRCROOT%"},
                "region": {"startLine": max(d.location.line, 1), "startColumn": max(d.location.column, 1)},
            }}]
        results.append(result)
    log = {
        "$schema": SARIF_SCHEMA,
        "version": "2.1.0",
        "runs": [{
            "tool": {"driver": {"name": "fasync", "version": __version__, "informationUri": INFORMATION_URI,
                                "rules": rules}},
            "results": results,
        }],
    }
    return json.dumps(log, indent=2, ensure_ascii=False)

