"""What a launch script runs, read without running it: the command line of its training program, after the
script's own variables, defaults (`${VAR:-default}`, nested), arithmetic (`$((...))`), arrays (`"${X[@]}"`),
exports and line continuations, with wrappers (`bash -c "..."`, `srun`, `ray job submit -- ...`, `torchrun`,
`accelerate launch`) unwrapped. An `if` takes the branch the script's values select (the first when the
condition cannot be decided, which is said); loops and commands whose output a value needs (`$(...)`,
`source`, `read`) are not run, and the variables they set stay unknown.

tree-sitter-bash parses the script (it reads arrays, `$((...))` and `[[ ]]`, which bashlex does not); this module
walks its syntax tree and evaluates the part of bash that launch scripts use to build a command line. A line
bash would reject (a `<PLACEHOLDER>` left for the user to fill in) is left out, and a note names it.
"""

from __future__ import annotations

import ast
import operator
import re
from collections.abc import Callable
from dataclasses import dataclass, field

import tree_sitter_bash
from tree_sitter import Language, Node, Parser

UNKNOWN = "\x00"
"""Marks text that stands for an unknown value (an unset variable, a command's output)."""

_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_WRAPPERS = {"srun", "sudo", "env", "nohup", "time", "exec", "mpirun", "numactl", "stdbuf", "timeout"}
_PYTHON = re.compile(r"(?:.*/)?(python[0-9.]*|torchrun|deepspeed|accelerate)$")

_PARSER = Parser(Language(tree_sitter_bash.language()))
_EXPANSIONS = {"simple_expansion", "expansion", "arithmetic_expansion", "command_substitution",
               "process_substitution"}
_BLOCKS = {"program", "list", "pipeline", "variable_assignments", "compound_statement", "subshell",
           "negated_command", "function_definition", "case_statement", "case_item"}
"""Nodes whose statements run in order (a function's body is read where it is defined; every case is read)."""
_REDIRECTS = {"file_redirect", "heredoc_redirect", "herestring_redirect"}
_PASSES = 32
"""Parses of one script with its invalid lines left out: a TrlParser docstring, prose around its command lines,
takes a dozen; a file of errors is read around after that instead of parsed once per line."""
_NAMED = 5
"""Invalid lines named one by one in the notes; more are counted."""
_SHOWN = 100
"""Characters of an invalid line a note shows."""
_CONDITIONS = {"test_command", "binary_expression", "unary_expression", "parenthesized_expression", "list",
               "negated_command", "redirected_statement", "pipeline"}
"""Condition nodes read as the words `_test` decides on: operands expanded, operators (`==`, `&&`, `[`) as they are."""


@dataclass
class Command:
    program: str
    """What runs: a Python module (`verl.trainer.main_ppo`) or script (`train_async.py`)."""
    words: list[str]
    """Its arguments."""


