"""`model.added_tokens`: pieces of text the embedded tokenizer reads as one token each (docs/config.md).

A run without the key keeps its vocabulary, so its token ids and the model's initial weights are what they were;
a run with it has the pieces after every other token, and refuses pieces that would not be new tokens."""

import pytest
import torch
from paths import LOADER_CONFIGS

from fasync.config.loader import load_config
from fasync.config.schema import DataConfig, ModelConfig
from fasync.diagnostics import Location
from fasync.model import CharTokenizer, build_model, build_tokenizer
from fasync.model.tokenizer import CHAT_TOKENS, TASK_ALPHABET, TEXT_ALPHABET

CALL = '<tool_call>{"name": "get"}</tool_call>'
PIECES = ['{"name": "', "get", '"}']


def chat_tokenizer(pieces=()):
    return build_tokenizer(ModelConfig(added_tokens=list(pieces)), DataConfig(), chat=True)


def test_without_the_key_the_vocabulary_and_the_initial_weights_are_unchanged():
    assert ModelConfig().added_tokens == []
    plain, chat = build_tokenizer(ModelConfig(), DataConfig()), chat_tokenizer()
    assert plain.vocab_size == 3 + len(TASK_ALPHABET)
    assert chat.vocab_size == 3 + len(TEXT_ALPHABET) + len(CHAT_TOKENS)
    # Every id as CharTokenizer numbered them before the key: characters, then the chat tokens in their order.
    assert chat.encode("<|user|>ab<|end|>") == [3 + len(TEXT_ALPHABET) + 1, 3 + TEXT_ALPHABET.index("a"),
                                                3 + TEXT_ALPHABET.index("b"), 3 + len(TEXT_ALPHABET) + 4]
    same = build_model(ModelConfig(), chat_tokenizer(), seed=0)
    reference = build_model(ModelConfig(), CharTokenizer(TEXT_ALPHABET, chat=True), seed=0)
    assert all(torch.equal(a, b) for a, b in zip(same.state_dict().values(), reference.state_dict().values()))


def test_added_pieces_are_one_token_each_after_the_others_and_round_trip():
    tokenizer = chat_tokenizer(PIECES)
    first = 3 + len(TEXT_ALPHABET) + len(CHAT_TOKENS)
    assert tokenizer.vocab_size == first + 3
    ids = tokenizer.encode(CALL)
    assert len(ids) == 5 and ids[1:4] == [first, first + 1, first + 2]
    assert tokenizer.decode(ids) == CALL
    # A piece inside other text is still one token; the characters around it stay characters.
    assert tokenizer.encode("forget") == [*tokenizer.encode("for"), first + 1]
    # The chat template and its stop token are as before.
    assert tokenizer.render_chat([{"role": "user", "content": "get"}], True)[-3:] == \
        [first + 1, tokenizer.encode("<|end|>")[0], tokenizer.encode("<|assistant|>")[0]]
    assert tokenizer.stop_token_ids == chat_tokenizer().stop_token_ids


def test_the_longest_piece_wins_where_pieces_overlap():
    tokenizer = chat_tokenizer(['{"name": "', '{"name": "get"}'])
    first = 3 + len(TEXT_ALPHABET) + len(CHAT_TOKENS)
    assert tokenizer.encode('{"name": "get"}') == [first + 1]
    assert tokenizer.encode('{"name": "x"}') == [first, *tokenizer.encode('x"}')]


def test_the_model_grows_an_embedding_row_per_piece():
    model = build_model(ModelConfig(), chat_tokenizer(PIECES), seed=0)
    assert model.token_embedding.weight.shape[0] == 3 + len(TEXT_ALPHABET) + len(CHAT_TOKENS) + 3


@pytest.mark.parametrize("value, message", [
    ("['', get]", "item 0 ('') is empty"),
    ("[get, x]", "item 1 ('x') is one character: every character of the embedded alphabet is a token already"),
    ("[get, ab, get]", "item 2 ('get') is named twice (also item 0)"),
    ("['<|end|>']", "item 0 ('<|end|>') is one of the embedded tokenizer's chat tokens already"),
], ids=["empty", "one-character", "twice", "chat-token"])
def test_pieces_that_would_not_be_new_tokens_are_located_errors(value, message):
    result = load_config(str(LOADER_CONFIGS / "grandchild.yaml"), [f"model.added_tokens={value}"])
    assert result.config is None
    [diagnostic] = result.diagnostics
    assert (diagnostic.code, diagnostic.key, diagnostic.location) == \
        ("F007", "model.added_tokens", Location("<cli>", 1, 1))
    assert message in diagnostic.message


def test_a_hugging_face_model_is_told_to_add_the_tokens_itself(tmp_path):
    result = load_config(str(LOADER_CONFIGS / "grandchild.yaml"), [f"model.path={tmp_path}", "model.added_tokens=[get]"])
    [diagnostic] = result.diagnostics
    assert diagnostic.code == "F007"
    assert "model.added_tokens grows the embedded model's vocabulary, and model.path is set" in diagnostic.message
    assert "tokenizer.add_tokens, then model.resize_token_embeddings" in diagnostic.message

