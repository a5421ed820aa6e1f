"""Pure builders: a finished request becomes an output row, a failure becomes a reject row.

Kept apart from the pump so the contract in DESIGN.md (which columns, which flags) is tested
without a server.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from flows.client.sampling import SamplingParams
from flows.run.quality import quality_flags
from flows.run.regen import Regenerated
from flows.store.shard_schema import normalize_message
from prompts.records import PromptRecord

DETAIL_LIMIT = 2000


def _now() -> datetime:
    return datetime.now(UTC)


def output_row(
    record: PromptRecord,
    regenerated: Regenerated,
    sampling: SamplingParams,
    endpoint: str,
    prompt_hash: str | None = None,
) -> dict[str, Any]:
    """The stored row: the conversation as regenerated (prompt turns + new assistant turns)."""
    usage = regenerated.usage
    capped = [g.max_tokens for g in regenerated.generations if g.max_tokens is not None]
    asked = dataclasses.replace(sampling, max_tokens=min(capped)) if capped else sampling
    return {
        "id": record.id,
        "category": record.category,
        "prompt_hash": prompt_hash,
        "source": {"dataset": record.source.dataset, "split": record.source.split, "row": record.source.row},
        "messages": [normalize_message(m) for m in regenerated.messages],
        "system_prompt": sent_system_prompt(record.messages),
        "tools": json.dumps(record.tools, ensure_ascii=False) if record.tools else None,
        "finish_reason": regenerated.finish_reason,
        "stop_reason": regenerated.stop_reason,
        "usage": {
            "prompt_tokens": usage.prompt_tokens,
            "completion_tokens": usage.completion_tokens,
            "reasoning_tokens": usage.reasoning_tokens,
            "cached_tokens": usage.cached_tokens,
        },
        "model": regenerated.model,
        "sampling": asked.to_json(),  # what the server was asked for
        "endpoint": endpoint,
        "latency_s": regenerated.latency_s,
        "ttft_s": regenerated.ttft_s,
        "attempts": regenerated.attempts,
        "requests": len(regenerated.generations),
        "created_at": _now(),
        "flags": _flags(regenerated, record.tools),
    }


def sent_system_prompt(messages: list[dict[str, Any]]) -> str:
    """The system prompt the first request carried ("" when none), as the server's template saw it.

    Recorded per row because a trainer re-renders the conversation with its own template, and some
    templates insert a default system prompt where there is none: the row says what is true.
    """
    leading = []
    for message in messages:
        if message.get("role") != "system":
            break
        leading.append(message.get("content") or "")
    return "\n\n".join(leading)


def _flags(regenerated: Regenerated, tools: list[dict[str, Any]] | None) -> list[str]:
    """Quality flags of every regenerated turn, each flag once, in first-seen order."""
    flags: dict[str, None] = {}
    for generation in regenerated.generations:
        flags.update(dict.fromkeys(quality_flags(generation.message, generation.finish_reason, tools)))
    return list(flags)


def reject_row(
    *,
    record_id: str,
    category: str,
    source: Mapping[str, Any],
    stage: str,
    reason: str,
    status: int | None = None,
    retryable: bool = False,
    attempts: int = 0,
    endpoint: str | None = None,
    detail: str | None = None,
    prompt_hash: str | None = None,
) -> dict[str, Any]:
    """A reject: which prompt, at which stage (convert/request/validate), why, and whether to retry."""
    return {
        "id": record_id,
        "category": category,
        "prompt_hash": prompt_hash,
        "source": dict(source),
        "stage": stage,
        "reason": reason,
        "status": status,
        "retryable": retryable,
        "attempts": attempts,
        "endpoint": endpoint,
        "created_at": _now(),
        "detail": detail[:DETAIL_LIMIT] if detail else None,
    }


def raw_row_id(row: Mapping[str, Any]) -> str:
    """An id for a source row that could not be converted: stable, so resume does not reject it twice."""
    canonical = json.dumps(row, sort_keys=True, ensure_ascii=False, default=str)
    # a lone surrogate in the row (a JSON escape without its pair) is why some rows are rejected:
    # hashed as it is, so that building their reject cannot fail too
    return "raw-" + hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()[:24]
