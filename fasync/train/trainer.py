"""The trainer: advantages, optimizer steps over a rollout, off-policy correction, and weights for the engines.

One `train_rollout` call trains on one rollout (fully_async: one drain). Samples get their
advantages over full groups (from rewards with the overlong shaping, if any), and `train.ppo_epochs` times
are shuffled and split into `num_steps_per_rollout` steps (the rest trimmed); each step accumulates gradients
over micro batches before one optimizer step, at the learning rate of the schedule (fasync.train.schedule).

The PPO ratio's anchor (`correction.ratio_anchor`, defaulted per mode in `fasync.config.derived`):
- `behaviour`: the rollout logprobs. The ratio already is the importance ratio, so correction
  weights are not applied again (masks and diagnostics still are). No extra forward.
- `recompute`: the trainer's own logprobs at the start of the rollout; correction weights
  π_old / π_behav when `correction.level` is set. The first step's anchor is its own forward, detached
  (no update has happened yet, so a no-grad forward would give the same values); only the later steps of
  a rollout (`num_steps_per_rollout > 1`, or `ppo_epochs > 1`) need the extra no-grad forward, taken before
  the first step.
- `proximal` (decoupled PPO): the policy at the start of each optimizer step. Weights do not change
  within a step, so these are the step's own forward, detached: no extra forward. The ratio's
  value is then 1 and its gradient the policy gradient; the weights π_prox / π_behav carry the
  off-policy correction.
"""

from __future__ import annotations

import math
import random
import time
from collections import defaultdict

import torch
from torch import Tensor

from fasync.killpoints import kill_point
from fasync.model import build_model, build_tokenizer, lora
from fasync.model.policy import DTYPES
from fasync.rollout.types import Sample
from fasync.train import correction, distributed
from fasync.train.advantages import compute_advantages, overlong_penalty
from fasync.train.batching import MicroBatch, collate, plan_steps, rank_micro_batches
from fasync.train.losses import aggregate, clipped_surrogate, k3_kl
from fasync.train.schedule import lr_factor
from fasync.weights.buckets import DEFAULT_BUCKET_BYTES, full_value, weight_buckets

# Correction metrics that combine across micro batches by max instead of a token-weighted mean.
_MAX_METRICS = {"is/weight_max"}


