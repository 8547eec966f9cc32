"""Verifiable rewards: functions of the fields they name, e.g. `(completion, label) -> float`.

A function takes the `REWARD_FIELDS` it names (verl's `compute_score(data_source, solution_str, ground_truth,
extra_info)` among them), or `(completion, label)` positionally; it may be `async def` or batched.
`fasync.data.scoring.RewardRunner` calls it for many completions at once; `fasync.data.remote` posts them to
`reward.url` instead.

Built-ins are module-level functions, which pickle by reference into whichever Ray actor scores the samples. A
`module:function` reward travels as its spec and the directories it is imported from, and is imported anew where
it arrives.

Where a `module:function` reward is imported from: `sys.path` as Python sets it up (PYTHONPATH, the standard
library, site-packages), then the working directory and the config's directory, appended after them and only in
the processes that score (the driver, and fully_async's rollouter). Neither directory goes on PYTHONPATH, so no
module beside the config (a `sitecustomize.py`, a `json.py`) runs in Ray's or fasync's other processes.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import logging
import math
import numbers
import re
import sys
import threading
import traceback
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from fractions import Fraction
from pathlib import Path

from fasync.config.schema import RewardConfig
from fasync.data.tasks import Problem
from fasync.errors import ConfigurationError

RewardFn = Callable[..., float]


def exact_match(completion: str, label: str) -> float:
    return float(completion.strip() == label.strip())


def partial_match(completion: str, label: str) -> float:
    """Fraction of positions where completion and label agree, over the longer of the two.

    Extra or missing characters count as wrong, so only the exact answer scores 1.
    """
    completion, label = completion.strip(), label.strip()
    longest = max(len(completion), len(label))
    if longest == 0:
        return 1.0
    return sum(a == b for a, b in zip(completion, label)) / longest


def last_boxed(text: str) -> str | None:
    """Contents of the last `\\boxed{...}` whose braces balance (a truncated one is skipped)."""
    found = None
    for match in re.finditer(r"\\boxed\s*\{", text):
        depth = 1
        for end in range(match.end(), len(text)):
            depth += {"{": 1, "}": -1}.get(text[end], 0)
            if depth == 0:
                found = text[match.end():end]
                break
    return found


_FRAC = re.compile(r"\\[dt]?frac\{([^{}]*)\}\{([^{}]*)\}")
_NUMBER = r"[+-]?(?:\d+\.?\d*|\.\d+)"
_RATIONAL = re.compile(rf"({_NUMBER})(?:/({_NUMBER}))?")
_THOUSANDS = re.compile(r"[+-]?\d{1,3}(?:,\d{3})+(?:\.\d*)?")


def normalize_answer(answer: str) -> str:
    """Canonical text of a maths answer: no spaces, `$`, `\\left`/`\\right` or trailing period;
    `\\frac{a}{b}` (and `\\dfrac`, `\\tfrac`) written `a/b`."""
    text = re.sub(r"\\left|\\right|\\[,;!]|\s", "", answer).rstrip(".").strip("$")
    text = _FRAC.sub(r"\1/\2", text)
    if _THOUSANDS.fullmatch(text):
        text = text.replace(",", "")
    return text


def as_number(text: str) -> Fraction | None:
    """The exact value of a decimal or a simple fraction (`0.50`, `.5`, `1/2`, `-3`), else None."""
    match = _RATIONAL.fullmatch(text)
    if match is None:
        return None
    numerator, denominator = match.groups()
    if denominator is None:
        return Fraction(numerator)
    if Fraction(denominator) == 0:
        return None
    return Fraction(numerator) / Fraction(denominator)


def boxed_math(completion: str, label: str) -> float:
    """1 when the completion's last `\\boxed{}` answer equals the label's.

    The label may itself hold a `\\boxed{}`. Numbers compare by exact value, so `0.50`, `.5`,
    `1/2` and `\\frac{1}{2}` agree; anything else compares as normalised text.
    """
    answer = last_boxed(completion)
    if answer is None:
        return 0.0
    reference = last_boxed(label)
    answer = normalize_answer(answer)
    reference = normalize_answer(label if reference is None else reference)
    answer_value, reference_value = as_number(answer), as_number(reference)
    if answer_value is not None and reference_value is not None:
        return float(answer_value == reference_value)
    return float(answer == reference)


GSM8K_ANSWER = re.compile(r"####\s*(.+?)\s*$", re.DOTALL)
"""GSM8K's answer line: `#### 14` ends the solution."""


