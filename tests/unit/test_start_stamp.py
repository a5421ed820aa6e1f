"""A start's stamp: names its files, reads back as the moment it began, sorts as time runs."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from flows.store.start_stamp import START_STAMP, stamp_moment, start_stamp


def test_a_stamp_reads_back_as_the_moment_it_was_made() -> None:
    before = datetime.now(UTC)
    stamp = start_stamp()
    after = datetime.now(UTC)
    assert before <= stamp_moment(stamp) <= after


def test_stamps_sort_by_name_as_their_moments_sort() -> None:
    moments = [datetime(2026, 12, 7, 9, 59, 59, 999_999, UTC) + timedelta(microseconds=k) for k in (0, 1, 10)]
    moments.append(datetime(2026, 12, 7, 10, 0, 0, 0, UTC) + timedelta(days=40))
    names = [moment.strftime(START_STAMP) for moment in moments]
    assert sorted(names) == names
    assert [stamp_moment(name) for name in names] == moments
