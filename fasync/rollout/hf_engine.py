"""The torch rollout engine: batched sampling with a KV cache, for the embedded model and Hugging Face ones.

Contexts of different lengths are left-padded into one batch, with an attention
mask and position ids that count real tokens only, so every row sees exactly
what it would see alone. Each step samples one token for all rows at once.

Behaviour logprobs are those of the distribution actually sampled from:
softmax(logits / temperature) cut to the top-k tokens, then to the top-p nucleus, and renormalised
(`fasync.model.policy.sampling_logprobs`). At temperature 1, top_p 1 and no top_k they
equal the trainer's `token_logprobs` on the same weights; greedy decoding
(temperature 0) reports the untempered model's logprobs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn.utils.rnn import pad_sequence

from fasync.model.policy import sampling_logprobs
from fasync.rollout.engine import Continuation, RolloutEngine
from fasync.rollout.types import SamplingParams


@dataclass
class Prefix:
    """Where a context's keys and values sit: row `row`, positions [start, end) of the cache `layers`."""

    layers: list[tuple[torch.Tensor, torch.Tensor]]
    row: int
    start: int
    end: int


class HFEngine(RolloutEngine):
    def __init__(self, model: nn.Module, pad_id: int, device: str = "cpu", seed: int = 0):
        super().__init__()
        self.device = torch.device(device)
        self.model = model.to(self.device).eval()
        self.pad_id = pad_id
        self.generator = torch.Generator(device=self.device).manual_seed(seed)
        self._prefixes: dict[tuple[int, ...], Prefix] = {}
        """The contexts the last call left unfinished (all but their newest token), as the loaded weights
        computed them: a call that continues one skips its prefill, as a prefix cache would."""

    def rng_state(self) -> bytes:
        # Bytes, not the generator's uint8 tensor: the driver keeps it in driver.pt without importing torch.
        return self.generator.get_state().numpy().tobytes()

    def set_rng_state(self, state) -> None:
        """What `rng_state` returned; a checkpoint written before it returned bytes holds the tensor itself."""
        if state is not None:
            self.generator.set_state(state if isinstance(state, torch.Tensor) else
                                     torch.frombuffer(bytearray(state), dtype=torch.uint8))

    def _load_state_dict(self, state_dict: dict) -> None:
        self.model.load_state_dict(state_dict)
        self._prefixes = {}  # keys and values of the old weights

    def _served_parameters(self, names: list[str]) -> dict:
        served = self.model.state_dict()
        return {name: served[name] for name in names}

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
        if interrupted():
            return [Continuation([], [], "abort") for _ in contexts]
        prefixes = [self._prefixes.get(tuple(c[:-1])) for c in contexts]
        # Only the unfinished rows of this call are continued by the next one: nothing else is kept.
        self._prefixes = {}
        buckets = length_buckets([row for row, prefix in enumerate(prefixes) if prefix is None], contexts)
        if (any(prefixes) or len(buckets) > 1) and min(lengths.tolist()) > 1:
            cache, base, logits = self._assemble(contexts, lengths, prefixes, buckets, steps)
        else:
            cache, base, logits = self._prefill(contexts, steps)
        # Column `base + t` holds the token sampled at step t; each row's context ends just before `base`.
        attention_mask = torch.zeros(batch, base + steps, dtype=torch.long, device=device)
        attention_mask[:, :base] = torch.arange(base, device=device) >= (base - lengths)[:, None]
        # A finished row keeps decoding (its tokens discarded) until the call's longest budget is spent, which
        # can carry it past the model's last position.
        last_position = (self.model.max_seq_len or base + steps) - 1
        budget = torch.tensor(budgets, device=device)
        stop_ids = torch.tensor(params.stop_token_ids, dtype=torch.long, device=device)

        tokens = torch.zeros(batch, steps, dtype=torch.long, device=device)
        logprobs = torch.zeros(batch, steps, device=device)
        kept = torch.zeros(batch, dtype=torch.long, device=device)
        stopped = torch.zeros(batch, dtype=torch.bool, device=device)
        done = torch.zeros(batch, dtype=torch.bool, device=device)
        for step in range(steps):
            if interrupted():
                break
            step_logprobs = sampling_logprobs(logits, params.temperature, params.top_p, params.top_k)
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
            attention_mask[:, base + step] = 1
            logits = self.model(token[:, None], attention_mask=attention_mask[:, : base + step + 1],
                                position_ids=(lengths[:, None] + step).clamp(max=last_position), cache=cache)[:, -1]

        return self._continuations(contexts, cache, base, tokens, logprobs, kept, stopped, done)

    def _continuations(self, contexts: list[list[int]], cache, base: int, tokens: torch.Tensor,
                       logprobs: torch.Tensor, kept: torch.Tensor, stopped: torch.Tensor,
                       done: torch.Tensor) -> list[Continuation]:
        """Each row's continuation from the decode's tensors; an unstopped row's cache is kept as a prefix that
        the next call may continue."""
        kept_list, tokens_list = kept.tolist(), tokens.tolist()
        layers = self.model.cache_layers(cache)
        for row, (context, n, was_stopped) in enumerate(zip(contexts, kept_list, stopped.tolist())):
            if not was_stopped:
                # Everything but the newest token went through the model: what a continuing call would prefill.
                self._prefixes[tuple((context + tokens_list[row][:n])[:-1])] = Prefix(
                    layers, row, base - len(context), base + n - 1)
        reasons = [
            "stop" if was_stopped else "length" if was_done else "abort"
            for was_stopped, was_done in zip(stopped.tolist(), done.tolist())
        ]
        return [
            Continuation(row_tokens[:n], row_logprobs[:n], reason)
            for row_tokens, row_logprobs, n, reason in zip(tokens_list, logprobs.tolist(), kept_list, reasons)
        ]

    def _prefill(self, contexts: list[list[int]], room: int):
        """The contexts left-padded through the model: (cache with `room` more positions, width, last logits).
        Identical contexts (a prompt's `n_samples_per_prompt` rows) go through the model once and their rows share
        its keys, values and logits, as a prefix cache would share them: at the medium shape the prefill is a
        quarter of a generate call, and 4 samples per prompt make three of its four rows repeats."""
        distinct: dict[tuple[int, ...], int] = {}
        rows = [distinct.setdefault(tuple(context), len(distinct)) for context in contexts]
        if len(distinct) == len(contexts):
            return self._prefill_rows(contexts, room)
        cache, width, logits = self._prefill_rows([list(context) for context in distinct], 0)
        index = torch.tensor(rows, device=self.device)
        layers = [(keys.index_select(0, index), values.index_select(0, index))
                  for keys, values in self.model.cache_layers(cache)]
        return self.model.cache_from_layers(layers, width + room), width, logits.index_select(0, index)

    def _prefill_rows(self, contexts: list[list[int]], room: int):
        """`_prefill` of every row as given."""
        device = self.device
        lengths = torch.tensor([len(c) for c in contexts], device=device)
        width = int(lengths.max())
        input_ids = pad_sequence(
            [torch.tensor(c, device=device) for c in contexts],
            batch_first=True, padding_value=self.pad_id, padding_side="left",
        )
        mask = (torch.arange(width, device=device) >= (width - lengths)[:, None]).long()
        position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
        cache = self.model.new_cache(len(contexts), width + room)
        logits = self.model(input_ids, attention_mask=mask, position_ids=position_ids, cache=cache)[:, -1]
        return cache, width, logits

    def _assemble(self, contexts: list[list[int]], lengths: torch.Tensor, prefixes: list[Prefix | None],
                  buckets: list[list[int]], steps: int):
        """Like `_prefill`, but each bucket of rows is prefilled (all but its last token) at its own width, the rows
        an earlier call left unfinished bring their keys and values instead, and then every row's last token goes
        through the model."""
        device = self.device
        for bucket in buckets:
            cache, width, _ = self._prefill([contexts[row][:-1] for row in bucket], 0)
            layers = self.model.cache_layers(cache)
            for index, row in enumerate(bucket):
                prefixes[row] = Prefix(layers, index, width - len(contexts[row]) + 1, width)
        merged = [
            tuple(pad_sequence([p.layers[layer][kind][p.row, :, p.start:p.end].transpose(0, 1) for p in prefixes],
                               batch_first=True, padding_side="left").transpose(1, 2)
                  for kind in (0, 1))
            for layer in range(len(prefixes[0].layers))
        ]
        width = merged[0][0].shape[2]
        cache = self.model.cache_from_layers(merged, width + 1 + steps)
        mask = torch.zeros(len(contexts), width + 1, dtype=torch.long, device=device)
        mask[:, :width] = torch.arange(width, device=device) >= (width - lengths + 1)[:, None]
        mask[:, width] = 1
        last = torch.tensor([c[-1] for c in contexts], device=device)[:, None]
        logits = self.model(last, attention_mask=mask, position_ids=lengths[:, None] - 1, cache=cache)[:, -1]
        return cache, width + 1, logits


def length_buckets(rows: list[int], contexts: list[list[int]]) -> list[list[int]]:
    """The rows in groups of similar context length, none padded to more than twice its own length: one
    long prompt must not make every short one in the call pay for its width."""
    buckets: list[list[int]] = []
    for row in sorted(rows, key=lambda r: len(contexts[r])):
        if buckets and len(contexts[row]) <= 2 * len(contexts[buckets[-1][0]]):
            buckets[-1].append(row)
        else:
            buckets.append([row])
    return buckets
