"""A remote reward: completions posted to `reward.url` in batches (like slime's `--rm-url`).

The server receives `POST {"items": [{completion, label, ground_truth, prompt, data_source, extra_info,
completion_tokens, finish_reason}, ...]}` and answers `{"rewards": [float, ...]}`, one per item, in order. Each
request waits at most `reward.timeout_s`; a failed one (no answer, a 5xx or 429 status, a malformed answer) is
retried `reward.retries` times with exponential backoff, then fails its items (`reward.on_error`).
`reward.concurrency` requests are in flight at once (the `RewardRunner`'s threads).
"""

from __future__ import annotations

import json
import time
from concurrent.futures import Future, ThreadPoolExecutor

from fasync.config.schema import RewardConfig
from fasync.data.rewards import RewardInput, batch_futures
from fasync.errors import ConfigurationError

BACKOFF_S = 0.5
"""The first retry's wait; each later one doubles it."""
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
ITEM_FIELDS = ("completion", "label", "ground_truth", "prompt", "data_source", "extra_info", "completion_tokens",
               "finish_reason")


def probe(reward_cfg: RewardConfig) -> None:
    """A ConfigurationError naming `reward.url` when nothing answers there: a run must not start only to drop
    or fail its first batch. An empty batch is posted; any HTTP answer counts as reachable."""
    import httpx

    try:
        httpx.post(reward_cfg.url, json={"items": []}, timeout=reward_cfg.timeout_s)
    except httpx.HTTPError as error:
        raise ConfigurationError(f"reward.url: nothing answers at {reward_cfg.url} ({type(error).__name__}: "
                                 f"{error or 'no detail'}); start the reward server first, or fix the URL") from None


class RemoteReward:
    """Posts batches of completions to `reward.url`; `batch` is what `RewardRunner` calls."""

    def __init__(self, reward_cfg: RewardConfig):
        self.cfg = reward_cfg
        backoff = sum(BACKOFF_S * 2 ** attempt for attempt in range(reward_cfg.retries))
        self.wait_s = (reward_cfg.retries + 1) * 2 * reward_cfg.timeout_s + backoff
        """The longest a batch can take with every retry (httpx bounds connecting and reading each by
        `reward.timeout_s`): how long the runner waits for one item before it counts the item as timed out."""

    @property
    def batch_size(self) -> int:
        return self.cfg.batch_size

    def batch(self, pool: ThreadPoolExecutor, items: list[RewardInput], wheres: list[str]) -> list[Future]:
        """A future reward per item, the items posted `reward.batch_size` at a time from `pool`'s threads."""
        return batch_futures(pool, items, self.batch_size, self.cfg.url, self._post)

    def _post(self, items: list[RewardInput]) -> list:
        import httpx

        body = json.dumps({"items": [{name: item.field(name) for name in ITEM_FIELDS} for item in items]},
                          default=str)
        failure = ""
        for attempt in range(self.cfg.retries + 1):
            if attempt:
                time.sleep(BACKOFF_S * 2 ** (attempt - 1))
            try:
                answer = httpx.post(self.cfg.url, content=body, headers={"content-type": "application/json"},
                                    timeout=self.cfg.timeout_s)
            except httpx.HTTPError as error:
                failure = f"{type(error).__name__}: {error or 'no detail'}"
                continue
            if answer.status_code in RETRY_STATUSES:
                failure = f"HTTP {answer.status_code}"
                continue
            if answer.status_code != 200:
                failure = f"HTTP {answer.status_code}: {answer.text[:100]}"
                break  # a client error does not go away by asking again
            try:
                rewards = answer.json()["rewards"]
            except (ValueError, KeyError, TypeError):
                failure = f"the answer is not {{\"rewards\": [...]}}: {answer.text[:100]!r}"
                break
            if isinstance(rewards, list) and len(rewards) == len(items):
                return rewards
            failure = f"{len(items)} completions posted, {len(rewards) if isinstance(rewards, list) else 'no'} " \
                      "rewards answered"
            break
        raise ConfigurationError(f"reward.url: {self.cfg.url} failed a batch of {len(items)} completions "
                                 f"after {attempt + 1} attempt{'s' if attempt else ''} ({failure})")
