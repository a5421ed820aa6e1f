"""No endpoint answers when a run starts: after ``outage_patience_s``, one line that says which, how long
it waited and what to check, and exit 3."""

from __future__ import annotations

from pathlib import Path

import pytest
from pipeline_support import write_config
from typer.testing import CliRunner

from flows.cli.main import app
from sglang_launch.ports import free_port


@pytest.mark.parametrize("endpoints", [1, 2])
def test_no_endpoint_answering_at_the_start_is_one_clean_line_and_exit_3(
    tmp_path: Path, endpoints: int
) -> None:
    """The line ended with "(attempt 2)": the count of the start's looks at the endpoints, which
    means nothing to a person and read as if a request had been retried."""
    urls = [f"http://127.0.0.1:{free_port()}" for _ in range(endpoints)]  # nothing listens there
    (tmp_path / "p.jsonl").write_text('{"messages": [{"role": "user", "content": "hi"}]}\n')
    config = write_config(
        tmp_path / "run.toml", name="r", output_dir=tmp_path, url=urls[0], source=tmp_path / "p.jsonl"
    )
    text = config.read_text().replace("max_wait_s = 0.5", "max_wait_s = 0.5\noutage_patience_s = 1")
    for url in urls[1:]:
        text = text.replace(f'url = "{urls[0]}"\n', f'url = "{urls[0]}"\n\n[[endpoints]]\nurl = "{url}"\n')
    config.write_text(text)

    result = CliRunner().invoke(app, ["run", str(config), "--no-prefect"])

    assert result.exit_code == 3, result.output
    [line] = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert all(url in line for url in urls), line
    assert " in 1 s ([retry] outage_patience_s)" in line and "running and reachable" in line, line
    assert "attempt" not in line, line
