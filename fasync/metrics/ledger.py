"""The sample ledger: every sample that entered generation is accounted for, in every mode.

A sample is in exactly one state: in flight (being generated), queued (generated and scored, waiting
for the trainer), trained, or dropped for a reason. The transitions below are the only way a count
changes, so that at every moment

    produced = trained + dropped (by reason) + queued + in flight.

Counts are in samples (a prompt group of n completions counts n). The ledger lives where the samples
are: in the driver's process in sync and async, in the rollouter actor in fully_async, which hands a
copy to the trainer with every drain.

Given the groups a transition moves, the ledger also notes it by group id (`GroupId`, "draw.attempt") in its
journal; the driver appends the journal to the run directory's ledger.jsonl, one event per line, and
`audit` replays that file across every resume of the run (`fasync ledger RUN_DIR`): no id trained twice,
every transition from the state the id was in, every prompt the data cursor handed out accounted for, and
which completion lengths the drops took.
"""

from __future__ import annotations

import json
import re
import threading
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from fasync.atomic import JsonlAppender
from fasync.killpoints import kill_point

DropReason = Literal["zero_variance", "surplus", "unfinished_at_stop", "stale", "stale_at_resume", "trimmed",
                     "reward_failed"]

DROPPED_FROM: dict[str, str] = {
    "zero_variance": "in_flight",
    "surplus": "in_flight",
    "unfinished_at_stop": "in_flight",
    "stale_at_resume": "in_flight",
    "stale": "queued",
    "trimmed": "queued",
    "reward_failed": "in_flight",
}
"""The state a sample leaves when it is dropped for each reason: dynamic sampling drops a group as
soon as it is scored, so does a reward that could not score one of its completions (`reward.on_error: drop`), a run that stops drops what it was generating, a resumed run drops a partial
generation whose prefix has become too stale, the trainer drops a group too stale to train on and the
samples that do not fill a global batch."""

JOURNAL = "ledger.jsonl"
"""The run directory's journal of group transitions."""


class Event:
    """The journal's event names (each ledger.jsonl line's `event`): the ledger's transitions, then the marks the
    driver adds where a process of the run resumed, took a checkpoint, and ended."""

    PRODUCED = "produced"
    QUEUED = "queued"
    TRAINED = "trained"
    DROPPED = "dropped"
    RESUME = "resume"
    CHECKPOINT = "checkpoint"
    END = "end"


class Journal(JsonlAppender):
    """The run directory's ledger.jsonl, which the driver's process writes: the ledger's transitions wherever
    the ledger lives (`write`), and its own marks (`mark`)."""

    def __init__(self, run_dir: Path):
        super().__init__(Path(run_dir) / JOURNAL)

    def write(self, entries: list[dict]) -> None:
        for index, entry in enumerate(entries):
            if index:
                kill_point("journal_append")
            self.append(entry)

    def mark(self, event: str, **fields) -> None:
        self.append({"event": event, **fields})


def _journal_entry(event: str, groups: Sequence, reason: str | None = None, lengths: bool = False) -> dict:
    entry: dict = {"event": event, "ids": [str(g.group_id) for g in groups]}
    if reason is not None:
        entry["reason"] = reason
    if lengths:
        entry["lengths"] = [g.response_length for g in groups]
    return entry


