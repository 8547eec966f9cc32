"""The `fasync` command line: it parses each command's arguments and calls the command's `run` in
`fasync.commands`, which does the work and returns the exit code.

Imports stay inside the commands so that `fasync check` loads only what it uses (never torch,
ray or vllm).
"""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Launcher and linter for sync, async and fully-async RL post-training.")
config_app = typer.Typer(no_args_is_help=True, help="Inspect resolved configs.")
app.add_typer(config_app, name="config")
data_app = typer.Typer(no_args_is_help=True, help="Inspect a config's data.")
app.add_typer(data_app, name="data")

class CheckFormat(str, Enum):
    text = "text"
    concise = "concise"
    json = "json"
    github = "github"
    sarif = "sarif"


class TableFormat(str, Enum):
    text = "text"
    json = "json"


class Framework(str, Enum):
    verl = "verl"
    slime = "slime"
    miles = "miles"
    areal = "areal"
    prime_rl = "prime-rl"
    openrlhf = "openrlhf"
    trl = "trl"


class ShowFormat(str, Enum):
    text = "text"
    yaml = "yaml"
    json = "json"


def split_targets(targets: list[str]) -> tuple[list[str], list[str]]:
    """(files, overrides): an argument with `=` (or hydra's `~key`) that is not an existing file is an override."""
    files = [t for t in targets if ("=" not in t and not t.startswith("~")) or Path(t).exists()]
    return files, [t for t in targets if t not in files]


def _codes(text: str | None) -> list[str] | None:
    return [c.strip() for c in text.split(",") if c.strip()] if text else None


def _fail(message: str) -> None:
    """Arguments that do not make a command: say so, and exit 2."""
    from fasync.commands import usage_error

    raise typer.Exit(usage_error(message))


@app.command()
def check(
    targets: Annotated[list[str], typer.Argument(metavar="FILE... [KEY=VALUE...]",
                                                 help="Config files, then overrides applied to every file.")],
    format: Annotated[CheckFormat, typer.Option("--format", help="Output format.")] = CheckFormat.text,
    strict: Annotated[bool, typer.Option("--strict", help="Warnings fail the check too.")] = False,
    select: Annotated[str | None, typer.Option(help="Only these rule codes or prefixes (comma list).")] = None,
    ignore: Annotated[str | None, typer.Option(help="Skip these rule codes or prefixes (comma list).")] = None,
    exit_zero: Annotated[bool, typer.Option("--exit-zero", help="Exit 0 even with findings (2 still means "
                                            "the check could not run).")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No summary line.")] = False,
    preflight: Annotated[bool, typer.Option("--preflight", help="Also check the live environment: the Ray "
                                            "cluster against the plan, vLLM with torch, model.path and the "
                                            "dataset (E codes).")] = False,
) -> None:
    """Lint config files. Exit 0: clean, 1: problems found (errors, load problems included, or warnings with
    --strict), 2: the check could not run (bad usage, a named file missing, an internal error)."""
    from fasync.commands import check as command

    files, overrides = split_targets(targets)
    if not files:
        _fail("fasync check: no config file given (arguments with `=` are overrides)")
    raise typer.Exit(command.run(files, overrides, _codes(select), _codes(ignore), format.value, strict, exit_zero,
                                 quiet, preflight))


@app.command("rules")
def list_rules(
    format: Annotated[TableFormat, typer.Option("--format", help="Output format.")] = TableFormat.text,
) -> None:
    """List every diagnostic code: load problems (F...) and lint rules."""
    from fasync.commands import check as command

    raise typer.Exit(command.rules(format.value))


@app.command("rule")
def explain_rule(code: Annotated[str, typer.Argument(help="A code from `fasync rules`, e.g. F006.")]) -> None:
    """Explain one rule: what it does, why it matters, a failing and a fixed example."""
    from fasync.commands import check as command

    raise typer.Exit(command.rule(code))


@config_app.command("show")
def config_show(
    targets: Annotated[list[str], typer.Argument(metavar="FILE [KEY=VALUE...]")],
    format: Annotated[ShowFormat, typer.Option("--format", help="Output format.")] = ShowFormat.text,
    as_framework: Annotated[Framework | None, typer.Option(
        "--as", help="Print the batch geometry, mode and staleness in this framework's own terms instead "
        "(what `fasync import` reads back).")] = None,
) -> None:
    """Print the resolved config, where each value was set, and the derived quantities."""
    from fasync.commands import check as command

    files, overrides = split_targets(targets)
    if len(files) != 1:
        _fail("fasync config show: give exactly one config file")
    raise typer.Exit(command.config_show(files[0], overrides, format.value,
                                         as_framework.value if as_framework is not None else None))


@data_app.command("show")
def data_show(
    targets: Annotated[list[str], typer.Argument(metavar="FILE [KEY=VALUE...]")],
    count: Annotated[int, typer.Option("-n", min=1, help="How many prompts to print.")] = 3,
) -> None:
    """Print the first prompts of the config's data exactly as the model is fed them (chat template, system
    prompt and special tokens applied), with their token counts and labels."""
    from fasync.commands import data as command

    files, overrides = split_targets(targets)
    if len(files) != 1:
        _fail("fasync data show: give exactly one config file")
    raise typer.Exit(command.show(files[0], overrides, count))


@app.command()
def train(
    targets: Annotated[list[str] | None, typer.Argument(metavar="FILE [KEY=VALUE...]",
                                                        help="The config file, then overrides such as "
                                                        "train.lr=1e-4 (with --resume: optional).")] = None,
    run_dir: Annotated[str | None, typer.Option("--run-dir", help="Where the run writes its files "
                                                "(default: logging.run_dir, else runs/<name>-<time>).")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Load, check and plan the actors, print the plan, "
                                          "and exit without training.")] = False,
    resume: Annotated[str | None, typer.Option("--resume", metavar="RUN_DIR", help="Continue the run in RUN_DIR "
                                               "from its newest checkpoint, with its own config unless FILE is "
                                               "given.")] = None,
    allow_config_change: Annotated[str | None, typer.Option("--allow-config-change", metavar="KEY,...",
                                                            help="With --resume: config keys that may differ "
                                                            "from the run's.")] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Also show the latest generation of each rollout "
                                          "(prompt, completion, reward, label).")] = False,
) -> None:
    """Check the config, start the actors on Ray and train. Exit 0: done (or resuming a finished run), 1: problems
    in the config, a run directory another run is using, or a failed run, 2: bad usage, a missing config file or
    a --resume that is no run directory, 130: interrupted by Ctrl-C (resumable), 143: terminated by SIGTERM
    (resumable)."""
    from fasync.commands import train as command

    files, overrides = split_targets(targets or [])
    if resume is not None:
        if len(files) > 1 or run_dir is not None or dry_run:
            _fail("fasync train --resume RUN_DIR: give at most one config file, and no --run-dir or --dry-run")
    elif len(files) != 1:
        _fail("fasync train: give exactly one config file")
    elif allow_config_change is not None:
        _fail("fasync train: --allow-config-change only goes with --resume")
    raise typer.Exit(command.run(files[0] if files else None, overrides, run_dir=run_dir, dry_run=dry_run,
                                 resume=resume, allow_config_change=_codes(allow_config_change) or [],
                                 verbose=verbose))


