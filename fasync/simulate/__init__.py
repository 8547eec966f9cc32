"""`fasync simulate`: the three drivers in simulated time, to predict speed, staleness and length bias
before spending GPUs.

Pure Python with no heavy imports (no torch, ray or vllm), so that `fasync check` could run it too. The
rules come from where the drivers take them (`fasync.staleness`, `fasync.config.derived`); only time is
simulated, from a cost model that a real run's metrics calibrate. docs/simulate.md explains the model,
its limits and how well it predicts real runs.
"""
