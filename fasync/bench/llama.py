"""The benchmarks' Hugging Face models, written in code (no hub is reachable): a Llama with random weights and a
fast tokenizer, saved in one directory that `model.path` (and TRL, bench/peer_trl.py) loads."""

from __future__ import annotations

from pathlib import Path

SPECIALS = ["<pad>", "<s>", "</s>", "<unk>"]
"""The first ids of every benchmark tokenizer, in this order: the model's pad, bos and eos ids are 0, 1 and 2."""


def save_llama(directory: Path, core, shape: dict, seed: int, chat_template: str | None = None,
               extra_special_tokens: list[str] | None = None) -> Path:
    """A `LlamaForCausalLM` of `shape` (`LlamaConfig`'s keywords; output projection untied), its weights drawn
    from `seed`, with the fast tokenizer around `core` (a `tokenizers.Tokenizer` whose first ids are `SPECIALS`)
    and its `extra_special_tokens`, saved in `directory`."""
    import torch
    import transformers

    extra = {"additional_special_tokens": extra_special_tokens} if extra_special_tokens else {}
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<s>", eos_token="</s>",
                                                     pad_token="<pad>", unk_token="<unk>", **extra)
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    tokenizer.save_pretrained(directory)
    config = transformers.LlamaConfig(vocab_size=len(tokenizer), pad_token_id=0, bos_token_id=1, eos_token_id=2,
                                      tie_word_embeddings=False, **shape)
    torch.manual_seed(seed)
    transformers.LlamaForCausalLM(config).save_pretrained(directory)
    return directory
