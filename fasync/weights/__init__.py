"""The weight path: how the trainer's weights reach the rollout engines, and what each engine is checked for.

- `transport`: which way a run's weights travel, by placement (`cpu`, `ipc`, `nccl`); torch-free.
- `cpu`: the Hugging Face names every transport loads under, and the vLLM worker side of the `cpu` transport,
  which reloads the state dict handed to it in process.
- `buckets`: the trainer's weights gathered out of any sharding one bucket at a time, in the engines' dtype.
- `sender`: the `ipc` and `nccl` transports, vLLM's weight transfer engines driven by the trainer ranks.
- `checksum`: what the trainer and every engine checksum, so that a sync that did not land fails the run.

The driver's side of a sync (publishing a version, checking what every engine serves) is
`fasync.drivers.weight_sync`.
"""
