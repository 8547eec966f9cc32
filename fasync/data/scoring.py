"""Scoring many completions at once: the run's reward (a function, or `reward.url`) in worker threads,
`reward.concurrency` at a time, each awaited at most `reward.timeout_s`, failures fatal or dropped."""

from __future__ import annotations

import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout

from fasync.config.schema import RewardConfig
from fasync.data.rewards import INSTANT_REWARDS, RewardInput, build_reward, score
from fasync.errors import ConfigurationError

_POOL_LOCK = threading.Lock()


class RewardFailed(Exception):
    """A completion the reward could not score (it raised, timed out or returned no finite number), with
    `reward.on_error: drop`: its group is dropped."""


class RewardRunner:
    """Scores many completions at once: `reward.concurrency` calls in worker threads, each awaited at most
    `reward.timeout_s`, so a slow reward neither serialises the batch nor holds the run for ever. A failure is a
    ConfigurationError (`reward.on_error: fail`) or a `RewardFailed` in the results (`drop`). A call that timed
    out keeps its worker thread until it returns: Python cannot stop a thread."""

    def __init__(self, reward_cfg: RewardConfig, search_path: tuple[str, ...] = ()):
        self.cfg = reward_cfg
        self.name = reward_cfg.url or reward_cfg.function
        self.key = "reward.url" if reward_cfg.url is not None else "reward.function"
        if reward_cfg.url is not None:
            from fasync.data.remote import RemoteReward, probe  # httpx only where a server is named

            probe(reward_cfg)
            self.reward = RemoteReward(reward_cfg)
        else:
            self.reward = build_reward(reward_cfg, search_path)  # also looked for in search_path
        self._pool: ThreadPoolExecutor | None = None
        self.instant = reward_cfg.url is None and reward_cfg.function in INSTANT_REWARDS
        """Whether the reward is one of `INSTANT_REWARDS`, which a caller with an event loop scores in its own
        thread."""

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_pool": None}  # threads do not cross into the Ray actor that scores

    @property
    def pool(self) -> ThreadPoolExecutor:
        with _POOL_LOCK:  # fully_async scores from several threads of the rollouter
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.cfg.concurrency, thread_name_prefix="fasync-reward")
            return self._pool

    def score(self, items: list[RewardInput], wheres: list[str]) -> list[float | RewardFailed]:
        """A reward for each item (`wheres[i]` names its prompt in messages). An instant reward is scored in the
        calling thread: handing each completion to a worker thread and waiting for it cost more than the scoring
        (a third of the rollouter's steady CPU time in fully_async at the quickstart shape)."""
        if self.instant:
            return [self._score_now(item, where) for item, where in zip(items, wheres)]
        return self._settle(self.reward.batch(self.pool, items, wheres), items, wheres)

    def _score_now(self, item: RewardInput, where: str) -> float | RewardFailed:
        try:
            return score(self.reward, self.reward.name, item, where)
        except ConfigurationError as error:
            return self._failed(error)

    def _settle(self, futures, items, wheres) -> list[float | RewardFailed]:
        """Each future's reward, all waited for until one deadline: a call's longest wait (`reward.timeout_s`,
        with a server's retries) for every round of `reward.concurrency` calls the items need, so a reward that
        hangs costs the batch that bound once, not once per completion."""
        per_call = getattr(self.reward, "batch_size", None) or 1
        rounds = math.ceil(len(items) / (per_call * self.cfg.concurrency))
        budget = getattr(self.reward, "wait_s", self.cfg.timeout_s) * max(rounds, 1)
        deadline = time.monotonic() + budget
        results = []
        for future, item, where in zip(futures, items, wheres):
            try:
                results.append(future.result(timeout=max(deadline - time.monotonic(), 0.0)))
            except FutureTimeout:
                future.cancel()
                results.append(self._failed(ConfigurationError(
                    f"{self.key}: {self.name} took longer than {budget:g} s (`reward.timeout_s`) for "
                    f"{where}, completion {item.completion[:40]!r}; make it faster, raise the timeout, or set "
                    "`reward.on_error: drop` to drop what it cannot score in time")))
            except ConfigurationError as error:
                results.append(self._failed(error))
        return results

    def _failed(self, error: ConfigurationError) -> RewardFailed:
        if self.cfg.on_error == "fail":
            raise error
        return RewardFailed(str(error))
