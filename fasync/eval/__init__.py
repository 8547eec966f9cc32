"""Evaluation on held-out prompts: during training (`eval` config section) and of a finished run (`fasync eval`).

`scores` turns scored completions into the `eval/` metrics (no torch, no Ray); `prompts` builds the eval set;
`evaluation` generates and scores it on the run's engines.
"""
