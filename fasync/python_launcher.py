"""What a Python launcher sets, read without running it: the command line it builds (miles' and slime's
`run_*.py`, CI end-to-end tests: the `--flag` strings it writes, in order), or the keywords of the
`...Config(...)` it calls (TRL).

Values are computed from the file's own constants, dataclass field defaults, argparse defaults and
`os.environ.get(NAME, default)` (with `--env` values), through literals, arithmetic, comparisons, `min`, `max`,
`int`, `float` and `str`. Nothing in the file is executed; a value that needs anything else stays unknown
(fasync.shell.UNKNOWN).
"""

from __future__ import annotations

import ast
import operator
import re

from fasync.shell import UNKNOWN


class _Unknown(Exception):
    pass


_COMPARE = {ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
            ast.Gt: operator.gt, ast.GtE: operator.ge}
_ARITHMETIC = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv,
               ast.Div: operator.truediv, ast.Mod: operator.mod}
_CALLS = {"int": int, "float": float, "str": str, "min": min, "max": max, "bool": bool}
_LARGEST = 10**15
"""Operands beyond this are no batch size or step count: left unknown rather than computed (a crafted file must
not make the import compute without end)."""
_LONGEST = 100_000
"""Longest string a concatenation may build."""


class _Scope:
    """The names a launcher binds, as far as they can be computed, and the environment it reads."""

    def __init__(self, tree: ast.Module, environment: dict[str, str]):
        self.environment = environment
        self.names: dict[str, object] = {}
        bindings = list(_bindings(tree))
        for _ in range(4):  # a binding may name a later one: a few passes settle them
            for name, value in bindings:
                if name not in self.names:
                    try:
                        self.names[name] = self.evaluate(value)
                    except _Unknown:
                        pass

    def evaluate(self, node: ast.AST) -> object:
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name) and node.id in self.names:
            return self.names[node.id]
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.attr in self.names:
            return self.names[node.attr]  # args.num_gpus_per_node: the dataclass or argparse default
        if isinstance(node, ast.IfExp):
            return self.evaluate(node.body if self.evaluate(node.test) else node.orelse)
        if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _COMPARE:
            return _COMPARE[type(node.ops[0])](self.evaluate(node.left), self.evaluate(node.comparators[0]))
        if isinstance(node, ast.BinOp) and type(node.op) in _ARITHMETIC:
            left, right = self.evaluate(node.left), self.evaluate(node.right)
            numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (left, right))
            joined = isinstance(node.op, ast.Add) and isinstance(left, str) and isinstance(right, str)
            if (numbers and max(abs(left), abs(right)) <= _LARGEST) or (joined and len(left) + len(right) <= _LONGEST):
                try:
                    return _ARITHMETIC[type(node.op)](left, right)
                except ZeroDivisionError as error:
                    raise _Unknown(ast.unparse(node)) from error
            raise _Unknown(ast.unparse(node))  # a sequence repeated, or numbers no setting holds
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            value = self.evaluate(node.operand)
            if isinstance(value, (int, float)):
                return -value
        if isinstance(node, (ast.List, ast.Tuple)):
            return [self.evaluate(element) for element in node.elts]
        if isinstance(node, ast.Subscript) and ast.unparse(node.value) == "os.environ":
            key = self.evaluate(node.slice)
            if key in self.environment:
                return self.environment[key]
        if isinstance(node, ast.Call):
            return self._call(node)
        raise _Unknown(ast.unparse(node))

    def _call(self, node: ast.Call) -> object:
        function = ast.unparse(node.func)
        if function in ("os.environ.get", "os.getenv") or (function in _CALLS and not node.keywords):
            arguments = [self.evaluate(argument) for argument in node.args]
            if function not in _CALLS:
                if arguments and arguments[0] in self.environment:
                    return self.environment[arguments[0]]
                if len(arguments) > 1:
                    return arguments[1]
            else:
                try:
                    return _CALLS[function](*arguments)
                except (TypeError, ValueError) as error:
                    raise _Unknown(ast.unparse(node)) from error
        raise _Unknown(ast.unparse(node))


