"""The shape every driver has: `train` sets up, runs its loop over the rollouts (drains), and cleans up whatever
way the loop ended; each rollout ends the same way (`end_rollout`)."""

from __future__ import annotations

import time
from typing import ClassVar

from fasync.checkpoint.run import ModeCheckpoint
from fasync.drivers.common import Run
from fasync.drivers.generation import RolloutBatch
from fasync.killpoints import kill_point
from fasync.metrics.ledger import Ledger
from fasync.metrics.samples import sample_rows


class Stopwatch:
    """`with Stopwatch() as watch: ...`, then `watch.seconds`: timing stays with the caller, so that no
    command has to return how long it took."""

    seconds = 0.0

    def __enter__(self) -> "Stopwatch":
        self._start = time.monotonic()
        return self

    def __exit__(self, *exc) -> None:
        self.seconds = time.monotonic() - self._start


class DriverLoop:
    mode: ClassVar[str]

    def __init__(self, run: Run):
        self.run = run
        self.ledger = Ledger() if run.resumed is None else Ledger.from_dict(run.resumed.ledger)
        """The run's sample ledger as this driver holds it (`Driver.ledger`)."""
        self.resumed_state = {} if run.resumed is None else run.resumed.mode
        """The mode's part of the resumed checkpoint (`ModeCheckpoint.state`), for `setup` to take up."""
        self.evaluation = None
        """When and what the run evaluates (`fasync.eval.evaluation.Evaluation`); None: it does not."""

    def train(self) -> None:
        try:
            self.setup()
            self.loop()
        finally:
            self.cleanup()
            if self.evaluation is not None:
                self.evaluation.close()

    def setup(self) -> None:
        """Start the mode's own parts, and wait until the run is ready to train; then evaluate the initial
        weights if the run asks for it."""
        run = self.run
        run.wait_until_ready()
        if run.eval_prompts is not None and run.cfg.eval.enabled:
            from fasync.drivers.generation import generate
            from fasync.eval.evaluation import Evaluation, Evaluator

            evaluator = Evaluator(run.cfg, run.factory.tokenizer, run.factory.rewards, run.eval_prompts,
                                  lambda groups, params: generate(run.engines, groups, params, run.watchdog))
            self.evaluation = Evaluation(evaluator, run.cfg.eval.every, self.mode != "sync", run.watchdog)
            self.evaluation.start(run.step, run.cfg.eval.before_train)

    def loop(self) -> None:
        """Train rollout (drain) after rollout, from `Run.start_rollout`, each ended by `end_rollout`, then take
        the last checkpoint. Each mode's own."""
        raise NotImplementedError

    def cleanup(self) -> None:
        """End the mode's own parts, after the loop finished or failed."""

    def checkpoint_state(self, last: bool = False) -> ModeCheckpoint:
        """`last`: the checkpoint at the end of the loop, after which the mode generates nothing new."""
        return ModeCheckpoint(self.ledger)

    def end_rollout(self, records: list[dict], weight_sync_time_s: float, batch: RolloutBatch) -> bool:
        """Once the rollout's (drain's) weights are pushed: start an evaluation that is due and put one that
        finished on its last record, write the records and the samples due, take a checkpoint when one is due,
        and say whether to stop here."""
        run = self.run
        if self.evaluation is not None and records:
            final = records[-1]["rollout"] + 1 >= run.cfg.train.num_rollouts or run.should_stop()
            results = self.evaluation.at_rollout_end(run.step, len(records), final)
            for record, result in zip(records[len(records) - len(results):], results):
                record.update(result)
        run.write(records, weight_sync_time_s, self.ledger)
        if records:
            last = records[-1]
            if last["rollout"] == run.start_rollout:  # once the actors have done their first work
                self.settle_heaps()
            if run.samples.due(run.step):  # a fully_async drain's groups are fetched only where they are read
                run.samples.after_rollout(run.step, last["rollout"], last["weight_version"], batch.groups)
            if run.progress.verbose:
                for latest in sample_rows(batch.groups, 1, run.step - 1, last["rollout"], last["weight_version"]):
                    run.progress.sample(latest)
        kill_point("rollout_end")
        if run.checkpoints.due(run.step):
            run.save_checkpoint("every", self.checkpoint_state())
        return run.should_stop()

    def settle_heaps(self) -> None:
        """The actors' heaps, settled once (`Run.settle_heaps`); a mode with actors of its own adds them."""
        self.run.settle_heaps()

    def save_last_checkpoint(self) -> None:
        """The checkpoint at the end of the loop: "finished", or the outcome of the stop that ended it."""
        self.run.save_checkpoint(self.run.stop_requested or "finished", self.checkpoint_state(last=True))
