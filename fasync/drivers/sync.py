"""sync: generate → reward → train → push weights, one rollout at a time.

Every trained sample comes from the weights the trainer holds (staleness 0). Colocated, the engines sleep
while the trainer trains (their GPU memory is training's), wake their weights for the push that fills them,
then their KV cache for the next rollout's generation.
"""

from __future__ import annotations

from fasync.drivers.common import Run
from fasync.drivers.generation import EngineRollouts
from fasync.drivers.loop import DriverLoop, Stopwatch
from fasync.metrics.steps import trained_samples


class SyncDriver(DriverLoop):
    """Its checkpoints hold nothing beyond what `Run` saves: between rollouts no sample is queued or in flight."""

    mode = "sync"

    def __init__(self, run: Run):
        super().__init__(run)
        self.rollouts: EngineRollouts | None = None

    def setup(self) -> None:
        run = self.run
        self.rollouts = EngineRollouts(run.cfg, run.factory, run.engines, run.watchdog, self.ledger)
        super().setup()

    def loop(self) -> None:
        run, rollouts = self.run, self.rollouts
        for rollout in range(run.start_rollout, run.cfg.train.num_rollouts):
            batch = rollouts.next_batch()
            rollouts.sleep()
            records = run.train_batch(rollout, batch)
            self.ledger.train(len(batch.samples), trained_samples(records), batch.groups)
            with Stopwatch() as sync:
                rollouts.wake(["weights"])
                run.weights.publish(run.step)
                rollouts.wake(["kv_cache"])
            if self.end_rollout(records, sync.seconds, batch):
                break
        self.save_last_checkpoint()
