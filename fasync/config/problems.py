"""The `F` codes: problems found while loading a config, before any lint rule runs.

They are catalogue entries like the lint rules (`fasync rule F003`, docs/rules.md), without a check: the
loader reports them itself.
"""

from __future__ import annotations

from fasync.diagnostics import Code, Diagnostic, Location, Severity


def report(code: str, message: str, location: Location | None, help: str | None = None,
           key: str | None = None) -> Diagnostic:
    """A diagnostic for one of these problems (they are all errors)."""
    return Diagnostic(code, PROBLEMS[code].severity, message, key, location, help)


def _problem(code: str, name: str, summary: str, *, what: str, why: str) -> Code:
    return Code(code, name, Severity.ERROR, summary, what, why)


INTERNAL_ERROR = "F000"
FILE_NOT_FOUND = "F001"
YAML_SYNTAX = "F002"
DUPLICATE_KEY = "F003"
EXTENDS_CYCLE = "F004"
BAD_INTERPOLATION = "F005"
UNKNOWN_KEY = "F006"
INVALID_VALUE = "F007"
FOREIGN_KEY = "F008"
NOT_A_MAPPING = "F009"
INVALID_EXTENDS = "F010"
INVALID_OVERRIDE = "F011"

PROBLEMS: dict[str, Code] = {
    p.code: p
    for p in (
        _problem(
            INTERNAL_ERROR, "internal-error", "A lint rule crashed on this config.",
            what="Reports a lint rule that raised an exception instead of returning findings. "
            "The other rules still run.",
            why="It is a bug in fasync, not in the config: please report it with the config that triggers it.",
        ),
        _problem(
            FILE_NOT_FOUND, "file-not-found", "A config file or an `extends` base cannot be read.",
            what="Reports a path given on the command line or named by `extends:` that does not exist, "
            "is a directory or cannot be read. `extends` paths are relative to the file that names them.",
            why="A missing base silently changes every value it would have set.",
        ),
        _problem(
            YAML_SYNTAX, "yaml-syntax", "The file is not valid YAML, or uses YAML a config cannot hold.",
            what="Reports a YAML syntax error, and YAML constructs a config cannot represent: several documents "
            "in one file, a recursive alias, a mapping used as a key, an unknown tag.",
            why="Nothing after the error can be read reliably, so the config is not loaded.",
        ),
        _problem(
            DUPLICATE_KEY, "duplicate-key", "The same key appears twice in one mapping.",
            what="Reports the second occurrence of a key in the same mapping of the same file.",
            why="YAML parsers silently keep the last value, so the first one, often the one you edited, "
            "has no effect.",
        ),
        _problem(
            EXTENDS_CYCLE, "extends-cycle", "Config files extend each other in a loop.",
            what="Reports an `extends:` entry that leads back to a file already being loaded.",
            why="A cycle has no first layer, so the merge order is undefined.",
        ),
        _problem(
            BAD_INTERPOLATION, "bad-interpolation", "A `${...}` interpolation cannot be resolved.",
            what="Reports an interpolation that names a missing key, an unset environment variable without a "
            "default (`${oc.env:VAR,default}`), an interpolation cycle or malformed `${...}` syntax.",
            why="The value the run would use is unknown; the key falls back to its default until it is fixed.",
        ),
        _problem(
            UNKNOWN_KEY, "unknown-key", "A key that no section of the schema has.",
            what="Reports a key the schema does not define at that place, with the closest valid key "
            "(`did you mean`) or the section where a key of that name lives.",
            why="A misspelt key is otherwise silently ignored and the run uses the default.",
        ),
        _problem(
            INVALID_VALUE, "invalid-value", "A value of the wrong type or outside its allowed range.",
            what="Reports every value the schema rejects: a string where a number is expected, a number below "
            "its minimum, a choice that is not one of the allowed ones, inconsistent bounds.",
            why="The trainer would fail at start-up, or worse, misread the value.",
        ),
        _problem(
            FOREIGN_KEY, "foreign-key", "A key from verl, slime, miles, AReaL, OpenRLHF or TRL.",
            what="Reports a key that another RL framework uses (`ppo_mini_batch_size`, `staleness_threshold`, "
            "`max_head_offpolicyness`, `num_generations`, ...) or a fasync key in the wrong section, "
            "and names the fasync key together with any difference in meaning.",
            why="Same-looking knobs often count different things: verl's `ppo_mini_batch_size` counts prompts, "
            "fasync's `train.global_batch_size` counts samples; verl's `staleness_threshold` is a fraction of a "
            "batch, fasync's `async.max_weight_staleness` counts weight versions.",
        ),
        _problem(
            NOT_A_MAPPING, "not-a-mapping", "The file's top level is not a mapping of keys.",
            what="Reports a config file whose document is a list or a scalar instead of `key: value` pairs.",
            why="Only a mapping can be merged with other layers and validated.",
        ),
        _problem(
            INVALID_EXTENDS, "invalid-extends", "`extends` is not a path or a list of paths.",
            what="Reports an `extends:` value that is not a string or a list of strings.",
            why="fasync cannot tell which base files to load.",
        ),
        _problem(
            INVALID_OVERRIDE, "invalid-override", "A command-line override is not `dotted.key=value`.",
            what="Reports an override whose key is empty or has an empty segment, or whose value is not valid "
            "YAML. Overrides are reported at `<cli>`, line N being the N-th override.",
            why="The override cannot be applied, so the run would not be the one asked for.",
        ),
    )
}
