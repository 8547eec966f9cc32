"""The `fasync` command line. Each command is a thin wrapper around a package function.

Imports stay inside the commands so that `fasync check` loads only what it uses (never torch,
ray or vllm).
"""

from __future__ import annotations

import os
import sys
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from fasync.exit_codes import ExitCode

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Launcher and linter for sync, async and fully-async RL post-training.")
config_app = typer.Typer(no_args_is_help=True, help="Inspect resolved configs.")
app.add_typer(config_app, name="config")

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
    typer.echo(message, err=True)
    raise typer.Exit(ExitCode.USAGE)


def _use_color() -> bool:
    return sys.stdout.isatty() and "NO_COLOR" not in os.environ


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
    from fasync.lint.engine import check_files, exit_code
    from fasync.lint.formats import render

    files, overrides = split_targets(targets)
    if not files:
        _fail("fasync check: no config file given (arguments with `=` are overrides)")
    try:
        run = check_files(files, overrides, _codes(select), _codes(ignore), preflight=preflight)
    except Exception as exc:  # noqa: BLE001 - a bug in fasync must read as "could not run", never as findings
        _fail(f"fasync check: internal error, please report it with this config: {type(exc).__name__}: {exc}")
    output = render(run.diagnostics, format.value, summary=not quiet, files=run.files,
                    color=format is CheckFormat.text and _use_color())
    if output:
        typer.echo(output)
    raise typer.Exit(exit_code(run, strict=strict, exit_zero=exit_zero))


@app.command("rules")
def list_rules(
    format: Annotated[TableFormat, typer.Option("--format", help="Output format.")] = TableFormat.text,
) -> None:
    """List every diagnostic code: load problems (F...) and lint rules."""
    from fasync.docs import rules_table

    typer.echo(rules_table(format.value))


@app.command("rule")
def explain_rule(code: Annotated[str, typer.Argument(help="A code from `fasync rules`, e.g. F006.")]) -> None:
    """Explain one rule: what it does, why it matters, a failing and a fixed example."""
    from fasync.lint.engine import catalogue

    entry = catalogue().get(code.upper())
    if entry is None:
        _fail(f"fasync rule: unknown code {code!r}; `fasync rules` lists them")
    typer.echo(entry.as_markdown())


@config_app.command("show")
def config_show(
    targets: Annotated[list[str], typer.Argument(metavar="FILE [KEY=VALUE...]")],
    format: Annotated[ShowFormat, typer.Option("--format", help="Output format.")] = ShowFormat.text,
    as_framework: Annotated[Framework | None, typer.Option(
        "--as", help="Print the batch geometry, mode and staleness in this framework's own terms instead "
        "(what `fasync import` reads back).")] = None,
) -> None:
    """Print the resolved config, where each value was set, and the derived quantities."""
    from fasync.config.loader import load_config
    from fasync.config.show import show
    from fasync.lint.formats import render

    files, overrides = split_targets(targets)
    if len(files) != 1:
        _fail("fasync config show: give exactly one config file")
    result = load_config(files[0], overrides)
    if result.config is None:
        typer.echo(render(result.diagnostics, "text", files=1, color=_use_color()), err=True)
        raise typer.Exit(ExitCode.FAILED if Path(files[0]).is_file() else ExitCode.USAGE)
    if as_framework is not None:
        from fasync.config.derived import derive
        from fasync.migrate import express, render_expressed

        expressed = express(as_framework.value, result.config, derive(result.config))
        typer.echo(render_expressed(expressed, files[0]), nl=False)
        return
    typer.echo(show(result, format.value))


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
) -> None:
    """Check the config, start the actors on Ray and train. Exit 0: done (or resuming a finished run), 1: problems
    in the config or a failed run, 2: bad usage, a missing config file or a --resume that is no run directory,
    130: interrupted (resumable)."""
    from fasync.launch.run import train as run_training

    files, overrides = split_targets(targets or [])
    if resume is not None:
        if len(files) > 1 or run_dir is not None or dry_run:
            _fail("fasync train --resume RUN_DIR: give at most one config file, and no --run-dir or --dry-run")
    elif len(files) != 1:
        _fail("fasync train: give exactly one config file")
    elif allow_config_change is not None:
        _fail("fasync train: --allow-config-change only goes with --resume")
    raise typer.Exit(run_training(files[0] if files else None, overrides, run_dir=run_dir, dry_run=dry_run,
                                  resume=resume, allow_config_change=_codes(allow_config_change) or []))


