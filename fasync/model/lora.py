"""LoRA through peft: low-rank adapters injected into the policy's linear layers, and the merged weights the
engines load.

The adapters are injected in place (`peft.inject_adapter_in_model`), into the Hugging Face model itself for a
`model.path` model (so that the adapter fasync exports loads with peft onto that model) and into the embedded
transformer otherwise. An adapted layer's weight is then `<layer>.base_layer.weight`, frozen, beside its
`lora_A` and `lora_B`; every other parameter is frozen too. The engines never see adapters: `EngineWeights`
gives them W + ΔW under the base model's names.

No dropout: the trainer runs the policy in eval mode, so that it trains the distribution the engines sample.
"""

from __future__ import annotations

from torch import Tensor, nn

ADAPTER = "default"
"""peft's name for the one adapter."""


def adapted_module(model: nn.Module) -> nn.Module:
    """Where the adapters go: the Hugging Face model inside fasync's wrapper, or the embedded model."""
    return getattr(model, "lm", model)


def default_targets(module: nn.Module) -> list[str]:
    """Every linear layer but the output projection (whose rows are the vocabulary)."""
    head = module.get_output_embeddings() if hasattr(module, "get_output_embeddings") else None
    return [name for name, layer in module.named_modules()
            if isinstance(layer, nn.Linear) and layer is not head and not name.endswith("lm_head")]


def peft_config(model: nn.Module, lora):
    """peft's `LoraConfig` for `model.lora` on `model` (without adapters yet)."""
    from peft import LoraConfig

    return LoraConfig(r=lora.rank, lora_alpha=lora.alpha, lora_dropout=0.0,
                      target_modules=lora.target_modules or default_targets(adapted_module(model)))


def apply(model: nn.Module, lora, seed: int) -> nn.Module:
    """Inject `model.lora`'s adapters into `model`, initialised from `seed`, and freeze everything else; returns
    `model`."""
    import torch
    from peft import inject_adapter_in_model
    from peft.tuners.lora import LoraLayer

    inject_adapter_in_model(peft_config(model, lora), adapted_module(model), adapter_name=ADAPTER)
    # peft draws the adapters from the global generator, whose state by then depends on the process (its hash
    # seed changed them: the same config trained differently from one run to the next); draw them again, in the
    # model's order, from the run's seed, as the model's own weights are.
    cuda = sorted({p.device.index or 0 for p in model.parameters() if p.device.type == "cuda"})
    with torch.random.fork_rng(devices=cuda):
        torch.manual_seed(seed)
        for layer in model.modules():
            if isinstance(layer, LoraLayer):
                layer.reset_lora_parameters(ADAPTER, init_lora_weights=True)
    for name, parameter in model.named_parameters():
        parameter.requires_grad_("lora_" in name)
    return model


def merged_state_dict(model: nn.Module) -> dict[str, Tensor]:
    """The weights with every adapter merged, W + (alpha / rank) B A, under the names of the model without
    adapters: what the engines load and `fasync export --merge` writes."""
    import torch
    from peft.tuners.lora import LoraLayer

    with torch.no_grad():
        state = {name.replace(".base_layer.", "."): value for name, value in model.state_dict().items()
                 if ".lora_" not in name}
        for name, layer in model.named_modules():
            if isinstance(layer, LoraLayer):
                key = f"{name}.weight"
                state[key] = state[key] + layer.get_delta_weight(ADAPTER).to(state[key].dtype)
    return state


def adapter_state_dict(model: nn.Module) -> dict[str, Tensor]:
    """The adapters alone, keyed as peft saves them (`base_model.model.<layer>.lora_A.weight`), so that peft's
    `PeftModel.from_pretrained` loads them onto the same base model."""
    from peft import get_peft_model_state_dict

    module = adapted_module(model)
    return {f"base_model.model.{name}": value.detach().contiguous()
            for name, value in get_peft_model_state_dict(module, adapter_name=ADAPTER).items()}


class EngineWeights:
    """The policy's weights as the engines load them, read through `state_dict()` as a model's are
    (`fasync.weights.buckets.weight_buckets`, `BucketSource.of_model`): merged when the policy has adapters."""

    def __init__(self, model: nn.Module):
        self.model = model

    def state_dict(self) -> dict[str, Tensor]:
        return merged_state_dict(self.model)
