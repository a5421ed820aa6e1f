"""Category quotas end to end, and runs that survive their server restarting or dying."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from pathlib import Path

from forked_runs import alive
from pipeline_support import (
    check_run,
    children,
    datagen,
    kill_group,
    never_flush,
    rows_on_disk,
    wait_for_rows,
    write_config,
    write_prompts,
)

from flows.config import load_config
from flows.runner import execute
from prompts.dedup import sample_score
from sglang_launch.simulator import FaultConfig, SimConfig, SimulatorProcess

FAST = {"time_scale": 0.02, "stream_interval_s": 0.02, "log_level": "warning", "context_length": 8192}


async def _wait_rows(run_dir: Path, minimum: int) -> None:
    while rows_on_disk(run_dir) < minimum:
        await asyncio.sleep(0.05)


async def test_two_categories_with_quotas_get_exactly_their_share(tmp_path: Path) -> None:
    write_prompts(tmp_path / "a.jsonl", 120, tag="a")
    write_prompts(tmp_path / "b.jsonl", 90, tag="b")
    quotas = f"""
quota = {{ count = 25, seed = 3 }}

[[categories]]
name = "other"
source = "{tmp_path / "b.jsonl"}"
format = "messages"
quota = {{ fraction = 0.5, seed = 3 }}
generation = {{ max_tokens = 16 }}
"""
    with SimulatorProcess(SimConfig(**FAST)) as sim:
        config = write_config(
            tmp_path / "run.toml",
            name="quota",
            output_dir=tmp_path,
            url=sim.url,
            source=tmp_path / "a.jsonl",
            extra=quotas,
        )
        cfg = load_config(config)
        first = await execute(cfg, use_prefect=False)
        again = await execute(cfg, use_prefect=False)  # resume: nothing new
    expected_other = {f"b{i:05d}" for i in range(90) if sample_score(3, f"b{i:05d}") < 0.5}
    counts = {c.name: c.rows for c in first.categories}
    assert counts == {"chat": 25, "other": len(expected_other)}
    check = check_run(tmp_path / "quota")
    assert check.duplicates == 0
    assert {i for i in check.row_ids if i.startswith("b")} == expected_other
    assert {c.name: c.rows for c in again.categories} == counts


async def test_a_server_restart_mid_run_costs_no_prompt(tmp_path: Path) -> None:
    source = tmp_path / "prompts.jsonl"
    write_prompts(source, 600)
    with SimulatorProcess(SimConfig(**FAST)) as sim:
        cfg = load_config(
            write_config(
                tmp_path / "run.toml", name="restart", output_dir=tmp_path, url=sim.url, source=source
            )
        )
        run = asyncio.create_task(execute(cfg, use_prefect=False))
        await _wait_rows(tmp_path / "restart", 150)
        await asyncio.to_thread(sim.restart, 4.0)  # all in-flight streams cut, 4 s of 503s
        status = await run
        stats = sim.stats()
    assert stats["restarts"] == 1
    check = check_run(tmp_path / "restart")
    assert check.duplicates == 0
    assert len(check.row_ids) == 600 and check.reject_ids == []  # retries outlasted, then recovered
    assert status.rows == 600


def _launching_config(tmp_path: Path, name: str, prompts: int, time_scale: float) -> Path:
    """A run of `prompts` prompts whose only server is the simulator it launches (`[server]`)."""
    source = tmp_path / "prompts.jsonl"
    write_prompts(source, prompts)
    config = write_config(
        tmp_path / "run.toml", name=name, output_dir=tmp_path, url="http://unused", source=source
    )
    text = config.read_text().replace('[[endpoints]]\nurl = "http://unused"\nstream = true\n', "")
    text += f"""
