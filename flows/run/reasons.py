"""Reject reasons as people read them: the commonest apart, the others summed.

A server's refusal quotes each prompt's own numbers ("maximum context length of 8192 tokens. You
requested a total of 9131 tokens"), so a week of long prompts is thousands of one-off reasons: kept
apart they grew without bound in the live tally, hid the reasons that matter in `datagen status`, and
were sent whole with every refresh of the Prefect card. The rejects table keeps every one.
"""

from __future__ import annotations

from collections.abc import Mapping

OTHER_REASONS = "other reasons (each in the rejects table)"


def commonest_reasons(reasons: Mapping[str, int], shown: int) -> list[tuple[str, int]]:
    """The ``shown`` commonest reasons, then ``OTHER_REASONS`` summing up the others (and those a
    live tally summed already)."""
    ranked = sorted(
        ((reason, n) for reason, n in reasons.items() if reason != OTHER_REASONS),
        key=lambda item: (-item[1], item[0]),
    )
    top = ranked[:shown]
    rest = reasons.get(OTHER_REASONS, 0) + sum(n for _, n in ranked[shown:])
    return [*top, (OTHER_REASONS, rest)] if rest else top