def _bindings(tree: ast.Module):
    """(name, value node) for every assignment, annotated field default and argparse `add_argument` default, in
    source order (a tuple assignment of a tuple binds each name)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    yield target.id, node.value
                elif isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple) and \
                        len(target.elts) == len(node.value.elts):
                    yield from ((t.id, v) for t, v in zip(target.elts, node.value.elts) if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            yield node.target.id, node.value
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument" \
                and node.args and isinstance(node.args[0], ast.Constant) and str(node.args[0].value).startswith("--"):
            default = next((k.value for k in node.keywords if k.arg == "default"), None)
            if default is not None:
                yield str(node.args[0].value)[2:].replace("-", "_"), default


def _text(node: ast.AST, scope: _Scope) -> str:
    if isinstance(node, ast.Constant):
        return str(node.value)
    parts = []
    for value in node.values:  # an f-string
        if isinstance(value, ast.FormattedValue):
            try:
                parts.append(str(scope.evaluate(value.value)))
            except _Unknown as unknown:
                parts.append(f"{UNKNOWN}{{{unknown}}}{UNKNOWN}")
        else:
            parts.append(str(value.value))
    return "".join(parts)


def config_keywords(text: str, environment: dict[str, str]) -> tuple[str, dict[str, object]]:
    """(the config class, its keywords) of the first `...GRPOConfig(...)` call, with the `model` of the
    `...Trainer(...)` call and its `reward_funcs` (as written: names, or a reward model's id) and
    `environment_factory` (as written); a keyword whose
    value cannot be computed is left out. ("", {}) when there is no config call; SyntaxError when the text is not
    Python."""
    try:
        tree = ast.parse(text)
    except SyntaxError as error:
        try:
            tree = ast.parse(f"GRPOConfig({text})")  # a bare `key=value, ...` list
        except SyntaxError:
            raise error from None
    scope = _Scope(tree, environment)
    calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call)]
    config = next((node for node in calls if _called(node).endswith("GRPOConfig") and node.keywords), None)
    if config is None:
        return "", {}
    keywords = _keywords(config, scope)
    trainer = next((node for node in calls if _called(node).endswith("Trainer")), None)
    if trainer is not None and "model" in (found := _keywords(trainer, scope)):
        keywords.setdefault("model", found["model"])
    for keyword in trainer.keywords if trainer is not None else ():
        if keyword.arg == "reward_funcs":
            value = keyword.value
            elements = value.elts if isinstance(value, (ast.List, ast.Tuple)) else [value]
            keywords["reward_funcs"] = [e.value if isinstance(e, ast.Constant) else ast.unparse(e) for e in elements]
        elif keyword.arg == "environment_factory":
            keywords["environment_factory"] = ast.unparse(keyword.value)
    return _called(config), keywords


def _called(node: ast.Call) -> str:
    return getattr(node.func, "id", getattr(node.func, "attr", ""))


def _keywords(node: ast.Call, scope: _Scope) -> dict[str, object]:
    keywords = {}
    for keyword in node.keywords:
        try:
            keywords[keyword.arg] = scope.evaluate(keyword.value)
        except _Unknown:
            continue
    return keywords


def docstring(text: str) -> str:
    """The module's docstring (where a TrlParser script gives its command line), or ""."""
    try:
        return ast.get_docstring(ast.parse(text)) or ""
    except SyntaxError:
        return ""


def command_line(text: str, environment: dict[str, str]) -> tuple[list[str], str]:
    """(the flag words, the training script it names) of a Python launcher; SyntaxError when it is not Python."""
    tree = ast.parse(text)
    scope = _Scope(tree, environment)
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
        value = _text(node, scope)
        if re.fullmatch(r"[\w/.-]*train(_async)?\.py", value):
            script = value
        elif value.lstrip().startswith("--"):
            words += _split(value)
    return words, script


def _split(text: str) -> list[str]:
    """Words split on blanks, an unknown field kept whole."""
    return re.findall(rf"(?:{UNKNOWN}[^{UNKNOWN}]*{UNKNOWN}|[^\s{UNKNOWN}])+", text)
