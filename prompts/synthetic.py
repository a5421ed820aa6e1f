"""Synthetic prompt sets of any size, for load tests, benchmarks and smoke runs against a server.

Deterministic (row i is always the same), in the UltraChat ``messages`` layout, with prompt lengths
that vary row to row, and optionally rows that must be rejected: unusable ones (no user turn) and
ones longer than a small model's context.
"""

from __future__ import annotations

import json
from pathlib import Path

WORDS = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "kernel",
    "cache",
    "decode",
    "prefill",
    "token",
    "batch",
    "queue",
    "drafter",
]


def write_synthetic_prompts(
    path: Path,
    count: int,
    *,
    bad_every: int = 0,
    long_every: int = 0,
    tag: str = "p",
    max_words: int = 40,
) -> int:
    """Write ``count`` rows with ids ``<tag>00000``...; return how many are convertible.

    Every ``bad_every``-th row has no user turn; every ``long_every``-th row carries ~56k characters.
    """
    good = 0
    with path.open("w", encoding="utf-8") as handle:
        for i in range(count):
            rid = f"{tag}{i:05d}"
            if bad_every and i % bad_every == bad_every - 1:
                messages = [{"role": "assistant", "content": "no question"}]
            else:
                words = " ".join(WORDS[(i + k) % len(WORDS)] for k in range(5 + i % max_words))
                text = f"Question {tag}{i}: explain {words}."
                if long_every and i % long_every == long_every - 1:
                    text += " filler" * 8000
                messages = [{"role": "user", "content": text}]
                good += 1
            handle.write(json.dumps({"prompt_id": rid, "messages": messages}) + "\n")
    return good
