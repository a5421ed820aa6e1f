"""The Prefect UI in a headless browser: does a run's page show the numbers of the run's files?

    uv run python -m bench.prefect_ui_check [--output output] [--chromium /usr/bin/chromium]

Starts `prefect server start` with its UI on a free loopback port, runs the demo (the bundled simulator
and 100 sample prompts) under it, then opens the flow run's Artifacts tab in headless Chromium (Debian's
``chromium``: Playwright's own browsers cannot be downloaded here) and checks what a person would
read there against the run directory: the progress card at 100%, and each category's table with the
rows and rejects that are in the shards. Saves screenshots of the tab and of a category's table under
OUTPUT (``prefect_ui_run.png``, ``prefect_ui_table.png``) and exits 1 when a number disagrees. The
`ui` test (``tests/ui``) runs it.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from playwright.sync_api import Page, sync_playwright
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from flows.orchestration.server import PrefectServer
from flows.report.status import run_status

CHROMIUM = Path("/usr/bin/chromium")
RUN = "demo"
"""The demo's run name (``prompts/samples/demo.toml``): its flow run and artifact keys."""
WAIT_MS = 60_000
"""How long the UI (a JS app, slow on a busy machine) may take to show a text."""
RUN_TIMEOUT_S = 600
ROWS = "rows on disk (all starts)"
REJECTS = "rejects on disk (standing)"
"""The category table's metrics read back from the files at the end of the run."""


@dataclass
class UiCheck:
    """What the page showed, and where it disagreed with the files (empty: it agreed)."""

    flow_run_id: str
    rows_in_files: dict[str, int]
    screenshots: list[Path]
    problems: list[str] = field(default_factory=list)


def run_demo(api_url: str, work: Path) -> Path:
    """`datagen demo` reporting to the server at ``api_url``; the run directory it wrote."""
    env = {**os.environ, "PREFECT_API_URL": api_url}
    done = subprocess.run(
        [sys.executable, "-m", "flows.cli", "demo", "--output-dir", str(work)],
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"the demo run failed (exit {done.returncode}):\n{done.stdout[-2000:]}{done.stderr[-2000:]}"
        )
    return work / RUN


def _api_find(api_url: str, path: str, body: dict[str, object]) -> list[dict[str, object]]:
    response = httpx.post(f"{api_url}/{path}", json=body, timeout=10)
    response.raise_for_status()
    found: list[dict[str, object]] = response.json()
    return found


def check_ui(server: PrefectServer, run_dir: Path, shots: Path, chromium: Path = CHROMIUM) -> UiCheck:
    """Open the run's flow run page and its artifacts; compare what is shown with ``run_dir``'s files."""
    status = run_status(run_dir)
    rows = {c.name: c.rows for c in status.categories}
    rejects = {c.name: c.rejects for c in status.categories}
    (flow_run,) = [
        r
        for r in _api_find(server.api_url, "flow_runs/filter", {"flow_runs": {"name": {"any_": [RUN]}}})
        if r["parent_task_run_id"] is None
    ]
    run_id = str(flow_run["id"])
    artifacts = {
        str(a["key"]): str(a["id"])
        for a in _api_find(
            server.api_url, "artifacts/filter", {"artifacts": {"flow_run_id": {"any_": [run_id]}}}
        )
    }
    shots.mkdir(parents=True, exist_ok=True)
    check = UiCheck(run_id, rows, [shots / "prefect_ui_run.png", shots / "prefect_ui_table.png"])
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=str(chromium), headless=True, args=["--no-sandbox", "--disable-dev-shm-usage"]
        )
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.set_default_timeout(WAIT_MS)
        # the flow run's page, Artifacts tab: one card per key, the progress card's line on it
        page.goto(f"{server.ui_url}/runs/flow-run/{run_id}")
        page.get_by_text("Artifacts", exact=True).first.click()
        settled = sum(rows.values()) + sum(rejects.values())
        if not _shows(page, f"done: {settled} prompts settled"):
            check.problems.append(f"the run page's progress card does not say {settled} prompts settled")
        for name in rows:
            if not _shows(page, _key(name)):
                check.problems.append(f"no card {_key(name)} on the run page")
        page.screenshot(path=str(check.screenshots[0]), full_page=True)
        # each card's own page: the progress bar's percent, the category's table
        page.goto(f"{server.ui_url}/artifacts/artifact/{artifacts[f'{RUN}-progress']}")
        if not _shows(page, "Progress: 100%"):
            check.problems.append("the progress card does not show 100%")
        for index, name in enumerate(rows):
            page.goto(f"{server.ui_url}/artifacts/artifact/{artifacts[_key(name)]}")
            page.get_by_text(ROWS).first.wait_for()
            shown = _table(page)
            for metric, files in ((ROWS, rows[name]), (REJECTS, rejects[name])):
                if shown.get(metric) != str(files):
                    check.problems.append(
                        f"{name}: the UI shows {metric} {shown.get(metric)}, the files {files}"
                    )
            if index == 0:
                page.screenshot(path=str(check.screenshots[1]), full_page=True)
        browser.close()
    return check


def _key(category: str) -> str:
    """A category's artifact key (lowercase: Prefect keys allow no capitals)."""
    return f"{RUN}-{category.lower()}"


def _shows(page: Page, text: str) -> bool:
    """Whether ``text`` appears (the UI renders after its API calls: wait for it, never sleep)."""
    try:
        page.get_by_text(text, exact=False).first.wait_for()
    except PlaywrightTimeout:
        return False
    return True


def _table(page: Page) -> dict[str, str]:
    """The artifact's table as the page renders it: metric -> value (the first two cells of each row)."""
    cells = page.locator("tbody tr").evaluate_all(
        "rows => rows.map(r => Array.from(r.querySelectorAll('td')).map(c => c.innerText.trim()))"
    )
    return {row[0]: row[1] for row in cells if len(row) >= 2}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", type=Path, default=Path("output"), help="Where the screenshots go.")
    parser.add_argument("--chromium", type=Path, default=CHROMIUM, help="A Chromium executable.")
    args = parser.parse_args()
    if not args.chromium.exists():
        sys.exit(f"no Chromium at {args.chromium}: apt-get install -y chromium")
    with tempfile.TemporaryDirectory() as tmp, PrefectServer(home=Path(tmp) / "home", ui=True) as server:
        run_dir = run_demo(server.api_url, Path(tmp))
        check = check_ui(server, run_dir, args.output, args.chromium)
    print(f"rows in the files: {check.rows_in_files}; screenshots: {', '.join(map(str, check.screenshots))}")
    for problem in check.problems:
        print(f"MISMATCH: {problem}")
    sys.exit(1 if check.problems else 0)


if __name__ == "__main__":
    main()
