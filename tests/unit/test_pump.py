from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from flows.client.errors import FatalEndpointError, PermanentRequestError, TransientRequestError
from flows.client.guard import Endpoint, EndpointGuard
from flows.client.responses import Generation, Usage
from flows.client.sampling import SamplingParams
from flows.config import CategoryConfig
from flows.control.demand import CategoryDemand
from flows.control.limit import FixedLimit, GuardedLimit
from flows.control.limiter import Lane, Limiter
from flows.run.prompt_stream import Ask, Reject, dedup_key
from flows.run.pump import CategorySink, Patience, RunAborted, Tally, pump_shard
from flows.run.rows import reject_row
from flows.run.suspects import SuspectGate
from flows.store.run_store import RunStore
from prompts.records import PromptRecord, SourceRef


class FakeClient:
    """Answers by prompt text: 'bad' -> 400, 'flaky' -> retries exhausted, 'key' -> 401."""

    endpoint = "http://fake"

    def __init__(self) -> None:
        self.in_flight = 0
        self.peak = 0
        self.sent: list[list[dict]] = []
        self.outages = 0

    async def generate(self, messages, tools, sampling):  # type: ignore[no-untyped-def]
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        try:
            await asyncio.sleep(0.001)
            self.sent.append(messages)
            text = messages[-1]["content"]
            if text == "bad":
                raise PermanentRequestError("prompt longer than the context", status=400)
            if text == "flaky":
                raise TransientRequestError("server unavailable (503)", status=503, attempts=6)
            if text == "outage" and self.outages:
                self.outages -= 1
                raise TransientRequestError("connection refused", attempts=6)
            if text == "key":
                raise FatalEndpointError("unauthorized (401)", status=401)
            return Generation(
                message={
                    "role": "assistant",
                    "content": "answer " + text,
                    "reasoning_content": None,
                    "tool_calls": None,
                },
                finish_reason="length" if text == "long" else "stop",
                usage=Usage(prompt_tokens=2, completion_tokens=3, reasoning_tokens=0, cached_tokens=0),
                model="m",
                latency_s=0.01,
                ttft_s=0.001,
                attempts=1,
            )
        finally:
            self.in_flight -= 1


class FakeGuard:
    """Reports the endpoint healthy (``comes_back``) or gone for good; counts the questions."""

    def __init__(self, comes_back: bool) -> None:
        self.comes_back = comes_back
        self.up = True
        self.asked = 0
        self.outages = 0  # it never sees its server down: a failure it recovers from is the prompt's

    @property
    def gone(self) -> bool:
        return not self.up

    async def recover(self, patience_s: float | None = None) -> bool:
        self.asked += 1
        self.up = self.comes_back
        return self.comes_back

    async def serve(self, request: Awaitable[Generation]) -> Generation:
        return await request


class SlowGuard(FakeGuard):
    """Comes back, after a health check that takes a while: down, not given up on, meanwhile."""

    def __init__(self, comes_back: bool, check_s: float) -> None:
        super().__init__(comes_back)
        self.check_s = check_s
        self.checking = False

    @property
    def gone(self) -> bool:
        return not self.up and not self.checking

    async def recover(self, patience_s: float | None = None) -> bool:
        self.asked += 1
        self.up, self.checking = False, True
        await asyncio.sleep(self.check_s)
        self.up, self.checking = self.comes_back, False
        return self.comes_back


def _lanes(*clients: FakeClient, limit: int, comes_back: bool = True) -> Limiter:
    """One lane per client, each with its guard, each lane closed while its guard is down."""
    lanes = []
    for client in clients:
        guard = FakeGuard(comes_back)
        lanes.append(Lane(Endpoint(client, guard), GuardedLimit(FixedLimit(limit), lambda g=guard: g.up)))  # type: ignore[arg-type]
    return Limiter(lanes)


def _item(i: int, text: str) -> Ask:
    record = PromptRecord(
        id=f"p{i}",
        category="c",
        source=SourceRef("d", "train", i),
        messages=[
            {"role": "system", "content": "sys"},
            {"role": "user", "content": text},
            {"role": "assistant", "content": "old"},
            {"role": "user", "content": "follow-up"},
        ],
    )
    return Ask(record, dedup_key(record, CATEGORY))


CATEGORY = CategoryConfig(name="c", source="x.jsonl", format="messages")


