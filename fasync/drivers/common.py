"""What the three drivers share: actors, the weight version, generation of prompt groups, step records."""

from __future__ import annotations

import time
from collections import Counter, deque
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import ray

from fasync import checkpoint
from fasync.atomic import JsonlAppender
from fasync.errors import TooManyBadSteps, WeightSyncMismatch
from fasync.launch.actors import TrainerGroup, push_weights, start_engines
from fasync.launch.faults import Watchdog
from fasync.launch.placement import Placement
from fasync.launch.plan import Resolved
from fasync.metrics.ledger import JOURNAL, Ledger
from fasync.metrics.progress import Progress
from fasync.metrics.signal import LearningSignal
from fasync.metrics.trackers import open_trackers
from fasync.metrics.writer import MetricsWriter
from fasync.rollout.groups import GroupFactory, PromptGroup, zero_variance
from fasync.rollout.weight_transfer import check_transport, transport_of
from fasync.staleness import VersionClock
from fasync.wire import pack, unpack

"""`Run.stop_reason` of a run that neither stopped early nor failed."""

REWARD_WINDOW = 3
"""Rollouts averaged for `train.target_reward` early stopping."""


def generate(engines: list, groups: list[PromptGroup], params, watchdog: Watchdog) -> list[PromptGroup]:
    """Run every request of `groups` to completion, spreading the groups over the engines."""
    shares = [groups[i:: len(engines)] for i in range(len(engines))]
    calls = {
        f"engine {index}'s generate call": engine.generate.remote(
            pack([req for group in share for req in group.requests]), params)
        for index, (engine, share) in enumerate(zip(engines, shares))
        if share
    }
    by_id = {gen.request_id: gen for result in watchdog.get(list(calls.values()), list(calls))
             for gen in unpack(result)}
    for group in groups:
        group.requests = [by_id[req.request_id] for req in group.requests]
    return groups


def version_stats(samples) -> dict:
    """How many weight versions a batch mixes, and how much of it partial rollouts stitched together."""
    spans = [s.newest_version - s.oldest_version for s in samples]
    return {
        "version_diversity": len({s.oldest_version for s in samples}),
        "partial_ratio": sum(span > 0 for span in spans) / max(len(spans), 1),
        "max_partial_span": max(spans, default=0),
    }


class Stopwatch:
    """`with Stopwatch() as watch: ...`, then `watch.seconds`: timing stays with the caller, so that no
    command has to return how long it took."""

    seconds = 0.0

    def __enter__(self) -> "Stopwatch":
        self._start = time.monotonic()
        return self

    def __exit__(self, *exc) -> None:
        self.seconds = time.monotonic() - self._start


def trained_samples(records: list[dict]) -> int:
    return sum(record["num_samples"] for record in records)


@dataclass
class RolloutBatch:
    groups: list[PromptGroup]
    generate_time_s: float
    rounds: int | None = 1
    """Generation rounds dynamic sampling took; None where there are no rounds (fully_async streams)."""
    drops: Counter = field(default_factory=Counter)
    """Samples dropped while collecting, by reason."""

    @property
    def samples(self):
        return [sample for group in self.groups for sample in group.samples]


@contextmanager
def _checkpoint_errors():
    """A trainer actor's CheckpointError as its own one line, not inside the actor's traceback."""
    try:
        yield
    except ray.exceptions.RayTaskError as error:
        cause = getattr(error, "cause", None)
        if isinstance(cause, checkpoint.CheckpointError):
            raise cause from None
        raise