[server]
launch = true
engine = "simulator"
served_model_name = "sim-model"
max_total_tokens = 16384
context_length = 8192
log_dir = "{tmp_path / "server-logs"}"
startup_timeout_s = 30
extra_args = ["--time-scale", "{time_scale}", "--stream-interval-s", "0.02", "--log-level", "warning"]
"""
    config.write_text(text)
    return config


async def test_a_launched_server_that_dies_is_restarted_and_the_run_continues(tmp_path: Path) -> None:
    cfg = load_config(_launching_config(tmp_path, "launched", 500, 0.02))
    run = asyncio.create_task(execute(cfg, use_prefect=False))
    await _wait_rows(tmp_path / "launched", 100)
    (server,) = children(os.getpid(), b"sglang_launch.simulator")
    os.kill(server, signal.SIGKILL)  # the server crashes mid-run
    status = await run
    check = check_run(tmp_path / "launched")
    assert len(check.row_ids) == 500 and check.reject_ids == [] and check.duplicates == 0
    assert status.rows == 500
    assert len(list((tmp_path / "server-logs").iterdir())) >= 2  # first start + the restart
    assert children(os.getpid(), b"sglang_launch.simulator") == []  # stopped at the end of the run


async def test_a_prompt_that_brings_its_server_down_is_found_alone_and_the_batch_beside_it_answered(
    tmp_path: Path,
) -> None:
    """One of 40 prompts brings the server down the moment it arrives (``crash_on_text``: the process
    exits, as at a kernel fault), the 40 in flight at once. The run restarts the server it launched
    each time; in flight at two deaths, every prompt is a suspect; none waiting for a slot, they go
    together, half as many after each death among them, until the killer is alone at a death: it
    is the only reject, the 39 beside it rows. The next start asks it alone first: it brings the
    server down once more and is a final reject, which the start after does not ask."""
    config = _launching_config(tmp_path, "killer", 40, 0.2)
    crash = '"--crash-on-text", "KILLER", "--log-level"'
    config.write_text(config.read_text().replace('"--log-level"', crash))
    source = tmp_path / "prompts.jsonl"
    lines = source.read_text().splitlines()
    killer = json.loads(lines[7])
    killer["messages"][0]["content"] += " KILLER"
    lines[7] = json.dumps(killer)
    source.write_text("\n".join(lines) + "\n")
    status = await asyncio.wait_for(execute(load_config(config), use_prefect=False), 240)
    check = check_run(tmp_path / "killer")
    assert list(check.reject_ids) == ["p00007"], check.reject_reasons
    (reason,) = check.reject_reasons
    assert reason.startswith("in flight at 3 server outages, the last with no other suspect in flight")
    assert len(check.row_ids) == 39 and check.duplicates == 0 and status.rows == 39
    starts = len(list((tmp_path / "server-logs").glob("*.log")))
    assert 4 <= starts <= 1 + 2 + 6 + 1, starts  # two deaths, groups of 40 down to 1 at most, alone
    # the next start asks it alone first: one death, a final reject; the start after asks nothing
    again = await asyncio.wait_for(execute(load_config(config), use_prefect=False), 240)
    check = check_run(tmp_path / "killer")
    assert check.reject_ids == ["p00007", "p00007"] and check.retryable_ids == {"p00007"}
    (final,) = [r for r in check.reject_reasons if not r.startswith("in flight at 3")]
    assert final.startswith("brought the server down again, asked alone"), final
    assert len(check.row_ids) == 39 and len(set(check.row_ids)) == 39 and again.rows == 39
    assert len(list((tmp_path / "server-logs").glob("*.log"))) == starts + 2  # its start, one restart
    last = await asyncio.wait_for(execute(load_config(config), use_prefect=False), 240)
    after = check_run(tmp_path / "killer")
    assert last.rows == 39 and len(after.row_ids) == 39 and len(after.reject_ids) == 2


def test_a_resume_after_kill_9_stops_the_server_the_killed_run_left(tmp_path: Path) -> None:
    """The server runs in its own session, so a kill -9 of the run leaves it holding its GPUs; the
    same command again (the resume) stops it before it launches its own, and finishes the run."""
    config = _launching_config(tmp_path, "orphan", 120, 0.2)
    killed = datagen("run", str(config), "--no-prefect")
    orphan = None
    try:
        wait_for_rows(tmp_path / "orphan", 10, killed, timeout_s=60)
        (orphan,) = children(killed.pid, b"sglang_launch.simulator")
        kill_group(killed)  # the run and its process group: the server's own session survives
        assert alive(orphan)
        resume = datagen("run", str(config), "--no-prefect")
        out, _ = resume.communicate(timeout=120)
        assert resume.returncode == 0, out.decode()[-3000:]
        assert not alive(orphan)
        assert f"stopping the SGLang server pid {orphan} that a killed run left on port".encode() in out
    finally:
        kill_group(killed)
        if orphan is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(orphan, signal.SIGKILL)
    check = check_run(tmp_path / "orphan")
    assert len(check.row_ids) == 120 and check.reject_ids == [] and check.duplicates == 0


def test_sigterm_flushes_buffered_rows_and_exits_for_a_resume(tmp_path: Path) -> None:
    source = tmp_path / "prompts.jsonl"
    write_prompts(source, 3000)
    with SimulatorProcess(SimConfig(**FAST)) as sim:
        config = write_config(
            tmp_path / "run.toml", name="term", output_dir=tmp_path, url=sim.url, source=source
        )
        never_flush(config)
        proc = datagen("run", str(config), "--no-prefect")
        deadline = time.monotonic() + 60
        while not (sim.stats()["requests_completed"] > 200 or time.monotonic() > deadline):
            time.sleep(0.1)
        assert rows_on_disk(tmp_path / "term") == 0
        os.kill(proc.pid, signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 130, out.decode()[-2000:]
        assert b"run the same command again to resume" in out
        saved = rows_on_disk(tmp_path / "term")
        assert saved > 100  # the server had finished 200+; the ones the client had read were kept
        again = datagen("run", str(config), "--no-prefect")
        assert again.wait(timeout=300) == 0
    check = check_run(tmp_path / "term")
    assert len(check.row_ids) == 3000 and check.duplicates == 0


def test_an_unreadable_source_fails_its_category_only_and_says_why(tmp_path: Path) -> None:
    write_prompts(tmp_path / "good.jsonl", 100)
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "part-0.parquet").write_bytes(b"PAR1 this is not parquet")
    extra = f"""
