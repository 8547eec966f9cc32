"""The generated docs match the schema and the rule registry."""

import pytest

from fasync.docs import generated_files


@pytest.mark.parametrize("path, text", list(generated_files().items()), ids=lambda v: getattr(v, "name", ""))
def test_generated_docs_are_fresh(path, text):
    committed = path.read_text(encoding="utf-8") if path.exists() else ""
    assert committed == text, f"{path.name} is stale: run `python -m fasync.docs` and commit the result"


def test_config_reference_covers_every_key():
    from fasync.config.fields import leaf_paths
    from fasync.config.provenance import format_key
    from fasync.docs import render_config_md

    text = render_config_md()
    for path in leaf_paths():
        assert f"| `{format_key(path)}` |" in text


def test_rules_reference_covers_every_code():
    from fasync.docs import render_rules_md
    from fasync.lint.engine import catalogue

    text = render_rules_md()
    for code, entry in catalogue().items():
        assert f"## {code} `{entry.name}` ({entry.severity.value})" in text