@app.command()
def ledger(run_dir: Annotated[str, typer.Argument(metavar="RUN_DIR", help="A run directory.")]) -> None:
    """Audit a run's sample ledger across all its resumes: produced = trained + dropped + queued + in flight, no
    prompt group trained twice, every prompt drawn accounted for, drops by completion length. Exit 0: every
    invariant holds, 1: one fails, 2: no run directory."""
    from fasync.commands import ledger as command

    raise typer.Exit(command.run(run_dir))


@app.command()
def export(
    run_dir: Annotated[str, typer.Argument(metavar="RUN_DIR", help="A run directory.")],
    out: Annotated[str, typer.Argument(metavar="OUT", help="The directory to write the model to.")],
    step: Annotated[int | None, typer.Option("--step", help="The checkpoint after this many optimizer steps "
                                             "(default: the newest).")] = None,
    force: Annotated[bool, typer.Option("--force", help="Write into OUT even if it holds files that are not "
                                        "a fasync export (files of the same names are replaced).")] = False,
    merge: Annotated[bool, typer.Option("--merge", help="A LoRA run (model.lora): write the model with the adapter "
                                        "merged in, instead of the adapter.")] = False,
) -> None:
    """Export a checkpoint's policy for use elsewhere: a Hugging Face model with save_pretrained (safetensors)
    and its tokenizer; the embedded model as model.safetensors; a LoRA run's adapter as peft writes it (or, with
    --merge, the merged model); and fasync_model.json. OUT must be new, empty or an earlier export. Exit 0:
    written, 1: the checkpoint cannot be used or OUT cannot be written, 2: no run directory."""
    from fasync.commands import export as command

    raise typer.Exit(command.run(run_dir, out, step, force, merge))


@app.command("eval")
def evaluate(
    run_dir: Annotated[str, typer.Argument(metavar="RUN_DIR", help="A run directory.")],
    step: Annotated[int | None, typer.Option("--step", help="The checkpoint after this many optimizer steps "
                                             "(default: the newest).")] = None,
    data: Annotated[str | None, typer.Option("--data", metavar="FILE", help="A dataset file of prompts and labels "
                                             "to evaluate on (default: the run's eval set).")] = None,
    export: Annotated[str | None, typer.Option("--export", metavar="DIR", help="Evaluate the policy `fasync "
                                               "export` wrote to DIR instead of a checkpoint.")] = None,
) -> None:
    """Evaluate a run's checkpoint (or its exported policy) without training: mean reward, mean@k and pass@k (`eval` section), overall
    and per data_source, printed and written to RUN_DIR/eval/. Exit 0: evaluated, 1: the checkpoint, reward or
    eval set cannot be used, 2: no run directory."""
    from fasync.commands import eval as command

    raise typer.Exit(command.run(run_dir, step, data, export))


