"""Parts of a run: every id in exactly one part, the same part on every machine, parts about even."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter

import pytest

from flows.store.parts import Part, PartError, part_index, part_of_file

IDS = [f"ultrachat-{n}" for n in range(20_000)]


def test_every_id_lands_in_exactly_one_part() -> None:
    parts = [Part(i, 4) for i in range(1, 5)]
    for record_id in IDS[:2000]:
        assert sum(part.owns(record_id) for part in parts) == 1


def test_parts_are_about_even() -> None:
    sizes = Counter(part_index(record_id, 8) for record_id in IDS)
    assert set(sizes) == set(range(1, 9))
    expected = len(IDS) / 8
    assert all(abs(size - expected) < 0.06 * expected for size in sizes.values()), sizes


def test_the_part_of_an_id_is_the_same_in_another_process() -> None:
    """Python's hash() of a str changes with each process's seed; the partition must not."""
    sample = IDS[:500]
    code = (
        "import json, sys; from flows.store.parts import part_index; "
        "print(json.dumps([part_index(i, 7) for i in json.load(sys.stdin)]))"
    )
    for seed in ("1", "2"):
        done = subprocess.run(
            [sys.executable, "-c", code],
            input=json.dumps(sample),
            capture_output=True,
            text=True,
            check=True,
            env={"PYTHONHASHSEED": seed, "PATH": ""},
        )
        assert json.loads(done.stdout) == [part_index(i, 7) for i in sample]


def test_one_part_owns_everything() -> None:
    assert all(Part(1, 1).owns(record_id) for record_id in IDS[:100])


@pytest.mark.parametrize("text", ["0/2", "3/2", "1/0", "a/b", "1", "1/2/3", "-1/2", "", "1/100001"])
def test_a_part_that_does_not_exist_is_refused(text: str) -> None:
    with pytest.raises(PartError, match="i/K"):
        Part.parse(text)


def test_parse_label_and_file_names_agree() -> None:
    part = Part.parse(" 2 / 5 ")
    assert (part.index, part.count, str(part)) == (2, 5, "2/5")
    assert part_of_file(f"{part.label}-0001764000000000-123-00001.parquet") == "2/5"
    assert part_of_file("part-0001764000000000-123-00001.parquet") is None
