"""Dataset files as records: JSONL, JSON, parquet and Hugging Face datasets saved to disk.

A record is one dict per prompt, as the file holds it. The format comes from the file itself (parquet's magic
bytes, a saved dataset's directory), else from its suffix, or from `data.format`; a parquet file is never read
as text. Keys may be dotted paths into nested records (`reward_model.ground_truth`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path

from fasync.errors import ConfigurationError

MAX_LINE_BYTES = 4 << 20
"""Longest dataset line fasync reads: 4 MiB, a million tokens of English text, more than any model's
context. A longer line is refused before it is decoded or parsed: a stray binary or concatenated file would
otherwise reach the engines whole (a 50 MB prompt grew an engine past 15 GB)."""

PARQUET_MAGIC = b"PAR1"
SAVED_DATASET_FILES = ("dataset_info.json", "state.json", "dataset_dict.json")
"""Files `datasets.Dataset.save_to_disk` (or a DatasetDict's) writes: a directory holding one is a saved dataset."""
SUFFIXES = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "json", ".parquet": "parquet", ".pq": "parquet"}
MISSING = object()
"""What `lookup` returns for a key path a record lacks (None is a value a record may hold)."""


def detect_format(path: str, explicit: str | None = None) -> str:
    """`jsonl`, `json`, `parquet` or `hf_disk`: `explicit` when set, else what the file is."""
    file = Path(path)
    if not file.exists():
        raise ConfigurationError(f"data.path: {path} does not exist")
    if explicit is not None:
        return explicit
    if file.is_dir():
        if any((file / name).is_file() for name in SAVED_DATASET_FILES):
            return "hf_disk"
        raise ConfigurationError(f"data.path: {path} is a directory, but not a Hugging Face dataset saved with "
                                 "save_to_disk (no dataset_info.json or state.json); name a file in it")
    with file.open("rb") as stream:
        if stream.read(4) == PARQUET_MAGIC:
            return "parquet"
    return SUFFIXES.get(file.suffix.lower(), "jsonl")


def lookup(record: Mapping, key: str):
    """The value at the dotted `key` in `record` (`reward_model.ground_truth`), or MISSING. A key the record
    holds whole (dots and all) wins over the path."""
    if key in record:
        return record[key]
    value = record
    for part in key.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return MISSING
        value = value[part]
    return value


def read_lines(file: Path) -> Iterator[tuple[int, str]]:
    """(line number, text) for each line of `file`, refusing an over-long line or one that is not UTF-8."""
    with file.open("rb") as stream:
        number = 0
        while raw := stream.readline(MAX_LINE_BYTES + 1):
            number += 1
            where = f"data.path: {file}:{number}"
            if len(raw) > MAX_LINE_BYTES:
                raise ConfigurationError(
                    f"{where}: the line is longer than {MAX_LINE_BYTES >> 20} MiB, the most fasync reads for one "
                    "record; no model's context holds a prompt that long. Check that the file is the JSONL dataset "
                    "meant (one record per line), and drop or split this record")
            try:
                yield number, raw.decode("utf-8-sig" if number == 1 else "utf-8")
            except UnicodeDecodeError as exc:
                column = len(raw[: exc.start].decode("utf-8", errors="replace")) + 1
                raise ConfigurationError(
                    f"{where}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at column {column}). Save the file as "
                    "UTF-8, e.g. `iconv -f latin1 -t utf-8 in.jsonl > out.jsonl` for Latin-1 text; a parquet file "
                    "or saved dataset needs `data.format` only where its name hides what it is") from None


def _jsonl(path: str) -> Iterator[tuple[str, dict]]:
    for number, line in read_lines(Path(path)):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ConfigurationError(f"data.path: {where}: invalid JSON ({exc.msg} at column {exc.colno})") from exc
        except RecursionError:
            raise ConfigurationError(f"data.path: {where}: the JSON is nested too deeply to read; a record is one "
                                     "object of strings, e.g. {\"prompt\": \"...\", \"label\": \"...\"}") from None
        if not isinstance(record, dict):
            raise ConfigurationError(f"data.path: {where}: expected a JSON object, got {type(record).__name__}")
        yield where, record


def _json(path: str) -> Iterator[tuple[str, dict]]:
    try:
        records = json.loads(Path(path).read_text(encoding="utf-8-sig"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigurationError(f"data.path: {path}: not a JSON array of records ({exc}); one record per line "
                                 "is `data.format: jsonl`") from None
    if not isinstance(records, list):
        raise ConfigurationError(f"data.path: {path}: a JSON dataset is an array of records, got "
                                 f"{type(records).__name__}")
    for index, record in enumerate(records):
        if not isinstance(record, dict):
            raise ConfigurationError(f"data.path: {path}[{index}]: expected a JSON object, got "
                                     f"{type(record).__name__}")
        yield f"{path}[{index}]", record


def _parquet(path: str) -> Iterator[tuple[str, dict]]:
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except Exception as exc:  # pyarrow raises ArrowInvalid, OSError and more for a damaged file
        raise ConfigurationError(f"data.path: {path} is not a readable parquet file ({type(exc).__name__}: "
                                 f"{exc})") from None
    for index, record in enumerate(table.to_pylist()):
        yield f"{path} row {index}", record


def _saved_dataset(path: str) -> Iterator[tuple[str, dict]]:
    import datasets

    try:
        loaded = datasets.load_from_disk(path)
    except Exception as exc:  # datasets raises FileNotFoundError, ValueError and its own errors
        raise ConfigurationError(f"data.path: cannot load the saved dataset {path} ({type(exc).__name__}: "
                                 f"{exc})") from None
    if isinstance(loaded, datasets.DatasetDict):
        if "train" not in loaded:
            raise ConfigurationError(f"data.path: {path} holds the splits {', '.join(loaded)}, and no `train`: "
                                     "name the split's directory")
        loaded = loaded["train"]
    for index, record in enumerate(loaded):
        yield f"{path} row {index}", record


READERS = {"jsonl": _jsonl, "json": _json, "parquet": _parquet, "hf_disk": _saved_dataset}


def read_records(path: str, explicit_format: str | None = None) -> Iterator[tuple[str, dict]]:
    """(where, record) for each record of the dataset at `path`; `where` names the file and line or row."""
    file = Path(path)
    fmt = detect_format(path, explicit_format)
    if fmt != "hf_disk" and file.is_dir():
        raise ConfigurationError(f"data.path: {path} is a directory")
    if fmt in ("jsonl", "json") and detect_format(path) == "parquet":
        raise ConfigurationError(f"data.path: {path} is a parquet file (it begins with {PARQUET_MAGIC.decode()}), but "
                                 f"`data.format` is {fmt}: set `data.format: parquet`, or leave it null")
    return READERS[fmt](path)
