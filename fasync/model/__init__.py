"""The policy model and its tokenizer.

`build_tokenizer` needs no torch; `build_model` and `token_logprobs` import it on first use, so
code that only tokenizes (building prompt groups) stays light.
"""

from fasync.model.tokenizer import CharTokenizer, HFTokenizer, Tokenizer, build_tokenizer

__all__ = ["CharTokenizer", "HFTokenizer", "Tokenizer", "build_model", "build_tokenizer", "token_logprobs"]


def __getattr__(name: str):
    if name in ("build_model", "token_logprobs", "sampling_logprobs"):
        from fasync.model import policy

        return getattr(policy, name)
    raise AttributeError(f"module 'fasync.model' has no attribute {name!r}")
