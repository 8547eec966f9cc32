"""The torch rollout engine: batched sampling with a KV cache, for the embedded model and Hugging Face ones.

Contexts of different lengths are left-padded into one batch, with an attention
mask and position ids that count real tokens only, so every row sees exactly
what it would see alone. Each step samples one token for all rows at once.

Behaviour logprobs are those of the distribution actually sampled from:
softmax(logits / temperature) cut to the top-p nucleus and renormalised
(`fasync.model.policy.sampling_logprobs`). At temperature 1 and top_p 1 they
equal the trainer's `token_logprobs` on the same weights; greedy decoding
(temperature 0) reports the untempered model's logprobs.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.nn.utils.rnn import pad_sequence

from fasync.model.policy import sampling_logprobs
from fasync.rollout.engine import Continuation, RolloutEngine
from fasync.rollout.types import SamplingParams


class HFEngine(RolloutEngine):
    def __init__(self, model: nn.Module, pad_id: int, device: str = "cpu", seed: int = 0):
        super().__init__()
        self.device = torch.device(device)
        self.model = model.to(self.device).eval()
        self.pad_id = pad_id
        self.generator = torch.Generator(device=self.device).manual_seed(seed)

    def _load_state_dict(self, state_dict: dict) -> None:
        self.model.load_state_dict(state_dict)

    @torch.inference_mode()
    def _continue(
        self, contexts: list[list[int]], budgets: list[int], params: SamplingParams, interrupted: Callable[[], bool]
    ) -> list[Continuation]:
        limit = self.model.max_seq_len
        if limit is not None:
            budgets = [min(budget, limit - len(context)) for context, budget in zip(contexts, budgets)]
        rows = [i for i, budget in enumerate(budgets) if budget > 0]
        results = [Continuation([], [], "length") for _ in contexts]
        if rows:
            for i, result in zip(rows, self._decode([contexts[i] for i in rows], [budgets[i] for i in rows],
                                                    params, interrupted)):
                results[i] = result
        return results

    def _decode(
        self, contexts: list[list[int]], budgets: list[int], params: SamplingParams, interrupted: Callable[[], bool]
    ) -> list[Continuation]:
        device = self.device
        batch, steps = len(contexts), max(budgets)
        lengths = torch.tensor([len(c) for c in contexts], device=device)
        width = int(lengths.max())
        input_ids = pad_sequence(
            [torch.tensor(c, device=device) for c in contexts],
            batch_first=True, padding_value=self.pad_id, padding_side="left",
        )
        # Room for every step's token up front: step t writes column width + t.
        attention_mask = torch.zeros(batch, width + steps, dtype=torch.long, device=device)
        attention_mask[:, :width] = torch.arange(width, device=device) >= (width - lengths)[:, None]
        position_ids = (attention_mask[:, :width].cumsum(-1) - 1).clamp(min=0)
        budget = torch.tensor(budgets, device=device)
        stop_ids = torch.tensor(params.stop_token_ids, dtype=torch.long, device=device)

        tokens = torch.zeros(batch, steps, dtype=torch.long, device=device)
        logprobs = torch.zeros(batch, steps, device=device)
        kept = torch.zeros(batch, dtype=torch.long, device=device)
        stopped = torch.zeros(batch, dtype=torch.bool, device=device)
        done = torch.zeros(batch, dtype=torch.bool, device=device)

        if interrupted():
            return [Continuation([], [], "abort") for _ in contexts]
        cache = self.model.new_cache(batch, width + steps)
        logits = self.model(input_ids, attention_mask=attention_mask[:, :width], position_ids=position_ids,
                            cache=cache)[:, -1]
        next_position = lengths[:, None]
        # A finished row keeps decoding (its tokens discarded) until the call's longest budget is spent, which
        # can carry it past the model's last position.
        last_position = (self.model.max_seq_len or width + steps) - 1
        for step in range(steps):
            if interrupted():
                break
            step_logprobs = sampling_logprobs(logits, params.temperature, params.top_p)
            if params.temperature == 0:
                token = step_logprobs.argmax(-1)
            else:
                token = torch.multinomial(step_logprobs.exp(), 1, generator=self.generator).squeeze(-1)
            tokens[:, step] = token
            logprobs[:, step] = step_logprobs.gather(-1, token[:, None]).squeeze(-1)
            active = ~done
            kept += active
            hit_stop = torch.isin(token, stop_ids) & active
            stopped |= hit_stop
            done |= hit_stop | (kept >= budget)
            if bool(done.all()):
                break
            attention_mask[:, width + step] = 1
            logits = self.model(token[:, None], attention_mask=attention_mask[:, : width + step + 1],
                                position_ids=(next_position + step).clamp(max=last_position), cache=cache)[:, -1]

        reasons = [
            "stop" if was_stopped else "length" if was_done else "abort"
            for was_stopped, was_done in zip(stopped.tolist(), done.tolist())
        ]
        return [
            Continuation(row_tokens[:n], row_logprobs[:n], reason)
            for row_tokens, row_logprobs, n, reason in zip(tokens.tolist(), logprobs.tolist(), kept.tolist(), reasons)
        ]
