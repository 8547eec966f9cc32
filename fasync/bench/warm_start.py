"""Supervised fine-tuning before a benchmark's runs, so that they start from a model that already does the task in
part: the long tail's (bench/vllm_long_tail.py), whose lengths must follow the data from the first rollout, and
the medium shape's learnable task (`fasync.bench.medium.CONTINUE`), whose reward a few dozen steps can raise."""

from __future__ import annotations

import random
from pathlib import Path


def fine_tune(directory: Path, examples: list[tuple[str, str]], steps: int, lr: float, batch: int,
              loss_every: int = 10, seed: int = 0) -> list[float]:
    """Fine-tunes the model in `directory` in place on `examples` (a prompt, through the tokenizer's template, and
    its answer, followed by `</s>`): `steps` AdamW steps at `lr`, each on `batch` examples drawn at random,
    cross-entropy on the answers' tokens only. Returns the loss of every `loss_every`-th step."""
    import torch
    import transformers

    from fasync.model.tokenizer import HFTokenizer

    tokenizer = HFTokenizer(str(directory))
    encoded = [(tokenizer.format_prompt(prompt), [*tokenizer.encode(answer), tokenizer.eos_id])
               for prompt, answer in examples]
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM.from_pretrained(directory)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    draw, losses = random.Random(seed), []
    for step in range(steps):
        chosen = draw.sample(encoded, batch)
        width = max(len(prompt) + len(answer) for prompt, answer in chosen)
        ids = torch.full((len(chosen), width), tokenizer.pad_id)
        labels = torch.full((len(chosen), width), -100)  # transformers' ignored label: prompts and padding
        for row, (prompt, answer) in enumerate(chosen):
            ids[row, :len(prompt) + len(answer)] = torch.tensor(prompt + answer)
            labels[row, len(prompt):len(prompt) + len(answer)] = torch.tensor(answer)
        loss = model(input_ids=ids, attention_mask=ids != tokenizer.pad_id, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % loss_every == 0:
            losses.append(loss.item())
    model.save_pretrained(directory)
    return losses