@dataclass
class Script:
    variables: dict[str, str | list[str]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    """What the evaluation decided that the reader should know (the branch of an if, a line left out)."""
    commands: list[Command] = field(default_factory=list)

    def training_command(self) -> Command | None:
        """The Python program with the most arguments: the training entry point (launch scripts also run
        conversion tools, `ray start` and the like)."""
        return max(self.commands, key=lambda c: len(c.words), default=None)


# --- the syntax tree -----------------------------------------------------------------------------------------

def _parse(text: str, script: Script, origin: str) -> tuple[bytes, Node]:
    """The script's syntax tree, with each line where tree-sitter finds an error left out (blanked, so that line
    numbers stay): the script is parsed again until no error is left, at most `_PASSES` times (an error left
    after that is read around: its statements are skipped). The notes name the lines left out."""
    lines = text.replace("\r\n", "\n").split("\n")
    left_out: list[int] = []
    for passes in range(_PASSES + 1):
        source = "\n".join(lines).encode()
        root = _PARSER.parse(source).root_node
        rows = sorted({_row(bad) for bad in _errors(root)}) if root.has_error else []
        rows = [row for row in rows if row < len(lines) and lines[row].strip()]
        left_out += rows  # a line left out is blank: never found again
        if not rows or passes == _PASSES:
            break
        for row in rows:
            lines[row] = ""
    original = text.replace("\r\n", "\n").split("\n")
    for row in sorted(left_out)[:_NAMED]:
        line = original[row].strip()
        line = line if len(line) <= _SHOWN else line[:_SHOWN] + "..."
        script.notes.append(f"{origin}:{row + 1}: not valid bash (`{line}`): left out")
    if len(left_out) > _NAMED:
        script.notes.append(f"{origin}: {len(left_out) - _NAMED} more lines that are not valid bash: left out")
    return source, root


def _errors(node: Node):
    if node.is_error or node.is_missing:
        yield node
    elif node.has_error:
        for child in node.children:
            yield from _errors(child)


def _row(bad: Node) -> int:
    """The line an error is on: for a missing closer (`)`, `fi`), the line of the construct it would close; for an
    error node, the line of its first part that is not a whole, valid construct (tree-sitter wraps the valid
    statements before a stray token into the error node)."""
    if bad.is_missing:
        return (bad.parent or bad).start_point.row
    for part in bad.children:
        if part.is_error or part.has_error or not part.is_named:
            return _row(part) if part.is_error else part.start_point.row
    return bad.start_point.row


class _Fields:
    """The fields one shell word expands to, built from its parts: unquoted expansions split on blanks,
    `${X[@]}` gives one field per element."""

    def __init__(self, splitting: bool):
        self.splitting = splitting
        self.fields: list[str] = []
        self.current: list[str] = []

    def literal(self, text: str) -> None:
        self.current.append(text)

    def quoted(self, parts: list[str]) -> None:
        """A double-quoted string: several parts where it holds `"${X[@]}"`."""
        self.current.append(parts[0])
        if len(parts) > 1:
            self.fields.append("".join(self.current))
            self.fields += parts[1:-1]
            self.current = [parts[-1]]

    def expanded(self, value: str | list[str]) -> None:
        if isinstance(value, list):
            if self.current:
                self.fields.append("".join(self.current))
                self.current = []
            self.fields += value
        elif self.splitting and UNKNOWN not in value and value.split() != [value]:
            pieces = value.split()
            if pieces:
                self.current.append(pieces[0])
                if len(pieces) > 1:
                    self.fields.append("".join(self.current))
                    self.fields += pieces[1:-1]
                    self.current = [pieces[-1]]
        else:
            self.current.append(value)

    def done(self) -> list[str]:
        return self.fields + (["".join(self.current)] if self.current else [])


def _unescaped(text: str) -> str:
    """Unquoted text: a backslash keeps the next character; one before a newline continues the line."""
    return re.sub(r"\\(.)", r"\1", text.replace("\\\n", ""), flags=re.S)


def _unescaped_quoted(text: str) -> str:
    """Text inside double quotes, where a backslash escapes only `"`, `\\`, `$`, a backquote and a newline."""
    return re.sub(r'\\(["\\$`\n])', lambda m: "" if m[1] == "\n" else m[1], text)


class _Evaluator:
    """Walks a script's syntax tree in order, expanding each word under the variables the script holds so far."""

    def __init__(self, source: bytes, script: Script):
        self.source = source
        self.script = script

    def text(self, start: int, end: int) -> str:
        return self.source[start:end].decode("utf-8", "replace")

    def of(self, node: Node) -> str:
        return self.text(node.start_byte, node.end_byte)

    # statements

    def statement(self, node: Node) -> None:
        kind = node.type
        if kind in _BLOCKS:
            for child in node.named_children:
                self.statement(child)
        elif kind == "redirected_statement":
            body = node.child_by_field_name("body")
            if body is not None and body.type == "command":
                self.command(body, tuple(child for child in node.children if child.type in _REDIRECTS))
            elif body is not None:
                self.statement(body)
        elif kind == "variable_assignment":
            self.assignment(node)
        elif kind == "declaration_command":  # export NAME=value, declare -a X=(...)
            for child in node.named_children:
                if child.type == "variable_assignment":
                    self.assignment(child)
        elif kind == "command":
            self.command(node)
        elif kind == "if_statement":
            self.branch(node)
        # loops are not run; a test, comment or anything else sets nothing a command line needs

    def assignment(self, node: Node) -> None:
        name, value = node.child_by_field_name("name"), node.child_by_field_name("value")
        if name is None or name.type != "variable_name":  # X[1]=...: an element, which no launch script sets
            return
        if value is None:
            expanded: str | list[str] = ""
        elif value.type == "array":
            expanded = [word for element in value.named_children if element.type != "comment"
                        for word in self.fields(element)]
        else:
            expanded = " ".join(self.fields(value, splitting=False))
        _assign(self.script, self.of(name), expanded, append=any(child.type == "+=" for child in node.children))

    def command(self, node: Node, redirects: tuple[Node, ...] = ()) -> None:
        """A command, with the redirections that follow it (the words after a redirection's target are the
        command's arguments still: `python x.py --url https://<host> --model M`)."""
        words: list[str] = []
        for child in [*node.named_children, *redirects]:
            if child.type == "variable_assignment":
                self.assignment(child)  # NAME=value before the command: kept as the script's
            elif child.type in _REDIRECTS:
                words += self.arguments_after(child)
            elif child.type not in ("comment", "ERROR"):
                words += self.fields(child)
        if not words:
            return
        program = words[0]
        if program in ("source", "."):
            self.script.notes.append(f"`source {' '.join(words[1:]).replace(UNKNOWN, '')}` is not read: the "
                                     "variables it sets stay unknown")
        elif program != "read":  # the variables read sets stay unset: unknown where they are used
            _command(words, self.script)

    def branch(self, node: Node) -> None:
        """`if`/`elif`/`else`: the first clause whose condition holds, with the script's values."""
        clauses: list[tuple[list[Node], list[Node]]] = []
        otherwise: list[Node] = []
        for part in [node] + [child for child in node.children if child.type in ("elif_clause", "else_clause")]:
            condition: list[Node] = []
            body: list[Node] = []
            current = body if part.type == "else_clause" else condition
            for child in part.children:
                if child.type == "then":
                    current = body
                elif child.is_named and child.type not in ("comment", "elif_clause", "else_clause"):
                    current.append(child)
            if part.type == "else_clause":
                otherwise = body
            else:
                clauses.append((condition, body))
        for condition, body in clauses:
            if _condition([word for part in condition for word in self.condition_words(part)], self.script):
                otherwise = body
                break
        for statement in otherwise:
            self.statement(statement)

    def arguments_after(self, redirect: Node) -> list[str]:
        """The words tree-sitter attaches to a redirection after its target."""
        if redirect.type != "file_redirect":
            return []
        targets = [child for child in redirect.named_children if child.type != "file_descriptor"]
        return [word for argument in targets[1:] for word in self.fields(argument)]

    def condition_words(self, node: Node) -> list[str]:
        if node.type == "command":
            return [word for child in node.named_children if child.type not in _REDIRECTS
                    for word in self.fields(child)]
        if node.type in _CONDITIONS:
            return [word for child in node.children if child.type not in _REDIRECTS
                    for word in (self.condition_words(child) if child.is_named else [child.type])]
        return self.fields(node)

    # words

    def fields(self, node: Node, splitting: bool = True) -> list[str]:
        built = _Fields(splitting)
        self.add(node, built)
        return built.done()

    def add(self, node: Node, built: _Fields) -> None:
        kind = node.type
        if kind == "command_name":
            for child in node.named_children:
                self.add(child, built)
        elif kind == "concatenation":
            position = node.start_byte
            for child in node.children:
                if child.start_byte > position:
                    built.literal(_unescaped(self.text(position, child.start_byte)))
                self.add(child, built)
                position = child.end_byte
        elif kind in _EXPANSIONS:
            built.expanded(self.expansion(node))
        elif kind in ("string", "translated_string"):
            built.quoted(self.quoted(node))
        elif kind == "raw_string":
            built.literal(self.of(node)[1:-1])
        elif kind == "ansi_c_string":
            built.literal(self.of(node)[2:-1])
        elif kind != "comment":
            built.literal(_unescaped(self.of(node)))

    def quoted(self, node: Node) -> list[str]:
        """A double-quoted string's text, expanded; several parts where it holds `${X[@]}`."""
        parts = [""]
        opening = node.children[0] if node.children else node
        closing = node.children[-1] if len(node.children) > 1 and node.children[-1].type == '"' else None
        position, end = opening.end_byte, closing.start_byte if closing else node.end_byte
        for child in node.children:
            if child.type in _EXPANSIONS:
                parts[-1] += _unescaped_quoted(self.text(position, child.start_byte))
                value = self.expansion(child)
                if isinstance(value, list):
                    if value:
                        parts[-1] += value[0]
                        parts += value[1:]
                else:
                    parts[-1] += value
                position = child.end_byte
        parts[-1] += _unescaped_quoted(self.text(position, end))
        return parts

    def region(self, node: Node, start: int, end: int) -> str:
        """The text of `node` from byte `start` to `end`, expanded as inside double quotes with its own quotes
        removed: a default's word, an arithmetic expression."""
        out, position = [], start
        for child in node.children:
            if child.end_byte <= position or child.start_byte >= end:
                continue
            out.append(self.text(position, child.start_byte))
            if child.type in _EXPANSIONS:
                value = self.expansion(child)
                out.append(" ".join(value) if isinstance(value, list) else value)
            elif child.type in ("string", "translated_string"):
                out.append("".join(self.quoted(child)))
            elif child.type == "raw_string":
                out.append(self.of(child)[1:-1])
            else:
                out.append(self.region(child, max(child.start_byte, position), min(child.end_byte, end)))
            position = max(position, min(child.end_byte, end))
        out.append(self.text(position, end))
        return "".join(out)

    def expansion(self, node: Node) -> str | list[str]:
        children = node.children
        inner_start = children[0].end_byte if children else node.start_byte
        inner_end = children[-1].start_byte if len(children) > 1 and children[-1].type in ("}", "))", ")", "`") \
            else node.end_byte
        inner = self.text(inner_start, inner_end)
        if node.type == "arithmetic_expansion":
            return _arithmetic(self.region(node, inner_start, inner_end), inner, self.script)
        if node.type in ("command_substitution", "process_substitution"):
            return f"{UNKNOWN}$({inner}){UNKNOWN}"

        def expand(start: int, end: int) -> str:
            """The characters `start:end` of `inner`, expanded."""
            offset = inner_start + len(inner[:start].encode())
            return self.region(node, offset, offset + len(inner[start:end].encode()))

        return _parameter(self.script, inner, expand)


# --- values --------------------------------------------------------------------------------------------------

def _positional(script: Script) -> list[str]:
    """`$@`: the positional arguments given with `--env 1=...`, none otherwise."""
    values, index = [], 1
    while str(index) in script.variables:
        values.append(str(script.variables[str(index)]))
        index += 1
    return values


def _value(script: Script, name: str) -> str | list[str] | None:
    if name in script.variables:
        return script.variables[name]
    return None


def _parameter(script: Script, inner: str, expand: Callable[[int, int], str]) -> str | list[str]:
    """`${inner}`: NAME, NAME:-default, NAME-default, NAME:=default, NAME,,, NAME^^, #NAME, X[@], X[i], #X[@];
    `expand(start, end)` is `inner[start:end]` expanded (an index, a default's word), evaluated only where needed."""
    if inner in ("@", "*"):
        return _positional(script)
    match = re.fullmatch(rf"(#?)({_NAME}|[0-9]+|@|\*)(\[([^\]]*)\])?(.*)", inner, re.S)
    if not match:
        return f"{UNKNOWN}${{{inner}}}{UNKNOWN}"
    length, name, _, index, rest = match.groups()
    value = _value(script, name)
    if index in ("@", "*") and value is None:  # an array the script does not define (a sourced file's)
        return []
    if index is not None and value is not None:
        elements = value if isinstance(value, list) else [value]
        if index in ("@", "*"):
            value = elements if not length else str(len(elements))
            return value
        try:
            position = int(_arithmetic(expand(match.start(4), match.end(4)), index, script))
            value = elements[position] if -len(elements) <= position < len(elements) else ""
        except ValueError:
            value = None
    elif isinstance(value, list):
        value = value[0] if value else ""
    if length:
        return str(len(value)) if isinstance(value, str) else f"{UNKNOWN}${{{inner}}}{UNKNOWN}"
    operation = re.match(r"(:?)([-=+?])(.*)", rest, re.S)
    if operation:
        colon, op, word = operation.groups()
        missing = value is None or (colon and value == "")
        if op in "-=" and missing:
            default = expand(len(inner) - len(word), len(inner))
            if op == "=":
                script.variables[name] = default
            return default
        if op == "+":
            return "" if missing else expand(len(inner) - len(word), len(inner))
    elif rest == ",,":
        value = value.lower() if isinstance(value, str) else value
    elif rest == "^^":
        value = value.upper() if isinstance(value, str) else value
    if value is None:
        return f"{UNKNOWN}${{{name}}}{UNKNOWN}"
    return value



_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv,
              ast.Mod: operator.mod, ast.Pow: operator.pow}


