"""Tasks, datasets and rewards, including every bad input a config can name."""

import json
import random
import re
import sys
from pathlib import Path

import pytest

from fasync.config.schema import DataConfig, RewardConfig
from fasync.data import ConfigurationError, Problem, build_dataset, build_reward
from fasync.data.rewards import RewardInput, boxed_math, exact_match, last_boxed, partial_match
from fasync.data.tasks import generate_problems
from fasync.model.tokenizer import TASK_ALPHABET

# -- tasks -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("task", ["reverse", "copy", "sort", "add"])
def test_task_labels_are_correct(task):
    for problem in generate_problems(task, length=5, count=50, seed=3):
        assert set(problem.prompt + problem.label) <= set(TASK_ALPHABET)
        question = problem.prompt.removesuffix("=")
        if task == "add":
            a, b = question.split("+")
            assert len(a) == len(b) == 5 and len(problem.label) == 6
            assert int(problem.label) == int(a) + int(b)
        else:
            assert len(question) == 5 and question.isdigit()
            expected = {"reverse": question[::-1], "copy": question, "sort": "".join(sorted(question))}[task]
            assert problem.label == expected


def test_task_examples():
    assert generate_problems("reverse", 6, 1, seed=0)[0].label == generate_problems("copy", 6, 1, 0)[0].label[::-1]
    add = generate_problems("add", 2, 200, seed=1)
    assert any(p.label.startswith("1") for p in add)  # a carry out of the top digit happens


def test_builtin_dataset_is_seeded_and_sampled_with_replacement():
    cfg = DataConfig(task="reverse", length=4, num_prompts=10, seed=7)
    first, second = build_dataset(cfg), build_dataset(cfg)
    assert len(first) == 10 and first.problems == second.problems
    draw = first.draw(0, 50, random.Random(0))
    assert len(draw) == 50 and set(draw) <= set(range(10))
    assert draw == second.draw(0, 50, random.Random(0))
    assert build_dataset(cfg.model_copy(update={"seed": 8})).problems != first.problems


def test_dataset_needs_a_task_or_a_path():
    with pytest.raises(ConfigurationError, match="data.task .* or data.path"):
        build_dataset(DataConfig(task=None))


# -- JSONL -----------------------------------------------------------------------------------------


def write(tmp_path, *lines: str):
    path = tmp_path / "problems.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_jsonl_with_custom_keys(tmp_path):
    path = write(tmp_path, json.dumps({"question": "1+1?", "answer": 2}), "", json.dumps({"question": "hi", "answer": "x"}))
    dataset = build_dataset(DataConfig(path=path, prompt_key="question", label_key="answer"))
    assert dataset.problems == [Problem("1+1?", "2"), Problem("hi", "x")]


@pytest.mark.parametrize("lines, message", [
    ((), "holds no records"),
    (("", "  "), "holds no records"),
    (('{"prompt": "a", "label": "b"}', '{"prompt": "a",'), r"problems.jsonl:2: invalid JSON"),
    (('{"prompt": "a", "label": "b"}', "", '{"prompt": "a"}'), r":3: no key 'label' \(data.label_key\); the line has: prompt"),
    (('{"text": "a", "label": "b"}',), r":1: no key 'prompt' \(data.prompt_key\)"),
    (('["a", "b"]',), ":1: expected a JSON object, got list"),
    (('{"prompt": 3, "label": "b"}',), ":1: 'prompt' must be a string"),
], ids=["empty", "blank", "bad-json", "no-label", "no-prompt", "not-object", "prompt-not-str"])
def test_bad_jsonl(tmp_path, lines, message):
    path = tmp_path / "problems.jsonl"
    path.write_text("\n".join(lines))
    with pytest.raises(ConfigurationError, match=message) as info:
        build_dataset(DataConfig(path=str(path)))
    assert str(info.value).startswith("data.path: ") and "\n" not in str(info.value)