def _sink(tmp_path: Path) -> CategorySink:
    store = RunStore(tmp_path)
    return CategorySink(
        rows=store.row_writer("c", flush_rows=1000, flush_seconds=1000),
        rejects=store.reject_writer("c", flush_rows=1000, flush_seconds=1000),
        tally=Tally(),
    )


async def test_every_prompt_ends_as_one_row_or_one_reject(tmp_path: Path) -> None:
    client = FakeClient()
    limiter = _lanes(client, limit=4)
    sink = _sink(tmp_path)
    texts = ["ok"] * 20 + ["bad", "flaky", "long"]
    items: list = [_item(i, t) for i, t in enumerate(texts)]
    items.append(
        Reject(
            reject_row(
                record_id="raw-1",
                category="c",
                source={"dataset": "d", "split": "t", "row": 99},
                stage="convert",
                reason="no user turn",
            )
        )
    )
    await pump_shard(
        items, limiter=limiter, category=CATEGORY, sampling=SamplingParams(max_tokens=8), sink=sink
    )
    assert client.peak == 4 and limiter.in_flight == 0
    rows = {r["id"]: r for r in sink.rows._rows}
    rejects = {r["id"]: r for r in sink.rejects._rows}
    assert len(rows) == 21 and len(rejects) == 3
    assert set(rows) | set(rejects) == {f"p{i}" for i in range(23)} | {"raw-1"}
    assert rejects["p20"]["retryable"] is False and rejects["p20"]["status"] == 400
    assert rejects["p21"]["retryable"] is True and rejects["p21"]["attempts"] == 6
    assert rows["p22"]["flags"] == ["truncated"]
    assert sink.tally.rows == 21 and sink.tally.rejects == 3 and sink.tally.truncated == 1
    assert sink.tally.reject_reasons == {
        "prompt longer than the context": 1,
        "server unavailable (503)": 1,
        "no user turn": 1,
    }
    assert all(len(sent) == 2 for sent in client.sent)


async def test_fatal_endpoint_error_aborts_without_rejecting(tmp_path: Path) -> None:
    client = FakeClient()
    limiter = _lanes(client, limit=2)
    sink = _sink(tmp_path)
    items = [_item(0, "key")] + [_item(i, "ok") for i in range(1, 50)]
    with pytest.raises(RunAborted, match="401"):
        await pump_shard(
            items, limiter=limiter, category=CATEGORY, sampling=SamplingParams(max_tokens=8), sink=sink
        )
    assert sink.rejects.pending == 0
    assert sink.tally.rows < 49
    assert limiter.in_flight == 0


async def test_a_fatal_error_in_one_category_stops_the_others_waiting_for_a_slot(tmp_path: Path) -> None:
    """The categories share the limiter: one that aborts must not leave another waiting forever."""
    client = FakeClient()
    limiter = _lanes(client, limit=1)
    sampling = SamplingParams(max_tokens=8)
    first, second = _sink(tmp_path / "a"), _sink(tmp_path / "b")
    shards = [
        pump_shard([_item(0, "key")], limiter=limiter, category=CATEGORY, sampling=sampling, sink=first),
        pump_shard(
            [_item(i, "ok") for i in range(1, 40)],
            limiter=limiter,
            category=CATEGORY,
            sampling=sampling,
            sink=second,
        ),
    ]
    results = await asyncio.wait_for(asyncio.gather(*shards, return_exceptions=True), 10)
    assert [type(result) for result in results] == [RunAborted, RunAborted]
    assert all("401" in str(result) for result in results)
    assert second.tally.rows < 39 and second.rejects.pending == 0  # stopped, nothing rejected
    assert limiter.in_flight == 0


async def test_exhausted_retries_during_an_outage_are_asked_again_once_the_server_is_back(
    tmp_path: Path,
) -> None:
    client = FakeClient()
    client.outages = 2
    limiter = _lanes(client, limit=1)
    sink = _sink(tmp_path)
    sampling = SamplingParams(max_tokens=8)
    await pump_shard([_item(0, "outage")], limiter=limiter, category=CATEGORY, sampling=sampling, sink=sink)
    assert sink.tally.rows == 1 and sink.tally.rejects == 0 and sink.tally.recovered == 2
    guard = limiter.lanes[0].endpoint.guard
    assert guard.asked == 2


class StampReadingClient(FakeClient):
    """Reads, at each request, when the budget counts the requests in flight on ``lane`` as admitted."""

    def __init__(self) -> None:
        super().__init__()
        self.lane: Lane | None = None
        self.stamps: list[list[float]] = []

    async def generate(self, messages, tools, sampling):  # type: ignore[no-untyped-def]
        assert self.lane is not None
        self.stamps.append([row[1] for _, rows in self.lane.footprints.values() for row in rows.values()])
        return await super().generate(messages, tools, sampling)