class Run:
    """State every driver keeps: the actors, the weight version and when each was published, the ledger
    and the step records, and the run's checkpoints.

    `ledger` is the run's sample ledger. sync and async keep it here, where their samples are; fully_async's
    rollouter keeps it, and the driver puts the copy each drain brings here. Its journal goes to the run
    directory's ledger.jsonl (`record`).

    Checkpoints are taken between rollouts (drains), where every count, RNG and group is settled: every
    `checkpoint.every` optimizer steps (`write`) and at a stop (`save_checkpoint`). Each driver adds its
    mode's part (`checkpoint_state`) and takes it back from `restored` when the run resumes from `resume`,
    whose driver.pt (`resume_state`) the caller has read before any actor started.

    Weight syncs take the run's transport (`fasync.rollout.weight_transfer.transport_of`): on the `cpu` path
    the trainer's state dict goes to every engine's `load_weights`; on `ipc` and `nccl` (vLLM on GPUs) every
    trainer rank sends, rank 0 driving the engines through vLLM's weight transfer engines, and reports what
    each engine serves after it. Either way `verify_loads` checks every engine's version."""

    def __init__(self, resolved: Resolved, factory: GroupFactory, run_dir: Path, progress: Progress,
                 engines: list | None = None, resume: checkpoint.Checkpoint | None = None,
                 resume_state: dict | None = None):
        self.resolved = resolved
        """The config with what follows from it (fasync.launch.plan.resolve), which the actors are given too."""
        self.cfg = cfg = resolved.config
        self.derived = resolved.derived
        self.plan = plan = resolved.plan
        self.run_dir = run_dir
        self.progress = progress
        check_transport(cfg)
        self.transport = transport_of(cfg)
        self.engines_sleep = cfg.resources.colocate and cfg.mode == "sync"
        """Colocated sync runs hand the engines' GPU memory to training between generation and the next
        weight push (`sleep_engines`, `wake_engines`). The async modes generate while training, so their
        engines stay awake."""
        self.writer = MetricsWriter(run_dir, cfg.mode, open_trackers(
            cfg.logging, run_dir, cfg.model_dump(mode="json", by_alias=True)))
        self.journal = JsonlAppender(run_dir / JOURNAL)
        self.ledger = Ledger()
        self.signal = LearningSignal()
        self.factory = factory
        self._owns_engines = engines is None
        self.watchdog = Watchdog(cfg.train.stall_timeout_s)
        self.bad_steps = 0
        """Optimizer steps skipped in a row for a NaN or inf loss or gradient."""
        self._sent: dict[int, object] = {}
        """version → the trainer's checksum (a reference) of the weights it sent as that version."""
        self._unverified: list[tuple[int, list]] = []
        """Weight loads pushed without waiting (async), checked once they are done."""
        # Every GPU of the run reserved at once, before any actor starts (fasync/launch/plan.py).
        self.placement = Placement(plan)
        self.engines = engines if engines is not None else start_engines(cfg, plan, self.placement)
        self.trainer = TrainerGroup(resolved, self.placement, wait=self.watchdog.get)
        self.watchdog.name_actors(self.engines, [f"engine {index}" for index in range(len(self.engines))])
        self.watchdog.name_actors(self.trainer.ranks, [f"trainer rank {rank}" for rank in range(len(self.trainer.ranks))])
        self.version = 0
        self.clock = VersionClock()
        self.step = 0
        self.recent_rewards: deque[float] = deque(maxlen=REWARD_WINDOW)
        self._last_record_time = time.monotonic()
        self.stop_reason: str | None = None
        """Why the driver stopped early (the target reward, a requested stop); None when it ran all its rollouts."""
        self.stop_requested: str | None = None
        """The outcome a stop was asked for with (`request_stop`); the drivers stop at the next rollout's end."""
        self.start_rollout = 0
        """The first rollout (drain) this process trains: 0, or where the resumed checkpoint left off."""
        self.driver = None
        """The mode's driver, which adds its state to a checkpoint (`checkpoint_state`)."""
        self.restored: dict = {}
        """The mode's state from the resumed checkpoint, for the driver to take up."""
        self._checkpointed_step = 0
        self.last_checkpoint: str | None = None
        if resume is not None:
            self._restore(resume, resume_state)
        self._setup = [] if self.transport == "cpu" else self.trainer.init_weight_sync(
            self.transport, self.engines, plan)
        """The trainer ranks' calls setting up the GPU weight transfer (none on the `cpu` path)."""
        # The trainer's weights (version 0, or the resumed version), pushed without waiting: a driver starts
        # its own actors before `wait_until_ready`, so that they start up alongside the engines and the trainer.
        self._first_push = self.push(self.version)

    def wait_until_ready(self) -> None:
        """Block until the engines and the trainer have started and the engines hold version 0; raises the
        start-up error of an actor that failed. The stall watchdog's clock starts here."""
        self.watchdog.get(self._setup, [f"trainer rank {rank}'s weight transfer set-up ({self.transport})"
                                        for rank in range(len(self._setup))])
        self.verify_loads(self.version, self._served(self.version, self._first_push))
        self.watchdog.arm()

    def weights_for(self, version: int):
        """The trainer's weights (a reference) to be published as `version`; their checksum is kept for
        `verify_loads`."""
        state = self.trainer.state_dict_ref()
        self._sent[version] = self.trainer.sent_checksum_ref()
        return state

    def push(self, version: int) -> list:
        """Start sending the trainer's weights to every engine as `version`; returns the calls, which
        `_served` waits on."""
        if self.transport == "cpu":
            return push_weights(self.engines, self.weights_for(version), version)
        # vLLM cannot read its weights back in the trainer's layout: only the version served is checked.
        self._sent[version] = None
        return self.trainer.send_weights(version)

    def load_labels(self, version: int) -> list[str]:
        """What each call of `push` waits for, by name (the stall watchdog's and a failure's labels)."""
        if self.transport == "cpu":
            return [f"engine {index}'s weight load (version {version})" for index in range(len(self.engines))]
        return [f"trainer rank {rank}'s weight send to the engines ({self.transport}, version {version})"
                for rank in range(len(self.trainer.ranks))]

    def _served(self, version: int, pushes: list) -> list[tuple[int, str | None]]:
        """What every engine serves once the `push` of `version` is done."""
        results = self.watchdog.get(pushes, self.load_labels(version))
        return results if self.transport == "cpu" else results[0].served  # rank 0 reports for every engine

    def verify_loads(self, version: int, served: list[tuple[int, str]]) -> None:
        """Every engine must serve `version` with the weights the trainer sent as it (a checksum of a few
        parameter slices, `fasync.rollout.engine.weights_checksum`); an engine that kept old weights, or
        loaded them wrongly, fails the run."""
        sent_ref = self._sent.pop(version)
        sent = None if sent_ref is None else self.watchdog.get([sent_ref], ["trainer rank 0's weight checksum"])[0]
        for index, (served_version, checksum) in enumerate(served):
            # None: a backend that cannot read its weights back (vLLM, whose CPU build repacks the linear
            # layers after loading) is held to the version it serves; its tests compare logprobs instead.
            if served_version != version or (checksum is not None and checksum != sent):
                raise WeightSyncMismatch(
                    f"weight sync: engine {index} serves version {served_version} with weight checksum "
                    f"{checksum or 'none'}, but the trainer sent version {version} with checksum {sent}: the "
                    "engine did not load the weights it was sent")

    # -- checkpoints -------------------------------------------------------------------------------

    def request_stop(self, outcome: str, reason: str) -> None:
        """Stop at the end of the rollout (drain) in progress, with a checkpoint (Ctrl-C, SIGTERM)."""
        self.stop_requested = outcome
        self.stop_reason = reason

    def should_stop(self) -> bool:
        """After each rollout (drain): the target reached, or a stop requested."""
        return self.stop_requested is not None or self.reached_target()

    def record(self, entries: list[dict]) -> None:
        """Append ledger journal entries to ledger.jsonl."""
        for entry in entries:
            self.journal.append(entry)

    def save_checkpoint(self, reason: str) -> Path:
        """Write a checkpoint of the run as it stands between two rollouts (drains); `reason` is "every", or
        the outcome of a stop ("finished", "interrupted", "terminated"). Returns its directory. Raises
        CheckpointError (one line) when it cannot be written; the previous checkpoints are kept."""
        import torch

        from fasync.checkpoint.state import capture_rngs

        temp = checkpoint.begin(self.run_dir, self.step)
        try:
            mode_state = self.driver.checkpoint_state() if self.driver is not None else {}
            self.record(mode_state.pop("journal", []))
            self.record(self.ledger.take_journal())
            with _checkpoint_errors():
                self.trainer.save_checkpoint(temp)
            engine_rngs = mode_state.pop("engine_rngs", None)
            if engine_rngs is None:
                engine_rngs = ray.get([engine.rng_state.remote() for engine in self.engines])
            draws = mode_state.pop("draws", self.factory.cursor)
            self.journal.append({"event": "end" if reason == "finished" else "checkpoint", "step": self.step,
                                 "draws": draws})
            # The learning-signal streaks go on too, so that a resumed run's rows and warnings are the
            # uninterrupted run's.
            state = {
                "step": self.step, "rollout": self.next_rollout, "version": self.version,
                "clock": self.clock.state_dict(), "ledger": self.ledger.as_dict(),
                "recent_rewards": list(self.recent_rewards), "signal": self.signal,
                "factory": self.factory.state_dict(),
                "rngs": capture_rngs(), "engine_rngs": engine_rngs, "mode": mode_state,
                "metrics_bytes": self.writer.size, "journal_bytes": self.journal.size,
                "wall_time": self.writer.elapsed,
            }
            torch.save(state, temp / checkpoint.DRIVER)
        except OSError as error:
            checkpoint.abandon(temp)
            raise checkpoint.CheckpointError(f"cannot write a checkpoint: {error}; the previous ones are kept") \
                from error
        except BaseException:
            checkpoint.abandon(temp)
            raise
        final = checkpoint.commit(temp, {
            "step": self.step, "rollout": self.next_rollout, "weight_version": self.version, "reason": reason,
            "finished": reason == "finished", "mode": self.cfg.mode, "strategy": self.derived.train_strategy,
            "trainer_ranks": self.cfg.resources.trainer_ranks, "stop_reason": self.stop_reason or (
                f"completed all {self.cfg.train.num_rollouts} rollouts" if reason == "finished" else reason),
        }, self.cfg.checkpoint.keep)
        self._checkpointed_step = self.step
        self.last_checkpoint = final.name
        return final

    @property
    def next_rollout(self) -> int:
        """The rollout (drain) after the last one written."""
        last = self.writer.history[-1]["rollout"] + 1 if self.writer.history else self.start_rollout
        return max(last, self.start_rollout)

    def _restore(self, resumed: checkpoint.Checkpoint, resume_state: dict) -> None:
        """Take up `resumed`: the trainer's state, the counters, the ledger, the data cursor, the RNGs, and
        the logs cut back to where the checkpoint was taken (what came after is kept beside them)."""
        from fasync.checkpoint.state import restore_rngs

        state = resume_state
        with _checkpoint_errors():
            self.trainer.load_checkpoint(resumed.path)
        self.step, self.start_rollout, self.version = state["step"], state["rollout"], state["version"]
        self.clock.load_state_dict(state["clock"])
        self.ledger = Ledger.from_dict(state["ledger"])
        self.recent_rewards.extend(state["recent_rewards"])
        self.signal = state["signal"]
        self.factory.load_state_dict(state["factory"])
        restore_rngs(state["rngs"])
        ray.get([engine.set_rng_state.remote(rng) for engine, rng in zip(self.engines, state["engine_rngs"])])
        marker = {"step": self.step, "rollout": self.start_rollout, "checkpoint": resumed.path.name}
        self.writer.resume(state["metrics_bytes"], state["wall_time"], marker)
        self.journal.rewind(state["journal_bytes"])
        self.journal.append({"event": "resume", **marker})
        self.restored = state["mode"]
        self._checkpointed_step = self.step
        self.last_checkpoint = resumed.path.name

    def next_version(self) -> int:
        """The trainer's weights become the next version, published after the steps taken so far."""
        self.version += 1
        self.clock.publish(self.version, self.step)
        return self.version

    def publish_weights(self, wait: bool = True) -> None:
        """Push the trainer's weights to every engine as the next version. Without `wait` the push queues
        behind any generation in progress on an engine."""
        self.verify_done_loads(block=False)
        version = self.next_version()
        pushes = self.push(version)
        self._unverified.append((version, pushes))
        if wait:
            self.verify_done_loads(block=True)

    def verify_done_loads(self, block: bool) -> None:
        """Check the weight loads pushed so far that are done (`block`: all of them, waiting)."""
        while self._unverified:
            version, pushes = self._unverified[0]
            if not block and len(ray.wait(pushes, num_returns=len(pushes), timeout=0)[0]) < len(pushes):
                return
            self._unverified.pop(0)
            self.verify_loads(version, self._served(version, pushes))

    def sleep_engines(self) -> None:
        """Colocated sync runs: the engines release their GPU memory (weights and KV cache) for training."""
        if self.engines_sleep:
            self.watchdog.get([engine.sleep.remote() for engine in self.engines],
                              [f"engine {index}'s sleep" for index in range(len(self.engines))])

    def wake_engines(self, tags: list[str]) -> None:
        """Colocated sync runs: the engines take back the memory `tags` name (`weights` before a push,
        `kv_cache` before generating)."""
        if self.engines_sleep:
            self.watchdog.get([engine.wake_up.remote(tags) for engine in self.engines],
                              [f"engine {index}'s wake-up ({', '.join(tags)})" for index in range(len(self.engines))])

    def collect(self) -> RolloutBatch:
        """One rollout of `rollout.batch_size` groups; with dynamic sampling, zero-variance groups are
        dropped and more prompts generated until the batch is full or the rounds run out."""
        cfg = self.cfg.rollout
        start = time.monotonic()
        kept: list[PromptGroup] = []
        drops: Counter = Counter()
        rounds = 0
        want = cfg.batch_size
        while len(kept) < cfg.batch_size and rounds < (cfg.max_sampling_rounds if cfg.dynamic_sampling else 1):
            groups = self.factory.new_groups(want)
            self.ledger.admit(sum(g.size for g in groups), groups)
            for group in generate(self.engines, groups, self.factory.params, self.watchdog):
                self.factory.score(group)
                if cfg.dynamic_sampling and zero_variance(group):
                    drops["zero_variance"] += group.size
                    self.ledger.drop("zero_variance", group.size, [group])
                else:
                    kept.append(group)
            rounds += 1
            want = cfg.over_sampling_batch_size or cfg.batch_size
        surplus = kept[cfg.batch_size:]
        kept = kept[: cfg.batch_size]
        drops["surplus"] += sum(g.size for g in surplus)
        self.ledger.drop("surplus", sum(g.size for g in surplus), surplus)
        self.ledger.deliver(sum(g.size for g in kept), kept)
        return RolloutBatch(kept, time.monotonic() - start, rounds, drops)

    def train_batch(self, rollout: int, batch: RolloutBatch, extra: dict | None = None) -> list[dict]:
        """Train on one rollout (or drain) at the current version; returns its step records, not yet written.
        The ledger is the caller's to update: its samples may be elsewhere."""
        samples = batch.samples
        start = time.monotonic()
        steps = self.trainer.train_rollout(samples, self.version)
        train_time = time.monotonic() - start
        self.recent_rewards.append(sum(s.reward for s in samples) / max(len(samples), 1))
        batch_stats = version_stats(samples)
        records = []
        for index, step in enumerate(steps):
            record = {
                "step": self.step,
                "rollout": rollout,
                "weight_version": self.version,
                "generate_time_s": batch.generate_time_s if index == 0 else 0.0,
                "weight_sync_time_s": 0.0,
                # The trainer's core is held for the whole call, the samples' transfer included.
                "train_call_time_s": train_time / len(steps),
                "rollout_reward_mean": self.recent_rewards[-1],
                **({} if batch.rounds is None else {"sampling_rounds": batch.rounds}),
                **{f"dropped_{reason}": count for reason, count in batch.drops.items()},
                **batch_stats,
                **(extra or {}),
                **step,
                # The step's oldest sample came from version `weight_version − staleness_max`.
                "policy_lag_max": self.clock.lag_steps(self.step, self.version - step["staleness_max"]),
            }
            record.setdefault("train_time_s", train_time / len(steps))
            self.step += 1
            records.append(record)
        return records

    def write(self, records: list[dict], weight_sync_time_s: float = 0.0) -> None:
        """Write a rollout's (drain's) step records and the ledger's journal; a checkpoint follows when the
        steps taken passed a multiple of `checkpoint.every`."""
        if records:
            records[-1]["weight_sync_time_s"] = weight_sync_time_s
        now = time.monotonic()
        tokens = sum(r.get("num_tokens", 0) for r in records)
        samples = sum(r.get("num_samples", 0) for r in records)
        elapsed = max(now - self._last_record_time, 1e-9)
        self._last_record_time = now
        too_many = None
        for record in records:
            self.count_bad_step(record)
            if self.bad_steps >= self.cfg.train.max_bad_steps:
                too_many = (self.bad_steps, record["step"])
            record["tokens_per_s"] = tokens / elapsed
            record["samples_per_s"] = samples / elapsed
            record["ledger_balanced"] = self.ledger.balanced
            warnings = self.signal.observe(record)
            self.progress.update(self.writer.write(record))
            for warning in warnings:
                self.progress.message(f"warning: {warning}")
            if record.get("skipped"):
                self.progress.message(f"warning: step {record['step']} took no optimizer step: {record['skip_reason']}")
        if too_many is not None:
            raise TooManyBadSteps(
                f"{too_many[0]} optimizer steps in a row had a NaN or inf loss or gradient and were skipped (the "
                f"last at step {too_many[1]}; train.max_bad_steps: {self.cfg.train.max_bad_steps}): the "
                "run stops without saving these weights")
        self.watchdog.progressed()
        self.record(self.ledger.take_journal())
        every = self.cfg.checkpoint.every
        if every and self.step // every > self._checkpointed_step // every:
            self.save_checkpoint("every")

    def count_bad_step(self, record: dict) -> None:
        if record.get("nonfinite_skipped"):
            self.bad_steps += 1
        elif not record.get("skipped"):
            self.bad_steps = 0

    def reached_target(self) -> bool:
        target = self.cfg.train.target_reward
        if target is None or len(self.recent_rewards) < REWARD_WINDOW:
            return False
        if sum(self.recent_rewards) / len(self.recent_rewards) >= target:
            self.stop_reason = f"reached target reward {target}"
            return True
        return False

    def close(self, outcome: str = "finished") -> None:
        """Flush the metrics, end the trackers' runs with the run's `outcome`, and end the actors this run
        started."""
        self.writer.close(outcome)
        self.journal.close()
        self.trainer.kill()
        for engine in self.engines if self._owns_engines else ():
            ray.kill(engine)
        self.placement.remove()