def test_missing_path_and_directory(tmp_path):
    with pytest.raises(ConfigurationError, match="nope.jsonl does not exist"):
        build_dataset(DataConfig(path=str(tmp_path / "nope.jsonl")))
    with pytest.raises(ConfigurationError, match="is a directory"):
        build_dataset(DataConfig(path=str(tmp_path)))


# -- rewards ---------------------------------------------------------------------------------------


def test_exact_and_partial_match():
    assert exact_match(" 123 ", "123") == 1.0 and exact_match("1234", "123") == 0.0
    assert partial_match("654321", "654321") == 1.0
    assert partial_match("654021", "654321") == pytest.approx(5 / 6)
    assert partial_match("6543", "654321") == pytest.approx(4 / 6)
    assert partial_match("65432100", "654321") == pytest.approx(6 / 8)
    assert partial_match("", "12") == 0.0 and partial_match("", "") == 1.0


@pytest.mark.parametrize("text, boxed", [
    (r"so \boxed{42}.", "42"),
    (r"\boxed{1} then \boxed{2}", "2"),
    (r"\boxed{\frac{1}{2}}", r"\frac{1}{2}"),
    (r"\boxed{\{a, b\}}", r"\{a, b\}"),
    (r"\boxed{7} and a cut-off \boxed{\frac{1", "7"),
    (r"\boxed {x}", "x"),
    ("no answer", None),
])
def test_last_boxed(text, boxed):
    assert last_boxed(text) == boxed


@pytest.mark.parametrize("completion, label, reward", [
    (r"The answer is \boxed{0.50}", ".5", 1.0),
    (r"\boxed{\frac{1}{2}}", "1/2", 1.0),
    (r"\boxed{\dfrac{1}{2}}", "0.5", 1.0),
    (r"\boxed{1/2}", r"\boxed{\frac{1}{2}}", 1.0),
    (r"\boxed{ -3 }", "-3.0", 1.0),
    (r"\boxed{1,000}", "1000", 1.0),
    (r"\boxed{$12$.}", "12", 1.0),
    (r"\boxed{x + 1}", "x+1", 1.0),
    (r"\boxed{\left(1,2\right)}", "(1,2)", 1.0),
    (r"\boxed{0.33}", "1/3", 0.0),
    (r"\boxed{2}", "3", 0.0),
    (r"\boxed{1/0}", "0", 0.0),
    ("42", "42", 0.0),  # no boxed answer, no reward
])
def test_boxed_math(completion, label, reward):
    assert boxed_math(completion, label) == reward


def test_builtin_rewards_by_name():
    assert build_reward(RewardConfig(function="partial_match")).function is partial_match
    with pytest.raises(ConfigurationError, match="unknown reward 'exact'; use one of exact_match"):
        build_reward(RewardConfig(function="exact"))


@pytest.fixture
def reward_module(user_modules):
    user_modules("my_rewards",
        "def length_bonus(completion, label):\n    return len(completion) / 10\n"
        "def one_arg(completion):\n    return 0.0\n"
        "NOT_CALLABLE = 3\n"
    )
    user_modules("broken_rewards", "import does_not_exist_anywhere\n")


def test_custom_reward_imports(reward_module):
    from fasync.data.rewards import RewardInput

    reward = build_reward(RewardConfig(function="my_rewards:length_bonus"))
    assert reward(RewardInput("abcde", Problem("p", ""))) == 0.5


@pytest.mark.parametrize("spec, message", [
    ("nowhere_module_xyz:f", "cannot import module 'nowhere_module_xyz'"),
    ("broken_rewards:f", "cannot import module 'broken_rewards' .*does_not_exist_anywhere"),
    ("my_rewards:missing", "module 'my_rewards' has no attribute 'missing'"),
    ("my_rewards:NOT_CALLABLE", "my_rewards:NOT_CALLABLE is a int, not a function"),
    ("my_rewards:one_arg", r"my_rewards:one_arg must accept \(completion, label\)"),
    ("my_rewards:", "is not of the form module:function"),
])
def test_custom_reward_errors(reward_module, spec, message):
    with pytest.raises(ConfigurationError, match=message) as info:
        build_reward(RewardConfig(function=spec))
    assert str(info.value).startswith("reward.function: ")


