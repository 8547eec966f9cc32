"""The command line a Python launcher builds (miles' and slime's `run_*.py`, CI end-to-end tests), read without
running it: the `--flag` strings it writes, in order, with the f-string fields that name its constants and its
dataclass defaults filled in. Nothing in the file is executed; a field whose value needs a call stays unknown
(fasync.shell.UNKNOWN)."""

from __future__ import annotations

import ast
import operator
import re

from fasync.shell import UNKNOWN


class _Unknown(Exception):
    pass


_COMPARE = {ast.Eq: operator.eq, ast.NotEq: operator.ne}


def _constants(tree: ast.Module) -> dict[str, object]:
    """Module constants (`NUM_ROLLOUT = 4`) and dataclass field defaults, the latter as `args.<field>` would
    read them (the launcher's defaults: the ones a plain run uses)."""
    names: dict[str, object] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            target, value = node.targets[0].id, node.value
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            target, value = node.target.id, node.value
        else:
            continue
        try:
            names.setdefault(target, ast.literal_eval(value))
        except ValueError:
            continue
    return names


def _evaluate(node: ast.AST, names: dict[str, object]) -> object:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name) and node.id in names:
        return names[node.id]
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.attr in names:
        return names[node.attr]  # args.num_gpus_per_node: the dataclass default
    if isinstance(node, ast.IfExp):
        return _evaluate(node.body if _evaluate(node.test, names) else node.orelse, names)
    if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _COMPARE:
        return _COMPARE[type(node.ops[0])](_evaluate(node.left, names), _evaluate(node.comparators[0], names))
    raise _Unknown(ast.unparse(node))


def _text(node: ast.AST, names: dict[str, object]) -> str:
    if isinstance(node, ast.Constant):
        return str(node.value)
    parts = []
    for value in node.values:  # an f-string
        if isinstance(value, ast.FormattedValue):
            try:
                parts.append(str(_evaluate(value.value, names)))
            except _Unknown as unknown:
                parts.append(f"{UNKNOWN}{{{unknown}}}{UNKNOWN}")
        else:
            parts.append(str(value.value))
    return "".join(parts)


def command_line(text: str) -> tuple[list[str], str]:
    """(the flag words, the training script it names) of a Python launcher; SyntaxError when it is not Python."""
    tree = ast.parse(text)
    names = _constants(tree)
    words: list[str] = []
    script = ""
    stack: list[ast.AST] = [tree]
    strings: list[ast.AST] = []
    while stack:  # every string, in source order, without descending into f-strings
        node = stack.pop()
        if isinstance(node, (ast.Constant, ast.JoinedStr)):
            strings.append(node)
            continue
        stack.extend(reversed(list(ast.iter_child_nodes(node))))
    for node in strings:
        if isinstance(node, ast.Constant) and not isinstance(node.value, str):
            continue
        value = _text(node, names)
        if re.fullmatch(r"[\w/.-]*train(_async)?\.py", value):
            script = value
        elif value.lstrip().startswith("--"):
            words += _split(value)
    return words, script


def _split(text: str) -> list[str]:
    """Words split on blanks, an unknown field kept whole."""
    return re.findall(rf"(?:{UNKNOWN}[^{UNKNOWN}]*{UNKNOWN}|[^\s{UNKNOWN}])+", text)