@app.command()
def bench(
    targets: Annotated[list[str], typer.Argument(metavar="[FILE] [KEY=VALUE...]",
                                                 help="The base config (default configs/quickstart.yaml), then "
                                                 "overrides applied to every run.")] = None,
    out: Annotated[str | None, typer.Option("--out", help="Keep every run's directory here "
                                            "(default: a temporary directory).")] = None,
    doc: Annotated[str, typer.Option("--doc", help="Document whose generated blocks are rewritten.")]
    = "docs/benchmarks.md",
    no_write: Annotated[bool, typer.Option("--no-write", help="Print the tables; leave the document alone.")] = False,
    long_tail: Annotated[bool, typer.Option("--long-tail/--no-long-tail",
                                            help="Also run the heavy-tailed answer-length scenario.")] = True,
    repeat: Annotated[int, typer.Option("--repeat", min=1, help="Runs per mode, taken in turn; the report "
                                        "shows medians.")] = 1,
) -> None:
    """Train the same task in sync, async and fully_async; report throughput, time to target, staleness,
    idle fractions and correction metrics against the ideal overlap, and write them into docs/benchmarks.md."""
    from fasync.commands import bench as command

    files, overrides = split_targets(targets or [])
    if len(files) > 1:
        _fail("fasync bench: give at most one config file")
    raise typer.Exit(command.run(files[0] if files else None, overrides, out, None if no_write else doc, long_tail,
                                 repeat))


@app.command()
def report(
    run_dirs: Annotated[list[str], typer.Argument(metavar="RUN_DIR...", help="Run directories written by "
                                                  "`fasync train`; several are overlaid.")],
    out: Annotated[str | None, typer.Option("-o", "--out", help="Where the PNGs and report.md go (default: "
                                            "RUN_DIR/report for one run, ./report for several).")] = None,
    label: Annotated[list[str] | None, typer.Option("--label", help="The legend name of each run, in order "
                                                    "(repeatable; default: the directory names).")] = None,
) -> None:
    """Chart one or several runs (reward, staleness and lag, queue and idle time, the is/ diagnostics, the time
    split) and write report.md with a summary table. Exit 0: written, 2: bad input."""
    from fasync.commands import report as command

    raise typer.Exit(command.run(run_dirs, out, label))


@app.command()
def simulate(
    targets: Annotated[list[str], typer.Argument(metavar="FILE [KEY=VALUE...]",
                                                 help="The config file, then overrides applied to every variant.")],
    calibrate: Annotated[list[str] | None, typer.Option("--calibrate", metavar="RUN_DIR",
                                                        help="Fit the costs to this run's metrics (repeatable).")]
    = None,
    sweep: Annotated[list[str] | None, typer.Option("--sweep", metavar="KEY=V1,V2,...",
                                                    help="Simulate every value (repeatable: the grid).")] = None,
    format: Annotated[TableFormat, typer.Option("--format", help="Output format.")] = TableFormat.text,
) -> None:
    """Predict samples/s, idle time, staleness, queue occupancy and the length bias of stale drops in each mode
    (or over a sweep), from a discrete-event simulation of the drivers. Exit 0: done, 2: bad input."""
    from fasync.commands import simulate as command

    files, overrides = split_targets(targets)
    if len(files) != 1:
        _fail("fasync simulate: give exactly one config file")
    raise typer.Exit(command.run(files[0], overrides, calibrate or [], sweep or [], format.value))


@app.command("import", context_settings={"ignore_unknown_options": True})
def import_(
    framework: Annotated[Framework, typer.Argument(help="The framework SOURCE is written for.")],
    sources: Annotated[list[str], typer.Argument(metavar="SOURCE...", help="YAML or TOML configs, launch scripts, "
                                                 "Python with a GRPOConfig(...), or hydra overrides and flags.")],
    out: Annotated[str | None, typer.Option("-o", "--out", help="Write the fasync config here "
                                            "(default: print it).")] = None,
    env: Annotated[list[str] | None, typer.Option("--env", metavar="VAR=VALUE", help="A variable the launch "
                                                  "script expects from its environment (repeatable); `1=...` "
                                                  "sets a positional argument.")] = None,
) -> None:
    """Write a fasync config from another framework's settings, each value with its source, then lint it.
    Exit as `fasync check` does on the result; 1 when SOURCE cannot be read, holds a setting fasync does not
    support, or nothing fasync recognises."""
    from fasync.commands import import_ as command

    raise typer.Exit(command.run(framework.value, sources, out, env or []))


@app.command()
def schema() -> None:
    """Print the config's JSON Schema (draft-07) for editor completion and validation."""
    from fasync.commands import check as command

    raise typer.Exit(command.schema())


def main() -> None:
    app(prog_name="fasync")


if __name__ == "__main__":
    main()