def test_data_and_rewards_do_not_import_torch():
    import subprocess

    code = "import sys, fasync.data, fasync.model.tokenizer; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# -- bad data, caught in the driver before Ray starts (issue 19 §3) ---------------------------------


def test_text_that_is_not_utf8_names_the_file_line_and_byte(tmp_path):
    path = tmp_path / "problems.jsonl"
    path.write_bytes(b'{"prompt": "ok", "label": "1"}\n{"prompt": "caf\xe9", "label": "2"}\n')
    with pytest.raises(ConfigurationError, match=r"problems.jsonl:2: not UTF-8 text \(byte 0xe9 at column 16\)"):
        build_dataset(DataConfig(path=str(path)))


def test_a_utf8_byte_order_mark_is_accepted(tmp_path):
    path = tmp_path / "problems.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"prompt": "a", "label": "b"}\n')
    assert build_dataset(DataConfig(path=str(path))).problems == [Problem("a", "b")]


def test_a_50_mb_line_is_refused_before_it_is_parsed(tmp_path, monkeypatch):
    import fasync.data.datasets as datasets

    path = tmp_path / "problems.jsonl"
    with path.open("w") as out:
        out.write('{"prompt": "a", "label": "b"}\n')
        out.write('{"prompt": "' + "x" * (50 << 20) + '", "label": "b"}\n')
    parsed, loads = [], json.loads
    monkeypatch.setattr(datasets.json, "loads", lambda text: parsed.append(len(text)) or loads(text))
    with pytest.raises(ConfigurationError, match=r"problems.jsonl:2: the line is longer than 4 MiB") as info:
        build_dataset(DataConfig(path=str(path)))
    assert len(parsed) == 1 and "\n" not in str(info.value)


def test_characters_outside_the_embedded_alphabet_are_found_with_their_line(tmp_path):
    from fasync.config.schema import FasyncConfig
    from fasync.launch.plan import resolve
    from fasync.rollout.groups import build_factory

    path = write(tmp_path, json.dumps({"prompt": "2+2=", "label": "4"}), json.dumps({"prompt": "2×2=", "label": "4"}))
    cfg = FasyncConfig.model_validate({"data": {"path": path}})
    with pytest.raises(ConfigurationError, match=r"problems.jsonl:2: character '×' \(U\+00D7, character 2 of the "
                       r"text\) is not in the embedded tokenizer's alphabet.*`model.path`"):
        build_factory(resolve(cfg))


def test_a_prompt_longer_than_the_context_is_refused_with_its_line(tmp_path):
    from fasync.config.schema import FasyncConfig
    from fasync.launch.plan import resolve
    from fasync.rollout.groups import build_factory

    path = write(tmp_path, json.dumps({"prompt": "short", "label": "x"}), json.dumps({"prompt": "y" * 63, "label": "x"}))
    cfg = FasyncConfig.model_validate({"data": {"path": path}, "model": {"max_seq_len": 64}})
    with pytest.raises(ConfigurationError, match=r"problems.jsonl:2: the prompt is 64 tokens, but the model's "
                       r"context is 64 tokens"):
        build_factory(resolve(cfg))
    fits = FasyncConfig.model_validate({"data": {"path": path}, "model": {"max_seq_len": 65}})
    assert len(build_factory(resolve(fits)).dataset) == 2


def test_a_builtin_task_that_fills_the_context_is_refused_too():
    from fasync.config.schema import FasyncConfig
    from fasync.launch.plan import resolve
    from fasync.rollout.groups import build_factory

    cfg = FasyncConfig.model_validate({"data": {"task": "reverse", "length": 8}, "model": {"max_seq_len": 10}})
    with pytest.raises(ConfigurationError, match=r"data.task: task reverse \(length 8\), prompt 0: the prompt is "
                       "10 tokens"):
        build_factory(resolve(cfg))


