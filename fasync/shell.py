"""What a launch script runs, read without running it: the command line of its training program, after the
script's own variables, defaults (`${VAR:-default}`, nested), arithmetic (`$((...))`), arrays (`"${X[@]}"`),
exports and line continuations, with wrappers (`bash -c "..."`, `srun`, `ray job submit -- ...`, `torchrun`,
`accelerate launch`) unwrapped. An `if` takes the branch the script's values select (the first when the
condition cannot be decided, which is said); loops and commands whose output a value needs (`$(...)`,
`source`, `read`) are not run, and the variables they set stay unknown.

(bashlex parses neither arrays nor `$((...))` nor `[[ ]]`, all common in launch scripts, so this is a small
evaluator of the part of bash that launch scripts use to build a command line.)
"""

from __future__ import annotations

import ast
import operator
import re
from dataclasses import dataclass, field

UNKNOWN = "\x00"
"""Marks text that stands for an unknown value (an unset variable, a command's output)."""

_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_CONTROL = {"if", "then", "elif", "else", "fi", "for", "while", "until", "do", "done", "case", "esac"}
_ASSIGNING = {"export", "local", "declare", "readonly", "typeset"}
_WRAPPERS = {"srun", "sudo", "env", "nohup", "time", "exec", "mpirun", "numactl", "stdbuf", "timeout"}
_PYTHON = re.compile(r"(?:.*/)?(python[0-9.]*|torchrun|deepspeed|accelerate)$")


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
    """What the evaluation decided that the reader should know (the branch of an if)."""
    commands: list[Command] = field(default_factory=list)

    def training_command(self) -> Command | None:
        """The Python program with the most arguments: the training entry point (launch scripts also run
        conversion tools, `ray start` and the like)."""
        return max(self.commands, key=lambda c: len(c.words), default=None)


# --- words ---------------------------------------------------------------------------------------------------

