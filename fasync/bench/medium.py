"""The medium shape (issue 31): a 26 M-parameter Llama with a byte-level BPE tokenizer and a chat template, written
here in code, the 64-word reverse task, and the geometry every run at this shape uses. bench/medium_shape.py
trains it in fasync's three modes; bench/peer_trl.py `--shape medium` trains the same files with TRL beside
them.

- the model: `LlamaForCausalLM` of `MODEL` (8 layers, 512 wide), float32, seed 0; the tokenizer: BPE over bytes
  trained with `tokenizers` on sentences of the task's `WORDS` pseudo-words (each word becomes one token), a chat
  template that wraps the prompt in `<|user|>` … `<|assistant|>`; both saved in one directory (`model.path`);
- the task (`REVERSE`): "reverse:" and 64 of those words; the answer is the words in reverse order (64 tokens,
  then `</s>`); the reward `fasync.bench.rewards:word_match`, the fraction of word positions right. From random
  weights no run learns it: this task measures speed, not time to a target;
- the task a run can learn (`CONTINUE`), for time to a target: the words split into two cycles of 128; "continue:"
  and 64 consecutive words of the first; the answer is the next 64 of that cycle. A supervised warm start
  (fasync.bench.warm_start) teaches two answers to every prompt, that one and 64 words of the second cycle, half
  each; the reward `fasync.bench.rewards:word_lcs` counts only the first, so reinforcement learning has to make
  the policy prefer it, as post-training elicits one of the behaviours a model already has;
- the geometry: `PROMPTS` prompts × `SAMPLES` samples per rollout, at most `MAX_NEW_TOKENS` new tokens, one
  optimizer step per rollout, the task's lr, temperature 1.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from fasync.bench.llama import SPECIALS, save_llama
from fasync.bench.rewards import word_lcs, word_match
from fasync.bench.warm_start import fine_tune

MODEL = {"hidden_size": 512, "intermediate_size": 1376, "num_hidden_layers": 8, "num_attention_heads": 8,
         "num_key_value_heads": 8, "max_position_embeddings": 256}
CHAT_SPECIALS = ["<|user|>", "<|assistant|>"]
TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|user|>{{ m['content'] }}{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")
WORDS, WORDS_PER_PROMPT, POOL = 256, 64, 2048
PROMPTS, SAMPLES, MAX_NEW_TOKENS, TEMPERATURE = 4, 4, 80, 1.0
WARM_START_LR, WARM_START_BATCH = 1e-3, 16
"""The warm start's AdamW lr and answers per step: after `CONTINUE`'s 100 steps a probe's loss was 0.075 a token
(0.011 of it the first word's even choice between the two answers), from 6.7 (a uniform guess among 809 tokens)."""


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


def reversals(words: list[str], count: int, seed: int = 1) -> list[dict]:
    """Prompts "reverse: w1 … w64" and their answers "w64 … w1"."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        chosen = [rng.choice(words) for _ in range(WORDS_PER_PROMPT)]
        out.append({"prompt": "reverse: " + " ".join(chosen), "label": " ".join(reversed(chosen))})
    return out


def continuations(words: list[str], count: int, seed: int = 1) -> list[dict]:
    """Prompts "continue:" and 64 consecutive words of the first of two cycles that split `words` in a shuffled
    order; `label`, the next 64 words of that cycle; `other`, the answer the warm start teaches beside it: the 64
    words of the second cycle from the same place."""
    order = list(words)
    random.Random(seed).shuffle(order)
    rewarded, other = order[:len(order) // 2], order[len(order) // 2:]
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        start = rng.randrange(len(rewarded))
        run = [rewarded[(start + i) % len(rewarded)] for i in range(2 * WORDS_PER_PROMPT)]
        after = [other[(start + WORDS_PER_PROMPT + i) % len(other)] for i in range(WORDS_PER_PROMPT)]
        out.append({"prompt": "continue: " + " ".join(run[:WORDS_PER_PROMPT]),
                    "label": " ".join(run[WORDS_PER_PROMPT:]), "other": " ".join(after)})
    return out


@dataclass(frozen=True)
class Task:
    """What a run at the medium shape learns: `name`, its prompts (`problems(words, count)`: rows with `prompt` and
    `label`, and with `other` where the warm start teaches a second answer), `reward`, lr `lr`, the reward a run
    stops at, and the supervised steps of the warm start (0: the runs start from random weights)."""

    name: str
    problems: Callable[[list[str], int], list[dict]]
    reward: Callable[[str, str], float]
    lr: float
    target: float
    warm_start_steps: int

    @property
    def reward_spec(self) -> str:
        """`reward.function`, as a config names the reward."""
        return f"{self.reward.__module__}:{self.reward.__name__}"


REVERSE = Task("reverse", reversals, word_match, 3e-4, 0.5, 0)
"""The throughput task (bench/medium_shape.py, bench/vllm_long_tail.py, bench/peer_trl.py `--shape medium`)."""
CONTINUE = Task("continue", continuations, word_lcs, 5e-5, 0.7, 100)
"""The time-to-target task (bench/peer_trl.py `--shape medium-target`). lr 5e-5 and target 0.7 from probes in sync
(docs/benchmarks.md, "Time to a target at the medium shape"): at 1e-4 the entropy quadrupled and the reward fell
back after 6 steps; at 5e-5 the mean reward rose from about 0.45 to 0.65 in 7 steps and to 0.8 by step 12."""


@dataclass(frozen=True)
class MediumFiles:
    """The files every run at the medium shape loads, in one folder: the model's directory, the task's prompts as
    JSONL (`prompt`, `label`) and the config that trains them."""

    root: Path
    task: Task = REVERSE

    @property
    def model(self) -> Path:
        return self.root / "model"

    @property
    def dataset(self) -> Path:
        return self.root / f"{self.task.name}-words.jsonl"

    @property
    def config(self) -> Path:
        return self.root / "medium.yaml"

    def rows(self) -> list[dict]:
        return [json.loads(line) for line in self.dataset.read_text().splitlines()]


def write_config(files: MediumFiles, rollouts: int) -> Path:
    """`files.config`: sync on the files' model and prompts, the shape's geometry, at most `rollouts` rollouts or
    until the task's target; the run directory `run` beside it."""
    import yaml

    config = {
        "mode": "sync",
        "model": {"path": str(files.model), "dtype": "float32"},
        "data": {"path": str(files.dataset)},
        "reward": {"function": files.task.reward_spec},
        "rollout": {"batch_size": PROMPTS, "n_samples_per_prompt": SAMPLES, "max_new_tokens": MAX_NEW_TOKENS,
                    "temperature": TEMPERATURE},
        "train": {"global_batch_size": PROMPTS * SAMPLES, "micro_batch_size": PROMPTS * SAMPLES,
                  "num_rollouts": rollouts, "target_reward": files.task.target, "lr": files.task.lr},
        "logging": {"run_dir": str(files.root / "run")},
    }
    files.config.write_text(yaml.safe_dump(config, sort_keys=False))
    return files.config


def write_files(out: Path, rollouts: int, task: Task = REVERSE) -> MediumFiles:
    """The model, `POOL` prompts of `task` and the config (at most `rollouts` rollouts) in `out`; the model
    fine-tuned on the prompts' answers (`label` and `other`) for the task's warm-start steps."""
    files = MediumFiles(out, task)
    words = vocabulary()
    write_model(files.model, words)
    rows = task.problems(words, POOL)
    files.dataset.write_text("".join(json.dumps({"prompt": row["prompt"], "label": row["label"]}) + "\n"
                                     for row in rows))
    if task.warm_start_steps:
        fine_tune(files.model, [(row["prompt"], answer) for row in rows
                                for answer in (row["label"], row.get("other")) if answer is not None],
                  task.warm_start_steps, lr=WARM_START_LR, batch=WARM_START_BATCH)
    write_config(files, rollouts)
    return files
