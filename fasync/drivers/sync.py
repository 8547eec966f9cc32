"""sync: generate → reward → train → push weights, one rollout at a time.

Every trained sample comes from the weights the trainer holds (staleness 0). Colocated, the engines sleep
while the trainer trains (their GPU memory is training's), wake their weights for the push that fills them,
then their KV cache for the next rollout's generation.
"""

from __future__ import annotations

from fasync.drivers.common import Run, Stopwatch, trained_samples


class SyncDriver:
    mode = "sync"

    def __init__(self, run: Run):
        self.run = run
        run.driver = self

    def train(self) -> None:
        run = self.run
        run.wait_until_ready()
        for rollout in range(run.start_rollout, run.cfg.train.num_rollouts):
            batch = run.collect()
            run.sleep_engines()
            records = run.train_batch(rollout, batch)
            run.ledger.train(len(batch.samples), trained_samples(records), batch.groups)
            with Stopwatch() as sync:
                run.wake_engines(["weights"])
                run.publish_weights()
                run.wake_engines(["kv_cache"])
            run.write(records, sync.seconds)
            if run.should_stop():
                break
        run.save_checkpoint(run.stop_requested or "finished")

    def checkpoint_state(self) -> dict:
        """Nothing beyond what `Run` saves: between rollouts no sample is queued or in flight."""
        return {}
