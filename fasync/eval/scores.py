"""The `eval/` metrics of one evaluation, from each prompt's completion rewards: the mean reward, mean@k and pass@k
with the unbiased estimator, overall and per `data_source`. Pure Python: `fasync eval` and tests use it as is."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from math import comb


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased estimate of pass@k from `n` completions of which `c` are correct: the chance that `k` drawn
    from them without replacement hold at least one correct one, 1 − C(n−c, k) / C(n, k) (Chen et al. 2021)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    # Exact integers until the one division: C(n, k) outgrows a float's mantissa long before n does.
    return 1.0 - comb(n - c, k) / comb(n, k)


@dataclass(frozen=True)
class PromptResult:
    """One eval prompt's completions, scored."""

    rewards: Sequence[float]
    data_source: str | None = None
    response_lengths: Sequence[int] = ()


def metric_source(data_source: str) -> str:
    """`data_source` as it appears in a metric key (`eval/<source>/pass@k`): a path separator, space or other
    character that trackers read as structure becomes `_`."""
    return re.sub(r"[^A-Za-z0-9_.@-]+", "_", data_source).strip("_") or "_"


def _figures(results: Sequence[PromptResult], k: int, correct_reward: float) -> dict[str, float]:
    rewards = [reward for result in results for reward in result.rewards]
    correct = [sum(reward >= correct_reward for reward in result.rewards) for result in results]
    return {
        "prompts": len(results),
        "reward_mean": sum(rewards) / len(rewards),
        "mean@k": sum(c / len(result.rewards) for c, result in zip(correct, results)) / len(results),
        "pass@k": sum(pass_at_k(len(result.rewards), c, k) for c, result in zip(correct, results)) / len(results),
    }


def eval_metrics(results: Sequence[PromptResult], k: int, correct_reward: float) -> dict[str, float]:
    """The evaluation's `eval/` keys: each figure over every prompt (a prompt weighs the same whatever its
    completions), then per `data_source` when the prompts carry one."""
    if not results:
        raise ValueError("an evaluation needs at least one prompt")
    out = {f"eval/{name}": value for name, value in _figures(results, k, correct_reward).items()}
    lengths = [length for result in results for length in result.response_lengths]
    if lengths:
        out["eval/response_length_mean"] = sum(lengths) / len(lengths)
    by_source: dict[str, list[PromptResult]] = {}
    for result in results:
        if result.data_source is not None:
            by_source.setdefault(metric_source(result.data_source), []).append(result)
    for source, group in sorted(by_source.items()):
        out.update({f"eval/{source}/{name}": value for name, value in _figures(group, k, correct_reward).items()})
    return out
