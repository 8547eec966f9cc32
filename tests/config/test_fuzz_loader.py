"""Property: whatever the YAML, loading and linting end in a config or diagnostics, never an exception."""

import math

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fasync.config.loader import load_config
from fasync.lint.engine import catalogue, lint
from fasync.lint.formats import FORMATS, render

FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

VALID = {
    "mode": "fully_async",
    "rollout": {"batch_size": 8, "n_samples_per_prompt": 4, "temperature": 1.0},
    "train": {"global_batch_size": 32, "micro_batch_size": 16, "lr": 1e-3},
    "async": {"max_weight_staleness": 1, "partial_rollout": True},
    "correction": {"level": "token", "reject_token_ratio": [0.5, 2.0]},
    "lint": {"ignore": ["W101"]},
}

weird_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(min_value=10**18, max_value=10**40),
    st.floats(allow_nan=True, allow_infinity=True), weird_text,
    st.sampled_from(["${train.lr}", "${oc.env:NO_SUCH_VAR}", "${oc.env:HOME,1}", "${", "???", "${a.b.c}",
                     "1e-3", "yes", "~", "sync", "token", "-1", "0x10", "2020-01-01"]),
)
trees = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(weird_text | st.sampled_from(["lr", "train", "async"]), inner,
                                                 max_size=4)), max_leaves=12)
paths = st.lists(st.sampled_from(["mode", "rollout", "train", "async", "correction", "lint", "batch_size",
                                  "lr", "level", "ignore", "reject_token_ratio", "extends", "staleness_threshold",
                                  "n", "0", "<<"]), min_size=1, max_size=3)


def _mutate(tree: dict, path: list, value, delete: bool) -> dict:
    node = tree
    for key in path[:-1]:
        child = node.get(key)
        if not isinstance(child, dict):
            child = node[key] = {}
        node = child
    if delete:
        node.pop(path[-1], None)
    else:
        node[path[-1]] = value
    return tree


def _check_outcome(result) -> None:
    diagnostics = lint(result)
    known = set(catalogue())
    for d in diagnostics:
        assert d.code in known and d.code != "F000", d  # F000: a rule crashed, which is a bug
        assert d.location is not None and d.location.line >= 1 and d.location.column >= 1
    if result.config is None:
        assert any(d.severity.value == "error" for d in result.diagnostics)
    for fmt in FORMATS:
        render(diagnostics, fmt, files=1)


@pytest.fixture(scope="module")
def config_file(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz") / "config.yaml"


@FUZZ
@given(tokens=st.lists(st.sampled_from(list("abc:-[]{}&*!|>'\"#%@`,?\t\n 01.$") + ["lr", "train", "<<", "!!int ",
                                                                                  "extends: "]), max_size=40))
def test_random_yaml_text(config_file, tokens):
    config_file.write_text("".join(tokens), encoding="utf-8")
    _check_outcome(load_config(config_file))


@FUZZ
@given(mutations=st.lists(st.tuples(paths, trees, st.booleans()), max_size=4),
       share=st.booleans(), overrides=st.lists(st.sampled_from(
           ["train.lr=2e-3", "train.lr=", "=1", "a..b=1", "rollout.batch_size=[1", "async=null", "mode=async",
            "train.micro_batch_size=1e400", "lint.ignore=[F]"]), max_size=2))
def test_mutated_config_trees(config_file, mutations, share, overrides):
    tree = yaml.safe_load(yaml.safe_dump(VALID))
    for path, value, delete in mutations:
        _mutate(tree, path, value, delete)
    if share:  # the same object twice: yaml.dump writes an anchor and an alias
        tree["shared"] = tree["rollout"] = tree.get("rollout") if isinstance(tree.get("rollout"), dict) else {}
    config_file.write_text(yaml.dump(tree, allow_unicode=True), encoding="utf-8")
    _check_outcome(load_config(config_file, overrides))


@FUZZ
@given(edits=st.lists(st.tuples(st.integers(min_value=0, max_value=400), st.sampled_from(
    ["\t", " ", "\n", ":", "- ", "&a ", "*a", "<<: *a\n", "{", "]", "'", "\x00", "é", "\ufeff", "9" * 30])),
    max_size=5), cut=st.integers(min_value=0, max_value=400))
def test_mutated_yaml_text(config_file, edits, cut):
    text = yaml.safe_dump(VALID)
    for position, insert in edits:
        text = text[:position] + insert + text[position:]
    config_file.write_text(text[: max(cut, len(text) // 2)], encoding="utf-8")
    _check_outcome(load_config(config_file))


def test_the_valid_base_is_valid(config_file):
    config_file.write_text(yaml.safe_dump(VALID))
    result = load_config(config_file)
    assert result.diagnostics == [] and math.isclose(result.config.train.lr, 1e-3)
