"""The Prefect tier's real server: one `prefect server start` per test module on a free loopback port."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from flows.orchestration.server import PrefectServer


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrefectServer]:
    """A fresh database per module: each module's assertions over all flow runs see only its own."""
    with PrefectServer(home=tmp_path_factory.mktemp("prefect-home"), ui=False) as running:
        yield running
