"""A Hugging Face model directory's weights are checked in the driver, before any actor loads them (issue 19 §3):
a truncated file or weights saved from another config.json is one message naming the file."""

import json
import shutil

import pytest

from fasync.config.schema import FasyncConfig
from fasync.errors import ConfigurationError

transformers = pytest.importorskip("transformers")
from tiny_models import write_tiny_llama  # noqa: E402

from fasync.launch.plan import resolve  # noqa: E402
from fasync.model.weights import check_weights, llama_shapes  # noqa: E402
from fasync.rollout.groups import build_factory  # noqa: E402


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    directory = tmp_path_factory.mktemp("tiny-llama")
    write_tiny_llama(directory)
    return directory


@pytest.fixture
def model_dir(saved, tmp_path):
    copy = tmp_path / "model"
    shutil.copytree(saved, copy)
    return copy


def config(path) -> FasyncConfig:
    return FasyncConfig.model_validate({"model": {"path": str(path)}, "data": {"task": "reverse", "length": 4}})


def test_a_complete_model_passes(model_dir):
    check_weights(str(model_dir))
    assert build_factory(resolve(config(model_dir))).tokenizer.eos_id == 2


@pytest.mark.parametrize("keep", [0.5, 0.999, 4, 100])
def test_a_truncated_weight_file_is_named(model_dir, keep):
    weights = model_dir / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: int(len(data) * keep) if keep < 1 else keep])
    with pytest.raises(ConfigurationError, match=rf"model.path: {weights} (is truncated|is \d+ bytes, too short)") as info:
        build_factory(resolve(config(model_dir)))
    assert "save or download the model again" in str(info.value).lower() and "\n" not in str(info.value)


def test_weights_of_another_shape_name_the_file_and_the_tensor(model_dir):
    settings = json.loads((model_dir / "config.json").read_text())
    settings["intermediate_size"] = 96  # the weights were saved with 64
    (model_dir / "config.json").write_text(json.dumps(settings))
    with pytest.raises(ConfigurationError, match=r"model.path: .*model.safetensors holds model.layers.0.mlp.\w+_proj.weight "
                       r"with shape \[\d+, \d+\], but .*config.json describes a model whose .* is \[\d+, \d+\]"):
        build_factory(resolve(config(model_dir)))


def test_a_shard_index_naming_a_missing_file(model_dir):
    index = {"metadata": {}, "weight_map": {"lm_head.weight": "model-00002-of-00002.safetensors",
                                            "model.norm.weight": "model.safetensors"}}
    (model_dir / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ConfigurationError, match=r"index.json names 1 shard\(s\) the directory lacks: model-00002"):
        check_weights(str(model_dir))



def test_a_torch_checkpoint_is_checked_the_same_way(model_dir):
    import torch
    from safetensors.torch import load_file

    state = load_file(model_dir / "model.safetensors")
    (model_dir / "model.safetensors").unlink()
    weights = model_dir / "pytorch_model.bin"
    torch.save(state, weights)
    check_weights(str(model_dir))
    weights.write_bytes(weights.read_bytes()[:-100])
    with pytest.raises(ConfigurationError, match=rf"model.path: {weights} is truncated or not a torch checkpoint") as info:
        check_weights(str(model_dir))
    assert "\n" not in str(info.value)
    state["model.norm.weight"] = torch.ones(7)
    torch.save(state, weights)
    with pytest.raises(ConfigurationError, match=r"holds model.norm.weight with shape \[7\], but .* is \[32\]"):
        check_weights(str(model_dir))


def test_a_prompt_longer_than_the_hugging_face_context_is_refused(model_dir, tmp_path):
    data = tmp_path / "data.jsonl"
    data.write_text(json.dumps({"prompt": "1" * 70, "label": "1"}) + "\n")
    cfg = FasyncConfig.model_validate({"model": {"path": str(model_dir)}, "data": {"path": str(data)}})
    with pytest.raises(ConfigurationError, match=r"data.jsonl:1: the prompt is 72 tokens, but the model's context "
                       r"is 64 tokens"):
        build_factory(resolve(cfg))


@pytest.mark.parametrize("keys", [
    {},
    {"num_key_value_heads": 2, "tie_word_embeddings": True},
    {"attention_bias": True, "mlp_bias": True, "head_dim": 16},
], ids=["plain", "grouped and tied", "biases and a head size of its own"])
def test_a_llamas_shapes_are_read_off_its_config_as_transformers_builds_it(keys):
    # Start-up (issue 31 §5): the driver checks a Llama's weights without importing torch and transformers.
    import torch

    settings = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 40, "hidden_size": 32,
                "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4, **keys}
    config = transformers.LlamaConfig(**{k: v for k, v in settings.items() if k not in ("model_type", "architectures")})
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(config)
    assert llama_shapes(settings) == {name: tuple(t.shape) for name, t in model.state_dict().items()}
    assert llama_shapes({**settings, "model_type": "qwen2"}) is None
