"""Local Hugging Face causal LMs, wrapped to the policy calling convention (the call returns logits)."""

from __future__ import annotations

import inspect

import torch
from torch import nn

from fasync.errors import ConfigurationError
from fasync.model.scoring import ScoreRequest, score_hidden
from fasync.model.tokenizer import check_model_dir

WRAPPER_PREFIX = "lm."
"""What the wrapper adds in front of the Hugging Face parameter names in its state dict."""


class HFCausalLM(nn.Module):
    def __init__(self, lm: nn.Module):
        super().__init__()
        self.lm = lm
        self.max_seq_len = getattr(lm.config, "max_position_embeddings", None)
        # transformers renamed `past_key_values` to `cache` (5.x); pass whichever this version takes.
        self._cache_argument = "cache" if "cache" in inspect.signature(lm.forward).parameters else "past_key_values"

    def new_cache(self, batch_size: int, max_len: int):
        """A cache with room for `max_len` positions, written in place (`fasync.model.hf_cache`)."""
        from fasync.model.hf_cache import preallocated_cache

        return preallocated_cache(self.lm.config, max_len)

    def cache_layers(self, cache) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer, the keys and values [B, H, T, D] of the positions filled so far."""
        return [(layer.keys, layer.values) for layer in cache.layers]

    def cache_from_layers(self, layers: list[tuple[torch.Tensor, torch.Tensor]], max_len: int):
        """A cache holding these keys and values, with room for `max_len` positions."""
        cache = self.new_cache(layers[0][0].shape[0], max_len)
        for index, (keys, values) in enumerate(layers):
            cache.update(keys, values, index)
        return cache

    def decoder_layers(self) -> nn.ModuleList:
        """The repeated blocks: the units of activation checkpointing and of FSDP2 sharding."""
        layers = getattr(self.lm.get_decoder(), "layers", None)
        if not isinstance(layers, nn.ModuleList):
            raise ConfigurationError(f"model.path: {type(self.lm).__name__} has no `layers` list of decoder blocks "
                                     "to shard or checkpoint")
        return layers

    def forward(self, input_ids, attention_mask=None, position_ids=None, cache=None,
                score: ScoreRequest | None = None):
        """Logits [B, T, V]; with `score`, the requested tokens' logprobs and entropies [N]. Without an
        attention mask, restarts of `position_ids` separate sequences packed into one row (transformers
        then masks attention between them)."""
        arguments = dict(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                         use_cache=cache is not None, **{self._cache_argument: cache})
        if score is None:
            return self.lm(**arguments).logits
        config = self.lm.config
        if getattr(config, "final_logit_softcapping", None) or getattr(config, "logit_scale", None):
            raise ConfigurationError(f"model.path: {config.model_type} transforms its logits after the output "
                                     "projection, which fasync's chunked scoring does not apply")
        hidden = self.lm.get_decoder()(**arguments).last_hidden_state
        head = self.lm.get_output_embeddings()
        return score_hidden(hidden, head.weight, head.bias, score)


def load_hf_model(path: str, dtype: torch.dtype) -> HFCausalLM:
    from transformers import AutoModelForCausalLM

    directory = check_model_dir(path)
    try:
        lm = AutoModelForCausalLM.from_pretrained(directory, local_files_only=True, dtype=dtype)
    except (OSError, ValueError) as exc:
        raise ConfigurationError(f"model.path: cannot load a causal LM from {path} ({exc})") from exc
    return HFCausalLM(lm)
