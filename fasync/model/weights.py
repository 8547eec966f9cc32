"""A Hugging Face model directory's weight files, checked in the driver before any actor loads them.

Only the files' tensor tables are read: their byte ranges against each file's size (a truncated download
or copy), and their shapes against the model that config.json builds, on the meta device so that it takes
no memory (weights saved from another configuration). Either problem otherwise surfaces as an engine
actor's traceback after the cluster has started.
"""

from __future__ import annotations

import json
import struct
import zipfile
from pathlib import Path

from fasync.errors import ConfigurationError

SAFETENSORS_INDEX = "model.safetensors.index.json"
TORCH_INDEX = "pytorch_model.bin.index.json"
MAX_HEADER_BYTES = 100 << 20
"""safetensors caps its JSON header at 100 MB; a larger length field means the file is not safetensors."""


def _problem(file: Path, what: str) -> ConfigurationError:
    return ConfigurationError(f"model.path: {file} {what}. Save or download the model again "
                              "(`save_pretrained`, or copy the complete directory)")


def safetensors_shapes(file: Path) -> dict[str, tuple[int, ...]]:
    """Tensor name → shape from a safetensors file's header, after checking that the file holds every byte
    the header describes."""
    size = file.stat().st_size
    with file.open("rb") as stream:
        prefix = stream.read(8)
        if len(prefix) < 8:
            raise _problem(file, f"is {size} bytes, too short for a safetensors file")
        (length,) = struct.unpack("<Q", prefix)
        if length > min(MAX_HEADER_BYTES, size - 8):
            raise _problem(file, f"is truncated or not a safetensors file: its header claims {length} bytes and "
                           f"the file has {size}")
        try:
            header = json.loads(stream.read(length))
            tensors = {name: entry for name, entry in header.items() if name != "__metadata__"}
            end = max((entry["data_offsets"][1] for entry in tensors.values()), default=0)
            shapes = {name: tuple(entry["shape"]) for name, entry in tensors.items()}
        except (ValueError, KeyError, TypeError, IndexError, AttributeError):
            raise _problem(file, "has an unreadable safetensors header") from None
    if 8 + length + end > size:
        raise _problem(file, f"is truncated: its tensors end at byte {8 + length + end} but the file has {size}")
    return shapes


def torch_shapes(file: Path) -> dict[str, tuple[int, ...]]:
    """Tensor name → shape from a `torch.save` file."""
    import torch

    try:
        # A zip checkpoint (torch ≥ 1.6) is mapped; the legacy format can only be read whole.
        state = torch.load(file, map_location="cpu", mmap=zipfile.is_zipfile(file), weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any failure to read the file is the file's problem
        reason = (str(exc).splitlines() or [""])[0]  # torch's explanations run to many lines
        raise _problem(file, f"is truncated or not a torch checkpoint ({type(exc).__name__}: {reason})") from None
    return {name: tuple(tensor.shape) for name, tensor in state.items() if hasattr(tensor, "shape")}


def _weight_files(directory: Path) -> list[Path]:
    """The files `from_pretrained` would read: those a shard index names, else the single-file checkpoint."""
    for index_name in (SAFETENSORS_INDEX, TORCH_INDEX):
        index = directory / index_name
        if index.is_file():
            try:
                names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
            except (ValueError, KeyError, TypeError, AttributeError):
                raise _problem(index, "is not a readable shard index (no `weight_map`)") from None
            missing = [name for name in names if not (directory / name).is_file()]
            if missing:
                raise _problem(index, f"names {len(missing)} shard(s) the directory lacks: {', '.join(missing[:3])}")
            return [directory / name for name in names]
    return [file for file in (directory / "model.safetensors", directory / "pytorch_model.bin") if file.is_file()][:1]


def llama_shapes(config: dict) -> dict[str, tuple[int, ...]] | None:
    """Parameter name → shape of the `LlamaForCausalLM` that `config` (config.json) describes, read off its keys
    without building it, so that the driver checks a Llama's weights without importing torch and transformers
    (about 2.8 s and 0.3 GiB at start-up); None for any other model. tests/model/test_model_weights.py compares
    it with transformers' model on the meta device."""
    if config.get("model_type") != "llama" or config.get("architectures", ["LlamaForCausalLM"]) != ["LlamaForCausalLM"] \
            or "quantization_config" in config:
        return None
    try:
        hidden, layers = int(config["hidden_size"]), int(config["num_hidden_layers"])
        heads = int(config["num_attention_heads"])
        kv_heads = int(config.get("num_key_value_heads") or heads)
        head_dim = int(config.get("head_dim") or hidden // heads)
        vocab, intermediate = int(config["vocab_size"]), int(config["intermediate_size"])
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return None
    projections = {"self_attn.q_proj": (heads * head_dim, hidden), "self_attn.k_proj": (kv_heads * head_dim, hidden),
                   "self_attn.v_proj": (kv_heads * head_dim, hidden), "self_attn.o_proj": (hidden, heads * head_dim),
                   "mlp.gate_proj": (intermediate, hidden), "mlp.up_proj": (intermediate, hidden),
                   "mlp.down_proj": (hidden, intermediate)}
    biased = {"self_attn": bool(config.get("attention_bias")), "mlp": bool(config.get("mlp_bias"))}
    shapes = {"model.embed_tokens.weight": (vocab, hidden), "model.norm.weight": (hidden,),
              "lm_head.weight": (vocab, hidden)}
    for layer in range(layers):
        for name, shape in projections.items():
            shapes[f"model.layers.{layer}.{name}.weight"] = shape
            if biased[name.split(".")[0]]:
                shapes[f"model.layers.{layer}.{name}.bias"] = shape[:1]
        for norm in ("input_layernorm", "post_attention_layernorm"):
            shapes[f"model.layers.{layer}.{norm}.weight"] = (hidden,)
    return shapes


def expected_shapes(directory: Path) -> tuple[dict[str, tuple[int, ...]], str]:
    """Parameter name → shape of the model config.json describes (a Llama's read off config.json, any other
    built on the meta device), and the prefix of its base model (checkpoints may be saved with or without it)."""
    try:
        llama = llama_shapes(json.loads((directory / "config.json").read_text()))
    except (OSError, ValueError):
        llama = None
    if llama is not None:
        return llama, "model"
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(directory, local_files_only=True)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return {name: tuple(t.shape) for name, t in model.state_dict().items()}, model.base_model_prefix


def check_weights(path: str) -> None:
    """Raise a ConfigurationError naming the file when a weight file of `path` is truncated, or holds a
    tensor whose shape differs from the one config.json asks for."""
    directory = Path(path)
    files = _weight_files(directory)
    if not files:
        return  # no weights fasync knows how to read ahead: loading reports what is there
    try:
        expected, prefix = expected_shapes(directory)
    except Exception:  # noqa: BLE001 - an architecture transformers cannot build is the loader's to report
        expected, prefix = {}, ""
    for file in files:
        shapes = safetensors_shapes(file) if file.suffix == ".safetensors" else torch_shapes(file)
        for name, shape in shapes.items():
            want = next((expected[key] for key in (name, f"{prefix}.{name}", name.removeprefix(f"{prefix}."))
                         if key in expected), None)
            if want is not None and want != shape:
                raise ConfigurationError(
                    f"model.path: {file} holds {name} with shape {list(shape)}, but {directory / 'config.json'} "
                    f"describes a model whose {name} is {list(want)}: the weights were saved from a different "
                    "configuration. Put the config.json they were saved with next to them")