# -- every reward is a finite number (issue 19 §4) -------------------------------------------------


@pytest.fixture
def odd_rewards(user_modules):
    user_modules("odd_rewards",
        "def nan(completion, label):\n    return float('nan')\n"
        "def inf(completion, label):\n    return float('-inf')\n"
        "def text(completion, label):\n    return '1.0'\n"
        "def none(completion, label):\n    return None\n"
        "def flag(completion, label):\n    return completion == label\n"
    )


def scored(function: str, path: str | None = None):
    """A group of two completions, generated by hand, scored by `function`."""
    from fasync.config.schema import FasyncConfig
    from fasync.launch.plan import resolve
    from fasync.rollout.groups import build_factory

    data = {"path": path, "task": None} if path else {"task": "reverse", "length": 3, "num_prompts": 5}
    cfg = FasyncConfig.model_validate({"data": data, "reward": {"function": function},
                                       "rollout": {"n_samples_per_prompt": 2}})
    factory = build_factory(resolve(cfg))
    group = factory.new_groups(1)[0]
    for request, text in zip(group.requests, ["12", "21"]):
        request.output_ids = factory.tokenizer.encode(text)
        request.finish_reason = "stop"
    return factory.score(group)


@pytest.mark.parametrize("function, shown", [
    ("odd_rewards:nan", "nan (float)"),
    ("odd_rewards:inf", "-inf (float)"),
    ("odd_rewards:text", "'1.0' (str)"),
    ("odd_rewards:none", "None (NoneType)"),
])
def test_a_reward_that_is_not_a_finite_number_is_one_clear_error(odd_rewards, function, shown):
    with pytest.raises(ConfigurationError) as info:
        scored(function)
    message = str(info.value)
    assert message.startswith(f"reward.function: {function} returned {shown} for prompt ")
    assert re.search(r"for prompt \d+ \(task reverse \(length 3\)\), completion '\d+'", message), message
    assert "finite" in message and "\n" not in message


def test_a_bad_reward_names_the_dataset_line(odd_rewards, tmp_path):
    path = write(tmp_path, json.dumps({"prompt": "1+1=", "label": "2"}))
    with pytest.raises(ConfigurationError, match=r"for prompt 0 \(.*problems.jsonl:1\)"):
        scored("odd_rewards:nan", path)


def test_numbers_of_any_kind_are_rewards(odd_rewards):
    assert [s.reward for s in scored("odd_rewards:flag").samples] == [0.0, 0.0]
    assert all(type(s.reward) is float for s in scored("exact_match").samples)


def test_advantages_refuse_a_non_finite_reward_by_name():
    from fasync.train.advantages import compute_advantages

    # statistics.pstdev raised AttributeError: 'float' object has no attribute 'numerator' here.
    for normalize in (True, False):
        with pytest.raises(ValueError, match="reward nan is not a finite number"):
            compute_advantages([1.0, float("nan")], [0, 0], "grpo", normalize)


@pytest.mark.parametrize("line, message", [
    ('{"prompt": ' + "[" * 100_000 + "]" * 100_000 + ', "label": "1"}', ":1: the JSON is nested too deeply to read"),
    ('{"prompt": "a", "label": null}', ":1: 'label' is null, but a label must be a string"),
    ('{"prompt": "a", "label": true}', ":1: 'label' is true, but a label must be a string"),
    ('{"prompt": "a", "label": ["b"]}', r':1: \'label\' is \["b"\], but a label must be a string'),
], ids=["deeply-nested", "label-null", "label-bool", "label-list"])
def test_records_fasync_cannot_train_on_are_refused_with_their_line(tmp_path, line, message):
    path = tmp_path / "problems.jsonl"
    path.write_text(line + "\n")
    with pytest.raises(ConfigurationError, match=message) as info:
        build_dataset(DataConfig(path=str(path)))
    assert str(info.value).startswith(f"data.path: {path}:1: ") and "\n" not in str(info.value)


