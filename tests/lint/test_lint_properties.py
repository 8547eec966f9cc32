"""Properties of the linter as a whole: the defaults are clean, a default never turns the user's own settings
into an error, and applying a suggested fix adds no warning."""

import re

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from fasync.config.loader import load_config
from fasync.diagnostics import Severity
from fasync.lint.engine import lint

MODES = ("sync", "async", "fully_async")
GEOMETRY = {
    "rollout.batch_size": st.integers(1, 64),
    "rollout.n_samples_per_prompt": st.integers(2, 16),
    "train.global_batch_size": st.integers(1, 1024),
    "train.micro_batch_size": st.integers(1, 512),
    "train.num_steps_per_rollout": st.integers(1, 16),
    "train.use_dynamic_global_batch_size": st.booleans(),
    "resources.trainer_ranks": st.integers(1, 8),
}
_KEY = re.compile(r"`([a-z_]+\.[a-z_]+)`")


def nested(flat: dict) -> dict:
    out: dict = {}
    for key, value in flat.items():
        section, name = key.split(".")
        out.setdefault(section, {})[name] = value
    return out


def diagnostics(tmp_path, data: dict):
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    result = load_config(path)
    assert result.config is not None, [d.message for d in result.diagnostics]
    return lint(result)


@pytest.mark.parametrize("mode", MODES)
def test_a_mode_alone_is_clean_under_strict(mode, tmp_path):
    assert diagnostics(tmp_path, {"mode": mode}) == []


@settings(max_examples=150, deadline=None)  # each example loads and lints a config: no per-example timing
@given(mode=st.sampled_from(MODES), key=st.sampled_from(sorted(GEOMETRY)), data=st.data())
def test_one_geometry_change_never_errs_about_a_key_the_user_did_not_set(tmp_path_factory, mode, key, data):
    value = data.draw(GEOMETRY[key], label=key)
    found = diagnostics(tmp_path_factory.mktemp("one"), {"mode": mode, **nested({key: value})})
    for d in found:
        if d.severity is Severity.ERROR:
            assert d.key == key, (d.code, d.message)
            assert set(_KEY.findall(d.message)) <= {key}, (d.code, d.message)


_FIX = re.compile(r"(set|remove) `([a-z_.]+)(?:: ([^`]+))?`")


def apply_help(data: dict, help_text: str) -> list[dict]:
    """Each alternative of a help text ("set `k: v` and remove `k2` (...); or ..."), applied to the config."""
    edited = []
    for alternative in help_text.split("; or "):
        copy = yaml.safe_load(yaml.safe_dump(data))
        for verb, key, value in _FIX.findall(alternative.split(" (")[0]):
            section, name = key.split(".")
            if verb == "remove":
                copy.get(section, {}).pop(name, None)
            else:
                copy.setdefault(section, {})[name] = yaml.safe_load(value)
        edited.append(copy)
    return edited


def _failing(found) -> set:
    return {(d.code, d.key) for d in found if d.severity is not Severity.INFO}


@settings(max_examples=120, deadline=None)
@given(mode=st.sampled_from(["async", "fully_async"]), prompts=st.integers(1, 32), n=st.integers(2, 8),
       divisor=st.integers(2, 8), bound=st.sampled_from([None, 0, 1, 2]),
       extra=st.dictionaries(st.sampled_from(["train.micro_batch_size", "resources.trainer_ranks",
                                              "resources.num_rollout_engines", "train.num_steps_per_rollout"]),
                             st.integers(1, 8), max_size=2))
def test_applying_a_suggested_fix_adds_no_warning(tmp_path_factory, mode, prompts, n, divisor, bound, extra):
    samples = prompts * n
    data = {"mode": mode, "async": {"max_weight_staleness": bound}, "correction": {"level": "token"},
            "rollout": {"batch_size": prompts, "n_samples_per_prompt": n},
            "train": {"global_batch_size": max(samples // divisor, 1)}}
    for key, value in nested(extra).items():
        data.setdefault(key, {}).update(value)
    folder = tmp_path_factory.mktemp("fix")
    before = diagnostics(folder, data)
    for d in (d for d in before if d.code == "S001" and "set `" in d.help):
        for fixed in apply_help(data, d.help):
            after = diagnostics(folder, fixed)
            assert "S001" not in {x.code for x in after}, (d.help, fixed)
            assert _failing(after) <= _failing(before), (d.help, fixed, [x.message for x in after])
