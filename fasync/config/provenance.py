"""Which layer set each key: the file, line and column a diagnostic points at.

Key paths are tuples of mapping keys and list indices; as text they read `train.lr` or
`correction.reject_token_ratio[0]`. Overrides are located at `<cli>`, line N for the N-th
override, column 1.
"""

from __future__ import annotations

import re

from fasync.diagnostics import Location

KeyPath = tuple[str | int, ...]
CLI_FILE = "<cli>"

_SEGMENT = re.compile(r"([^.\[\]]+)|\[(\d+)\]")


def parse_key(key: str | KeyPath) -> KeyPath:
    """`a.b[0].c` (or `a.b.0.c`) → ("a", "b", 0, "c"); a tuple is returned as it is."""
    if isinstance(key, tuple):
        return key
    path: list[str | int] = []
    for name, index in _SEGMENT.findall(key):
        path.append(int(index) if index else (int(name) if name.isdigit() else name))
    return tuple(path)


def format_key(path: KeyPath) -> str:
    text = ""
    for segment in path:
        text += f"[{segment}]" if isinstance(segment, int) else (f".{segment}" if text else str(segment))
    return text


class Provenance:
    """The location of every key path some layer set, later layers replacing earlier ones."""

    def __init__(self, top_file: str):
        self.top_file = top_file
        self._setters: dict[KeyPath, Location] = {}

    def setter(self, key: str | KeyPath) -> Location | None:
        """Where the effective value of exactly this key was written; None when it is a default."""
        return self._setters.get(parse_key(key))

    def origin(self, key: str | KeyPath) -> Location:
        """Where to point for this key: its setter, else the nearest parent some layer wrote, else line 1."""
        path = parse_key(key)
        for end in range(len(path), 0, -1):
            location = self._setters.get(path[:end])
            if location is not None:
                return location
        return Location(self.top_file, 1, 1)

    def mention(self, path: KeyPath, location: Location | None) -> None:
        """A later layer merges into the mapping at `path`: it is now the one that names it."""
        if location is not None:
            self._setters[path] = location

    def replace(self, path: KeyPath, locations: dict[KeyPath, Location]) -> None:
        """A later layer replaced the value at `path`: forget the old layer's keys below it."""
        if path in self._setters:  # keys below a path are only ever recorded together with the path
            depth = len(path)
            for known in [p for p in self._setters if p[:depth] == path]:
                del self._setters[known]
        self._setters.update(locations)

    def items(self) -> list[tuple[KeyPath, Location]]:
        return list(self._setters.items())
