"""The Prefect tier's server: a real `prefect server start` on a free loopback port, one per test module
(a module's assertions over every flow run of the API must not see another module's runs)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import httpx
import pytest

from flows.orchestration.server import PrefectServer


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrefectServer]:
    with PrefectServer(home=tmp_path_factory.mktemp("prefect-home"), ui=False) as running:
        yield running


ApiPost = Callable[..., list[dict[str, object]]]


@pytest.fixture
def api_post(server: PrefectServer) -> ApiPost:
    """POST to the server's REST API (``flow_runs/filter``, ...) and return the JSON list."""

    def post(path: str, body: dict[str, object] | None = None) -> list[dict[str, object]]:
        response = httpx.post(f"{server.api_url}/{path}", json=body or {}, timeout=10)
        response.raise_for_status()
        result: list[dict[str, object]] = response.json()
        return result

    return post
