"""The Prefect card of each category: its own numbers, not the whole run's."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from prefect.artifacts import Artifact, TableArtifact

from flows.config import parse_config
from flows.orchestration import flow
from flows.run.session import RunSession


def _tok_per_s(table: list[dict[str, str]]) -> float:
    return float(next(row["value"] for row in table if row["metric"] == "output tok/s"))


def test_each_category_card_shows_its_own_current_output_rate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every card was given the run's tok/s: a category with no output token in the window showed
    666.1 tok/s, the rate of the other one."""
    config = parse_config(
        {
            "run": {"name": "r", "output_dir": str(tmp_path)},
            "endpoints": [{"url": "http://127.0.0.1:9"}],
            "categories": [
                {"name": "chat", "source": "chat.jsonl", "format": "messages"},
                {"name": "code", "source": "code.jsonl", "format": "messages"},
            ],
        }
    )
    session = RunSession(config)
    chat, code = session.categories.get("chat").sink.tally, session.categories.get("code").sink.tally
    cards: dict[str, list[dict[str, str]]] = {}

    async def put(card: Any, artifact: Artifact) -> None:
        if isinstance(artifact, TableArtifact) and artifact.key and artifact.key.startswith("r-c"):
            cards[artifact.key] = artifact.table  # type: ignore[assignment]

    monkeypatch.setattr(flow._Card, "put", put)
    view = flow._LiveView(session, None)

    async def ticks() -> None:
        code.completion_tokens = 500  # before the window: no output of code's in it
        await view.tick()
        await asyncio.sleep(0.2)
        chat.rows, chat.completion_tokens = 4, 2000
        await view.tick()

    asyncio.run(ticks())
    chat_rate, code_rate = _tok_per_s(cards["r-chat"]), _tok_per_s(cards["r-code"])
    assert code_rate == 0.0
    assert 2000 / 0.5 < chat_rate <= 2000 / 0.2
