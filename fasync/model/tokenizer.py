"""Tokenizers behind one small interface: the embedded character tokenizer and Hugging Face ones.

Both turn a prompt (text, or chat messages) into the ids the model is fed (`format_prompt`) and name
the ids that end a completion (`stop_token_ids`). How a prompt is built (`data.system_prompt`,
`data.chat_template`, `data.chat_template_kwargs`) is the tokenizer's `PromptStyle`. No torch here.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, Union

from fasync.config.schema import CHAT_TOKENS, DataConfig, ModelConfig
from fasync.errors import ConfigurationError

TASK_ALPHABET = "0123456789+="
"""Every character a built-in task's prompt or answer uses (fasync.data.tasks): the embedded tokenizer's
characters for a built-in task."""
TEXT_ALPHABET = "".join(chr(code) for code in range(32, 127)) + "\n"
"""Printable ASCII and newline: what the embedded tokenizer covers for a JSONL dataset."""


Prompt = Union[str, list[dict[str, str]]]
"""Text, or `{role, content}` chat messages."""


@dataclass(frozen=True)
class PromptStyle:
    """How prompts become text: the `data` keys that say so."""

    system_prompt: str | None = None
    chat_template: bool = True
    chat_template_kwargs: dict = field(default_factory=dict)

    @classmethod
    def of(cls, data_cfg: DataConfig) -> PromptStyle:
        return cls(data_cfg.system_prompt, data_cfg.chat_template, dict(data_cfg.chat_template_kwargs))

    def messages(self, prompt: Prompt) -> list[dict[str, str]]:
        """The prompt as chat messages, as given, after the configured system prompt unless one leads them."""
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
        if self.system_prompt is not None and (not messages or messages[0]["role"] != "system"):
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        return messages

    def plain_text(self, prompt: Prompt) -> str:
        """The prompt without a chat template: its text, or its messages' contents one per line (a system
        prompt first). A text prompt with no system prompt is exactly itself."""
        return "\n".join(message["content"] for message in self.messages(prompt))


class Tokenizer(Protocol):
    eos_id: int
    pad_id: int
    vocab_size: int
    stop_token_ids: tuple[int, ...]

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...

    def format_prompt(self, prompt: Prompt) -> list[int]: ...

    def prompt_text(self, prompt: Prompt) -> str: ...

    def render_chat(self, messages: list[dict], add_generation_prompt: bool) -> list[int]:
        """`messages` ({"role", "content"}) through the chat template, as ids; with `add_generation_prompt`,
        followed by what opens the assistant's turn."""
        ...


class CharTokenizer:
    """One id per character of `alphabet`, after PAD (0), BOS (1) and EOS (2); with `chat`, the `CHAT_TOKENS` after
    them, one id each, and a chat template (an assistant turn ends with `<|end|>`, which stops generation); then the
    `added_tokens` (`model.added_tokens`), one id each. Text is split at its longest pieces first."""

    pad_id, bos_id, eos_id = 0, 1, 2
    num_special = 3

    def __init__(self, alphabet: str, style: PromptStyle = PromptStyle(), chat: bool = False,
                 added_tokens: tuple[str, ...] = ()):
        self.alphabet = alphabet
        self.style = style
        self._ids = {char: index + self.num_special for index, char in enumerate(alphabet)}
        self.chat_tokens = CHAT_TOKENS if chat else ()
        self.pieces = (*self.chat_tokens, *added_tokens)
        """The tokens that are not one character, in id order."""
        self._special_ids = {token: self.num_special + len(alphabet) + i for i, token in enumerate(self.pieces)}
        longest_first = sorted(self.pieces, key=len, reverse=True)
        self._special_split = re.compile("(" + "|".join(map(re.escape, longest_first)) + ")") if self.pieces else None
        self.vocab_size = self.num_special + len(alphabet) + len(self.pieces)
        self.stop_token_ids = (self.eos_id, self._special_ids["<|end|>"]) if chat else (self.eos_id,)

    def encode(self, text: str) -> list[int]:
        if self._special_split is None:
            return self._encode_chars(text)
        return [token for piece in self._special_split.split(text) if piece
                for token in ([self._special_ids[piece]] if piece in self._special_ids else self._encode_chars(piece))]

    def _encode_chars(self, text: str) -> list[int]:
        try:
            return [self._ids[char] for char in text]
        except KeyError as exc:
            char = exc.args[0]
            raise ValueError(f"character {char!r} (U+{ord(char):04X}, character {text.index(char) + 1} of the text) is not in "
                             "the embedded tokenizer's alphabet") from None

    def decode(self, ids: list[int]) -> str:
        """Text of the ids, skipping PAD, BOS and EOS; a chat token or added token reads as its text, except
        `<|end|>`."""
        first_piece = self.num_special + len(self.alphabet)
        return "".join(self.alphabet[i - self.num_special] if i < first_piece else self.pieces[i - first_piece]
                       for i in ids if i >= self.num_special and i != self._special_ids.get("<|end|>"))

    def prompt_text(self, prompt: Prompt) -> str:
        """The text the prompt's ids spell (after BOS): with `chat`, the chat template's; else the plain text."""
        if self.chat_tokens:
            return self._chat_text(self.style.messages(prompt), add_generation_prompt=True)
        return self.style.plain_text(prompt)

    def format_prompt(self, prompt: Prompt) -> list[int]:
        return [self.bos_id, *self.encode(self.prompt_text(prompt))]

    def render_chat(self, messages: list[dict], add_generation_prompt: bool) -> list[int]:
        if not self.chat_tokens:
            raise ConfigurationError("the embedded tokenizer has no chat template without its chat tokens")
        return [self.bos_id, *self.encode(self._chat_text(messages, add_generation_prompt))]

    @staticmethod
    def _chat_text(messages: list[dict], add_generation_prompt: bool) -> str:
        text = "".join(f"<|{m['role']}|>{m['content']}<|end|>" for m in messages)
        return text + ("<|assistant|>" if add_generation_prompt else "")


