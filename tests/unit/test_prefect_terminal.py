"""What `datagen run` shows of Prefect on its terminal: that Prefect's temporary server is starting,
and nothing of that server's own logging."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest
from pipeline_support import write_config
from rich.console import Console
from typer.testing import CliRunner

from flows.cli import console as console_module
from flows.cli.main import app
from flows.orchestration import link as prefect_link
from flows.orchestration.link import STARTING_TEMPORARY_SERVER, PrefectUnavailable
from sglang_launch.ports import free_port


def _config(tmp_path: Path) -> Path:
    (tmp_path / "p.jsonl").write_text('{"messages": [{"role": "user", "content": "hi"}]}\n')
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens: nothing is asked before Prefect is ready
    return write_config(
        tmp_path / "run.toml", name="r", output_dir=tmp_path, url=url, source=tmp_path / "p.jsonl"
    )


def test_starting_the_temporary_server_is_said_before_it_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No PREFECT_API_URL: the temporary server took about 20 s on 2 cores, and the terminal showed
    nothing until the progress line came: the run looked hung. Into a file (no terminal) it is one
    plain line, said before the server is started; here the start fails at once."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    started: list[bool] = []

    def refuse() -> None:
        started.append(True)
        raise PrefectUnavailable("the temporary server did not start")

    monkeypatch.setattr(prefect_link, "start_ephemeral", refuse)
    with temporary_settings(restore_defaults={PREFECT_API_URL}):
        result = CliRunner().invoke(app, ["run", str(_config(tmp_path))])
    assert started and result.exit_code == 3, result.output
    assert result.output.splitlines() == [
        STARTING_TEMPORARY_SERVER,
        "error: the temporary server did not start",
    ]


async def test_a_configured_api_starts_no_server_and_says_nothing_of_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A PREFECT_API_URL (here one that does not answer: the run goes on without Prefect) starts no
    temporary server, so nothing is said of one."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    shown: list[str] = []

    def never() -> None:
        raise AssertionError("no temporary server with a PREFECT_API_URL")

    monkeypatch.setattr(prefect_link, "start_ephemeral", never)
    monkeypatch.setattr(prefect_link, "tell", lambda text: None)
    with temporary_settings(updates={PREFECT_API_URL: f"http://127.0.0.1:{free_port()}/api"}):
        assert await prefect_link.open_link(lambda what: _Shown(shown, what)) is None
    assert shown == []


class _Shown:
    """A display's ``waiting``: records what it was asked to show."""

    def __init__(self, shown: list[str], what: str) -> None:
        shown.append(what)

    def __enter__(self) -> None: ...

    def __exit__(self, *exc: object) -> None: ...


def test_on_a_terminal_the_start_is_a_spinner(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a terminal the same words, as a status beside a spinner, until the server answers."""
    screen = io.StringIO()
    terminal = Console(file=screen, force_terminal=True, force_interactive=True, width=120)
    monkeypatch.setattr(console_module, "console", terminal)
    display = console_module.run_display()
    assert isinstance(display, console_module.LiveProgress)
    with display.waiting(STARTING_TEMPORARY_SERVER):
        pass
    assert STARTING_TEMPORARY_SERVER in screen.getvalue()


SERVER_LINE = (
    "12:00:00.000 | WARNING | prefect.server.events.actions - Action failed: "
    "'Failed to set state: Run is already in terminal state CRASHED.'"
)
"""What the temporary server printed on the resume after a crashed run: its automation "mark dead
flow runs Crashed" (in the Prefect database the temporary server shares with `prefect server start`)
acting on a flow run that the resume had marked Crashed already."""


def test_the_temporary_servers_own_log_lines_go_to_its_log_not_the_terminal(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """Prefect starts its temporary server as a child that writes to the run's terminal: its own
    records (Prefect's format, not the run's) came between the run's lines, past the CLI's log
    filter, which only sees this process's records. A child started as Prefect starts the server
    stands in for it here."""
    from prefect.server.api import server as prefect_server
    from prefect.settings import PREFECT_HOME, temporary_settings

    from flows.orchestration.temporary_server import _popen_in_own_session

    program = f"import sys; print({SERVER_LINE!r}, file=sys.stderr); print('stdout too')"
    with temporary_settings(updates={PREFECT_HOME: tmp_path}), _popen_in_own_session():
        child = prefect_server.subprocess.Popen(args=[sys.executable, "-c", program])  # as Prefect calls it
    assert child.wait(timeout=60) == 0
    shown = capfd.readouterr()
    assert SERVER_LINE not in shown.err and "stdout too" not in shown.out
    assert (tmp_path / "temporary-server.log").read_text().splitlines() == [SERVER_LINE, "stdout too"]


def test_each_start_of_the_temporary_server_keeps_its_own_output_and_the_previous_one(
    tmp_path: Path,
) -> None:
    """Every start appended to one file, never rotated: a week of scheduled runs grew it without
    bound. The file holds this start's output (what the line of a server that did not start names)
    and ``.1`` the start before it (the first try, when a failed start was retried); older ones go."""
    from prefect.server.api import server as prefect_server
    from prefect.settings import PREFECT_HOME, temporary_settings

    from flows.orchestration.temporary_server import _popen_in_own_session, server_log

    with temporary_settings(updates={PREFECT_HOME: tmp_path}):
        for start in ("first", "second", "third"):
            with _popen_in_own_session():
                child = prefect_server.subprocess.Popen([sys.executable, "-c", f"print('{start} start')"])
            assert child.wait(timeout=60) == 0
        log = server_log()
    assert log.read_text().splitlines() == ["third start"]
    assert log.with_name(log.name + ".1").read_text().splitlines() == ["second start"]
    assert sorted(path.name for path in tmp_path.iterdir()) == [log.name, log.name + ".1"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the death signal is Linux's")
def test_a_server_forked_as_its_parent_dies_stops_itself_and_one_whose_parent_lives_runs() -> None:
    """The death signal is asked for in the child, after the fork: a run ``kill -9``-ed in between is
    never heard of, and its temporary server (in a session of its own) would live on for good. A
    parent pid that is not the child's parent stands in for the parent gone by then."""
    import os
    import signal
    import subprocess

    from flows.orchestration.temporary_server import _stop_with_parent

    orphaned = subprocess.Popen(["sleep", "30"], preexec_fn=_stop_with_parent(os.getpid() + 1_000_000))
    assert orphaned.wait(timeout=10) == -signal.SIGTERM
    kept = subprocess.Popen(["sleep", "30"], preexec_fn=_stop_with_parent(os.getpid()))
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            kept.wait(timeout=1)
    finally:
        kept.kill()
        kept.wait()
