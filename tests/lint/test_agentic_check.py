"""`fasync check --preflight` on agentic configs: the rollout function or environment must import from where
`fasync train` looks for it (E008), found beside the config as a reward module is."""

import json

from paths import REPO

from fasync import preflight
from fasync.config.loader import load_config


def rollout_findings(tmp_path, rollout: str):
    path = tmp_path / "run.yaml"
    path.write_text(f"rollout:\n  max_turns: 2\n  {rollout}\n")
    return preflight._rollout_module(load_config(path, []))


def test_an_environment_beside_the_config_imports(tmp_path):
    (tmp_path / "my_env.py").write_text("class Env:\n    async def reset(self, task): ...\n"
                                        "    async def step(self, text): ...\n")
    assert rollout_findings(tmp_path, "env: my_env:Env") == []


def test_a_module_that_is_missing_or_fails_to_import_is_named_at_its_key(tmp_path):
    (found,) = rollout_findings(tmp_path, "function: nowhere:rollout")
    assert (found.code, found.key, found.location.line) == ("E008", "rollout.function", 3)
    assert "cannot import module 'nowhere'" in found.message
    (tmp_path / "broken.py").write_text("raise RuntimeError('no GPU here')\n")
    (found,) = rollout_findings(tmp_path, "env: broken:Env")
    assert "RuntimeError: no GPU here" in found.message


def test_a_missing_attribute_is_named(tmp_path):
    (tmp_path / "my_env.py").write_text("X = 1\n")
    (found,) = rollout_findings(tmp_path, "env: my_env:Env")
    assert "has no attribute 'Env'" in found.message


def test_the_example_configs_check_clean():

    from fasync.lint.engine import lint

    for path in sorted((REPO / "examples" / "agentic").glob("*.yaml")):
        assert [d.message for d in lint(load_config(path, []))] == [], path


def t003(tmp_path, template) -> list:
    from fasync.lint.engine import lint

    model = tmp_path / "model"
    model.mkdir()
    (model / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
    path = tmp_path / "run.yaml"
    path.write_text(f"model:\n  path: {model}\nrollout:\n  env: my_env:Env\n")
    return [d for d in lint(load_config(path, [])) if d.code == "T003"]


def test_a_template_that_writes_calls_in_another_format_than_the_parser_reads_is_reported_at_the_parser(tmp_path):
    llama = ("{% for m in messages %}{% if m.role == 'tool' or m.role == 'ipython' %}<|start_header_id|>ipython"
             "{% elif m.tool_calls %}<|python_tag|>{{ m.tool_calls[0].function | tojson }}{% endif %}{% endfor %}")
    (found,) = t003(tmp_path, llama)
    assert found.key == "rollout.tool_parser" and "without `<tool_call>`" in found.message


def test_named_templates_are_read_tool_use_first_and_a_hermes_template_is_clean(tmp_path):
    hermes = "{% for m in messages %}{% if m.role == \"tool\" %}<tool_response>{% endif %}<tool_call>{% endfor %}"
    assert t003(tmp_path, [{"name": "default", "template": "{{ messages }}"}, {"name": "tool_use", "template": hermes}]) == []