@app.command()
def ledger(run_dir: Annotated[str, typer.Argument(metavar="RUN_DIR", help="A run directory.")]) -> None:
    """Audit a run's sample ledger across all its resumes: produced = trained + dropped + queued + in flight, no
    prompt group trained twice, every prompt drawn accounted for, drops by completion length. Exit 0: every
    invariant holds, 1: one fails, 2: no run directory."""
    from fasync.metrics.ledger import audit_run

    try:
        result = audit_run(Path(run_dir))
    except FileNotFoundError as error:
        _fail(f"fasync ledger: {error}")
    typer.echo(result.report())
    raise typer.Exit(ExitCode.OK if result.ok else ExitCode.FAILED)


@app.command()
def export(
    run_dir: Annotated[str, typer.Argument(metavar="RUN_DIR", help="A run directory.")],
    out: Annotated[str, typer.Argument(metavar="OUT", help="The directory to write the model to.")],
    step: Annotated[int | None, typer.Option("--step", help="The checkpoint after this many optimizer steps "
                                             "(default: the newest).")] = None,
) -> None:
    """Export a checkpoint's policy for use elsewhere: a Hugging Face model with save_pretrained (safetensors)
    and its tokenizer; the embedded model as model.safetensors and fasync_model.json. Exit 0: written, 1: the
    checkpoint cannot be used, 2: no run directory."""
    from fasync.atomic import RunFileError
    from fasync.errors import ConfigurationError

    directory = Path(run_dir)
    if not (directory / "config.yaml").is_file():
        _fail(f"fasync export: {run_dir}: not a fasync run directory (no config.yaml)")
    from fasync.checkpoint.state import export_run

    try:
        found, files = export_run(directory, step, Path(out))
    except (RunFileError, ConfigurationError) as error:
        typer.echo(f"fasync export: {error}", err=True)
        raise typer.Exit(ExitCode.FAILED) from None
    except OSError as error:
        from fasync.atomic import describe_os_error

        typer.echo(f"fasync export: cannot write {describe_os_error(out, error)}", err=True)
        raise typer.Exit(ExitCode.FAILED) from None
    typer.echo(f"fasync export: {found.path.name} (step {found.step}) written to {out}: {', '.join(files)}")


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
    from fasync.bench.modes import LONG_TAIL
    from fasync.bench.report import benchmark
    from fasync.errors import ConfigurationError

    files, overrides = split_targets(targets or [])
    if len(files) > 1:
        _fail("fasync bench: give at most one config file")
    try:
        _, blocks = benchmark(files[0] if files else "configs/quickstart.yaml", overrides,
                              out_dir=Path(out) if out else None, doc=None if no_write else Path(doc),
                              long_tail=LONG_TAIL if long_tail else None, repeats=repeat)
    except ConfigurationError as error:
        _fail(str(error))
    typer.echo("\n\n".join(blocks.values()))


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
    from fasync.report import ReportError, write_report

    target = Path(out) if out else (Path(run_dirs[0]) / "report" if len(run_dirs) == 1 else Path("report"))
    try:
        written = write_report(run_dirs, target, labels=label or None)
    except ReportError as error:
        _fail(f"fasync report: {error}")
    typer.echo(f"fasync report: wrote {written} and its charts")


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
    from fasync.simulate.command import run

    files, overrides = split_targets(targets)
    if len(files) != 1:
        _fail("fasync simulate: give exactly one config file")
    code, output = run(files[0], overrides, calibrate or [], sweep or [], format.value)
    typer.echo(output, err=code != 0)
    raise typer.Exit(code)


@app.command("import", context_settings={"ignore_unknown_options": True})
def import_(
    framework: Annotated[Framework, typer.Argument(help="The framework SOURCE is written for.")],
    sources: Annotated[list[str], typer.Argument(metavar="SOURCE...", help="YAML or TOML configs, launch scripts, "
                                                 "Python with a GRPOConfig(...), or hydra overrides and flags.")],
    out: Annotated[str | None, typer.Option("-o", "--out", help="Write the fasync config here "
                                            "(default: print it).")] = None,
) -> None:
    """Write a fasync config from another framework's settings, each value with its source, then lint it.
    Exit as `fasync check` does on the result."""
    import tempfile

    from fasync.lint.engine import check_files, exit_code
    from fasync.lint.formats import render
    from fasync.migrate import import_config

    text, _ = import_config(framework.value, sources)
    if out:
        Path(out).write_text(text, encoding="utf-8")
        target = out
    else:
        typer.echo(text)
        target = tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False).name
        Path(target).write_text(text, encoding="utf-8")
    run = check_files([target])
    typer.echo(render(run.diagnostics, "text", files=1), err=True)
    if not out:
        Path(target).unlink()
    raise typer.Exit(exit_code(run))


@app.command()
def schema() -> None:
    """Print the config's JSON Schema (draft-07) for editor completion and validation."""
    from fasync.docs import render_schema_json

    typer.echo(render_schema_json(), nl=False)


def main() -> None:
    app(prog_name="fasync")


if __name__ == "__main__":
    main()
