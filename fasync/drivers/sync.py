"""sync: generate → reward → train → push weights, one rollout at a time.

Every trained sample comes from the weights the trainer holds (staleness 0).
"""

from __future__ import annotations

from fasync.drivers.common import Run, Stopwatch, trained_samples


class SyncDriver:
    mode = "sync"

    def __init__(self, run: Run):
        self.run = run

    def train(self) -> None:
        run = self.run
        run.wait_until_ready()
        for rollout in range(run.cfg.train.num_rollouts):
            batch = run.collect()
            records = run.train_batch(rollout, batch)
            run.ledger.train(len(batch.samples), trained_samples(records))
            with Stopwatch() as sync:
                run.publish_weights()
            run.write(records, sync.seconds)
            if run.reached_target():
                break
