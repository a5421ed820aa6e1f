"""Exact prompt dedup: the same question asked twice costs GPU time twice and teaches nothing new.

"Exact" after normalisation: Unicode NFKC, whitespace runs collapsed, ends trimmed. Case and
punctuation are kept: "Explain X." and "explain x" may well deserve different answers.
"""

from __future__ import annotations

import hashlib
import json
import re
import unicodedata
from collections.abc import Sequence
from typing import Any

_SPACE = re.compile(r"\s+")


def normalize_text(text: str) -> str:
    return _SPACE.sub(" ", unicodedata.normalize("NFKC", text)).strip()


def prompt_key(messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None = None) -> str:
    """A hash of what the model is asked: roles and normalised texts of the turns, plus tool names."""
    turns = [[m.get("role"), normalize_text(m.get("content") or "")] for m in messages]
    names = sorted(str((t.get("function") or {}).get("name")) for t in tools or [])
    payload = json.dumps([turns, names], ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()[:32]


class DedupIndex:
    """Which category claimed which prompt, across the whole run (and from disk on resume)."""

    def __init__(self) -> None:
        self._owner: dict[str, str] = {}

    def claim(self, key: str, category: str) -> str | None:
        """Claim ``key`` for ``category``; return the earlier owner if it was already claimed."""
        owner = self._owner.get(key)
        if owner is None:
            self._owner[key] = category
        return owner

    def __len__(self) -> int:
        return len(self._owner)


def sample_score(seed: int, record_id: str) -> float:
    """A uniform number in [0, 1) fixed by (seed, id): the basis of stable quota sampling."""
    digest = hashlib.sha256(f"{seed}:{record_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64
