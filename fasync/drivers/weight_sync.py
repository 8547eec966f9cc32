"""The driver's side of a weight sync: the trainer's weights published to every engine as the next version,
and what every engine serves checked against what the trainer sent.

Syncs take the run's transport (`fasync.weights.transport.transport_of`): on the `cpu` path the trainer's
state dict goes to every engine's `load_weights`; on `ipc` and `nccl` (vLLM on GPUs) every trainer rank sends,
rank 0 driving the engines through vLLM's weight transfer engines, and reports what each engine serves after
it. Either way `verify_loads` checks every engine's version. fully_async hands the weights to its rollouter
instead, which holds generation while the engines take them (`hand_off`, `PendingSync`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import ray

from fasync.errors import WeightSyncMismatch
from fasync.killpoints import kill_point
from fasync.launch.actors import push_weights
from fasync.launch.plan import ResourcePlan
from fasync.staleness import VersionClock
from fasync.weights.transport import Transport


@dataclass(frozen=True)
class PendingSync:
    """fully_async's weight sync under way: the rollouter's `update_weights` call for `version`, and, on the
    `ipc` and `nccl` transports, the other trainer ranks' sends (rank 0's reports for every engine)."""

    version: int
    call: object
    other_sends: list = field(default_factory=list)
    other_labels: list[str] = field(default_factory=list)


class WeightSync:
    """The weight version the engines serve, when each was published (`clock`), and the pushes to them.

    `engines` and `trainer` are the run's engine actors and `TrainerGroup`; `wait` is the stall watchdog's
    `get`, (refs, labels) → results, failing with the label of what died or hung."""

    def __init__(self, transport: Transport, engines: list, trainer, wait, version: int = 0,
                 clock: VersionClock | None = None):
        self.transport = transport
        self.engines = engines
        self.trainer = trainer
        self.wait = wait
        self.version = version
        self.clock = clock or VersionClock()
        self._sent: dict[int, object] = {}
        """version → the trainer's checksum (a reference) of the weights it sent as that version."""
        self._unverified: list[tuple[int, list]] = []
        """Weight loads pushed without waiting (async), checked once they are done."""
        self._setup: list = []
        self._first_push: list = []

    def start(self, plan: ResourcePlan) -> None:
        """Start setting up the GPU weight transfer (nothing on the `cpu` path) and pushing the trainer's weights
        as the current version, without waiting: a driver starts its own actors before `wait_until_ready`, so
        that they start up alongside the engines and the trainer."""
        self._setup = [] if self.transport == "cpu" else self.trainer.init_weight_sync(
            self.transport, self.engines, plan)
        self._first_push = self.push(self.version)

    def wait_until_ready(self) -> None:
        """Block until the weight transfer is set up and every engine serves the first version pushed."""
        self.wait(self._setup, [f"trainer rank {rank}'s weight transfer set-up ({self.transport})"
                                for rank in range(len(self._setup))])
        self.verify_loads(self.version, self._served(self.version, self._first_push))

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
        results = self.wait(pushes, self.load_labels(version))
        return results if self.transport == "cpu" else results[0].served  # rank 0 reports for every engine

    def verify_loads(self, version: int, served: list[tuple[int, str]]) -> None:
        """Every engine must serve `version` with the weights the trainer sent as it (a checksum of a few
        parameter slices, `fasync.weights.checksum`); an engine that kept old weights, or
        loaded them wrongly, fails the run."""
        sent_ref = self._sent.pop(version)
        sent = None if sent_ref is None else self.wait([sent_ref], ["trainer rank 0's weight checksum"])[0]
        for index, (served_version, checksum) in enumerate(served):
            # None: a backend that cannot read its weights back (vLLM, whose CPU build repacks the linear
            # layers after loading) is held to the version it serves; its tests compare logprobs instead.
            if served_version != version or (checksum is not None and checksum != sent):
                raise WeightSyncMismatch(
                    f"weight sync: engine {index} serves version {served_version} with weight checksum "
                    f"{checksum or 'none'}, but the trainer sent version {version} with checksum {sent}: the "
                    "engine did not load the weights it was sent")

    def next_version(self, steps_taken: int) -> int:
        """The trainer's weights become the next version, published after `steps_taken` optimizer steps."""
        kill_point("weight_sync")
        self.version += 1
        self.clock.publish(self.version, steps_taken)
        return self.version

    def publish(self, steps_taken: int, wait: bool = True) -> None:
        """Push the trainer's weights to every engine as the next version. Without `wait` the push queues
        behind any generation in progress on an engine."""
        self.verify_done_loads(block=False)
        version = self.next_version(steps_taken)
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

    def hand_off(self, steps_taken: int, update_weights) -> PendingSync:
        """fully_async: the next version, handed to the rollouter's `update_weights(weights, version)`. On the
        `ipc` and `nccl` transports the trainer ranks send it themselves, and rank 0's result (what the engines
        serve) is what the rollouter hands on."""
        version = self.next_version(steps_taken)
        if self.transport == "cpu":
            return PendingSync(version, update_weights([self.weights_for(version)], version))
        # The other ranks' sends are waited on as well, so that one that fails fails the sync under its own name.
        rank_0, *others = self.push(version)
        return PendingSync(version, update_weights([rank_0], version), others, self.load_labels(version)[1:])

    def finish(self, pending: PendingSync, served: list[tuple[int, str | None]]) -> None:
        """Check what every engine serves after the sync `pending` (`served`, as the rollouter reports it)."""
        self.verify_loads(pending.version, served)
        self.wait(pending.other_sends, pending.other_labels)
