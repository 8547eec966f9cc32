"""sync: generate → reward → train → push weights, one rollout at a time.

Every trained sample comes from the weights the trainer holds (staleness 0).
"""

from __future__ import annotations

from fasync.drivers.common import Run


def run_sync(run: Run) -> None:
    run.wait_until_ready()
    for rollout in range(run.cfg.train.num_rollouts):
        batch = run.collect(run.version)
        records = run.train(rollout, batch)
        run.write(records, run.bump_version())
        if run.reached_target():
            break
