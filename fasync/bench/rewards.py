"""The benchmarks' rewards: the long tail's (`fasync.bench.rewards:length_then_digits`) and the medium shape's
(`word_match` for its throughput task, `word_lcs` for the one a run learns).

With `partial_match` alone the tiny model takes hundreds of rollouts to discover the stop token, and
until then every completion runs to `max_new_tokens`: the data's length distribution never reaches
generation. Half of this reward is for the completion's length, so within a few dozen rollouts short
problems stop after their two digits and long ones run on, and the generation lengths follow the data.
"""

from __future__ import annotations

from fasync.data.rewards import partial_match


def length_then_digits(completion: str, label: str) -> float:
    completion, label = completion.strip(), label.strip()
    length = 1.0 - min(abs(len(completion) - len(label)) / max(len(label), 1), 1.0)
    return 0.5 * length + 0.5 * partial_match(completion, label)


def word_match(completion: str, label: str) -> float:
    """The medium shape's reward (bench/medium_shape.py): the fraction of word positions where the completion's
    words (split at whitespace) equal the label's, over the longer of the two; `partial_match` at the level of
    words, whose every one is a token of the benchmark's tokenizer."""
    said, wanted = completion.split(), label.split()
    longest = max(len(said), len(wanted))
    return sum(a == b for a, b in zip(said, wanted)) / longest if longest else 1.0


def word_lcs(completion: str, label: str) -> float:
    """The medium shape's time-to-target reward (`fasync.bench.medium.CONTINUE`): the longest common subsequence of
    the completion's and the label's words, over the longer of the two. A word skipped or said twice costs one
    word, where `word_match` would lose every position after it."""
    said, wanted = completion.split(), label.split()
    longest = max(len(said), len(wanted))
    if not longest:
        return 1.0
    previous = [0] * (len(wanted) + 1)
    for word in said:
        current = [0]
        for index, other in enumerate(wanted):
            current.append(previous[index] + 1 if word == other else max(previous[index + 1], current[index]))
        previous = current
    return previous[-1] / longest
