"""A plain Hugging Face tokenizer file read without transformers (`PlainTokenizerFile`) is the tokenizer
`AutoTokenizer` serves for it, and the driver's side of a run then imports neither transformers nor torch."""

import json
import subprocess
import sys

import pytest
from paths import REPO
from tiny_models import write_tiny_llama

from fasync.config.schema import FasyncConfig
from fasync.model.tokenizer import HFTokenizer, PlainTokenizerFile, PromptStyle, build_tokenizer

transformers = pytest.importorskip("transformers")

TEXTS = ["", "12+3=", "what is 12+3?", "<s>12</s>", "<eot> a", "  two  spaces ", "ABC", "é", "<pad><unk>"]


@pytest.fixture(scope="module")
def plain_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("plain-llama")
    write_tiny_llama(directory, chat_template=None)
    return directory


def test_a_plain_tokenizer_file_is_what_auto_tokenizer_serves(plain_dir):
    plain = PlainTokenizerFile.load(plain_dir)
    auto = transformers.AutoTokenizer.from_pretrained(plain_dir, local_files_only=True)
    assert plain is not None
    assert (plain.eos_token_id, plain.pad_token_id, len(plain)) == (auto.eos_token_id, auto.pad_token_id, len(auto))
    for text in TEXTS:
        for special in (False, True):
            ids = auto.encode(text, add_special_tokens=special)
            assert plain.encode(text, add_special_tokens=special) == ids, (text, special)
            for skip in (False, True):
                assert plain.decode(ids, skip_special_tokens=skip) == auto.decode(ids, skip_special_tokens=skip)


def test_an_export_saves_the_plain_file_as_transformers_saves_it(plain_dir, tmp_path):
    PlainTokenizerFile.load(plain_dir).save_pretrained(tmp_path)
    saved = transformers.AutoTokenizer.from_pretrained(tmp_path, local_files_only=True)
    assert saved.encode("12+3=", add_special_tokens=True) == PlainTokenizerFile.load(plain_dir).encode("12+3=")


def test_hf_tokenizer_reads_a_plain_file_the_same_either_way(plain_dir, monkeypatch):
    style = PromptStyle(system_prompt="sys")
    fast = HFTokenizer(str(plain_dir), style)
    assert isinstance(fast.hf, PlainTokenizerFile)
    monkeypatch.setattr(PlainTokenizerFile, "load", classmethod(lambda cls, directory: None))
    auto = HFTokenizer(str(plain_dir), style)
    assert not isinstance(auto.hf, PlainTokenizerFile)
    for name in ("eos_id", "pad_id", "vocab_size", "stop_token_ids", "templated"):
        assert getattr(fast, name) == getattr(auto, name), name
    for prompt in ("12+3", [{"role": "user", "content": "what is 1+1?"}]):
        assert fast.format_prompt(prompt) == auto.format_prompt(prompt)
        assert fast.prompt_text(prompt) == auto.prompt_text(prompt)


def test_a_tokenizer_transformers_may_rebuild_goes_through_auto_tokenizer(tmp_path):
    # With a chat template, a model type whose class transformers 5 picks itself, a BOS added by
    # post-processing, or a legacy special-tokens file, the file alone is not provably the tokenizer.
    cases = {
        "template": lambda d: write_tiny_llama(d),
        "model type": lambda d: _edit(d / "config.json", model_type="qwen2"),
        "add_bos_token": lambda d: _edit(d / "tokenizer_config.json", add_bos_token=True),
        "special tokens map": lambda d: (d / "special_tokens_map.json").write_text("{}"),
        "class": lambda d: _edit(d / "tokenizer_config.json", tokenizer_class="LlamaTokenizer"),
    }
    for name, change in cases.items():
        directory = tmp_path / name.replace(" ", "_")
        directory.mkdir()
        write_tiny_llama(directory, chat_template=None)
        assert PlainTokenizerFile.load(directory) is not None
        change(directory)
        assert PlainTokenizerFile.load(directory) is None, name


def _edit(path, **keys):
    path.write_text(json.dumps({**json.loads(path.read_text()), **keys}))


@pytest.mark.parametrize("with_path", [False, True], ids=["embedded model", "plain tokenizer file"])
def test_the_drivers_data_side_imports_neither_transformers_nor_torch(plain_dir, with_path):
    # Start-up (issue 31 §5): the driver builds the prompts and their tokenizer while Ray starts; importing
    # transformers (and with it torch) there cost about 2.8 s and 0.3 GiB.
    overrides = [f"model.path={plain_dir}"] if with_path else []
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from fasync.commands.train import build_data, load_and_lint\n"
        "from fasync.launch.plan import resolve\n"
        f"cfg, raw, model, failed = load_and_lint('configs/quickstart.yaml', {overrides!r})\n"
        "assert failed is None\n"
        "factory, _ = build_data(resolve(cfg, model), Path('configs'))\n"
        "factory.new_groups(2)\n"
        "print(sorted(name for name in ('transformers', 'torch') if name in sys.modules))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120,
                            env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[]"


def test_build_tokenizer_takes_the_plain_file_for_a_model_path(plain_dir):
    cfg = FasyncConfig.model_validate({"model": {"path": str(plain_dir)}})
    assert isinstance(build_tokenizer(cfg.model, cfg.data).hf, PlainTokenizerFile)