async def test_a_prompt_asked_again_after_an_outage_counts_as_admitted_anew(tmp_path: Path) -> None:
    """Asked again from its start, it holds only its prompt: counted at its old age, the outlook
    took it for nearly done and let the budget admit beside it what its answer would need."""
    client = StampReadingClient()
    client.outages = 1
    limiter = _lanes(client, limit=1)
    client.lane = limiter.lanes[0]
    sink = _sink(tmp_path)
    demand = CategoryDemand(max_tokens=8)
    await pump_shard(
        [_item(0, "outage")],
        limiter=limiter,
        category=CATEGORY,
        sampling=SamplingParams(max_tokens=8),
        sink=sink,
        demand=demand,
    )
    assert sink.tally.rows == 1 and sink.tally.recovered == 1
    (first,), (again,) = client.stamps
    assert again > first
    assert limiter.lanes[0].footprints[id(demand)][1] == {}  # forgotten once answered


async def test_a_prompt_failing_on_a_healthy_server_ends_as_a_retryable_reject(tmp_path: Path) -> None:
    client = FakeClient()
    limiter = _lanes(client, limit=1)
    sink = _sink(tmp_path)
    sampling = SamplingParams(max_tokens=8)
    await pump_shard([_item(0, "flaky")], limiter=limiter, category=CATEGORY, sampling=sampling, sink=sink)
    (reject,) = sink.rejects._rows
    assert reject["retryable"] is True
    # asked again twice; the third failure too asks whether the server is healthy (it is: the
    # prompt's fault), then gives up (3 rounds)
    assert limiter.lanes[0].endpoint.guard.asked == 3


async def test_a_lone_endpoint_gone_for_good_stops_the_run_instead_of_rejecting(tmp_path: Path) -> None:
    client = FakeClient()
    client.outages = 10**6
    limiter = _lanes(client, limit=4, comes_back=False)
    sink = _sink(tmp_path)
    items = [_item(i, "ok") for i in range(3)] + [_item(i, "outage") for i in range(3, 40)]
    with pytest.raises(RunAborted, match="no endpoint has answered"):
        await pump_shard(
            items, limiter=limiter, category=CATEGORY, sampling=SamplingParams(max_tokens=8), sink=sink
        )
    assert sink.tally.rows == 3 and sink.tally.rejects == 0  # what was done is kept; nothing rejected
    assert limiter.in_flight == 0


async def test_prompts_move_to_another_endpoint_when_theirs_goes_silent(tmp_path: Path) -> None:
    dead, alive = FakeClient(), FakeClient()
    dead.outages = 10**6
    dead.endpoint = "http://dead"  # type: ignore[misc]
    limiter = _lanes(dead, alive, limit=2)
    limiter.lanes[0].endpoint.guard.comes_back = False  # type: ignore[attr-defined]
    sink = _sink(tmp_path)
    items = [_item(i, "outage") for i in range(20)]
    await pump_shard(
        items, limiter=limiter, category=CATEGORY, sampling=SamplingParams(max_tokens=8), sink=sink
    )
    rows = sink.rows._rows
    assert len(rows) == 20 and sink.tally.rejects == 0
    assert {row["endpoint"] for row in rows} == {"http://fake"}  # all answered by the live endpoint
    assert limiter.lanes[0].endpoint.guard.up is False  # the silent one took no more prompts
    assert sink.tally.recovered >= 1


async def test_an_endpoint_checking_its_health_is_not_given_up_on_by_another_ones_requests(
    tmp_path: Path,
) -> None:
    """A's requests give up on A while B's one failed request checks B's health: the run goes on on
    B (it stopped here, every lane being down for that moment)."""
    dead, flaky = FakeClient(), FakeClient()
    dead.outages, flaky.outages = 10**6, 1
    dead.endpoint = "http://dead"  # type: ignore[misc]
    guards = [SlowGuard(comes_back=False, check_s=0.05), SlowGuard(comes_back=True, check_s=0.3)]
    limiter = Limiter(
        [
            Lane(Endpoint(client, guard), GuardedLimit(FixedLimit(1), lambda g=guard: g.up))  # type: ignore[arg-type]
            for client, guard in zip((dead, flaky), guards, strict=True)
        ]
    )
    sink = _sink(tmp_path)
    items = [_item(0, "outage"), _item(1, "outage")]
    await asyncio.wait_for(
        pump_shard(
            items, limiter=limiter, category=CATEGORY, sampling=SamplingParams(max_tokens=8), sink=sink
        ),
        10,
    )
    assert sink.tally.rows == 2 and sink.tally.rejects == 0
    assert {row["endpoint"] for row in sink.rows._rows} == {"http://fake"}


