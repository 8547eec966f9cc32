"""How much of the vocabulary projection scoring (fasync.model.scoring) computes at once.

Apart from scoring.py, which imports torch, so that the memory estimate (fasync.memory, torch-free) counts the
same chunk.
"""

LOGIT_CHUNK_ELEMENTS = 1 << 26
"""fp32 logits per scoring chunk (256 MiB): 441 positions of a 152k vocabulary, 2,097 of a 32k one."""