_LARGEST = 10**15
"""Operands beyond this are no launch script's numbers."""


def _arithmetic(expanded: str, expression: str, script: Script) -> str:
    """`$((expression))` with integer arithmetic, from the expression with its `$` expansions `expanded`; a bare
    name is a variable, as in bash."""
    def substitute(match: re.Match) -> str:
        value = _value(script, match[0])
        value = value[0] if isinstance(value, list) and value else value
        if value is None or not re.fullmatch(r"\s*-?[0-9]+\s*", str(value)):
            raise ValueError(match[0])
        return f"({value})"

    try:
        if UNKNOWN in expanded:
            raise ValueError(expanded)
        expanded = re.sub(_NAME, substitute, expanded).replace("/", "//")
        return str(_evaluate(ast.parse(expanded.strip(), mode="eval").body))
    except (ValueError, SyntaxError, ZeroDivisionError, KeyError, TypeError):
        return f"{UNKNOWN}$(({expression})){UNKNOWN}"


def _evaluate(node: ast.AST) -> int:
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if max(abs(left), abs(right)) > _LARGEST or (isinstance(node.op, ast.Pow) and not 0 <= right <= 64):
            raise ValueError("no launch script's number")  # left unknown: a crafted script must not hang the import
        return _OPERATORS[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _evaluate(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    raise ValueError(ast.dump(node))


# --- statements ----------------------------------------------------------------------------------------------

_HIDDEN = "FASYNC_UNKNOWN_{}"
"""Names that stand for unknown parts of a `bash -c` string while it is parsed (tree-sitter reads no NUL)."""


def evaluate(text: str, environment: dict[str, str] | None = None, script: Script | None = None,
             origin: str = "the script") -> Script:
    """The script's variables and the Python commands it runs, with `environment` (`--env`) as its
    environment and positional arguments (`1`, `2`, ...); `origin` names the script in notes."""
    script = script or Script(variables=dict(environment or {}))
    hidden: list[str] = []

    def hide(match: re.Match) -> str:
        hidden.append(_HIDDEN.format(len(hidden)))
        script.variables[hidden[-1]] = match[0]
        return "${" + hidden[-1] + "}"

    try:
        source, root = _parse(re.sub(rf"{UNKNOWN}.*?{UNKNOWN}", hide, text, flags=re.S), script, origin)
        _Evaluator(source, script).statement(root)
    except RecursionError:  # no launch script nests so deep; a crafted one must not crash the import
        script.notes.append(f"{origin}: nested deeper than fasync reads (`if`, `$(...)`, `${{...}}` inside one "
                            "another): read up to there")
    for name in hidden:
        script.variables.pop(name, None)
    return script


def _condition(words: list[str], script: Script) -> bool:
    """`[ a op b ]`, `[[ ... && ... ]]`: decided where its values are known; the first branch otherwise."""
    shown = " ".join(w for w in words if isinstance(w, str)).replace(UNKNOWN, "")
    body = [w for w in words if isinstance(w, str) and w not in ("[", "]", "[[", "]]")]
    try:
        result = _test(body)
    except ValueError:
        script.notes.append(f"`if {shown}` cannot be decided without running the script: took its first branch")
        return True
    script.notes.append(f"`if {shown}` is {'true' if result else 'false'} with the script's values: took the "
                        f"{'first' if result else 'next'} branch")
    return result


def _test(words: list[str]) -> bool:
    for joiner in ("||", "&&"):
        if joiner in words:
            index = words.index(joiner)
            left, right = _test(words[:index]), _test(words[index + 1:])
            return (left or right) if joiner == "||" else (left and right)
    if words[:1] == ["!"]:
        return not _test(words[1:])
    if any(UNKNOWN in w for w in words):
        raise ValueError(words)
    if len(words) == 2 and words[0] in ("-z", "-n"):
        return (words[1] == "") == (words[0] == "-z")
    if len(words) == 3:
        left, op, right = words
        if op in ("=", "=="):
            return left == right
        if op == "!=":
            return left != right
        numeric = {"-eq": operator.eq, "-ne": operator.ne, "-gt": operator.gt, "-ge": operator.ge,
                   "-lt": operator.lt, "-le": operator.le}
        if op in numeric:
            return numeric[op](int(left), int(right))
    if len(words) == 1:
        return words[0] != ""
    raise ValueError(words)


def _assign(script: Script, name: str, value: str | list[str], append: bool) -> None:
    if isinstance(value, str) and re.fullmatch(rf"{UNKNOWN}\$\(.*\){UNKNOWN}", value, re.S):
        script.variables.pop(name, None)  # a command's output: unknown where it is used, named as a variable
        return
    previous = script.variables.get(name, [] if isinstance(value, list) else "")
    if append and isinstance(value, list):
        value = (previous if isinstance(previous, list) else [previous]) + value
    elif append:
        value = (previous if isinstance(previous, str) else " ".join(previous)) + value
    script.variables[name] = value


def _command(words: list[str], script: Script) -> None:
    """Unwraps `srun ... bash -c "..."`, `ray job submit ... -- ...`, `env X=1 ...` down to the program."""
    while words:
        program = words[0].rsplit("/", 1)[-1]
        if program in ("bash", "sh") and "-c" in words:
            inner = words[words.index("-c") + 1] if words.index("-c") + 1 < len(words) else ""
            evaluate(inner, script=script)
            return
        if program == "ray" and "--" in words:
            words = words[words.index("--") + 1:]
            continue
        if program in _WRAPPERS:
            rest = words[1:]
            while rest and (rest[0].startswith("-") or re.match(rf"{_NAME}=", rest[0])):
                flag = rest.pop(0)
                if program == "srun" and not ("=" in flag or flag.startswith("--")) and rest:
                    rest.pop(0)  # -w node
            words = rest
            continue
        if _PYTHON.match(words[0]):
            _python(words, script)
        return


def _python(words: list[str], script: Script) -> None:
    rest = words[1:]
    if words[0].endswith("accelerate") and rest[:1] == ["launch"]:
        rest = rest[1:]
    while rest:
        word = rest.pop(0)
        if word == "-m" and rest:
            script.commands.append(Command(rest[0], rest[1:]))
            return
        if word.endswith(".py"):
            script.commands.append(Command(word, rest))
            return
        if word.startswith("-") and "=" not in word and rest and not rest[0].startswith("-") \
                and not rest[0].endswith(".py") and word not in ("-u", "-O", "-B"):
            rest.pop(0)  # a launcher's option value: --nproc_per_node 8


def unknown_in(value) -> list[str]:
    """The unknown parts of an expanded value (`${HOME}`, `$(nvidia-smi ...)`)."""
    text = " ".join(map(str, value)) if isinstance(value, list) else str(value)
    return re.findall(rf"{UNKNOWN}(.*?){UNKNOWN}", text, re.S)


def shown(value: str) -> str:
    return value.replace(UNKNOWN, "")