class _Lexer:
    """Splits a script into statements of expanded words, under the variables the evaluator holds so far."""

    def __init__(self, text: str, script: Script):
        self.text = text.replace("\r\n", "\n")
        self.pos = 0
        self.script = script

    def statements(self):
        """Yields the words of one statement at a time, so that its assignments take effect before the next is
        expanded."""
        while self.pos < len(self.text):
            words = self._statement()
            if words:
                yield words

    def _statement(self) -> list:
        words: list = []
        while self.pos < len(self.text):
            char = self.text[self.pos]
            if self.text.startswith("\\\n", self.pos):
                self.pos += 2
            elif char in " \t":
                self.pos += 1
            elif char == "#":
                end = self.text.find("\n", self.pos)
                self.pos = len(self.text) if end < 0 else end
            elif char == "\n" or char == ";":
                self.pos += 1
                if self.text.startswith(";", self.pos):  # ;; in case
                    self.pos += 1
                return words
            elif self.text.startswith(("&&", "||"), self.pos):
                self.pos += 2
                if "[[" in words and "]]" not in words:  # inside [[ ]] they join conditions
                    words.append(self.text[self.pos - 2:self.pos])
                else:
                    return words
            elif self.text.startswith("&>", self.pos):
                self._redirect()
            elif char in "|&":
                self.pos += 1
                return words
            elif self._at_redirect():
                self._redirect()
            elif char in "()":
                self.pos += 1
                words.append(char)
            else:
                start = self.pos
                word, array = self._word(splitting=True)
                self.pos += self.pos == start  # a character no word starts with: skip it
                if array is not None:
                    words.append(array)  # an array assignment NAME=( ... )
                else:
                    words += word
        return words

    def _at_redirect(self) -> bool:
        return bool(re.match(r"[0-9]?(>>?|<<<|<)", self.text[self.pos:self.pos + 4]))

    def _redirect(self) -> None:
        """Skips a redirection and its target (none for a descriptor copy, `2>&1`)."""
        match = re.match(r"&?[0-9]?(>>?|<<<|<)(&[0-9-])?", self.text[self.pos:])
        self.pos += match.end()
        if match[2]:
            return
        while self.pos < len(self.text) and self.text[self.pos] in " \t":
            self.pos += 1
        self._word(splitting=False)

    def _word(self, splitting: bool):
        """One shell word, expanded: a list of fields (unquoted expansions split, `"${X[@]}"` gives one per
        element), or an array assignment as ('NAME', [elements])."""
        fields: list[str] = []
        current: list[str] = []
        started = False
        assignment = re.match(rf"({_NAME})(\+?)=\(", self.text[self.pos:])
        if assignment:
            self.pos += assignment.end()
            return [], (assignment[1], self._array_elements())
        while self.pos < len(self.text):
            char = self.text[self.pos]
            placeholder = char == "<" and "".join(current).endswith("=")  # NAME=<PLACEHOLDER>
            if char in " \t\n;|&()" or (char in "<>" and not placeholder) or (char == "#" and not started):
                break
            started = True
            if self.text.startswith("\\\n", self.pos):
                self.pos += 2
            elif char == "\\":
                current.append(self.text[self.pos + 1:self.pos + 2])
                self.pos += 2
            elif char == "'":
                end = self.text.find("'", self.pos + 1)
                end = len(self.text) if end < 0 else end
                current.append(self.text[self.pos + 1:end])
                self.pos = end + 1
            elif char == '"':
                self.pos += 1
                parts = self._double_quoted()
                if len(parts) != 1:  # "${X[@]}": one field per element
                    if parts:
                        current.append(parts[0])
                        fields.append("".join(current))
                        fields += parts[1:-1]
                        current = [parts[-1]]
                    continue
                current.append(parts[0])
            elif char == "$":
                value = self._expansion()
                if isinstance(value, list):
                    if current:
                        fields.append("".join(current))
                        current = []
                    fields += value
                    started = bool(value)
                elif splitting and UNKNOWN not in value and value.split() != [value]:  # unquoted: split on blanks
                    pieces = value.split()
                    if pieces:
                        current.append(pieces[0])
                        if len(pieces) > 1:
                            fields.append("".join(current))
                            fields += pieces[1:-1]
                            current = [pieces[-1]]
                else:
                    current.append(value)
            else:
                current.append(char)
                self.pos += 1
        if current or (started and not fields and self.text[self.pos - 1:self.pos] in "\"'"):
            fields.append("".join(current))
        return fields, None

    def _array_elements(self) -> list[str]:
        elements: list[str] = []
        while self.pos < len(self.text):
            char = self.text[self.pos]
            if self.text.startswith("\\\n", self.pos):
                self.pos += 2
            elif char in " \t\n":
                self.pos += 1
            elif char == "#":
                end = self.text.find("\n", self.pos)
                self.pos = len(self.text) if end < 0 else end
            elif char == ")":
                self.pos += 1
                break
            else:
                start = self.pos
                words, _ = self._word(splitting=True)
                elements += words
                self.pos += self.pos == start  # an operator inside the parentheses: skip it
        return elements

    def _double_quoted(self) -> list[str]:
        """The text up to the closing quote, expanded; several parts where it holds `${X[@]}`."""
        parts: list[str] = [""]
        while self.pos < len(self.text):
            char = self.text[self.pos]
            if char == '"':
                self.pos += 1
                break
            if char == "\\" and self.text[self.pos + 1:self.pos + 2] in ('"', "\\", "$", "`", "\n"):
                escaped = self.text[self.pos + 1]
                parts[-1] += "" if escaped == "\n" else escaped
                self.pos += 2
            elif char == "$":
                value = self._expansion()
                if isinstance(value, list):
                    if not value:
                        continue
                    parts[-1] += value[0]
                    parts += value[1:]
                else:
                    parts[-1] += value
            else:
                parts[-1] += char
                self.pos += 1
        return parts

    def _double_quoted_text(self) -> str:
        """A default's word: expanded as inside double quotes, its own quotes removed."""
        out = ""
        while self.pos < len(self.text):
            char = self.text[self.pos]
            if char == '"':
                self.pos += 1
                out += "".join(self._double_quoted())
            elif char == "'":
                end = self.text.find("'", self.pos + 1)
                end = len(self.text) if end < 0 else end
                out += self.text[self.pos + 1:end]
                self.pos = end + 1
            elif char == "$":
                value = self._expansion()
                out += " ".join(value) if isinstance(value, list) else value
            else:
                out += char
                self.pos += 1
        return out

    def _closing(self, open_: str, close: str, start: int) -> int:
        """The index of the `close` that balances an `open_` before `start`."""
        depth, index = 1, start
        while index < len(self.text):
            if self.text.startswith(open_, index):
                depth += 1
                index += len(open_)
            elif self.text.startswith(close, index):
                depth -= 1
                if depth == 0:
                    return index
                index += len(close)
            else:
                index += 1
        return len(self.text)

    def _expansion(self) -> str | list[str]:
        text = self.text
        if text.startswith("$((", self.pos):
            end = self._closing("(", ")", self._closing("(", ")", self.pos + 3) + 1)
            expression = text[self.pos + 3:end - 1]
            self.pos = end + 1
            return arithmetic(expression, self.script)
        if text.startswith("$(", self.pos):
            end = self._closing("(", ")", self.pos + 2)
            command = text[self.pos + 2:end]
            self.pos = end + 1
            return f"{UNKNOWN}$({command}){UNKNOWN}"
        if text.startswith("${", self.pos):
            end = self._closing("{", "}", self.pos + 2)
            inner = text[self.pos + 2:end]
            self.pos = end + 1
            return _parameter(self.script, inner)
        match = re.match(rf"\$({_NAME}|[0-9@*#?$!])", text[self.pos:])
        if match:
            self.pos += match.end()
            return _parameter(self.script, match[1])
        self.pos += 1
        return "$"


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


