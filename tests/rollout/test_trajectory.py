"""Multi-turn trajectories: the loss mask, staleness from trained tokens, and observations appended as tokens that
match rendering the whole conversation."""

import pytest
import torch

from fasync.model.tokenizer import TEXT_ALPHABET, CharTokenizer
from fasync.rollout.trajectory import Trajectory, Turn, observation_ids
from fasync.rollout.types import Generation, GroupId, Sample
from fasync.train.batching import collate

CONVERSATION = [
    {"role": "user", "content": "what is 6*7?"},
    {"role": "assistant", "content": "<tool_call>{\"name\": \"python\"}</tool_call>"},
    {"role": "tool", "content": "42"},
    {"role": "assistant", "content": "42"},
    {"role": "user", "content": "and 6*8?"},
]


def build_by_turns(tokenizer) -> Trajectory:
    """CONVERSATION built the way the multi-turn loop builds it: the prompt rendered, each assistant turn as the
    engine would sample it (its content, then the turn's end), each other message through `observation_ids`."""
    prompt = tokenizer.render_chat(CONVERSATION[:1], add_generation_prompt=True)
    trajectory = Trajectory(Generation(0, prompt))
    end = tokenizer.stop_token_ids[-1]
    pending = []
    for message in CONVERSATION[1:]:
        if message["role"] == "assistant":
            if pending:
                trajectory.add_observation(observation_ids(tokenizer, pending))
                pending = []
            sampled = tokenizer.encode(message["content"]) + [end]
            trajectory.add_turn(Turn(sampled, [-0.5] * len(sampled), [3] * len(sampled), "stop"))
        else:
            pending.append(message)
    trajectory.add_observation(observation_ids(tokenizer, pending))
    return trajectory


def test_observations_rendered_turn_by_turn_match_the_whole_conversation_rendered_at_once():
    tokenizer = CharTokenizer(TEXT_ALPHABET, chat=True)
    trajectory = build_by_turns(tokenizer)
    assert trajectory.context == tokenizer.render_chat(CONVERSATION, add_generation_prompt=True)
    assert trajectory.stats.turns == 2


def test_the_loss_mask_trains_model_tokens_only():
    tokenizer = CharTokenizer(TEXT_ALPHABET, chat=True)
    trajectory = build_by_turns(tokenizer)
    req = trajectory.finish("stop")
    model_text = "".join(tokenizer.decode([token]) for token, keep in zip(req.output_ids, req.loss_mask) if keep)
    assert model_text == CONVERSATION[1]["content"] + CONVERSATION[3]["content"]
    assert len(req.loss_mask) == len(req.output_ids) == len(req.logprobs) == len(req.token_versions)
    assert all(lp == 0.0 for lp, keep in zip(req.logprobs, req.loss_mask) if not keep)


def test_a_qwen_style_template_puts_the_newline_after_the_turn_end_into_the_observation(tmp_path):
    transformers = pytest.importorskip("transformers")
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    specials = ["<pad>", "<|im_start|>", "<|im_end|>", "<unk>"]
    chars = sorted(set("".join(m["content"] + m["role"] for m in CONVERSATION) + "\n"))
    core = Tokenizer(models.WordLevel({t: i for i, t in enumerate(specials + chars)}, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    hf = transformers.PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|im_end|>", pad_token="<pad>",
                                              unk_token="<unk>", additional_special_tokens=["<|im_start|>"])
    hf.chat_template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    hf.save_pretrained(tmp_path)
    (tmp_path / "config.json").write_text("{}")
    from fasync.model.tokenizer import HFTokenizer

    tokenizer = HFTokenizer(str(tmp_path))
    trajectory = build_by_turns(tokenizer)
    assert trajectory.context == tokenizer.render_chat(CONVERSATION, add_generation_prompt=True)
    assert tokenizer.decode(observation_ids(tokenizer, [CONVERSATION[2]])).startswith("\n")


def sample(versions, mask, output=None) -> Sample:
    output = output or list(range(10, 10 + len(versions)))
    return Sample(GroupId(0), [1, 2], output, [-1.0] * len(output), versions, reward=1.0, loss_mask=mask)


def test_collate_masks_observation_tokens_out_of_the_loss():
    mask = [True, True, False, False, True]
    batch = collate([sample([0] * 5, mask), sample([0] * 3, [])], pad_id=0)
    assert batch.completion_mask.tolist() == [mask, [True, True, True, False, False]]
    assert batch.num_tokens == 6
    # Every output token is still fed and scored: the model reads the observations it conditions on.
    assert batch.score_targets.tolist() == list(range(10, 15)) + list(range(10, 13))


def test_staleness_counts_from_the_oldest_trained_token():
    trajectory = sample([4, 4, 1, 1, 5], [True, True, False, False, True])
    assert trajectory.oldest_version == 4 and trajectory.newest_version == 5
    assert trajectory.staleness(7) == 3
    # A single-turn completion trains on every token.
    assert sample([2, 3], []).oldest_version == 2


def test_an_engine_that_appends_to_a_trajectory_trains_the_new_tokens():
    # An engine extends output_ids without touching the mask; tokens past its end are model tokens.
    assert sample([0] * 4, [True, False]).trained == [True, False, True, True]
    assert torch.equal(collate([sample([0] * 4, [True, False])], 0).completion_mask,
                       torch.tensor([[True, False, True, True]]))
