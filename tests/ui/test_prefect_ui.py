"""The Prefect UI in headless Chromium (marker `ui`, run by `.ci/run`): a run's page shows its files' numbers.

Runs `bench/prefect_ui_check.py`'s check: the demo under a real `prefect server start` with its UI, then
the flow run's Artifacts tab and each card's page read in the browser. Screenshots go to the
repository's output/ (git-ignored; CI keeps them).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.prefect_ui_check import CHROMIUM, check_ui, run_demo
from flows.orchestration.server import PrefectServer
from flows.report.status import run_status

pytestmark = [
    pytest.mark.ui,
    pytest.mark.skipif(not CHROMIUM.exists(), reason=f"no {CHROMIUM} (apt-get install -y chromium)"),
]

SHOTS = Path(__file__).resolve().parents[2] / "output"


def test_the_run_page_shows_the_numbers_of_the_runs_files(tmp_path: Path) -> None:
    with PrefectServer(home=tmp_path / "prefect-home", ui=True) as server:
        run_dir = run_demo(server.api_url, tmp_path)
        check = check_ui(server, run_dir, SHOTS)
    status = run_status(run_dir)
    assert check.rows_in_files == {c.name: c.rows for c in status.categories}
    assert sum(check.rows_in_files.values()) > 0
    assert check.problems == []
    for shot in check.screenshots:
        assert shot.stat().st_size > 10_000, f"{shot} is not a rendered page"
