"""The medium shape (issue 31): a 26 M-parameter Llama with a byte-level BPE tokenizer and a chat template, written
here in code, the 64-word reverse task, and the geometry every run at this shape uses. bench/medium_shape.py
trains it in fasync's three modes; bench/peer_trl.py `--shape medium` trains the same files with TRL beside
them.

- the model: `LlamaForCausalLM` of `MODEL` (8 layers, 512 wide), float32, seed 0; the tokenizer: BPE over bytes
  trained with `tokenizers` on sentences of the task's `WORDS` pseudo-words (each word becomes one token), a chat
  template that wraps the prompt in `<|user|>` … `<|assistant|>`; both saved in one directory (`model.path`);
- the task: "reverse:" and 64 of those words; the answer is the words in reverse order (64 tokens, then `</s>`);
  the reward `fasync.bench.rewards:word_match`, the fraction of word positions right;
- the geometry: `PROMPTS` prompts × `SAMPLES` samples per rollout, at most `MAX_NEW_TOKENS` new tokens, one
  optimizer step per rollout, lr `LR`, temperature 1.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from fasync.bench.llama import SPECIALS, save_llama

MODEL = {"hidden_size": 512, "intermediate_size": 1376, "num_hidden_layers": 8, "num_attention_heads": 8,
         "num_key_value_heads": 8, "max_position_embeddings": 256}
CHAT_SPECIALS = ["<|user|>", "<|assistant|>"]
TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|user|>{{ m['content'] }}{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")
WORDS, WORDS_PER_PROMPT, POOL = 256, 64, 2048
PROMPTS, SAMPLES, MAX_NEW_TOKENS, LR, TEMPERATURE, TARGET = 4, 4, 80, 3e-4, 1.0, 0.5
REWARD = "fasync.bench.rewards:word_match"


def vocabulary(seed: int = 0) -> list[str]:
    """`WORDS` distinct pseudo-words of two or three consonant-vowel syllables."""
    rng = random.Random(seed)
    syllables = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]
    found: set[str] = set()
    while len(found) < WORDS:
        found.add("".join(rng.choice(syllables) for _ in range(rng.choice((2, 3)))))
    return sorted(found)


def write_model(directory: Path, words: list[str], seed: int = 0) -> Path:
    """The Llama of `MODEL` and its tokenizer: byte-level BPE trained on sentences of `words` until every word
    (with its leading space) is one token, `SPECIALS`, `CHAT_SPECIALS` and the chat template `TEMPLATE`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    rng = random.Random(seed)
    sentences = [" ".join(rng.choice(words) for _ in range(WORDS_PER_PROMPT)) for _ in range(2000)]
    core = Tokenizer(models.BPE(unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    core.decoder = decoders.ByteLevel()
    core.train_from_iterator(sentences + ["reverse:"], trainers.BpeTrainer(
        vocab_size=4096, special_tokens=SPECIALS + CHAT_SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    return save_llama(directory, core, MODEL, seed, chat_template=TEMPLATE, extra_special_tokens=CHAT_SPECIALS)


def problems(words: list[str], count: int, seed: int = 1) -> list[dict]:
    """Prompts "reverse: w1 … w64" and their answers "w64 … w1"."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        chosen = [rng.choice(words) for _ in range(WORDS_PER_PROMPT)]
        out.append({"prompt": "reverse: " + " ".join(chosen), "label": " ".join(reversed(chosen))})
    return out


@dataclass(frozen=True)
class MediumFiles:
    """The files every run at the medium shape loads, in one folder: the model's directory, the prompts as JSONL
    (`prompt`, `label`) and the config that trains them."""

    root: Path

    @property
    def model(self) -> Path:
        return self.root / "model"

    @property
    def dataset(self) -> Path:
        return self.root / "reverse-words.jsonl"

    @property
    def config(self) -> Path:
        return self.root / "medium.yaml"

    def rows(self) -> list[dict]:
        return [json.loads(line) for line in self.dataset.read_text().splitlines()]


def write_config(files: MediumFiles, rollouts: int) -> Path:
    """`files.config`: sync on the files' model and prompts, the shape's geometry, at most `rollouts` rollouts or
    until `TARGET`; the run directory `run` beside it."""
    import yaml

    config = {
        "mode": "sync",
        "model": {"path": str(files.model), "dtype": "float32"},
        "data": {"path": str(files.dataset)},
        "reward": {"function": REWARD},
        "rollout": {"batch_size": PROMPTS, "n_samples_per_prompt": SAMPLES, "max_new_tokens": MAX_NEW_TOKENS,
                    "temperature": TEMPERATURE},
        "train": {"global_batch_size": PROMPTS * SAMPLES, "micro_batch_size": PROMPTS * SAMPLES,
                  "num_rollouts": rollouts, "target_reward": TARGET, "lr": LR},
        "logging": {"run_dir": str(files.root / "run")},
    }
    files.config.write_text(yaml.safe_dump(config, sort_keys=False))
    return files.config


def write_files(out: Path, rollouts: int) -> MediumFiles:
    """The model, `POOL` prompts and the config (at most `rollouts` rollouts) in `out`."""
    files = MediumFiles(out)
    words = vocabulary()
    write_model(files.model, words)
    files.dataset.write_text("".join(json.dumps(row) + "\n" for row in problems(words, POOL)))
    write_config(files, rollouts)
    return files