class Trainer:
    def __init__(self, resolved, rank: int = 0, world_size: int = 1, init_method: str | None = None):
        """`resolved`: the config with what follows from it (`fasync.launch.plan.Resolved`)."""
        self.cfg = cfg = resolved.config
        self.derived = resolved.derived
        self.strategy = self.derived.train_strategy
        self.rank, self.world_size = rank, world_size
        self.device = distributed.local_device(cfg.resources.gpus_per_trainer_rank)
        tokenizer = build_tokenizer(cfg.model, cfg.data, chat=cfg.rollout.agentic)
        self.pad_id = tokenizer.pad_id
        distributed.init(rank, world_size, init_method, self.device, always=self.strategy == "fsdp2")
        self.compute_dtype = DTYPES[cfg.model.dtype]
        # fp32 master weights, so that the AdamW moments and the updates are fp32 too: in bf16, an update
        # at lr 1e-6 is below the weights' precision and vanishes. The forward runs in `model.dtype`.
        # Eval mode throughout, gradients or not: with dropout on, the policy trained would not be the one the
        # engines sample from (and score behaviour logprobs with), so even fresh samples would look off-policy.
        self.model = build_model(cfg.model, tokenizer, seed=cfg.train.seed, dtype=torch.float32).to(self.device).eval()
        if cfg.model.lora is not None:
            lora.apply(self.model, cfg.model.lora, cfg.train.seed)
        self.engine_weights = lora.EngineWeights(self.model) if cfg.model.lora is not None else self.model
        """What the engines load, read through `state_dict()`: the model, or its merged weights under LoRA."""
        if cfg.train.activation_checkpointing:
            from torch.distributed._composable import checkpoint

            for layer in self.model.decoder_layers():
                checkpoint(layer)
        self.reference = None
        if cfg.train.kl_coef > 0:
            self.reference = build_model(cfg.model, tokenizer, seed=cfg.train.seed).to(self.device).eval()
            self.reference.requires_grad_(False)
        if self.strategy == "fsdp2":
            # Every rank builds the same weights (one seed, or the same files), so nothing is broadcast.
            distributed.shard(self.model, self.compute_dtype)
            if self.reference is not None:
                distributed.shard(self.reference, self.compute_dtype, trainable=False)
        else:
            distributed.broadcast_parameters(self.model)
            if self.reference is not None:
                self.reference.load_state_dict(self.engine_weights.state_dict())
        # Only what trains: under LoRA the adapters, so AdamW holds moments for them alone.
        self.optimizer = torch.optim.AdamW([p for p in self.model.parameters() if p.requires_grad], lr=cfg.train.lr,
                                           weight_decay=cfg.train.weight_decay)
        self.rollouts = 0
        self.steps = 0

    # -- training ------------------------------------------------------------------------------

    def train_rollout(self, samples: list[Sample], current_version: int) -> list[dict]:
        """Train on one rollout at weight version `current_version`; one record per optimizer step."""
        train = self.cfg.train
        advantages = compute_advantages(self._shaped_rewards(samples), [s.group_id for s in samples],
                                        train.advantage_estimator, train.normalize_advantage_std,
                                        [sum(s.trained) for s in samples])
        for sample, advantage in zip(samples, advantages):
            sample.advantage = advantage
        rng = random.Random(train.seed * 1_000_003 + self.rollouts)
        self.rollouts += 1
        # Every epoch's steps are planned (and their anchors taken) before the first one changes the weights.
        planned = []
        for epoch in range(train.ppo_epochs):
            order = list(range(len(samples)))
            rng.shuffle(order)
            shuffled = [samples[i] for i in order]
            steps, _ = plan_steps(len(shuffled), self.derived, train.use_dynamic_global_batch_size)
            planned += [(epoch, [shuffled[i] for i in step], batches)
                        for step, batches in zip(steps, self._micro_batches(shuffled, steps))]
        if self.derived.ratio_anchor == "recompute":
            for _, _, batches in planned[1:]:
                for batch in batches:
                    batch.anchor_logp = self._logprobs(batch)
        records = []
        for epoch, step_samples, batches in planned:
            record = self._step(step_samples, batches, current_version)
            if train.ppo_epochs > 1:
                record["epoch"] = epoch
            records.append(record)
        return records

    def _shaped_rewards(self, samples: list[Sample]) -> list[float]:
        """The rewards the advantages are computed from: each sample's, plus DAPO's overlong penalty when
        `reward.overlong_buffer` is set. The step records' `reward_mean` stays the task's reward."""
        reward, budget = self.cfg.reward, self.cfg.rollout.max_new_tokens
        if reward.overlong_buffer is None:
            return [s.reward for s in samples]
        return [s.reward + overlong_penalty(len(s.output_ids), s.finish_reason == "length", budget,
                                            reward.overlong_buffer, reward.overlong_penalty) for s in samples]

    def _micro_batches(self, samples: list[Sample], steps: list[range]) -> list[list[MicroBatch]]:
        train = self.cfg.train
        packed = train.max_tokens_per_micro_batch is not None
        lengths = [len(s.prompt_ids) + len(s.output_ids) for s in samples]
        return [
            [collate([samples[i] for i in rows], self.pad_id, packed).to(self.device)
             for rows in rank_micro_batches(step, lengths, self.rank, self.world_size, self.derived.micro_batch_size,
                                            train.max_tokens_per_micro_batch)]
            for step in steps
        ]

    def _scores(self, batch: MicroBatch, model=None, entropy_grad: bool = False) -> tuple[Tensor, Tensor]:
        """Logprobs and entropies [S, L] of the batch's completion tokens (`MicroBatch.scored`)."""
        model = self.model if model is None else model
        # FSDP2 casts the parameters itself; replicated fp32 master weights compute under autocast.
        autocast = self.strategy == "ddp" and self.compute_dtype != torch.float32 and model is self.model
        with torch.autocast(self.device.type, dtype=self.compute_dtype, enabled=autocast):
            logp, entropy = model(batch.input_ids, position_ids=batch.position_ids,
                                  score=batch.request(self.cfg.rollout.temperature, entropy_grad))
        return batch.scored(logp), batch.scored(entropy)

    @torch.no_grad()
    def _logprobs(self, batch: MicroBatch, model=None) -> Tensor:
        return self._scores(batch, model)[0]

    def _step(self, step_samples: list[Sample], batches: list[MicroBatch], current_version: int) -> dict:
        kill_point("trainer_step")
        start = time.monotonic()
        tokens = sum(b.num_tokens for b in batches)
        step_tokens, step_sequences = (int(v) for v in distributed.sum_scalars(
            [tokens, sum(int(b.completion_mask.any(-1).sum()) for b in batches)], self.device))
        sums: dict[str, float] = defaultdict(float)
        # Correction metrics of this rank: token-weighted sums, and maxima.
        correction_sums: dict[str, float] = defaultdict(float)
        correction_maxima: dict[str, float] = {}

        self.optimizer.zero_grad(set_to_none=True)
        train = self.cfg.train
        for group in self.optimizer.param_groups:
            group["lr"] = train.lr * lr_factor(self.steps, train.lr_warmup_steps, self.derived.total_optimizer_steps,
                                               train.lr_schedule)
        for batch in batches:
            corrected = self._backward(batch, step_tokens, step_sequences, sums)
            batch_tokens = batch.num_tokens
            for name, value in corrected.metrics.items() if batch_tokens else ():
                if name in _MAX_METRICS:
                    correction_maxima[name] = max(correction_maxima.get(name, value), value)
                else:
                    correction_sums[name] += value * batch_tokens

        names = ["loss", "pg_loss", "entropy", "kl", "clipped", "kept"]
        totals = dict(zip(names, distributed.sum_scalars([sums[name] for name in names], self.device)))
        record, grad_norm = self._optimizer_step(totals)
        correction_metrics = _combine_correction_metrics(
            distributed.gather_objects((correction_sums, correction_maxima)), step_tokens)
        correction_metrics["is/all_rejected"] = float(record["skipped"])

        staleness = [s.staleness(current_version) for s in step_samples]

        def sample_mean(value) -> float:
            """The mean of `value(sample)` over the step's samples (0 for a step without any)."""
            return sum(value(s) for s in step_samples) / max(len(step_samples), 1)

        record.update({
            "loss": totals["loss"],
            "pg_loss": totals["pg_loss"],
            "kl": totals["kl"],
            "entropy": totals["entropy"],
            "clip_fraction": totals["clipped"] / max(totals["kept"], 1),
            "grad_norm": grad_norm,
            "lr": self.optimizer.param_groups[0]["lr"],
            "num_samples": len(step_samples),
            "num_tokens": step_tokens,
            "reward_mean": sample_mean(lambda s: s.reward),
            "advantage_abs_mean": sample_mean(lambda s: abs(s.advantage)),
            "response_length_mean": sample_mean(lambda s: len(s.output_ids)),
            "response_truncated_fraction": sample_mean(lambda s: s.finish_reason == "length"),
            "staleness_mean": sum(staleness) / max(len(staleness), 1),
            "staleness_max": max(staleness, default=0),
            "train_time_s": time.monotonic() - start,
            **correction_metrics,
        })
        return record

    def _backward(self, batch: MicroBatch, step_tokens: int, step_sequences: int, sums: dict[str, float]):
        """One micro-batch's loss, backpropagated, its parts added to `sums`; returns its correction."""
        train = self.cfg.train
        logp, entropy = self._scores(batch, entropy_grad=train.entropy_coef != 0)
        if self.derived.ratio_anchor == "behaviour":
            old = batch.behaviour_logprobs
            corrected = correction.apply(logp, old, batch.completion_mask, self.cfg.correction)
            weights = torch.ones_like(logp)
        else:
            # proximal, and the first step of recompute: the weights have not moved since they
            # produced `logp`, so the anchor is the step's own forward, detached.
            old = logp.detach() if batch.anchor_logp is None else batch.anchor_logp
            corrected = correction.apply(old, batch.behaviour_logprobs, batch.completion_mask,
                                         self.cfg.correction)
            weights = corrected.weights
        keep = corrected.keep_mask
        clip_low, clip_high = self.derived.clip_eps
        surrogate, clipped = clipped_surrogate(logp, old, batch.advantages, clip_low, clip_high,
                                               batch.completion_mask, train.importance_ratio)
        terms = {"pg_loss": surrogate * weights, "entropy": entropy}
        if self.reference is not None:
            terms["kl"] = k3_kl(logp, self._logprobs(batch, self.reference))
        parts = {name: aggregate(values, keep, train.loss_aggregation, step_tokens, step_sequences,
                                 self.cfg.rollout.max_new_tokens)
                 for name, values in terms.items()}
        loss = parts["pg_loss"] + train.kl_coef * parts.get("kl", 0.0) - train.entropy_coef * parts["entropy"]
        loss.backward()
        kept = int(keep.sum())
        sums["loss"] += float(loss.detach())
        for name, part in parts.items():
            sums[name] += float(part.detach())
        sums["clipped"] += float((clipped & keep).sum())
        sums["kept"] += kept
        return corrected

    def _optimizer_step(self, totals: dict[str, float]) -> tuple[dict, float]:
        """The optimizer step on the gradients of every micro-batch, unless no token was kept or the loss or
        the gradient is not finite; returns the record's skip fields and the gradient norm."""
        train = self.cfg.train
        record = {"skipped": totals["kept"] == 0, "skip_reason": None, "nonfinite_skipped": 0}
        if record["skipped"]:
            # Every token was rejected: a step now would only apply weight decay and momentum.
            record["skip_reason"] = "all tokens rejected by correction"
            return record, 0.0
        if self.strategy == "ddp":
            distributed.sum_gradients(self.model)
        max_norm = train.grad_clip if train.grad_clip is not None else float("inf")
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm)
        grad_norm = float(full_value(norm))
        # Every rank holds the same summed loss and global norm, so every rank skips the same steps.
        broken = [name for name, value in (("loss", totals["loss"]), ("gradient", grad_norm))
                  if not math.isfinite(value)]
        if broken:
            # One NaN step would make every weight NaN, and the engines would sample from garbage.
            record.update(skipped=True, nonfinite_skipped=1,
                          skip_reason=f"non-finite {' and '.join(broken)} (NaN or inf): no optimizer step")
            self.optimizer.zero_grad(set_to_none=True)
        else:
            self.optimizer.step()
            self.steps += 1
        return record, grad_norm

    # -- weights -------------------------------------------------------------------------------

    def weight_buckets(self, bucket_bytes: int = DEFAULT_BUCKET_BYTES):
        """The policy's weights in the engines' dtype, whole, bucketed, on the trainer's device; every rank
        must iterate (`fasync.weights.buckets`)."""
        return weight_buckets(self.engine_weights, self.compute_dtype, bucket_bytes)

    def rollout_state_dict(self) -> dict[str, Tensor]:
        """Weights for the rollout engines, on the CPU (what crosses to the engine actors); every rank must call."""
        return {name: tensor.cpu() for bucket in self.weight_buckets() for name, tensor in bucket}


def _combine_correction_metrics(shares: list[tuple[dict[str, float], dict[str, float]]], step_tokens: int) -> dict:
    """The step's correction metrics from every rank's (token-weighted sums, maxima): token means over the
    whole step, and maxima over all ranks. A rank without tokens this step contributes nothing."""
    metrics: dict[str, float] = defaultdict(float)
    for sums, maxima in shares:
        for name, value in sums.items():
            metrics[name] += value / max(step_tokens, 1)
        for name, value in maxima.items():
            metrics[name] = max(metrics.get(name, value), value)
    return metrics