def math_verify(completion: str, label: str) -> float:
    """1 when the completion's final answer equals the label's by math-verify (a maintained verifier): the last
    `\\boxed{}`, GSM8K's `#### answer`, or the answer stated in the text; numbers, fractions and LaTeX compare
    by value (`\\frac{1}{2}` is `0.5`, `1,000` is `1000`)."""
    from math_verify import parse, verify

    # Its own timeouts use SIGALRM, which only the main thread may set; elsewhere `reward.timeout_s` bounds it.
    timeout = 5 if threading.current_thread() is threading.main_thread() else None
    logging.getLogger("math_verify").setLevel(logging.ERROR)  # it warns on every call made without a timeout

    def answer(text: str):
        gsm8k = GSM8K_ANSWER.search(text)
        return parse(gsm8k.group(1) if gsm8k and last_boxed(text) is None else text, parsing_timeout=timeout)

    gold, given = answer(label), answer(completion)
    return float(bool(gold) and bool(given) and verify(gold, given, timeout_seconds=timeout))


BUILTIN_REWARDS: dict[str, RewardFn] = {
    "exact_match": exact_match,
    "partial_match": partial_match,
    "boxed_math": boxed_math,
    "math_verify": math_verify,
}
INSTANT_REWARDS = ("exact_match", "partial_match", "boxed_math")
"""The built-ins that score a completion in microseconds (comparisons of short strings and numbers): scoring
them where the caller is costs less than handing them to a thread. math_verify parses LaTeX and is not one."""


@dataclass(frozen=True)
class RewardInput:
    """One completion to score, and what a reward function may ask about it."""

    completion: str
    problem: Problem
    completion_tokens: int = 0
    finish_reason: str | None = None

    def field(self, name: str):
        """The value of the `REWARD_FIELDS` entry `name`."""
        record = self.problem.record
        ground_truth = self.problem.label if self.problem.ground_truth is None else self.problem.ground_truth
        return {
            "completion": lambda: self.completion,
            "solution_str": lambda: self.completion,
            "label": lambda: self.problem.label,
            "ground_truth": lambda: ground_truth,
            "prompt": lambda: self.problem.prompt,
            "data_source": lambda: record.get("data_source", ""),
            "extra_info": lambda: record.get("extra_info"),
            "record": lambda: record,
            "completion_tokens": lambda: self.completion_tokens,
            "finish_reason": lambda: self.finish_reason,
        }[name]()


REWARD_FIELDS = ("completion", "solution_str", "label", "ground_truth", "prompt", "data_source", "extra_info",
                 "record", "completion_tokens", "finish_reason")
"""What a reward function may name: the completion (verl: `solution_str`), the label as text or as the record
holds it (`ground_truth`), the prompt, the record's `data_source` and `extra_info`, the whole record, and the
completion's token count and finish reason (`stop` or `length`, for overlong shaping)."""