@dataclass
class Ledger:
    produced: int = 0
    consumed: int = 0
    """Trained on."""
    queued: int = 0
    in_flight: int = 0
    dropped: Counter = field(default_factory=Counter)
    journal: list = field(default_factory=list, repr=False, compare=False)
    """Transitions by group id not yet written to the run's ledger.jsonl (`take_journal`)."""
    _lock: threading.RLock = field(default_factory=threading.RLock, repr=False, compare=False)
    """async generates in a thread while the trainer trains: each transition is atomic."""

    # -- transitions -----------------------------------------------------------------------------

    # Each transition takes the sample count and, where the caller has them, the prompt groups it moves
    # (anything with `group_id` and `response_length`), which go into the journal.

    def _note(self, entry: dict) -> None:
        if entry["ids"]:
            self.journal.append(entry)

    def admit(self, samples: int, groups: Sequence = ()) -> None:
        """New samples start generating."""
        with self._lock:
            self.produced += samples
            self.in_flight += samples
            self._note(_journal_entry(Event.PRODUCED, groups))

    def deliver(self, samples: int, groups: Sequence = ()) -> None:
        """Generated and scored samples wait for the trainer."""
        with self._lock:
            self.in_flight -= samples
            self.queued += samples
            self._note(_journal_entry(Event.QUEUED, groups))

    def drop(self, reason: DropReason, samples: int, groups: Sequence = ()) -> None:
        """Samples leave the state `DROPPED_FROM[reason]` and are never trained on."""
        if not samples:
            return
        with self._lock:
            setattr(self, DROPPED_FROM[reason], getattr(self, DROPPED_FROM[reason]) - samples)
            self.dropped[reason] += samples
            self._note(_journal_entry(Event.DROPPED, groups, reason, lengths=True))

    def train(self, taken: int, trained: int, groups: Sequence = ()) -> None:
        """The trainer took `taken` queued samples (of `groups`) and trained on `trained` of them; the rest
        were trimmed. A group counts as trained once, however many of its samples the trim left."""
        with self._lock:
            self.queued -= trained
            self.consumed += trained
            self._note(_journal_entry(Event.TRAINED, groups, lengths=True))
            self.drop("trimmed", taken - trained)

    def take_journal(self) -> list[dict]:
        """The journal entries since the last call, for ledger.jsonl."""
        with self._lock:
            entries, self.journal = self.journal, []
            return entries

    # -- reading ---------------------------------------------------------------------------------

    @property
    def dropped_total(self) -> int:
        return sum(self.dropped.values())

    @property
    def balanced(self) -> bool:
        with self._lock:
            counts = (self.consumed, self.queued, self.in_flight, *self.dropped.values())
            return min(counts) >= 0 and self.produced == sum(counts)

    def copy(self) -> "Ledger":
        with self._lock:
            return Ledger(self.produced, self.consumed, self.queued, self.in_flight, Counter(self.dropped))

    def __getstate__(self) -> dict:
        return {name: value for name, value in self.copy().__dict__.items() if name not in ("_lock", "journal")}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, journal=[], _lock=threading.RLock())

    def as_dict(self) -> dict:
        return {
            "produced": self.produced,
            "consumed": self.consumed,
            "dropped": dict(self.dropped),
            "queued": self.queued,
            "in_flight": self.in_flight,
            "balanced": self.balanced,
        }

    @classmethod
    def from_dict(cls, counts: dict) -> "Ledger":
        """The ledger `as_dict` wrote (a checkpoint restores it so)."""
        return cls(counts["produced"], counts["consumed"], counts["queued"], counts["in_flight"],
                   Counter(counts["dropped"]))

    def balance_sheet(self) -> str:
        """produced = consumed + dropped (by reason) + queued + in flight, and whether it holds."""
        drops = ", ".join(f"{reason} {n}" for reason, n in sorted(self.dropped.items())) or "none"
        verdict = "balanced" if self.balanced else "UNBALANCED"
        return (
            f"produced {self.produced} = consumed {self.consumed} + dropped {self.dropped_total} ({drops}) "
            f"+ queued {self.queued} + in flight {self.in_flight}: {verdict}"
        )


# -- the audit of a run's journal ------------------------------------------------------------------


def length_bucket(length: float) -> str:
    """Completion lengths in powers of two: "0", "1", "2", "3-4", "5-8", ..."""
    if length <= 2:
        return str(round(length))
    upper = 4
    while length > upper:
        upper *= 2
    return f"{upper // 2 + 1}-{upper}"


def _bucket_order(bucket: str) -> int:
    return int(bucket.split("-")[0])


@dataclass
class Audit:
    """What `audit` found in a run's ledger.jsonl. `problems` empty means every invariant holds."""

    processes: int = 1
    """The run's processes: the first and one per resume."""
    states: Counter = field(default_factory=Counter)
    """Groups by their last state: in_flight, queued, trained, dropped."""
    dropped: Counter = field(default_factory=Counter)
    """Dropped groups by reason."""
    by_length: dict = field(default_factory=lambda: defaultdict(Counter))
    """Per completion-length bucket: trained groups and dropped groups by reason."""
    cursor: int | None = None
    """Prompts the data cursor had handed out at the last checkpoint or the end."""
    finished: bool = False
    """The run's last process ended it (its final checkpoint is in the journal): it was not killed."""
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def produced(self) -> int:
        return sum(self.states.values())

    def report(self) -> str:
        """What `fasync ledger` prints: the groups' balance, the processes, the drops and any problem."""
        lines = [f"groups: produced {self.produced} = trained {self.states['trained']} + dropped "
                 f"{self.states['dropped']} + queued {self.states['queued']} + in flight {self.states['in_flight']}",
                 f"processes: {self.processes} ({self.processes - 1} resume{'' if self.processes == 2 else 's'}); "
                 f"data cursor: {self.cursor if self.cursor is not None else 'not recorded'}; "
                 f"{'ended cleanly' if self.finished else 'did not end cleanly (killed, or still running)'}"]
        if self.dropped:
            lines.append("dropped by reason: " + ", ".join(f"{r} {n}" for r, n in sorted(self.dropped.items())))
            reasons = sorted(self.dropped)
            lines.append("completion length   trained  " + "  ".join(f"{r:>12}" for r in reasons))
            for bucket in sorted(self.by_length, key=_bucket_order):
                counts = self.by_length[bucket]
                lines.append(f"{bucket:>17}   {counts['trained']:>7}  "
                             + "  ".join(f"{counts[r]:>12}" for r in reasons))
        if self.problems:
            lines.append(f"FAILED: {len(self.problems)} problem{'s' if len(self.problems) > 1 else ''}")
            lines += [f"  {problem}" for problem in self.problems[:20]]
            if len(self.problems) > 20:
                lines.append(f"  ... and {len(self.problems) - 20} more")
        else:
            lines.append("every invariant holds: no group trained twice, every transition from the state its group "
                         "was in, every prompt drawn accounted for")
        return "\n".join(lines)


