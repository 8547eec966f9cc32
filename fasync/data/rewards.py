"""Verifiable rewards: `(completion, label) -> float`.

Built-ins are module-level functions, which pickle by reference into whichever Ray actor scores the samples. A
`module:function` reward is a `ModuleReward`: it travels as its spec and the directories it is imported from, and
is imported anew where it arrives.

Where a `module:function` reward is imported from: `sys.path` as Python sets it up (PYTHONPATH, the standard
library, site-packages), then the working directory and the config's directory, appended after them and only in
the processes that score (the driver, and fully_async's rollouter). Neither directory goes on PYTHONPATH, so no
module beside the config (a `sitecustomize.py`, a `json.py`) runs in Ray's or fasync's other processes.
"""

from __future__ import annotations

import importlib
import inspect
import math
import numbers
import re
import sys
import traceback
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path

from fasync.config.schema import RewardConfig
from fasync.errors import ConfigurationError

RewardFn = Callable[[str, str], float]


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


BUILTIN_REWARDS: dict[str, RewardFn] = {
    "exact_match": exact_match,
    "partial_match": partial_match,
    "boxed_math": boxed_math,
}


def reward_search_path(config_dir: str | Path) -> tuple[str, ...]:
    """The directories a `module:function` reward is looked for in after `sys.path`: the working directory and
    the config's (absolute, so that an actor elsewhere resolves them the same way)."""
    return tuple(dict.fromkeys(str(directory.resolve()) for directory in (Path.cwd(), Path(config_dir))))


class ModuleReward:
    """A `module:function` reward, imported from `sys.path` and then `search_path` (`reward_search_path`). It
    pickles as the two, so that the actor it is sent to imports it the same way."""

    def __init__(self, spec: str, search_path: tuple[str, ...] = ()):
        self.spec = spec
        self.search_path = tuple(search_path)
        self.function = import_reward(spec, self.search_path)

    def __call__(self, completion: str, label: str) -> float:
        return self.function(completion, label)

    def __reduce__(self):
        return ModuleReward, (self.spec, self.search_path)


def make_importable(search_path: tuple[str, ...]) -> None:
    """The user's module directories (`reward_search_path`) go on `sys.path` after the standard library's and
    site's own, so that a user's module never shadows them (and a `sitecustomize.py` beside a config never runs)."""
    sys.path.extend(path for path in search_path if path not in sys.path)


def import_reward(spec: str, search_path: tuple[str, ...] = ()) -> RewardFn:
    """The function named by `module:function`, looked for in `sys.path` and then in `search_path`, checked to
    take (completion, label)."""
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
    try:
        inspect.signature(function).bind("completion", "label")
    except TypeError as exc:
        raise ConfigurationError(
            f"reward.function: {spec} must accept (completion, label) ({exc})"
        ) from exc
    except ValueError:
        pass  # no introspectable signature (some builtins): trust the call
    return function


MAX_REWARD = 1e30
"""The largest reward magnitude taken. Rewards are averaged and their spread squared in the advantages, and
the advantages are summed over a batch's tokens in float32 (whose largest number is 3.4e38): 1e30 leaves room
for both. A larger value (1e308 overflowed the group mean) is a bug in the reward, not a scale."""


def score(reward_fn: RewardFn, name: str, completion: str, label: str, where: str) -> float:
    """`reward_fn(completion, label)`, which must be a finite int or float of at most `MAX_REWARD` in
    magnitude; an exception it raises, or any other value, is a ConfigurationError naming the function, the
    prompt (`where`) and the completion. A NaN or an infinity would train a NaN step and push NaN weights to
    the engines, and text would be silently converted."""
    about = f"for {where}, completion {completion[:40]!r}"
    try:
        value = reward_fn(completion, label)
    except Exception as error:
        raise ConfigurationError(f"reward.function: {name} raised {_raised(error)} {about}; a reward must return "
                                 "a number for every completion (catch what it cannot score and return 0.0)") from error
    except KeyboardInterrupt as error:
        if type(error) is not KeyboardInterrupt:
            raise  # a stop signal that reached the process while the reward ran: the run stops as it asked
        raise ConfigurationError(f"reward.function: {name} raised {_raised(error)} {about}; a reward must return "
                                 "a number, not stop the run (fasync's own Ctrl-C handling raises no bare "
                                 "KeyboardInterrupt)") from error
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


def build_reward(reward_cfg: RewardConfig, search_path: tuple[str, ...] = ()) -> RewardFn:
    """The reward `reward.function` names: a built-in, or a `ModuleReward` also looked for in `search_path`."""
    name = reward_cfg.function
    if name in BUILTIN_REWARDS:
        return BUILTIN_REWARDS[name]
    if ":" not in name:
        builtins = ", ".join(BUILTIN_REWARDS)
        raise ConfigurationError(f"reward.function: unknown reward {name!r}; use one of {builtins} or module:function")
    return ModuleReward(name, search_path)