def _parameter(script: Script, inner: str) -> str | list[str]:
    """`${inner}`: NAME, NAME:-default, NAME-default, NAME:=default, NAME,,, NAME^^, #NAME, X[@], X[i], #X[@]."""
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
            position = int(arithmetic(index, script))
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
            default = _Lexer(word, script)._double_quoted_text()
            if op == "=":
                script.variables[name] = default
            return default
        if op == "+":
            return "" if missing else _Lexer(word, script)._double_quoted_text()
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


def arithmetic(expression: str, script: Script) -> str:
    """`$((expression))` with integer arithmetic; a bare name is a variable, as in bash."""
    def substitute(match: re.Match) -> str:
        value = _value(script, match[0])
        value = value[0] if isinstance(value, list) and value else value
        if value is None or not re.fullmatch(r"\s*-?[0-9]+\s*", str(value)):
            raise ValueError(match[0])
        return f"({value})"

    try:
        expanded = _Lexer(expression, script)._double_quoted_text()
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

def evaluate(text: str, environment: dict[str, str] | None = None, script: Script | None = None) -> Script:
    """The script's variables and the Python commands it runs, with `environment` (`--env`) as its
    environment and positional arguments (`1`, `2`, ...)."""
    script = script or Script(variables=dict(environment or {}))
    lexer = _Lexer(text, script)
    branches: list[list] = []
    """Per open `if`: [taking the current branch, a branch was taken, the enclosing level is live]."""
    loops = 0
    for words in lexer.statements():
        head = words[0] if isinstance(words[0], str) else ""
        live = all(level[0] for level in branches) and not loops
        if head in ("for", "while", "until"):
            loops += 1
            if "do" not in words:
                continue
            words = []
        if head == "done" or (words and words[-1] == "done"):
            loops = max(loops - 1, 0)
            continue
        if head in ("if", "elif"):
            condition = [w for w in words[1:] if w != "then"]
            if head == "if":
                branches.append([False, False, live])
            level = branches[-1]
            if level[1] or not level[2]:
                level[0] = False
            else:
                taken = _condition(condition, script)
                level[0] = taken
                level[1] = taken
            continue
        if head == "then":
            words = words[1:]
            if not words:
                continue
        if head == "else" and branches:
            level = branches[-1]
            level[0] = level[2] and not level[1]
            level[1] = True
            words = words[1:]
            if not words:
                continue
        if head == "fi" and branches:
            branches.pop()
            continue
        if not all(level[0] for level in branches) or loops:
            continue
        _statement(words, script)
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


def _statement(words: list, script: Script) -> None:
    if isinstance(words[0], str) and words[0] in _ASSIGNING:  # export NAME=value, declare -a X=(...)
        for word in words[1:]:
            if isinstance(word, tuple) or ("=" in word and not word.startswith("-")):
                _assign(word, script)
        return
    while words and (isinstance(words[0], tuple) or re.match(rf"{_NAME}\+?=", words[0])):
        _assign(words[0], script)
        words = words[1:]
    if not words:
        return
    program = words[0]
    if program in ("source", "."):
        script.notes.append(f"`source {' '.join(words[1:]).replace(UNKNOWN, '')}` is not read: the variables it "
                            "sets stay unknown")
        return
    if program == "read":  # the variables it sets stay unset: unknown where they are used
        return
    _command([w for w in words if isinstance(w, str)], script)


def _assign(word, script: Script) -> None:
    if isinstance(word, tuple):
        name, elements = word
        script.variables[name] = elements
        return
    name, _, value = word.partition("=")
    append = name.endswith("+")
    name = name.rstrip("+")
    if UNKNOWN in value and re.fullmatch(rf"{UNKNOWN}\$\(.*\){UNKNOWN}", value, re.S):
        script.variables.pop(name, None)  # a command's output: unknown where it is used, named as a variable
        return
    previous = script.variables.get(name, "")
    script.variables[name] = (previous if isinstance(previous, str) else " ".join(previous)) + value if append \
        else value


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
