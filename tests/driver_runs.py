"""A mode's driver run in the test's process on a `Run` of a config (the actors on the tests' Ray session)."""

from __future__ import annotations

from fasync.config.schema import FasyncConfig
from fasync.metrics.progress import Progress


def start_run(cfg: FasyncConfig, tmp_path, engines=None):
    from fasync.drivers.common import Run
    from fasync.launch.plan import resolve
    from fasync.rollout.groups import build_factory

    resolved = resolve(cfg)
    run = Run(resolved, build_factory(resolved), tmp_path, Progress(1, "none"), engines=engines)
    run.start()
    return run


def run_mode(cfg: FasyncConfig, tmp_path, engines=None):
    """The mode's driver, after it trained a run to its end."""
    from fasync.drivers import DRIVERS

    run = start_run(cfg, tmp_path, engines)
    driver = DRIVERS[cfg.mode](run)
    try:
        driver.train()
    finally:
        run.close()
    return driver


def assert_rows_match_the_registry(driver) -> None:
    """Every row holds each metric the registry says the mode always writes (the writer refuses the rest)."""
    from fasync.metrics.registry import METRICS

    always = {name for name, metric in METRICS.items() if driver.mode in metric.modes and metric.when is None}
    for row in driver.run.writer.history:
        assert always <= row.keys(), always - row.keys()


def assert_ledger_balanced(driver) -> None:
    assert_rows_match_the_registry(driver)
    ledger = driver.ledger
    assert ledger.balanced, ledger.balance_sheet()
    assert ledger.consumed > 0
    assert all(record["ledger_balanced"] for record in driver.run.writer.history)