GROUP_ID = re.compile(r"\d+\.\d+")
"""A group id as the journal writes it: "draw.attempt"."""


def _count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _entry_problem(entry) -> str | None:
    """What makes `entry` other than an event the driver writes, or None."""
    if not isinstance(entry, dict):
        return f"an event must be a JSON object, not {type(entry).__name__}"
    event = entry.get("event")
    if not isinstance(event, str):
        return "the object has no \"event\" name"
    if event in ("checkpoint", "end") and not _count(entry.get("draws")):
        return f"the {event} event's \"draws\" must be a whole number, not {json.dumps(entry.get('draws'))[:40]}"
    if event not in ("produced", "queued", "trained", "dropped"):
        return None
    ids = entry.get("ids")
    if not isinstance(ids, list) or not all(isinstance(g, str) and GROUP_ID.fullmatch(g) for g in ids):
        return f"the {event} event's \"ids\" must be a list of group ids \"draw.attempt\""
    if event in ("trained", "dropped"):
        lengths = entry.get("lengths")
        if (not isinstance(lengths, list) or len(lengths) != len(ids)
                or not all(isinstance(n, (int, float)) and not isinstance(n, bool) for n in lengths)):
            return f"the {event} event's \"lengths\" must be a list of one number per id"
    if event == "dropped" and entry.get("reason") not in DROPPED_FROM:
        return f"a drop's \"reason\" must be one of {', '.join(DROPPED_FROM)}, not {json.dumps(entry.get('reason'))[:40]}"
    return None


def read_journal(journal: Path) -> list[tuple[int, dict]]:
    """(line number, event) of every event in a ledger.jsonl; a last line a crash cut short is left out, any
    other line that is not an event the driver writes is a DamagedFileError naming the file and line."""
    from fasync.atomic import DamagedFileError, read_jsonl_lines

    entries = []
    for number, entry in read_jsonl_lines(journal):
        problem = _entry_problem(entry)
        if problem is not None:
            raise DamagedFileError(f"{journal}:{number}: {problem}; the journal is damaged, so the ledger cannot "
                                   "be audited (fasync writes one event object per line)")
        entries.append((number, entry))
    return entries


def audit(journal: Path, counts: dict | None = None, samples_per_group: int | None = None) -> Audit:
    """Replay ledger.jsonl. With the run's final sample `counts` (summary.json's ledger) and its
    `samples_per_group`, also check that the journal and the counts agree. A damaged journal is a
    DamagedFileError."""
    result = Audit()
    draws = _replay(read_journal(journal), result)
    if result.cursor is not None:
        _check_cursor(result, draws)
    if counts is not None and samples_per_group and result.finished:
        _check_counts(result, counts, samples_per_group)
    return result


