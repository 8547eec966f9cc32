"""Other RL frameworks, one module each: its key table (the loader's hints, F008, and the equivalence tables
of docs/migrate.md), its importer (`fasync import`) and its expresser (`fasync config show --as`).

Each table row names a key as the framework writes it (a dotted path in its config, or an argparse flag
without its dashes, `-` read as `_`), the fasync key(s) it feeds, how (the same value, a value converted by
the framework's own semantics, or no equivalent) and, where the meaning differs, how. Checked against each
framework's sources (verl, slime, miles, AReaL, prime-rl, OpenRLHF, TRL; see docs/migrate.md for the
versions read).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from fasync.frameworks import areal, miles, openrlhf, prime_rl, slime, trl, verl
from fasync.frameworks.common import Framework, KeyMapping

FRAMEWORKS: dict[str, Framework] = {module.FRAMEWORK.id: module.FRAMEWORK
                                    for module in (verl, slime, miles, areal, prime_rl, openrlhf, trl)}
"""Framework ids → frameworks, in the order the docs list them."""

TABLE: list[KeyMapping] = [row for framework in FRAMEWORKS.values() for row in framework.keys]

_GENERIC = {"batch_size", "n", "lr", "seed", "temperature", "top_p", "path", "name", "micro_batch_size",
            "max_new_tokens", "max_tokens", "weight_decay", "max_steps", "group_size", "beta", "epsilon"}
"""Leaf names too common to be matched on their own: only a longer path identifies them."""


def normalize(name: str) -> str:
    """`--rollout-batch-size`, `+actor_rollout_ref.x`, `~trainer.logger` → the table's spelling."""
    return name.lstrip("-+~").lower().replace("-", "_")


def _score(row: KeyMapping, path: tuple[str, ...]) -> float:
    """How well the row identifies a key at `path`: the number of trailing segments they share, when those
    are the whole of one of them or at least two (a bare common leaf such as `n` identifies nothing); a section
    row (`critic.*`) covers itself and the keys below it, just below a row that names the key. 0: no match."""
    source = tuple(row.source.split("."))
    if source[-1] == "*":
        prefix = source[:-1]
        return len(path) - 0.5 if path[: len(prefix)] == prefix else 0
    shared = 0
    while shared < min(len(source), len(path)) and source[-shared - 1] == path[-shared - 1]:
        shared += 1
    if shared == 0 or (shared == 1 and len(source) > 1 and path[-1] in _GENERIC):
        return 0
    return shared


def mappings_for(path: Iterable[str], framework: str | None = None) -> list[KeyMapping]:
    """The rows that best describe a foreign key at dotted `path` (its full path, or the longest trailing part
    of it, in some framework's table); only `framework`'s rows when it is known and has one."""
    normalized = tuple(normalize(str(p)) for p in path)
    scored = [(score, row) for row in TABLE if (score := _score(row, normalized))]
    if framework is not None and any(row.framework == framework for _, row in scored):
        scored = [(score, row) for score, row in scored if row.framework == framework]
    best = max((score for score, _ in scored), default=0)
    return [row for score, row in scored if score == best]


def row_for(framework: str, key: str) -> KeyMapping | None:
    """`framework`'s row for the key at its full dotted path (normalised): the row naming it, else the
    innermost section row (`critic.*`) above it; None when its table says nothing of it. Never a row that only
    shares the last component (`eval.n_samples_per_prompt` is not `rollout.n_samples_per_prompt`)."""
    key = ".".join(normalize(part) for part in key.split("."))
    rows = {row.source: row for row in FRAMEWORKS[framework].keys}
    if key in rows:
        return rows[key]
    parts = key.split(".")
    for length in range(len(parts) - 1, 0, -1):
        section = ".".join(parts[:length]) + ".*"
        if section in rows:
            return rows[section]
    return None


def detect(paths: Iterable[tuple[str, ...]]) -> str | None:
    """The framework whose table names at least three of these key paths and two thirds of those any table
    names, or None (a handful of habits from several frameworks is no framework's config)."""
    votes: Counter = Counter()
    named = 0
    for path in paths:
        frameworks = {row.framework for row in mappings_for(path)}
        named += bool(frameworks)
        votes.update(frameworks)
    if not votes:
        return None
    framework, count = votes.most_common(1)[0]
    return framework if count >= 3 and 3 * count >= 2 * named else None


def foreign_key_hint(key: str, rows: list[KeyMapping]) -> tuple[str, str]:
    """(message, help) for a diagnostic about the foreign key at dotted path `key`."""
    frameworks = "/".join(dict.fromkeys(row.display for row in rows))
    targets = list(dict.fromkeys(t for row in rows for t in row.targets))
    if not targets:
        message = f"`{key}` comes from {frameworks} and has no fasync equivalent"
    else:
        names = " or ".join(f"`{t}`" for t in targets)
        message = f"`{key}` comes from {frameworks}; fasync's is {names}"
    notes = list(dict.fromkeys(row.note for row in rows if row.note))
    if len(rows) > 1 and len(notes) > 1:
        help = " ".join(f"{row.display}: {row.note}" for row in rows if row.note)
    else:
        help = notes[0] if notes else f"rename it to `{targets[0]}`"
    return message, help
