"""Files a crash, a kill or a full disk never leaves half-written.

- `write_atomic`: a state file (summary.json, a checkpoint's meta.json) goes to a temp file beside it, is
  flushed to disk, then renamed over the old one: a reader sees the old file or the new one, never a part.
- `JsonlAppender`: one JSON object per line, each written whole and flushed; a write that fails part-way
  (disk full) is cut back to the last complete line before the error is raised.
- `describe_os_error`: the one line a user sees when the filesystem refuses (full, read-only, busy, a
  file where a directory should be).
- `read_jsonl_lines`: what a JSONL file of a run directory holds, line by line; a damaged line is a
  `DamagedFileError` that names the file and line.

Torch-free and dependency-free, so that any part of fasync can use it.
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from typing import Literal


class RunFileError(Exception):
    """The filesystem refused a write the run needs. The message is one line naming the path and the
    problem, fit to print as is."""


_PROBLEMS = {
    errno.ENOSPC: "no space left on device (the disk is full)",
    errno.EDQUOT: "the disk quota is exceeded",
    errno.EROFS: "the filesystem is read-only",
    errno.EACCES: "permission denied",
    errno.EPERM: "permission denied",
    errno.EBUSY: "it is busy (a mount point, or in use by another process)",
    errno.ENOTDIR: "a path component is a file, not a directory",
    errno.EEXIST: "it already exists",
    errno.EISDIR: "it is a directory",
    errno.ENAMETOOLONG: "the name is too long",
}


def describe_os_error(path: Path | str, error: OSError) -> str:
    """`PATH: no space left on device (the disk is full)` — one line, for any OSError a write raised."""
    problem = _PROBLEMS.get(error.errno, error.strerror or type(error).__name__)
    return f"{path}: {problem}"


def run_file_error(path: Path | str, error: OSError, doing: str) -> RunFileError:
    return RunFileError(f"cannot {doing} {describe_os_error(path, error)}")


def write_atomic(path: Path | str, data: str | bytes) -> None:
    """Replace `path` with `data` in one step: a temp file in the same directory, fsynced, then renamed."""
    path = Path(path)
    temp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    raw = data.encode("utf-8") if isinstance(data, str) else data
    try:
        with open(temp, "wb") as file:
            file.write(raw)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temp, path)
    except OSError as error:
        temp.unlink(missing_ok=True)
        raise run_file_error(path, error, "write") from error


def write_json_atomic(path: Path | str, value) -> None:
    write_atomic(path, json.dumps(value, indent=2) + "\n")


class JsonlAppender:
    """Appends whole JSON lines to `path`, flushed one by one.

    A line is written with as many `os.write` calls as it takes; if one fails (ENOSPC mid-line) the file is
    truncated back to where the line began, so the file always ends with a complete line."""

    def __init__(self, path: Path | str):
        self.path = Path(path)
        try:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        except OSError as error:
            raise run_file_error(self.path, error, "open") from error

    def append(self, value) -> None:
        data = (json.dumps(value) + "\n").encode("utf-8")
        start = os.lseek(self._fd, 0, os.SEEK_END)
        written = 0
        try:
            while written < len(data):
                written += os.write(self._fd, data[written:])
        except OSError as error:
            try:
                os.ftruncate(self._fd, start)
            except OSError:
                pass  # the line stays cut; `read_jsonl_lines` skips a last line that does not parse
            raise run_file_error(self.path, error, "write") from error

    @property
    def size(self) -> int:
        """Bytes written so far: a checkpoint records it, and a resume cuts the file back to it."""
        return os.lseek(self._fd, 0, os.SEEK_END)

    def rewind(self, size: int) -> int:
        """Cut the file back to `size` bytes (a resume going back to its checkpoint); what followed is kept in
        `<name>.rolled-back` beside it. Returns the bytes moved."""
        return cut_back(self.path, size, self.path.with_name(self.path.name + ".rolled-back"))

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class DamagedFileError(ValueError):
    """A file of a run directory that does not read as fasync writes it. The message names the file and line
    and says what to do, fit to print as is."""


def read_jsonl_lines(path: Path | str, cut_last_line: Literal["skip", "refuse"] = "skip") -> list[tuple[int, object]]:
    """(line number, value) of every non-blank line of a JSONL file. A last line a crash cut short is left out
    (`cut_last_line="skip"`) or a DamagedFileError (`"refuse"`); any other line that is not JSON (garbage,
    binary, nested too deeply to parse) is a DamagedFileError naming the file and line."""
    raw = Path(path).read_bytes()
    lines = raw.splitlines()
    values: list[tuple[int, object]] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        cut_short = number == len(lines) and not raw.endswith(b"\n")
        try:
            values.append((number, json.loads(line.decode("utf-8"))))
            continue
        except UnicodeDecodeError:
            problem = "not UTF-8 text (binary data)"
        except json.JSONDecodeError as error:
            problem = f"not a complete JSON object ({error.msg})"
        except RecursionError:
            problem = "nested too deeply to read"
        if cut_short and cut_last_line == "skip":
            break
        hint = ("the run stopped while writing this line; remove it to use the lines before it" if cut_short
                else "the file is damaged; fasync writes one JSON object per line")
        raise DamagedFileError(f"{path}:{number}: {problem}; {hint}")
    return values


def read_jsonl(path: Path | str) -> list:
    """Every complete line of a JSONL file; a last line cut short (by a crash before the truncation could
    run) is left out, a damaged line elsewhere is a DamagedFileError."""
    return [value for _, value in read_jsonl_lines(path)]


def cut_back(path: Path | str, size: int, keep_as: Path | str) -> int:
    """Truncate `path` to `size` bytes, moving what was after it to `keep_as` (appended); returns the bytes
    moved. A resume rewinds its logs to the checkpoint this way, and nothing written is lost."""
    path = Path(path)
    if not path.exists():
        return 0
    with open(path, "r+b") as file:
        file.seek(size)
        tail = file.read()
        if tail:
            with open(keep_as, "ab") as kept:
                kept.write(tail)
            file.truncate(size)
    return len(tail)
