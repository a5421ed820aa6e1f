"""Exact prompt dedup: the same question asked twice costs GPU time twice and teaches nothing new.

"Exact" after normalisation (``normalize_text``): Unicode NFC, line endings as ``\\n``, trailing
whitespace of each line, blank lines around the text and a margin shared by every line dropped, each
whitespace run inside a line (after its indentation) as one space. The line structure is kept: two
code prompts that differ in indentation or line breaks are different programs, not one question
asked twice. Case and punctuation are kept too: "Explain X." and "explain x" may well deserve
different answers.

The key is versioned. Version 1 (``collapse_whitespace``) made every whitespace run one space, line
breaks and indentation included, and so merged different programs. A run stores each prompt's key
(``prompt_hash``) and claims the stored keys on resume, so a run keeps the version it was started
with (its manifest says which): with another key, the exact duplicate of a prompt it answered would
not match and would be asked again.
"""

from __future__ import annotations

import hashlib
import json
import re
import textwrap
import unicodedata
from collections.abc import Callable, Sequence
from typing import Any

_SPACE = re.compile(r"\s+")
_LINE_END = re.compile(r"\r\n?")


def collapse_whitespace(text: str) -> str:
    """Key version 1: NFKC, every whitespace run one space (newlines and indentation too), ends trimmed."""
    return _SPACE.sub(" ", unicodedata.normalize("NFKC", text)).strip()


def normalize_text(text: str) -> str:
    """Key version 2: NFC and spacing that does not change the question, with the lines kept.

    NFC, not version 1's NFKC: NFKC folds compatibility characters, and ``x²`` and ``x2``, or ``½``
    and ``1⁄2``, are different questions (a math set's rows merged). NFC only joins the spellings of
    one character (``e`` and a combining accent, and ``é``).

    Each line keeps its indentation (spaces and tabs, exactly), except a margin every non-blank line
    shares: a block pasted indented is the same block, and only the indentation of lines against each
    other is structure. After the indentation, every whitespace run is one space.

    Runs of blank lines are kept as they are, not collapsed: a blank line can be content (inside a
    string literal, a heredoc, an expected output), and the two mistakes are not alike: a duplicate
    kept because of a blank line costs one more answer, two questions merged lose a row.
    """
    lines = _LINE_END.sub("\n", unicodedata.normalize("NFC", text)).split("\n")
    block = textwrap.dedent("\n".join(line.rstrip() for line in lines)).strip("\n")
    return "\n".join(_squeeze_inside(line) for line in block.split("\n"))


def _squeeze_inside(line: str) -> str:
    """The line's indentation as it is, then every whitespace run one space."""
    body = line.lstrip(" \t")
    return line[: len(line) - len(body)] + _SPACE.sub(" ", body)


_NORMALIZERS: dict[int, Callable[[str], str]] = {1: collapse_whitespace, 2: normalize_text}
"""Key version -> the normalisation its keys hash."""
KEY_VERSIONS = frozenset(_NORMALIZERS)
KEY_VERSION = 2
"""The key version a new run records and uses."""
FIRST_KEY_VERSION = 1
"""The version of a run whose manifest names none: made before the key had versions."""


def prompt_key(
    messages: Sequence[dict[str, Any]],
    tools: Sequence[dict[str, Any]] | None = None,
    *,
    version: int = KEY_VERSION,
) -> str:
    """A hash of what the model is asked: roles and normalised texts of the turns, plus tool names.

    The payload is the same in every version; only the normalisation of the texts differs.
    """
    normalize = normalizer(version)
    turns = [[m.get("role"), normalize(m.get("content") or "")] for m in messages]
    names = sorted(str((t.get("function") or {}).get("name")) for t in tools or [])
    payload = json.dumps([turns, names], ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()[:32]


def normalizer(version: int) -> Callable[[str], str]:
    """The normalisation of key ``version``; a ``ValueError`` for one this code does not know (a run
    started by a newer version of the project)."""
    try:
        return _NORMALIZERS[version]
    except KeyError:
        known = ", ".join(map(str, sorted(_NORMALIZERS)))
        raise ValueError(
            f"prompt key version {version} is unknown to this version of the project (it knows {known}): "
            "resume the run with the version that started it"
        ) from None


class DedupIndex:
    """Which category claimed which prompt, across the whole run (and from disk on resume).

    ``version``: the key version of the keys claimed here (the run's); the stream hashes with it.
    """

    def __init__(self, version: int = KEY_VERSION) -> None:
        normalizer(version)  # an unknown version is refused before any prompt is read
        self.version = version
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
