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

from fasync.config.schema import DataConfig, ModelConfig
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


CHAT_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>", "<|tool|>", "<|end|>", "<tool_call>", "</tool_call>")
"""The embedded tokenizer's chat tokens (`CharTokenizer(chat=True)`): a turn is `<|role|>` content `<|end|>`, and
a tool call is `<tool_call>{json}</tool_call>` in the assistant's content (the Hermes/Qwen format)."""


class CharTokenizer:
    """One id per character of `alphabet`, after PAD (0), BOS (1) and EOS (2); with `chat`, the `CHAT_TOKENS` after
    them, one id each, and a chat template (an assistant turn ends with `<|end|>`, which stops generation)."""

    pad_id, bos_id, eos_id = 0, 1, 2
    num_special = 3

    def __init__(self, alphabet: str, style: PromptStyle = PromptStyle(), chat: bool = False):
        self.alphabet = alphabet
        self.style = style
        self._ids = {char: index + self.num_special for index, char in enumerate(alphabet)}
        self.chat_tokens = CHAT_TOKENS if chat else ()
        self._special_ids = {token: self.num_special + len(alphabet) + i for i, token in enumerate(self.chat_tokens)}
        self._special_split = re.compile("(" + "|".join(map(re.escape, self.chat_tokens)) + ")") if chat else None
        self.vocab_size = self.num_special + len(alphabet) + len(self.chat_tokens)
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
        """Text of the ids, skipping PAD, BOS and EOS; a chat token reads as its text, except `<|end|>`."""
        first_chat = self.num_special + len(self.alphabet)
        return "".join(self.alphabet[i - self.num_special] if i < first_chat else self.chat_tokens[i - first_chat]
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
    """A local Hugging Face tokenizer; prompts go through its chat template when it has one."""

    def __init__(self, path: str, style: PromptStyle = PromptStyle()):
        from transformers import AutoTokenizer

        self.style = style
        directory = check_model_dir(path)
        try:
            self.hf = AutoTokenizer.from_pretrained(directory, local_files_only=True)
        except (OSError, ValueError) as exc:
            raise ConfigurationError(f"model.path: cannot load a tokenizer from {path} ({exc})") from exc
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
    (tool calls are JSON, environments speak words) and has its chat tokens too."""
    style = PromptStyle.of(data_cfg)
    if model_cfg.path is not None:
        return HFTokenizer(model_cfg.path, style)
    text = data_cfg.path is not None or data_cfg.system_prompt is not None or chat
    return CharTokenizer(TEXT_ALPHABET if text else TASK_ALPHABET, style, chat=chat)