@pytest.fixture
def failing_rewards(user_modules):
    user_modules("failing_rewards",
        "def huge(completion, label):\n    return 1e308\n"
        "def raises(completion, label):\n    return int(completion) / 0\n"
        "def interrupts(completion, label):\n    raise KeyboardInterrupt\n"
    )


@pytest.mark.parametrize("function, said", [
    ("failing_rewards:huge", r"returned 1e\+308 \(float\) for prompt \d+ \(task reverse \(length 3\)\), completion "
     r"'12'; every reward must be a finite int or float of at most 1e\+30 in magnitude: scale the reward down"),
    ("failing_rewards:raises", r"raised ZeroDivisionError: division by zero \(at failing_rewards.py:4\) for prompt "
     r"\d+ \(task reverse \(length 3\)\), completion '12'; a reward must return a number for every completion"),
    ("failing_rewards:interrupts", r"raised KeyboardInterrupt \(at failing_rewards.py:6\) for prompt \d+ \(task "
     r"reverse \(length 3\)\), completion '12'; a reward must return a number, not stop the run"),
], ids=["overflowing", "raising", "keyboard-interrupt"])
def test_a_reward_that_fails_is_one_error_naming_the_function_and_the_prompt(failing_rewards, function, said):
    # 1e308 overflowed the group mean in the trainer (OverflowError in fsum); a KeyboardInterrupt from the
    # reward read as Ctrl-C (exit 130); an exception named neither the reward nor the prompt.
    with pytest.raises(ConfigurationError) as info:
        scored(function)
    assert re.fullmatch(f"reward.function: {function} {said}.*", str(info.value)), str(info.value)
    assert "\n" not in str(info.value)


def test_a_stop_signal_during_the_reward_still_stops_the_run():
    from fasync.data.rewards import Reward, score
    from fasync.launch.signals import Stop

    def stopped(completion, label):
        raise Stop(2)  # what the driver's SIGINT handler raises wherever the run is

    with pytest.raises(Stop):
        score(Reward.of(stopped, "m:stopped"), "m:stopped", RewardInput("12", Problem("p", "21")), "prompt 0")


def test_a_module_reward_is_looked_for_after_the_standard_library_and_travels_with_its_directories(tmp_path):
    # Issue 32 §5.7: the working directory and the config's went first on PYTHONPATH, so that any module beside
    # the config (a sitecustomize.py, a json.py) ran in every process of the run, built-in reward or not.
    import os
    import pickle
    from importlib.machinery import PathFinder

    (tmp_path / "beside_config.py").write_text("def score(completion, label):\n    return 1.0\n")
    (tmp_path / "json.py").write_text("raise RuntimeError('a module beside the config shadowed the stdlib')\n")
    before, pythonpath = list(sys.path), os.environ.get("PYTHONPATH")
    try:
        assert build_reward(RewardConfig(function="partial_match"), (str(tmp_path),)).function is partial_match
        assert sys.path == before  # a built-in reward needs no directory
        reward = build_reward(RewardConfig(function="beside_config:score"), (str(tmp_path),))
        assert reward(RewardInput("a", Problem("p", "b"))) == 1.0
        assert sys.path == [*before, str(tmp_path)]  # after the standard library and site-packages
        # The standard library's json is found first, not the one beside the config.
        assert Path(PathFinder.find_spec("json").origin).parent != tmp_path

        sys.path[:] = before
        sys.modules.pop("beside_config")
        copy = pickle.loads(pickle.dumps(reward))  # as an actor receives it: imported anew from its directories
        assert copy.function is not reward.function and copy(RewardInput("a", Problem("p", "b"))) == 1.0
        assert os.environ.get("PYTHONPATH") == pythonpath
    finally:
        sys.path[:] = before
        sys.modules.pop("beside_config", None)