def check_model_dir(path: str) -> Path:
    """`path` as a directory holding a Hugging Face config, or a ConfigurationError."""
    directory = Path(path)
    if not directory.exists():
        raise ConfigurationError(f"model.path: {path} does not exist")
    if not (directory / "config.json").is_file():
        raise ConfigurationError(f"model.path: {path} is not a Hugging Face model directory (no config.json)")
    return directory


class HFTokenizer:
    """A local Hugging Face tokenizer; prompts go through its chat template when it has one. `hf` is what
    `AutoTokenizer` loads, or for a plain tokenizer file the same pipeline read without transformers
    (`PlainTokenizerFile`)."""

    def __init__(self, path: str, style: PromptStyle = PromptStyle()):
        self.style = style
        directory = check_model_dir(path)
        self.hf = PlainTokenizerFile.load(directory) or _auto_tokenizer(directory, path)
        if self.hf.eos_token_id is None:
            raise ConfigurationError(f"model.path: the tokenizer in {path} has no EOS token to stop on")
        self.eos_id = self.hf.eos_token_id
        self.pad_id = self.hf.pad_token_id if self.hf.pad_token_id is not None else self.eos_id
        self.vocab_size = len(self.hf)
        self.stop_token_ids = (self.eos_id, *(i for i in _generation_eos_ids(directory) if i != self.eos_id))

    def encode(self, text: str) -> list[int]:
        return self.hf.encode(text, add_special_tokens=False)

    def decode(self, ids: list[int]) -> str:
        return self.hf.decode(ids, skip_special_tokens=True)

    @property
    def templated(self) -> bool:
        return bool(self.hf.chat_template) and self.style.chat_template

    def prompt_text(self, prompt: Prompt) -> str:
        """The exact text the model is fed, special tokens included: the chat template's output, or the plain
        text with the tokenizer's own special tokens (BOS) around it."""
        if self.templated:
            try:
                return self.hf.apply_chat_template(self.style.messages(prompt), tokenize=False,
                                                   add_generation_prompt=True, **self.style.chat_template_kwargs)
            except Exception as exc:  # jinja2's TemplateError, or the template's own raise_exception
                raise ValueError(f"the chat template refused the messages ({type(exc).__name__}: {exc})") from None
        return self.hf.decode(self.hf.encode(self.style.plain_text(prompt), add_special_tokens=True))

    def format_prompt(self, prompt: Prompt) -> list[int]:
        if self.templated:
            return self.encode(self.prompt_text(prompt))
        return self.hf.encode(self.style.plain_text(prompt), add_special_tokens=True)

    def render_chat(self, messages: list[dict], add_generation_prompt: bool) -> list[int]:
        if not self.hf.chat_template:
            raise ConfigurationError("model.path: the tokenizer has no chat template to render a conversation with")
        text = self.hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
        return self.encode(text)


def _auto_tokenizer(directory: Path, path: str):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(directory, local_files_only=True)
    except (OSError, ValueError) as exc:
        raise ConfigurationError(f"model.path: cannot load a tokenizer from {path} ({exc})") from exc


GENERIC_CLASSES = ("PreTrainedTokenizerFast", "TokenizersBackend")
"""The generic fast tokenizer class (transformers 5 names it `TokenizersBackend`): it serves tokenizer.json's
pipeline as the file has it, where a model's own class may rebuild parts of it in code."""
GENERIC_MODEL_TYPES = ("llama",)
"""Model types whose generic tokenizer `AutoTokenizer` loads as the generic class (transformers 4 and 5): for some
others (qwen2, phi3, ...) transformers 5 takes the model's own class whatever tokenizer_config.json names."""
NAMED_SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token")