[[categories]]
name = "broken"
source = "{broken}"
format = "messages"
"""
    with SimulatorProcess(SimConfig(**FAST)) as sim:
        config = write_config(
            tmp_path / "run.toml",
            name="src",
            output_dir=tmp_path,
            url=sim.url,
            source=tmp_path / "good.jsonl",
            extra=extra,
        )
        proc = datagen("run", str(config), "--no-prefect")
        out, _ = proc.communicate(timeout=120)
    text = out.decode()
    assert proc.returncode == 2, text[-2000:]
    assert "category broken: cannot read" in text and "Traceback" not in text
    assert len(check_run(tmp_path / "src").row_ids) == 100  # the other category ran to the end


def test_a_missing_local_source_is_refused_before_anything_starts(tmp_path: Path) -> None:
    config = write_config(
        tmp_path / "run.toml",
        name="none",
        output_dir=tmp_path,
        url="http://127.0.0.1:9",
        source=tmp_path / "nope.jsonl",
    )
    proc = datagen("run", str(config), "--no-prefect")
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert b"prompt source not found (chat:" in out
    assert not (tmp_path / "none").exists()


def test_an_unreachable_endpoint_is_one_clear_line_not_a_traceback(tmp_path: Path) -> None:
    """No server behind the only endpoint: 72 s of silence, then exit 3. Now one warning in the first
    seconds that it does not answer and how long the run waits for it (no advice to enable metrics:
    nothing answers); then, after that wait, one line and exit 3."""
    write_prompts(tmp_path / "p.jsonl", 5)
    config = write_config(
        tmp_path / "run.toml",
        name="down",
        output_dir=tmp_path,
        url="http://127.0.0.1:9",
        source=tmp_path / "p.jsonl",
    )
    config.write_text(
        config.read_text().replace("max_wait_s = 0.5", "max_wait_s = 0.5\noutage_patience_s = 6")
    )
    started = time.monotonic()
    proc = datagen("run", str(config), "--no-prefect")
    assert proc.stdout is not None
    first = proc.stdout.readline().decode()
    said_after = time.monotonic() - started
    rest, _ = proc.communicate(timeout=60)
    out = first + rest.decode()
    assert proc.returncode == 3, out
    assert said_after < 5.5 and "http://127.0.0.1:9 does not answer" in first and "up to 6 s" in first, out
    assert time.monotonic() - started >= 6
    assert "cannot use the endpoint" in out and "Traceback" not in out and "--enable-metrics" not in out


async def test_prompts_fail_over_to_the_other_endpoint_when_one_dies(tmp_path: Path) -> None:
    source = tmp_path / "prompts.jsonl"
    write_prompts(source, 800)
    with SimulatorProcess(SimConfig(**FAST)) as first, SimulatorProcess(SimConfig(**FAST)) as second:
        config = write_config(
            tmp_path / "run.toml", name="two", output_dir=tmp_path, url=first.url, source=source
        )
        text = config.read_text().replace(
            f'url = "{first.url}"\n', f'url = "{first.url}"\n\n[[endpoints]]\nurl = "{second.url}"\n'
        )
        text = text.replace(
            "max_wait_s = 0.5", "max_wait_s = 0.5\nfailover_after_s = 1\noutage_patience_s = 30"
        )
        config.write_text(text)
        run = asyncio.create_task(execute(load_config(config), use_prefect=False))
        await _wait_rows(tmp_path / "two", 150)
        first.kill()  # gone for good: never comes back during the run
        status = await run
    check = check_run(tmp_path / "two")
    assert len(check.row_ids) == 800 and check.reject_ids == [] and check.duplicates == 0
    assert status.rows == 800
    summary = json.loads((tmp_path / "two" / "summary.json").read_text())
    assert summary["categories"][0]["this_run"]["recovered_after_outage"] >= 1


def test_a_lone_server_gone_for_good_stops_the_run_then_resume_finishes(tmp_path: Path) -> None:
    source = tmp_path / "prompts.jsonl"
    write_prompts(source, 600)
    # a server that answers at its own pace, not the client's: at FAST's the client read the last of
    # the 600 answers 0.5-1 s after the 100th row reached the disk, a gap a faster or loaded CI
    # machine can leave between two looks at the disk (then the kill found the run done)
    with SimulatorProcess(SimConfig(**{**FAST, "time_scale": 0.3})) as sim:
        config = write_config(
            tmp_path / "run.toml", name="gone", output_dir=tmp_path, url=sim.url, source=source
        )
        config.write_text(
            config.read_text().replace("max_wait_s = 0.5", "max_wait_s = 0.5\noutage_patience_s = 3")
        )
        proc = datagen("run", str(config), "--no-prefect")
        wait_for_rows(tmp_path / "gone", 100, proc, timeout_s=120)
        sim.kill()
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 3, out.decode()[-2000:]
        assert b"no endpoint has answered for 3 s" in out
        stopped = check_run(tmp_path / "gone")
        assert stopped.reject_ids == [] and 100 <= len(stopped.row_ids) < 600  # nothing turned into a reject
        sim.start()  # the server is back (same port): the same command finishes the run
        again = datagen("run", str(config), "--no-prefect")
        assert again.wait(timeout=300) == 0
    final = check_run(tmp_path / "gone")
    assert len(final.row_ids) == 600 and final.duplicates == 0 and final.reject_ids == []


async def test_a_slow_endpoint_does_not_hold_the_other_endpoints_prompts_hostage(tmp_path: Path) -> None:
    """Of three endpoints one answers after 12 s, two in a fraction of a second. The shards sending at
    once each send a few prompts to the slow one; one that has sent all its prompts must not keep the
    next from starting, or the fast endpoints idle until the slow one answers (they did: the two
    shards of the window each waited for their slowest prompt, 32 of 300 prompts were answered in
    those 12 s, and the run went at the slow endpoint's pace)."""
    source = tmp_path / "prompts.jsonl"
    write_prompts(source, 300)
    slow = SimConfig(**FAST, faults=FaultConfig(extra_latency_s=12.0))
    with (
        SimulatorProcess(SimConfig(**FAST)) as first,
        SimulatorProcess(SimConfig(**FAST)) as second,
        SimulatorProcess(slow) as slow_sim,
    ):
        config = write_config(
            tmp_path / "run.toml", name="slow", output_dir=tmp_path, url=first.url, source=source
        )
        more = "".join(f'\n[[endpoints]]\nurl = "{sim.url}"\n' for sim in (second, slow_sim))
        text = config.read_text().replace(f'url = "{first.url}"\n', f'url = "{first.url}"\n{more}')
        text = text.replace("limit = 64", "limit = 8").replace("shard_prompts = 250", "shard_prompts = 20")
        config.write_text(text)
        run = asyncio.create_task(execute(load_config(config), use_prefect=False))
        try:
            deadline = time.monotonic() + 30
            while (await asyncio.to_thread(slow_sim.stats))["requests_completed"] == 0:
                assert time.monotonic() < deadline, "the slow endpoint never answered"
                await asyncio.sleep(0.1)
            fast = [(await asyncio.to_thread(sim.stats))["requests_completed"] for sim in (first, second)]
            assert sum(fast) >= 250, f"the fast endpoints answered {fast} while the slow one answered none"
            status = await asyncio.wait_for(run, 30)
        finally:
            run.cancel()
    check = check_run(tmp_path / "slow")
    assert len(check.row_ids) == 300 and check.reject_ids == [] and check.duplicates == 0
    assert status.rows == 300


def test_prompts_in_flight_when_a_lone_server_dies_a_third_time_for_good_are_asked_again_once(
    tmp_path: Path,
) -> None:
    """A lone server restarts twice with every prompt in flight and then dies for good: the run stops
    (exit 3). In flight at two outages, every prompt is a suspect; none waiting for a slot (the run's
    last prompts), they are asked again together, and at the third outage together none is counted.
    None was there through a fault of its own: no reject (each a row to pay for, and a duplicate of
    the row the resume makes), and the same command asks each of them once."""
    prompts = 40
    source = tmp_path / "prompts.jsonl"
    write_prompts(source, prompts)
    # answers that take seconds (64 decode steps of 0.1 s, none stopping early): every prompt is in
    # flight, holding its slot, through each restart and back
    slow = SimConfig(**{**FAST, "time_scale": 1.0}, decode_base_s=0.1, stop_probability=0.0)
    with SimulatorProcess(slow) as sim:
        config = write_config(
            tmp_path / "run.toml", name="thrice", output_dir=tmp_path, url=sim.url, source=source
        )
        config.write_text(
            config.read_text().replace("max_wait_s = 0.5", "max_wait_s = 0.5\noutage_patience_s = 3")
        )
        proc = datagen("run", str(config), "--no-prefect")

        def all_running() -> None:
            deadline = time.monotonic() + 60
            while sim.stats()["running"] < prompts:
                assert proc.poll() is None and time.monotonic() < deadline, "the prompts were not all sent"
                time.sleep(0.05)

        for _ in range(2):
            all_running()
            sim.restart(4.0)  # longer than the client's retries: each prompt waits for the server
        all_running()
        sim.kill()
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 3, out.decode()[-2000:]
        assert b"is a suspect (in flight at two server outages)" in out
        stopped = check_run(tmp_path / "thrice")
        assert stopped.row_ids == [] and stopped.reject_ids == [], stopped.reject_reasons
        sim.start()  # the server is back (same port): the same command asks each prompt once
        again = datagen("run", str(config), "--no-prefect")
        assert again.wait(timeout=120) == 0
        assert sim.stats()["requests_received"] == prompts
    final = check_run(tmp_path / "thrice")
    assert len(final.row_ids) == prompts and final.duplicates == 0 and final.reject_ids == []