@dataclass(frozen=True)
class Reward:
    """A reward function and how to call it: with the fields it names, or `(completion, label)` by position;
    one completion a call, or (`reward.batched`) lists of `batch_size` completions' fields a call."""

    function: RewardFn
    name: str
    fields: tuple[str, ...] | None
    """The `REWARD_FIELDS` it takes by name; None: `(completion, label)` by position."""
    batch_size: int | None = None
    """None: the function scores one completion a call; else it takes lists of this many and returns a list."""
    search_path: tuple[str, ...] | None = None
    """Where a `module:function` reward (`name`) was imported from after `sys.path`; None for a built-in."""

    def __reduce__(self):
        # A user's function travels as its name and search path and is imported anew where it arrives: pickled by
        # reference, its module would have to be importable in every Ray worker, which PYTHONPATH would give to
        # every process, user modules and all.
        if self.search_path is None:
            return Reward, (self.function, self.name, self.fields, self.batch_size)
        return _imported_reward, (self.name, self.search_path, self.batch_size)

    def __call__(self, item: RewardInput):
        return self._call(lambda name: item.field(name))

    def _call(self, field: Callable[[str], object]):
        if self.fields is None:
            value = self.function(field("completion"), field("label"))
        else:
            value = self.function(**{name: field(name) for name in self.fields})
        return asyncio.run(value) if inspect.isawaitable(value) else value

    def score_batch(self, items: list[RewardInput]) -> list:
        """The batched function's rewards for `items`, one per item; a ConfigurationError when it raises or
        answers with something else than a list of that length."""
        try:
            values = self._call(lambda name: [item.field(name) for item in items])
        except Exception as error:
            raise ConfigurationError(f"reward.function: {self.name} raised {_raised(error)} for a batch of "
                                     f"{len(items)} completions") from error
        if not isinstance(values, (list, tuple)) or len(values) != len(items):
            raise ConfigurationError(f"reward.function: {self.name} is batched (`reward.batched`) and got "
                                     f"{len(items)} completions, but returned {type(values).__name__} "
                                     f"{str(values)[:40]}; return a list of one reward per completion")
        return list(values)

    def batch(self, pool: ThreadPoolExecutor, items: list[RewardInput], wheres: list[str]) -> list[Future]:
        """A future reward per item, scored in `pool`'s threads: one call per item, or `batch_size` a call."""
        if self.batch_size is None:
            return [pool.submit(score, self, self.name, item, where) for item, where in zip(items, wheres)]
        return batch_futures(pool, items, self.batch_size, self.name, self.score_batch)

    @classmethod
    def of(cls, function: RewardFn, name: str) -> Reward:
        """How to call `function`: by the fields its parameters name when every one is a `REWARD_FIELDS` entry,
        else `(completion, label)` when it takes two arguments; else a ConfigurationError saying what it takes."""
        try:
            parameters = inspect.signature(function).parameters.values()
        except (TypeError, ValueError):
            return cls(function, name, None)  # no introspectable signature (some builtins): trust the call
        named = [p for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        names = {p.name for p in named}
        if names - {"completion", "label"} and names <= set(REWARD_FIELDS):
            return cls(function, name, tuple(p.name for p in named))
        try:
            inspect.signature(function).bind("completion", "label")
        except TypeError as exc:
            raise ConfigurationError(
                f"reward.function: {name} must accept (completion, label) ({exc}), or name the fields it takes "
                f"among {', '.join(REWARD_FIELDS)}") from None
        return cls(function, name, None)


def reward_search_path(config_dir: str | Path) -> tuple[str, ...]:
    """The directories a `module:function` reward is looked for in after `sys.path`: the working directory and
    the config's (absolute, so that an actor elsewhere resolves them the same way)."""
    return tuple(dict.fromkeys(str(directory.resolve()) for directory in (Path.cwd(), Path(config_dir))))


def make_importable(search_path: tuple[str, ...]) -> None:
    """The user's module directories (`reward_search_path`) go on `sys.path` after the standard library's and
    site's own, so that a user's module never shadows them (and a `sitecustomize.py` beside a config never runs)."""
    sys.path.extend(path for path in search_path if path not in sys.path)


def import_reward(spec: str, search_path: tuple[str, ...] = ()) -> Reward:
    """The function named by `module:function`, looked for in `sys.path` and then in `search_path`, and how to
    call it. The `Reward` pickles as the two, so that the actor it is sent to imports it the same way."""
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise ConfigurationError(f"reward.function: {spec!r} is not of the form module:function")
    make_importable(search_path)
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise ConfigurationError(
            f"reward.function: cannot import module {module_name!r} ({type(exc).__name__}: {exc}); "
            "fasync imports it from PYTHONPATH and the installed packages, then the working directory and the "
            "config's directory"
        ) from exc
    function = getattr(module, attribute, None)
    if function is None:
        raise ConfigurationError(f"reward.function: module {module_name!r} has no attribute {attribute!r}")
    if not callable(function):
        raise ConfigurationError(f"reward.function: {spec} is a {type(function).__name__}, not a function")
    return replace(Reward.of(function, spec), search_path=tuple(search_path))


MAX_REWARD = 1e30
"""The largest reward magnitude taken. Rewards are averaged and their spread squared in the advantages, and
the advantages are summed over a batch's tokens in float32 (whose largest number is 3.4e38): 1e30 leaves room
for both. A larger value (1e308 overflowed the group mean) is a bug in the reward, not a scale."""


def score(reward: Callable[[RewardInput], object], name: str, item: RewardInput, where: str) -> float:
    """`reward(item)`, which must be a finite int or float of at most `MAX_REWARD` in magnitude; an exception
    it raises, or any other value, is a ConfigurationError naming the function, the prompt (`where`) and the
    completion. A NaN or an infinity would train a NaN step and push NaN weights to the engines, and text would
    be silently converted."""
    about = f"for {where}, completion {item.completion[:40]!r}"
    try:
        value = reward(item)
    except Exception as error:
        raise ConfigurationError(f"reward.function: {name} raised {_raised(error)} {about}; a reward must return "
                                 "a number for every completion (catch what it cannot score and return 0.0)") from error
    except KeyboardInterrupt as error:
        if type(error) is not KeyboardInterrupt:
            raise  # a stop signal that reached the process while the reward ran: the run stops as it asked
        raise ConfigurationError(f"reward.function: {name} raised {_raised(error)} {about}; a reward must return "
                                 "a number, not stop the run (fasync's own Ctrl-C handling raises no bare "
                                 "KeyboardInterrupt)") from error
    return checked_value(value, name, about)


def checked_value(value, name: str, about: str) -> float:
    """`value` as a float when it is a finite real number of at most `MAX_REWARD` in magnitude, else a
    ConfigurationError naming the reward (`name`) and what it scored (`about`)."""
    finite = isinstance(value, numbers.Real) and math.isfinite(value)
    if finite and abs(value) <= MAX_REWARD:
        return float(value)
    raise ConfigurationError(
        f"reward.function: {name} returned {value!r} ({type(value).__name__}) {about}; every reward must be a "
        "finite int or float " + (f"of at most {MAX_REWARD:g} in magnitude: scale the reward down" if finite else
                                  f"(at most {MAX_REWARD:g} in magnitude): return float(...) of a number, never "
                                  "NaN, an infinity or text"))


def _raised(error: BaseException) -> str:
    """`ValueError: bad input (at my_rewards.py:12)`: the exception and the line of the reward that raised it."""
    frames = traceback.extract_tb(error.__traceback__)
    # The innermost frame is the reward's own line, unless it raised in fasync's call to it.
    where = f" (at {Path(frames[-1].filename).name}:{frames[-1].lineno})" if frames[-1].filename != __file__ else ""
    return f"{type(error).__name__}: {error}{where}" if str(error) else f"{type(error).__name__}{where}"


def build_reward(reward_cfg: RewardConfig, search_path: tuple[str, ...] = ()) -> Reward:
    """The configured reward function, resolved (a `module:function` imported, also from `search_path`) and ready
    to call; a ConfigurationError in one line when it cannot be."""
    name = reward_cfg.function
    if name in BUILTIN_REWARDS:
        if reward_cfg.batched:
            raise ConfigurationError(f"reward.function: the built-in {name} scores one completion a call; "
                                     "`reward.batched: true` is for a function of lists")
        return Reward(BUILTIN_REWARDS[name], name, None)
    if ":" not in name:
        builtins = ", ".join(BUILTIN_REWARDS)
        raise ConfigurationError(f"reward.function: unknown reward {name!r}; use one of {builtins} or module:function")
    reward = import_reward(name, search_path)
    return replace(reward, batch_size=reward_cfg.batch_size) if reward_cfg.batched else reward


def _imported_reward(spec: str, search_path: tuple[str, ...], batch_size: int | None) -> Reward:
    """A pickled `module:function` reward, imported again where it arrived."""
    return replace(import_reward(spec, search_path), batch_size=batch_size)


def batch_futures(pool: ThreadPoolExecutor, items: list[RewardInput], size: int, name: str,
                  score_batch: Callable[[list[RewardInput]], list]) -> list[Future]:
    """A future reward per item: `score_batch` gets the items `size` at a time, in `pool`'s threads, and
    answers one value per item, each checked as `score` checks one; a ConfigurationError it raises fails
    every item of its batch."""
    futures: list[Future] = [Future() for _ in items]

    def settle(start: int) -> None:
        batch, waiting = items[start:start + size], futures[start:start + size]
        try:
            values = score_batch(batch)
        except ConfigurationError as error:
            for future in waiting:
                future.set_exception(error)
            return
        for future, value, item in zip(waiting, values, batch):
            try:
                future.set_result(checked_value(value, name, f"for completion {item.completion[:40]!r}"))
            except ConfigurationError as error:
                future.set_exception(error)

    for start in range(0, len(items), size):
        pool.submit(settle, start)
    return futures
