"""What the rollout tests share: the agentic examples (examples/agentic/) importable by their module names."""

import pytest
from paths import REPO

AGENTIC_EXAMPLES = REPO / "examples" / "agentic"


@pytest.fixture
def agentic_examples(monkeypatch):
    """The examples' directory on `sys.path` for one test, as `fasync train` makes a config's directory importable.
    The session's Ray workers started without it: a rollouter actor finds the environment through the directory
    its runner carries (`AgentRunner`)."""
    monkeypatch.syspath_prepend(str(AGENTIC_EXAMPLES))
    return AGENTIC_EXAMPLES
