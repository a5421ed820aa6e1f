"""Parts of a run: the prompts split by a stable hash of their id, one part per machine.

Where one machine is not enough, K processes (K Prefect workers, K nodes) each run ``--part i/K``
into one output location: each asks only the prompts whose id hashes to its part, so no id is ever
written by two parts, and each part resumes on its own. The hash is blake2b of the id, never
Python's ``hash()``, which is salted per process: two machines must agree on every id's part.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

_SPEC = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$")
_LABEL = re.compile(r"part-(\d+)-of-(\d+)-")
MAX_PARTS = 10_000


class PartError(ValueError):
    """A ``--part`` value that is not ``i/K`` with 1 <= i <= K (the CLI exits 2 with this line)."""


def part_index(record_id: str, count: int) -> int:
    """The part (1-based) that owns ``record_id`` among ``count`` parts: the same on every machine."""
    digest = hashlib.blake2b(record_id.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % count + 1


@dataclass(frozen=True)
class Part:
    """Part ``index`` of ``count`` (1-based, as people count machines: 1/4 .. 4/4)."""

    index: int
    count: int

    def __post_init__(self) -> None:
        if not 1 <= self.count <= MAX_PARTS or not 1 <= self.index <= self.count:
            raise PartError(
                f"part {self.index}/{self.count} does not exist: write i/K with 1 <= i <= K <= {MAX_PARTS}"
            )

    @classmethod
    def parse(cls, text: str) -> Part:
        """``"2/4"`` -> Part(2, 4); anything else is a ``PartError`` saying what to write."""
        match = _SPEC.match(text)
        if match is None:
            raise PartError(f"--part {text!r}: write i/K, e.g. --part 1/4 (parts are counted from 1)")
        return cls(int(match.group(1)), int(match.group(2)))

    def owns(self, record_id: str) -> bool:
        return part_index(record_id, self.count) == self.index

    @property
    def label(self) -> str:
        """What this part's file names carry, so two parts never write the same name."""
        return f"part-{self.index}-of-{self.count}"

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


def part_of_file(name: str) -> str | None:
    """The part label a shard's file name carries (``"1/4"``), None for a shard of an unpartitioned run."""
    match = _LABEL.match(name)
    return None if match is None else f"{match.group(1)}/{match.group(2)}"