def _replay(entries: list[tuple[int, dict]], result: Audit) -> set[int]:
    """Move every group through its states as the journal's events say, noting each move its state does not
    allow; fills `result` (processes, cursor, states, drops, lengths) and returns the draws that produced a
    group."""
    state: dict[str, str] = {}
    draws: set[int] = set()
    for number, entry in entries:
        event = entry.get("event")
        if event == Event.RESUME:
            result.processes += 1
            result.finished = False
            continue
        if event in (Event.CHECKPOINT, Event.END):
            result.cursor = entry["draws"]
            result.finished = result.finished or event == Event.END
            continue
        for index, group in enumerate(entry.get("ids", [])):
            where = f"line {number}: group {group}"
            before = state.get(group)
            if event == Event.PRODUCED:
                if before is not None:
                    result.problems.append(f"{where} produced again (it was {before})")
                draws.add(int(group.split(".")[0]))
                state[group] = "in_flight"
            elif event == Event.QUEUED:
                if before != "in_flight":
                    result.problems.append(f"{where} queued while {before or 'never produced'}")
                state[group] = "queued"
            elif event == Event.TRAINED:
                if before == "trained":
                    result.problems.append(f"{where} trained twice")
                elif before != "queued":
                    result.problems.append(f"{where} trained while {before or 'never produced'}")
                state[group] = "trained"
                result.by_length[length_bucket(entry["lengths"][index])]["trained"] += 1
            elif event == Event.DROPPED:
                reason = entry["reason"]
                if before != DROPPED_FROM.get(reason):
                    result.problems.append(f"{where} dropped ({reason}) while {before or 'never produced'}")
                state[group] = "dropped"
                result.dropped[reason] += 1
                result.by_length[length_bucket(entry["lengths"][index])][reason] += 1
            else:
                result.problems.append(f"line {number}: unknown event {event!r}")
                break
    result.states = Counter(state.values())
    return draws


def _check_cursor(result: Audit, draws: set[int]) -> None:
    """Every draw the data cursor handed out has a group, and a run that ended has none beyond it."""
    missing = sorted(set(range(result.cursor)) - draws)
    if missing:
        result.problems.append(f"{len(missing)} prompt(s) the data cursor handed out have no group: draws "
                               f"{', '.join(map(str, missing[:10]))}{' ...' if len(missing) > 10 else ''}")
    beyond = sorted(d for d in draws if d >= result.cursor)
    if beyond and result.finished:
        result.problems.append(f"groups of draws beyond the data cursor {result.cursor}: {beyond[:10]}")


def _check_counts(result: Audit, counts: dict, samples_per_group: int) -> None:
    """The summary's sample counts equal the journal's groups, `samples_per_group` samples each."""
    n = samples_per_group
    expected = {
        "trained (consumed + trimmed)": (counts["consumed"] + counts["dropped"].get("trimmed", 0),
                                         result.states["trained"] * n),
        "queued": (counts["queued"], result.states["queued"] * n),
        "in flight": (counts["in_flight"], result.states["in_flight"] * n),
        **{f"dropped {reason}": (count, result.dropped[reason] * n)
           for reason, count in counts["dropped"].items() if reason != "trimmed"},
    }
    for name, (samples, journal_samples) in expected.items():
        if samples != journal_samples:
            result.problems.append(f"the summary's ledger says {name} {samples} samples, the journal "
                                   f"{journal_samples}")


def _counts_problem(counts) -> str | None:
    """What makes summary.json's `ledger` other than the counts `Ledger.as_dict` writes, or None."""
    if not isinstance(counts, dict):
        return f"must be an object of sample counts, not {type(counts).__name__}"
    for key in ("consumed", "queued", "in_flight"):
        if not _count(counts.get(key)):
            return f"{key!r} must be a whole number of samples, not {json.dumps(counts.get(key))[:40]}"
    dropped = counts.get("dropped")
    if not isinstance(dropped, dict) or not all(_count(n) for n in dropped.values()):
        return "'dropped' must be an object of whole numbers of samples by reason"
    return None


def audit_run(run_dir: Path) -> Audit:
    """`audit` of a run directory's journal, checked against its summary.json when the run ended cleanly.
    Raises FileNotFoundError (with the path) when the directory holds no journal, DamagedFileError when the
    journal or the summary's counts are not what fasync writes."""
    import yaml

    from fasync.atomic import DamagedFileError

    run_dir = Path(run_dir)
    journal = run_dir / JOURNAL
    if not journal.is_file():
        raise FileNotFoundError(f"{run_dir}: no {JOURNAL} (not a fasync run directory, or a run from before the "
                                "ledger journal)")
    counts = n = None
    try:
        counts = json.loads((run_dir / "summary.json").read_text())["ledger"]
        n = (yaml.safe_load((run_dir / "config.yaml").read_text()) or {})["rollout"]["n_samples_per_prompt"]
    except (OSError, ValueError, KeyError, TypeError):
        pass  # no summary (a killed run): the journal alone is audited
    if counts is not None and (problem := _counts_problem(counts)):
        raise DamagedFileError(f"{run_dir / 'summary.json'}: its \"ledger\" {problem}; the summary is damaged, "
                               f"so the journal cannot be checked against it (move it aside to audit {JOURNAL} alone)")
    return audit(journal, counts, n if _count(n) and n else None)