class PlainTokenizerFile:
    """A Hugging Face tokenizer of the generic fast class, read from its tokenizer.json with the `tokenizers`
    library: the pipeline `AutoTokenizer` would serve for it, without importing transformers and torch (about
    2.8 s and 0.3 GiB in the driver). `load` takes only a directory where that is provably the same tokenizer
    (`_plain_config`); every other goes through `AutoTokenizer`. It answers the part of transformers' tokenizer
    interface that `HFTokenizer` uses, with the same defaults (no truncation, no padding, no clean-up of spaces).
    tests/model/test_tokenizer_file.py compares it with `AutoTokenizer` on such a model."""

    chat_template = None

    def __init__(self, directory: Path, backend, config: dict):
        self.directory = directory
        self.backend = backend
        self.eos_token_id = self._id(config.get("eos_token"))
        self.pad_token_id = self._id(config.get("pad_token"))

    @classmethod
    def load(cls, directory: Path) -> PlainTokenizerFile | None:
        """The tokenizer of `directory` when it is a plain tokenizer file, else None."""
        config = _plain_config(directory)
        if config is None:
            return None
        try:
            from tokenizers import Tokenizer

            backend = Tokenizer.from_file(str(directory / "tokenizer.json"))
        except Exception:  # noqa: BLE001 - not installed, or a file it cannot read: AutoTokenizer says why
            return None
        if not _special_tokens_added(backend, config) or backend.get_vocab_size() > 100_000:
            return None  # transformers would add tokens, or patch a large vocabulary's regex
        backend.no_truncation()
        backend.no_padding()
        return cls(directory, backend, config)

    def _id(self, token) -> int | None:
        content = token.get("content") if isinstance(token, dict) else token
        return self.backend.token_to_id(content) if content is not None else None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return self.backend.decode(ids, skip_special_tokens=skip_special_tokens)

    def __len__(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def save_pretrained(self, directory: Path) -> None:
        """As transformers saves it (an export, where transformers is loaded anyway)."""
        from transformers import AutoTokenizer

        AutoTokenizer.from_pretrained(self.directory, local_files_only=True).save_pretrained(directory)


def _plain_config(directory: Path) -> dict | None:
    """tokenizer_config.json of `directory` when its tokenizer is the generic class over tokenizer.json alone,
    as transformers loads it unchanged: a model type that keeps the named class, no chat template, no remote
    code, no legacy special-tokens file, and none of the keys under which transformers changes the pipeline
    (a BOS or EOS added by post-processing, special tokens split, spaces cleaned up on decoding). Else None."""
    try:
        config = json.loads((directory / "tokenizer_config.json").read_text())
        model_type = json.loads((directory / "config.json").read_text()).get("model_type")
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict) or config.get("tokenizer_class") not in GENERIC_CLASSES \
            or model_type not in GENERIC_MODEL_TYPES or not (directory / "tokenizer.json").is_file():
        return None
    beside = ("special_tokens_map.json", "chat_template.jinja", "chat_template.json", "additional_chat_templates")
    if any((directory / name).exists() for name in beside):
        return None
    changing = ("chat_template", "auto_map", "add_bos_token", "add_eos_token", "split_special_tokens",
                "clean_up_tokenization_spaces")
    if any(config.get(key) for key in changing) or config.get("backend", "tokenizers") != "tokenizers":
        return None
    return config


def _special_tokens_added(backend, config: dict) -> bool:
    """Whether every special token `config` names is already one of the file's special added tokens, as they
    are declared (`added_tokens_decoder`): transformers would add the others, and change how text splits."""
    added = {token.content: (token_id, token) for token_id, token in backend.get_added_tokens_decoder().items()}
    named = [config.get(key) for key in NAMED_SPECIAL_TOKENS]
    extra = config.get("extra_special_tokens") or config.get("additional_special_tokens") or []
    named += list(extra.values()) if isinstance(extra, dict) else extra
    for token in named:
        content = token.get("content") if isinstance(token, dict) else token
        if content is not None and (content not in added or not added[content][1].special):
            return False
    for token_id, declared in (config.get("added_tokens_decoder") or {}).items():
        found = added.get(declared.get("content"))
        if found is None or found[0] != int(token_id) or any(
                getattr(found[1], key) != declared.get(key, getattr(found[1], key))
                for key in ("special", "lstrip", "rstrip", "normalized", "single_word")):
            return False
    return True


def _generation_eos_ids(directory: Path) -> tuple[int, ...]:
    """Extra end-of-turn ids a chat model's generation config stops on (e.g. `<|eot_id|>`)."""
    config = directory / "generation_config.json"
    if not config.is_file():
        return ()
    eos = json.loads(config.read_text()).get("eos_token_id")
    if eos is None:
        return ()
    return tuple(eos) if isinstance(eos, list) else (eos,)


def build_tokenizer(model_cfg: ModelConfig, data_cfg: DataConfig, chat: bool = False) -> Tokenizer:
    """The tokenizer of `model.path`, or the embedded one sized to what the data needs:
    the digit alphabet for a built-in task (a small vocabulary learns fast), printable text for a file or a
    system prompt; with `chat` (agentic rollouts: `RolloutConfig.agentic`), the embedded one covers printable text
    (tool calls are JSON, environments speak words) and has its chat tokens too; then `model.added_tokens`."""
    style = PromptStyle.of(data_cfg)
    if model_cfg.path is not None:
        return HFTokenizer(model_cfg.path, style)
    text = data_cfg.path is not None or data_cfg.system_prompt is not None or chat
    return CharTokenizer(TEXT_ALPHABET if text else TASK_ALPHABET, style, chat=chat,
                         added_tokens=tuple(model_cfg.added_tokens))
