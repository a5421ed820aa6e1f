"""The Prefect tier's server: a real `prefect server start` on a free loopback port, one per test module
(a module's assertions over every flow run of the API must not see another module's runs)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from tenacity import retry, retry_if_result, stop_after_attempt, wait_exponential

from flows.orchestration.server import PrefectServer

BUSY = frozenset({429, 502, 503})
"""Answers of a Prefect server too busy to answer now (its database locked under a loaded machine:
a 503 from `create_flow_run` failed CI once); Prefect's own client retries these, so do the tests."""


@retry(
    retry=retry_if_result(lambda response: response.status_code in BUSY),
    stop=stop_after_attempt(6),
    wait=wait_exponential(multiplier=0.5, max=8),
    retry_error_callback=lambda state: state.outcome.result() if state.outcome else None,
)
def prefect_api(method: str, url: str, **kwargs: Any) -> httpx.Response:
    """A call to the Prefect server's REST API, tried again while the server says it is busy."""
    return httpx.request(method, url, timeout=10, **kwargs)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrefectServer]:
    with PrefectServer(home=tmp_path_factory.mktemp("prefect-home"), ui=False) as running:
        yield running


ApiPost = Callable[..., list[dict[str, object]]]


@pytest.fixture
def api_post(server: PrefectServer) -> ApiPost:
    """POST to the server's REST API (``flow_runs/filter``, ...) and return the JSON list."""

    def post(path: str, body: dict[str, object] | None = None) -> list[dict[str, object]]:
        response = prefect_api("POST", f"{server.api_url}/{path}", json=body or {})
        response.raise_for_status()
        result: list[dict[str, object]] = response.json()
        return result

    return post