async def test_every_endpoint_given_up_on_stops_the_run_and_says_how_long_each_was_waited_for(
    tmp_path: Path,
) -> None:
    first, second = FakeClient(), FakeClient()
    first.outages = second.outages = 10**6
    limiter = _lanes(first, second, limit=2, comes_back=False)
    sink = _sink(tmp_path)
    items = [_item(i, "outage") for i in range(10)]
    with pytest.raises(RunAborted, match=r"each of the 2 was given up on \(after 60 s while another"):
        await pump_shard(
            items, limiter=limiter, category=CATEGORY, sampling=SamplingParams(max_tokens=8), sink=sink
        )
    assert sink.tally.rows == 0 and sink.tally.rejects == 0 and limiter.in_flight == 0


async def test_an_answer_that_cannot_be_read_is_a_retryable_reject_not_a_lost_prompt(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    class Buggy(FakeClient):
        async def generate(self, messages, tools, sampling):  # type: ignore[no-untyped-def]
            if messages[-1]["content"] == "odd":
                raise KeyError("tool_calls")
            return await super().generate(messages, tools, sampling)

    limiter = _lanes(Buggy(), limit=4)
    sink = _sink(tmp_path)
    items = [_item(0, "ok"), _item(1, "odd"), _item(2, "ok"), _item(3, "odd")]
    await pump_shard(
        items, limiter=limiter, category=CATEGORY, sampling=SamplingParams(max_tokens=8), sink=sink
    )
    assert sink.tally.rows == 2 and sink.tally.rejects == 2 and sink.tally.internal_errors == 2
    rejects = {r["id"]: r for r in sink.rejects._rows}
    assert set(rejects) == {"p1", "p3"}
    assert all(r["retryable"] is True for r in rejects.values())
    assert rejects["p1"]["reason"] == "internal error: KeyError: 'tool_calls'"
    errors = [r for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and errors[0].exc_info is not None  # the first traceback, once
    assert limiter.in_flight == 0


async def test_a_category_whose_first_rows_are_nearly_all_left_out_of_training_is_said_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A thinking model whose answers all end inside the reasoning made flagged rows for a week, the
    numbers in the report only at the end."""
    limiter = _lanes(FakeClient(), limit=4)
    sink = _sink(tmp_path)
    items = [_item(i, "long") for i in range(40)]  # every answer cut by max_tokens
    await pump_shard(
        items, limiter=limiter, category=CATEGORY, sampling=SamplingParams(max_tokens=8), sink=sink
    )
    warnings = [r.getMessage() for r in caplog.records if "left out of training" in r.getMessage()]
    assert len(warnings) == 1 and "32 of its first 32 rows" in warnings[0] and "truncated 32" in warnings[0]
    assert sink.tally.truncated == sink.tally.left_out == 40
    caplog.clear()
    fine = _sink(tmp_path / "fine")
    await pump_shard(
        [_item(i, "ok") for i in range(40)],
        limiter=limiter,
        category=CATEGORY,
        sampling=SamplingParams(max_tokens=8),
        sink=fine,
    )
    assert not [r for r in caplog.records if "left out of training" in r.getMessage()]


async def test_an_answer_of_types_the_shard_cannot_hold_is_a_retryable_reject_and_the_shard_still_writes(
    tmp_path: Path,
) -> None:
    """A server that says a tool call's arguments as a JSON object (not the string OpenAI's API has)
    made a row Arrow could not write: the whole buffered shard failed at its flush, the run stopped
    with every other buffered row of the category lost, and each resume asked the prompt again and
    stopped again."""

    class ObjectArguments(FakeClient):
        async def generate(self, messages, tools, sampling):  # type: ignore[no-untyped-def]
            generation = await super().generate(messages, tools, sampling)
            if messages[-1]["content"] == "odd":
                call = {"id": "call-1", "type": "function", "function": {"name": "f", "arguments": {"a": 1}}}
                generation.message = {**generation.message, "content": None, "tool_calls": [call]}
            return generation

    limiter = _lanes(ObjectArguments(), limit=4)
    sink = _sink(tmp_path)
    items = [_item(0, "ok"), _item(1, "odd"), _item(2, "ok")]
    await pump_shard(
        items, limiter=limiter, category=CATEGORY, sampling=SamplingParams(max_tokens=8), sink=sink
    )
    assert sink.rows.write(sink.rows.take()) is not None  # the good rows reach the disk
    assert sink.rows.written == 2 and sink.tally.rows == 2
    (reject,) = sink.rejects.take()
    assert reject["id"] == "p1" and reject["retryable"] is True
    assert reject["reason"].startswith("internal error: UnstorableRow: ")
    assert limiter.in_flight == 0


class DownClient(FakeClient):
    """An endpoint that refuses every request until ``back_at`` (``time.monotonic``; None: never)."""

    def __init__(self, endpoint: str, back_at: float | None) -> None:
        super().__init__()
        self.endpoint = endpoint  # type: ignore[misc]
        self.back_at = back_at

    def serving(self) -> bool:
        return self.back_at is not None and time.monotonic() >= self.back_at

    async def generate(self, messages, tools, sampling):  # type: ignore[no-untyped-def]
        if not self.serving():
            await asyncio.sleep(0.001)
            raise TransientRequestError("connection refused", attempts=6)
        return await super().generate(messages, tools, sampling)


async def test_every_endpoint_down_then_one_back_within_the_outage_patience_finishes_the_run(
    tmp_path: Path,
) -> None:
    """All endpoints down at once (a switch rebooting), one back after 1 s: each is given up on after
    ``failover_s`` (0.2 s), but no endpoint has been silent for ``outage_s`` (5 s), so the prompts
    wait for the one that comes back. The run stopped at 0.2 s: a node idle until someone looked."""
    sink = _sink(tmp_path)  # before the clock starts: making the store can take a second
    clients = [DownClient("http://a", None), DownClient("http://b", time.monotonic() + 1.0)]
    lanes = []
    for client in clients:
        guard = EndpointGuard(client.endpoint, poll_s=0.02)
        guard.healthy = lambda c=client: asyncio.sleep(0, c.serving())  # type: ignore[method-assign]
        lanes.append(Lane(Endpoint(client, guard), GuardedLimit(FixedLimit(2), guard.is_up)))  # type: ignore[arg-type]
    limiter = Limiter(lanes)
    for lane in lanes:
        lane.endpoint.guard.on_up = limiter.notify

    async def probe() -> None:  # the pool's probe loop: an endpoint given up on is put back
        while True:
            await asyncio.sleep(0.05)
            for lane in lanes:
                await lane.endpoint.guard.probe()

    prober = asyncio.create_task(probe())
    try:
        await asyncio.wait_for(
            pump_shard(
                [_item(i, "ok") for i in range(6)],
                limiter=limiter,
                category=CATEGORY,
                sampling=SamplingParams(max_tokens=8),
                sink=sink,
                patience=Patience(outage_s=5.0, failover_s=0.2),
            ),
            10,
        )
    finally:
        prober.cancel()
    assert sink.tally.rows == 6 and sink.tally.rejects == 0
    assert {row["endpoint"] for row in sink.rows._rows} == {"http://b"}


async def test_a_request_left_waiting_on_an_endpoint_given_up_on_moves_to_one_that_answers(
    tmp_path: Path,
) -> None:
    """A host gone silent (powered off, cut from the network) closes no connection: a request it was
    answering waits for the read timeout (an hour by default) while its endpoint's other requests fail,
    and the guard gives up on it after ``failover_s``. That request is then asked elsewhere too; it
    waited out the hour, and held its shard (and the run's end) with it."""

    class Vanished(FakeClient):
        endpoint = "http://vanished"

        def __init__(self) -> None:
            super().__init__()
            self.requests = 0

        async def generate(self, messages, tools, sampling):  # type: ignore[no-untyped-def]
            self.requests += 1
            if self.requests == 1:
                await asyncio.sleep(3600)  # its answer never comes, its connection stays open
            raise TransientRequestError("connection timed out", attempts=6)

    sink = _sink(tmp_path)
    guard = EndpointGuard("http://vanished", poll_s=0.02)
    guard.healthy = lambda: asyncio.sleep(0, False)  # type: ignore[method-assign]
    lanes = [
        Lane(Endpoint(Vanished(), guard), GuardedLimit(FixedLimit(2), guard.is_up)),  # type: ignore[arg-type]
        Lane(Endpoint(FakeClient(), FakeGuard(comes_back=True)), FixedLimit(2)),  # type: ignore[arg-type]
    ]
    await asyncio.wait_for(
        pump_shard(
            [_item(i, "ok") for i in range(6)],
            limiter=Limiter(lanes),
            category=CATEGORY,
            sampling=SamplingParams(max_tokens=8),
            sink=sink,
            patience=Patience(outage_s=5.0, failover_s=0.2),
        ),
        5,
    )
    assert sink.tally.rows == 6 and sink.tally.rejects == 0
    assert {row["endpoint"] for row in sink.rows._rows} == {"http://fake"}


class DyingServer(FakeClient):
    """A server the test brings down: its requests go as ``script`` says, one entry a request, then
    answer. 'dies': it goes down with the request in flight (refused until restarted); '503': the
    client's retries run out on a healthy, busy server. A prompt 'kills' brings it down every time."""

    def __init__(self, endpoint: str, script: list[str] | None = None) -> None:
        super().__init__()
        self.endpoint = endpoint  # type: ignore[misc]
        self.script = script or []
        self.alive = True
        self.deaths = 0

    async def generate(self, messages, tools, sampling):  # type: ignore[no-untyped-def]
        await asyncio.sleep(0.001)
        step = "dies" if messages[-1]["content"] == "kills" else self.script.pop(0) if self.script else ""
        if step == "dies" and self.alive:
            self.alive, self.deaths = False, self.deaths + 1
        if not self.alive:
            raise TransientRequestError("connection refused", attempts=6)
        if step == "503":
            raise TransientRequestError("server unavailable (503)", status=503, attempts=6)
        return await super().generate(messages, tools, sampling)


class Relauncher:
    """The ``Engine`` of a server the run launched: ``ensure_running`` restarts it when it is down,
    ``restarts`` times; the start after those fails (as ``LaunchedEngine``'s does: it raises)."""

    def __init__(self, server: DyingServer, restarts: float = math.inf, start_s: float = 0.0) -> None:
        self.server = server
        self.restarts = restarts
        self.start_s = start_s

    def ensure_running(self, on_start: Callable[[], object] | None = None) -> list[str]:
        if self.server.alive:
            return []
        if on_start is not None:
            on_start()
        if not self.restarts:
            raise RuntimeError("the server did not start")
        self.restarts -= 1
        time.sleep(self.start_s)  # in the guard's thread, as a real start
        self.server.alive = True
        return ["restarted"]


def _dying_lane(
    server: DyingServer, limit: int, *, relaunched: bool, restarts: float = math.inf, start_s: float = 0.0
) -> Lane:
    """A lane on ``server`` with a real guard: one the run restarts (``restarts`` times, each start
    taking ``start_s``), or one gone once it dies."""
    engine = Relauncher(server, restarts, start_s) if relaunched else None
    guard = EndpointGuard(server.endpoint, engine, poll_s=0.01)  # type: ignore[arg-type]
    guard.healthy = lambda: asyncio.sleep(0, server.alive)  # type: ignore[method-assign]
    return Lane(Endpoint(server, guard), GuardedLimit(FixedLimit(limit), guard.is_up))  # type: ignore[arg-type]


async def test_outages_a_prompt_lived_through_do_not_spend_its_rounds_on_a_healthy_server(
    tmp_path: Path,
) -> None:
    """Endpoint A dies with the prompt in flight (it moves to B), then B dies and is restarted, then
    B, healthy but busy, answers 503 until the client's retries run out, twice. Two outages and two
    failures on a healthy server: the prompt is answered. The outages spent its rounds, and its
    first failure on a healthy server after them made it a reject that only a resume asked again."""
    a = DyingServer("http://a", ["dies"])
    b = DyingServer("http://b", ["dies", "503", "503"])
    sink = _sink(tmp_path)
    lanes = [_dying_lane(a, limit=2, relaunched=False), _dying_lane(b, limit=1, relaunched=True)]
    await asyncio.wait_for(
        pump_shard(
            [_item(0, "ok")],
            limiter=Limiter(lanes),
            category=CATEGORY,
            sampling=SamplingParams(max_tokens=8),
            sink=sink,
            patience=Patience(outage_s=5.0, failover_s=0.05),
        ),
        10,
    )
    assert sink.rejects._rows == [] and [row["endpoint"] for row in sink.rows._rows] == ["http://b"]
    assert lanes[1].endpoint.guard.restarts == 1 and not b.script  # it went through all of it


async def _pump_on(
    lane: Lane,
    items: list[Ask],
    sink: CategorySink,
    convicted: frozenset[str] = frozenset(),
    suspects: SuspectGate | None = None,
) -> None:
    """The items through one lane, within 10 s (``convicted``, ``suspects``: as ``pump_shard`` takes them)."""
    await asyncio.wait_for(
        pump_shard(
            items,
            limiter=Limiter([lane]),
            category=CATEGORY,
            sampling=SamplingParams(max_tokens=8),
            sink=sink,
            convicted=convicted,
            suspects=suspects,
        ),
        10,
    )


async def test_a_prompt_that_brings_the_server_down_each_time_is_rejected_after_three_outages(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A prompt that crashes the server (a real thing: a kernel fault on one input) must not have the
    run restart the server for ever: in flight at three of its deaths, it is a retryable reject that
    says why, and the prompts after it are answered by the restarted server."""
    server = DyingServer("http://a")
    lane = _dying_lane(server, limit=1, relaunched=True)
    sink = _sink(tmp_path)
    await _pump_on(lane, [_item(0, "kills")] + [_item(i, "ok") for i in range(1, 6)], sink)
    (reject,) = sink.rejects._rows
    assert reject["id"] == "p0" and reject["retryable"] is True
    assert reject["reason"].startswith("in flight at 3 server outages")
    assert server.deaths == 3  # sent three times, each time it brought the server down
    assert sink.tally.rows == 5 and lane.endpoint.guard.restarts == 3
    (named,) = [r.getMessage() for r in caplog.records if "a retryable reject" in r.getMessage()]
    assert "prompt p0 was in flight at 3 server outages" in named


async def test_a_prompt_in_flight_at_the_outage_that_stops_the_run_is_left_to_the_resume_not_rejected(
    tmp_path: Path,
) -> None:
    """A lone endpoint dies three times with the prompt in flight: restarted twice, its third start
    fails and the run stops. The prompt failed with its server each time: not rejected (a reject
    row to pay for and retry by hand), but left unanswered, and the resume asks it once."""
    server = DyingServer("http://a", ["dies", "dies", "dies"])
    lane = _dying_lane(server, limit=1, relaunched=True, restarts=2)
    sink = _sink(tmp_path)
    items = [_item(0, "ok")]
    with pytest.raises(RunAborted, match="no endpoint has answered"):
        await asyncio.wait_for(
            pump_shard(
                items,
                limiter=Limiter([lane]),
                category=CATEGORY,
                sampling=SamplingParams(max_tokens=8),
                sink=sink,
            ),
            10,
        )
    assert server.deaths == 3 and lane.endpoint.guard.restarts == 2  # in flight at all three
    assert sink.rejects._rows == [] and sink.tally.rejects == 0 and sink.tally.rows == 0
    sink.rows.flush(), sink.rejects.flush()

    done = RunStore(tmp_path).category_state("c").done_ids
    again = [item for item in items if item.record.id not in done]  # what the resume asks
    back = DyingServer("http://a")
    resumed = _sink(tmp_path)
    await pump_shard(
        again,
        limiter=Limiter([_dying_lane(back, limit=1, relaunched=True)]),
        category=CATEGORY,
        sampling=SamplingParams(max_tokens=8),
        sink=resumed,
    )
    resumed.rows.flush(), resumed.rejects.flush()
    state = RunStore(tmp_path).category_state("c")
    assert len(back.sent) == 1 and state.row_ids == {"p0"}
    assert state.final_reject_ids == state.retryable_reject_ids == set()


async def test_a_lone_server_dying_again_right_after_its_restart_leaves_its_prompt_for_the_resume(
    tmp_path: Path,
) -> None:
    """Restarted once, the server dies again with the re-sent prompt in flight, and does not start
    again. The guard had answered "it serves" to any request within a second of its last passing
    check, later failures included: the prompt's failures on the dead server counted as its own,
    three of them a reject, as the run stopped on that server."""
    server = DyingServer("http://a", ["dies", "dies"])
    lane = _dying_lane(server, limit=1, relaunched=True, restarts=1)
    guard = lane.endpoint.guard
    sink = _sink(tmp_path)
    with pytest.raises(RunAborted, match="no endpoint has answered"):
        await asyncio.wait_for(
            pump_shard(
                [_item(0, "ok")],
                limiter=Limiter([lane]),
                category=CATEGORY,
                sampling=SamplingParams(max_tokens=8),
                sink=sink,
            ),
            10,
        )
    assert server.deaths == 2 and guard.restarts == 1
    assert sink.rejects._rows == [] and sink.tally.rows == 0


class BatchServer(DyingServer):
    """Answers after 50 ms, and a request in flight when the server dies fails with it; a killer
    brings it down 20 ms into its request (a fault in the decode): the batch beside a killer is in
    flight at each of its deaths."""

    async def generate(self, messages, tools, sampling):  # type: ignore[no-untyped-def]
        if not self.alive:
            return await super().generate(messages, tools, sampling)
        life = self.deaths
        await asyncio.sleep(0.02 if messages[-1]["content"] == "kills" else 0.05)
        if messages[-1]["content"] == "kills":
            return await super().generate(messages, tools, sampling)
        if not self.alive or self.deaths != life:
            raise TransientRequestError("connection reset", attempts=6)
        return await super().generate(messages, tools, sampling)


async def test_a_killer_among_a_batch_is_found_alone_and_the_batch_beside_it_is_answered(
    tmp_path: Path,
) -> None:
    """A prompt that brings the server down, sent in a batch, more prompts waiting for a slot: the
    batch is in flight at its first two deaths, and every prompt in flight at three used to be
    rejected with it (a resume asked them all again, and the killer brought the server down three
    more times). In flight at a second outage, a prompt is asked again only with no other such
    suspect in flight while prompts wait: the killer is alone among them at its third death, the only
    reject; every other prompt is a row, and three deaths in all."""
    server = BatchServer("http://a")
    lane = _dying_lane(server, limit=6, relaunched=True, start_s=0.1)
    sink = _sink(tmp_path)
    waiting = [_item(i, "ok") for i in range(6, 100)]
    await _pump_on(lane, [_item(i, "ok") for i in range(1, 6)] + [_item(0, "kills")] + waiting, sink)
    (reject,) = sink.rejects._rows
    assert reject["id"] == "p0" and reject["retryable"] is True
    assert "no other suspect in flight" in reject["reason"], reject["reason"]
    assert server.deaths == 3
    assert sorted(row["id"] for row in sink.rows._rows) == sorted(f"p{i}" for i in range(1, 100))
    assert sink.tally.outage_rejects == 1


async def test_a_killer_among_the_last_prompts_is_found_in_halving_groups(tmp_path: Path) -> None:
    """The same batch with no prompt waiting (the run's last): suspects one at a time would leave the
    batch's slots empty for as many request lives, so they go together, half as many after each
    death among them; the killer is alone after a few more deaths, the only reject, the rest rows."""
    server = BatchServer("http://a")
    lane = _dying_lane(server, limit=16, relaunched=True, start_s=0.1)
    sink = _sink(tmp_path)
    gate = SuspectGate(unused_s=0.0)  # the room to spare seen at once: they go together at once
    await _pump_on(lane, [_item(i, "ok") for i in range(1, 16)] + [_item(0, "kills")], sink, suspects=gate)
    (reject,) = sink.rejects._rows
    assert reject["id"] == "p0" and "no other suspect in flight" in reject["reason"]
    assert sorted(row["id"] for row in sink.rows._rows) == sorted(f"p{i}" for i in range(1, 16))
    # two deaths make the suspects, then groups of 16, 8, 4, 2 at most, then the killer alone
    assert 3 < server.deaths <= 2 + 4 + 1, server.deaths


async def test_a_prompt_an_earlier_start_rejected_alone_is_asked_alone_first_and_final_if_it_kills_again(
    tmp_path: Path,
) -> None:
    """An earlier start rejected p0 alone among suspects at its third outage. This start asks it as a
    suspect from the first, alone while prompts wait: it brings the server down once more, and is a
    final reject that no start asks again (before: three deaths at every start); the five
    beside it are rows. A prompt an earlier start rejected so, that this one answers, is a row."""
    server = BatchServer("http://a")
    lane = _dying_lane(server, limit=6, relaunched=True, start_s=0.1)
    sink = _sink(tmp_path)
    items = [_item(0, "kills"), _item(6, "ok")] + [_item(i, "ok") for i in range(1, 6)]
    waiting = [_item(i, "ok") for i in range(7, 100)]
    await _pump_on(lane, items + waiting, sink, convicted=frozenset({"p0", "p6"}))
    (reject,) = sink.rejects._rows
    assert reject["id"] == "p0" and reject["retryable"] is False
    assert reject["reason"].startswith("brought the server down again"), reject["reason"]
    assert server.deaths == 1
    assert sorted(row["id"] for row in sink.rows._rows) == sorted(f"p{i}" for i in range(1, 100))
