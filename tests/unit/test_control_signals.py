"""Load signals parsed from the real servers' captured responses (SGLang 0.5.23, vLLM 0.32)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from flows.control.signals import (
    ServerSample,
    SignalReader,
    parse_loads,
    parse_metrics,
    with_loads,
    with_pool,
)
from sglang_launch.probe import kv_capacity, kv_page_tokens

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def _text(name: str) -> str:
    return (FIXTURES / name).read_text()


def test_sglang_metrics_under_load_after_a_retraction() -> None:
    sample = parse_metrics(_text("sglang-0.5.23/metrics_after_retraction.prom"))
    assert sample == ServerSample(
        source="sglang-metrics",
        kv_usage=0.93,
        running=10,
        queued=46,
        preemptions_total=1.0,
        capacity_tokens=4096,
        generation_tokens_total=2257.0 + 16.0,  # both is_streaming series
        decode_tokens_per_s=1976.3521852093966,  # gen_throughput: the decode clock's rate
    )


def test_sglang_retraction_counter_absent_before_the_first_retraction_reads_zero() -> None:
    text = _text("sglang-0.5.23/metrics_idle.prom")
    assert "num_retracted_requests_total" not in text
    sample = parse_metrics(text)
    assert sample is not None and sample.preemptions_total == 0.0 and sample.queued == 0


def test_only_tp_rank_0_carries_the_load_gauges() -> None:
    both = (
        "# TYPE sglang:token_usage gauge\n"
        'sglang:token_usage{tp_rank="1"} 0.10\n'
        'sglang:token_usage{tp_rank="0"} 0.85\n'
        "# TYPE sglang:num_running_reqs gauge\n"
        'sglang:num_running_reqs{tp_rank="1"} 0.0\n'
        'sglang:num_running_reqs{tp_rank="0"} 12.0\n'
    )
    sample = parse_metrics(both)
    assert sample is not None and (sample.kv_usage, sample.running) == (0.85, 12)
    text = _text("sglang-0.5.23/metrics_after_retraction.prom")
    assert parse_metrics(text.replace('tp_rank="0"', 'tp_rank="1"')) is None


def test_with_data_parallel_ranks_the_gauges_are_summed_over_ranks_as_the_loads_are() -> None:
    """SGLang before /v1/loads (0.5.8): each DP rank's tp_rank 0 says its own gauges (``dp_rank``)."""
    one = _text("sglang-0.5.23/metrics_load_kvfull_queue.prom")
    ranked = one.replace('tp_rank="0"', 'tp_rank="0",dp_rank="0"')
    other = "\n".join(
        line.replace('dp_rank="0"', 'dp_rank="1"')
        .replace("} 0.99", "} 0.49")  # the second rank half as full
        .replace("} 9.0", "} 5.0")  # running
        for line in ranked.splitlines()
        if 'dp_rank="0"' in line
    )
    alone, both = parse_metrics(one), parse_metrics(ranked + "\n" + other + "\n")
    assert alone is not None and both is not None
    assert (alone.kv_usage, alone.running, alone.queued, alone.capacity_tokens) == (0.99, 9, 12, 4096)
    assert both.capacity_tokens == 2 * 4096 and both.running == 9 + 5 and both.queued == 2 * 12
    assert both.kv_usage == pytest.approx((0.99 + 0.49) / 2)  # pools alike: the used over both
    assert both.preemptions_total == 2 * 2.0
    assert alone.decode_tokens_per_s is not None
    assert both.decode_tokens_per_s == pytest.approx(2 * alone.decode_tokens_per_s)
    assert both.generation_tokens_total == alone.generation_tokens_total  # not per rank: counted once


def test_vllm_metrics_map_to_the_same_sample() -> None:
    sample = parse_metrics(_text("vllm-0.32.0/metrics_after_preemption.prom"))
    assert sample is not None
    assert sample.source == "vllm-metrics"
    assert (sample.running, sample.queued, sample.preemptions_total) == (10, 52, 2.0)
    assert sample.kv_usage is not None and abs(sample.kv_usage - 0.9677) < 1e-3
    assert sample.capacity_tokens == 4096  # cache_config_info's kv_cache_size_tokens: the budget's pool


def test_vllm_capacity_from_blocks_where_the_pool_size_label_is_missing() -> None:
    text = _text("vllm-0.32.0/metrics_after_preemption.prom").replace('kv_cache_size_tokens="4096",', "")
    sample = parse_metrics(text)
    assert sample is not None and sample.capacity_tokens == 32 * 128  # num_gpu_blocks x block_size
    bare = "\n".join(line for line in text.splitlines() if "cache_config_info" not in line)
    no_config = parse_metrics(bare)
    assert no_config is not None and no_config.capacity_tokens is None  # usage alone, as before


def test_text_without_engine_metrics_is_no_sample() -> None:
    assert parse_metrics("# HELP x y\n# TYPE x gauge\nx 1.0\n") is None


def test_v1_loads_under_load() -> None:
    sample = parse_loads(json.loads(_text("sglang-0.5.23/v1_loads_load.json")))
    assert sample is not None
    assert (sample.running, sample.queued, sample.capacity_tokens, sample.max_running) == (8, 56, 4096, 16)
    assert sample.kv_usage is not None and abs(sample.kv_usage - 3796 / 4096) < 1e-9
    assert sample.busy_us == 1056093 + 13411235  # prefill's busy µs + the decode steps' (decode_moments[2])
    assert sample.decode_tokens_per_s == 1991.03  # gen_throughput, as /metrics says it
    older = {
        key: value for key, value in json.loads(_text("sglang-0.5.23/v1_loads_load.json"))["loads"][0].items()
    }
    del older["gen_throughput"]
    before = parse_loads({"loads": [older]})
    assert before is not None and before.decode_tokens_per_s is None  # not said: not zero
    assert parse_loads({"loads": []}) is None


def test_the_busy_time_is_the_mean_over_dp_ranks_and_unknown_where_the_server_does_not_count_it() -> None:
    idle = json.loads(_text("sglang-0.5.23/v1_loads_idle.json"))["loads"][0]
    two_ranks = {"loads": [idle, {**idle, "total_prefill_busy_us": 0, "decode_moments": None}]}
    sample = parse_loads(two_ranks)
    assert sample is not None and sample.busy_us == (87672 + 360151) / 2  # the second rank never decoded
    older = {
        key: value for key, value in idle.items() if key not in ("total_prefill_busy_us", "decode_moments")
    }
    before = parse_loads({"loads": [older]})
    assert before is not None and before.busy_us is None and before.running == idle["num_running_reqs"]


def test_the_pool_from_server_info_fills_only_what_is_missing() -> None:
    bare = ServerSample(source="sglang-loads", kv_usage=0.5)
    assert with_pool(bare, 8192, 16) == ServerSample(
        source="sglang-loads", kv_usage=0.5, capacity_tokens=8192, block_tokens=16
    )
    said = ServerSample(source="vllm-metrics", capacity_tokens=4096, block_tokens=128)
    assert with_pool(said, 8192, 16) == said
    assert with_pool(bare, None, None) == bare
    assert with_pool(None, 8192, 1) is None


def test_vllm_says_its_block_size() -> None:
    sample = parse_metrics(_text("vllm-0.32.0/metrics_after_preemption.prom"))
    assert sample is not None and sample.block_tokens == 128
    sglang = parse_metrics(_text("sglang-0.5.23/metrics_after_retraction.prom"))
    assert sglang is not None and sglang.block_tokens is None  # SGLang's page size is in its server info


def test_sglang_says_its_page_size_in_its_server_info() -> None:
    info = json.loads(_text("sglang-0.5.23/get_server_info.json"))
    assert kv_page_tokens(info) == 1 and kv_capacity(info) == 4096
    assert kv_page_tokens({"page_size": 64}) == 64
    assert kv_page_tokens({}) is None and kv_page_tokens(None) is None


def test_sglang_load_now_from_v1_loads_and_the_counters_and_rate_from_metrics() -> None:
    metrics = parse_metrics(_text("sglang-0.5.23/metrics_after_retraction.prom"))
    loads = parse_loads(json.loads(_text("sglang-0.5.23/v1_loads_load.json")))
    assert metrics is not None and loads is not None
    both = with_loads(metrics, loads)
    assert both.source == "sglang-metrics+loads" and not both.lags and metrics.lags
    # the load as the snapshot says it (15 decode steps old at most, the gauges 40)
    assert (both.kv_usage, both.running, both.queued) == (3796 / 4096, 8, 56)
    assert both.max_running == 16 and both.busy_us == loads.busy_us
    assert both.decode_steps == 273.0  # decode_moments[0]: a token per running request each step
    # the counters, and the decode rate with the requests it was measured over, from /metrics
    assert (both.preemptions_total, both.generation_tokens_total) == (1.0, 2257.0 + 16.0)
    assert (both.decode_tokens_per_s, both.decode_running) == (metrics.decode_tokens_per_s, 10)
    assert with_loads(metrics, None) is metrics
    assert both.capacity_tokens == 4096 == metrics.capacity_tokens  # one rank: the same pool


def test_with_data_parallel_ranks_the_pool_is_all_ranks_as_the_load_is() -> None:
    metrics = parse_metrics(_text("sglang-0.5.23/metrics_after_retraction.prom"))  # rank 0's gauges
    rank = json.loads(_text("sglang-0.5.23/v1_loads_load.json"))["loads"][0]
    loads = parse_loads({"loads": [rank, {**rank, "dp_rank": 1, "num_used_tokens": 1000}]})
    assert metrics is not None and loads is not None
    both = with_loads(metrics, loads)
    assert both.capacity_tokens == 2 * 4096 and both.running == 16
    assert both.kv_usage == (3796 + 1000) / (2 * 4096)


class _Server:
    """An endpoint's ``/metrics`` and ``/v1/loads`` answers, counting what was asked."""

    def __init__(self, metrics: str, loads: list[httpx.Response]) -> None:
        self.metrics, self.loads, self.asked = metrics, loads, {"/metrics": 0, "/v1/loads": 0}

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.asked[request.url.path] += 1
        if request.url.path == "/metrics":
            return httpx.Response(200, text=self.metrics)
        return self.loads.pop(0) if len(self.loads) > 1 else self.loads[0]


async def _reads(server: _Server, times: int) -> list[ServerSample | None]:
    reader = SignalReader("http://server")
    reader._http = httpx.AsyncClient(transport=httpx.MockTransport(server))
    try:
        return [await reader.read() for _ in range(times)]
    finally:
        await reader.aclose()


def test_a_server_without_v1_loads_is_not_asked_again_and_reads_its_metrics() -> None:
    vllm = _Server(
        _text("vllm-0.32.0/metrics_load_kvfull_queue.prom"),
        [httpx.Response(404, json={"detail": "Not Found"})],
    )
    samples = asyncio.run(_reads(vllm, 3))
    assert [s.source if s else None for s in samples] == ["vllm-metrics"] * 3
    assert vllm.asked == {"/metrics": 3, "/v1/loads": 1}


def test_sglang_is_read_both_ways_each_poll_and_a_failed_snapshot_leaves_the_gauges() -> None:
    load = json.loads(_text("sglang-0.5.23/v1_loads_load.json"))
    sglang = _Server(
        _text("sglang-0.5.23/metrics_after_retraction.prom"),
        [httpx.Response(200, json=load), httpx.Response(503), httpx.Response(200, json=load)],
    )
    samples = asyncio.run(_reads(sglang, 3))
    assert [s.source if s else None for s in samples] == [
        "sglang-metrics+loads",
        "sglang-metrics",  # a restarting server's 503: the gauges alone, and asked again next poll
        "sglang-metrics+loads",
    ]
    assert sglang.asked == {"/metrics": 3, "/v1/loads": 3}


def test_a_malformed_loads_document_reads_as_no_sample_or_as_what_it_does_say() -> None:
    """What a proxy, a restarting server or a newer schema may answer: never an exception (one would
    stop the endpoint's controller with its limit and pace frozen)."""
    for document in (None, [], "busy", {"loads": None}, {"loads": "x"}, {"loads": [None, 3]}):
        assert parse_loads(document) is None
    rank = json.loads(_text("sglang-0.5.23/v1_loads_load.json"))["loads"][0]
    nulls = {**rank, "num_used_tokens": None, "num_running_reqs": None, "max_running_requests": "64"}
    sample = parse_loads({"loads": [nulls]})
    assert sample is not None
    assert (sample.kv_usage, sample.running, sample.queued, sample.max_running) == (0.0, 0, 56, None)
    broken = {
        **rank,
        "max_total_num_tokens": None,
        "gen_throughput": float("nan"),
        "decode_moments": [1, None, None],
    }
    sample = parse_loads({"loads": [broken]})
    assert sample is not None
    assert (sample.kv_usage, sample.capacity_tokens, sample.decode_tokens_per_s, sample.busy_us) == (
        None,
        None,
        None,
        None,
    )
    assert sample.decode_steps == 1.0


def test_non_finite_gauges_read_as_not_said() -> None:
    text = _text("sglang-0.5.23/metrics_after_retraction.prom")
    lines = [
        'sglang:token_usage{tp_rank="0"} NaN' if line.startswith("sglang:token_usage{") else line
        for line in text.splitlines()
    ]
    lines = [
        line.rsplit(" ", 1)[0] + " +Inf" if line.startswith("sglang:num_queue_reqs{") else line
        for line in lines
    ]
    sample = parse_metrics("\n".join(lines) + "\n")
    assert sample is not None and sample.kv_usage is None and sample.queued is None
    assert sample.running == 10  # the rest as the server said it


def test_negative_loads_read_as_not_said() -> None:
    """No load is below zero: a negative running count made a negative decode rate per request,
    and a negative usage a cache the law would fill past its pool."""
    text = _text("sglang-0.5.23/metrics_after_retraction.prom")
    for gauge in ("sglang:num_running_reqs{", "sglang:token_usage{"):
        lines = [
            line.rsplit(" ", 1)[0] + " -3" if line.startswith(gauge) else line for line in text.splitlines()
        ]
        sample = parse_metrics("\n".join(lines) + "\n")
        assert sample is not None
        assert (sample.running, sample.kv_usage) == ((None, 0.93) if "running" in gauge else (10, None))
    rank = json.loads(_text("sglang-0.5.23/v1_loads_load.json"))["loads"][0]
    loads = parse_loads({"loads": [{**rank, "num_running_reqs": -2, "num_used_tokens": -100}]})
    assert loads is not None and (loads.running, loads.kv_usage) == (0, 0.0)  # a rank not saying it: 0


def test_a_loads_answer_that_is_no_document_is_asked_again_and_a_missing_route_is_not() -> None:
    load = json.loads(_text("sglang-0.5.23/v1_loads_load.json"))
    sglang = _Server(
        _text("sglang-0.5.23/metrics_after_retraction.prom"),
        [httpx.Response(200, json=[]), httpx.Response(401), httpx.Response(200, json=load)],
    )
    samples = asyncio.run(_reads(sglang, 3))
    assert [s.source if s else None for s in samples] == [
        "sglang-metrics",
        "sglang-metrics",
        "sglang-metrics+loads",
    ]
    absent = _Server(_text("sglang-0.5.23/metrics_after_retraction.prom"), [httpx.Response(405)])
    asyncio.run(_reads(absent, 3))
    assert absent.asked == {"/metrics": 3, "/v1/loads": 1}


def test_with_data_parallel_ranks_a_failed_snapshot_keeps_the_pool_the_last_one_said() -> None:
    """Not rank 0's pool from the gauges for one poll: the law would take the change for a restart."""
    rank = json.loads(_text("sglang-0.5.23/v1_loads_load.json"))["loads"][0]
    two_ranks = {"loads": [rank, {**rank, "dp_rank": 1}]}
    sglang = _Server(
        _text("sglang-0.5.23/metrics_after_retraction.prom"),
        [httpx.Response(200, json=two_ranks), httpx.Response(503), httpx.Response(200, json=two_ranks)],
    )
    samples = asyncio.run(_reads(sglang, 3))
    assert [s.capacity_tokens if s else None for s in samples] == [8192] * 3
    assert samples[1] is not None and samples[1].source == "sglang-metrics"


def _mocked_reader(handler: Callable[[httpx.Request], httpx.Response]) -> SignalReader:
    """A reader of ``http://server`` whose every request ``handler`` answers (or fails)."""
    reader = SignalReader("http://server")
    reader._http = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    return reader


def test_a_server_that_stops_answering_for_a_while_is_not_advised_to_enable_metrics(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A restart (a server this run launched, started again by its guard) made the first poll of
    the outage warn that the server serves neither source and to start it with --enable-metrics:
    advice for a server that had served its metrics all along. A server that never answered either
    is still told, once."""
    metrics = _text("sglang-0.5.23/metrics_after_retraction.prom")
    down = False

    def restarting(request: httpx.Request) -> httpx.Response:
        if down:
            raise httpx.ConnectError("connection refused", request=request)
        if request.url.path == "/metrics":
            return httpx.Response(200, text=metrics)
        return httpx.Response(404)

    async def through_a_restart() -> list[ServerSample | None]:
        nonlocal down
        reader = _mocked_reader(restarting)
        try:
            samples = [await reader.read()]
            down = True
            samples += [await reader.read(), await reader.read()]
            down = False
            return [*samples, await reader.read()]
        finally:
            await reader.aclose()

    samples = asyncio.run(through_a_restart())
    assert [s.source if s else None for s in samples] == ["sglang-metrics", None, None, "sglang-metrics"]
    assert not [r for r in caplog.records if "--enable-metrics" in r.getMessage()]
    assert len([r for r in caplog.records if r.levelname == "WARNING"]) == 1  # the outage, said once

    silent = _Server("# nothing a load reader knows\n", [httpx.Response(404)])
    asyncio.run(_reads(silent, 3))
    advice = [r for r in caplog.records if "--enable-metrics" in r.getMessage()]
    assert len(advice) == 1


def test_a_server_that_is_down_is_not_advised_to_enable_metrics_until_it_answers_without_them(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A URL where nothing listens was told that it "serves neither /metrics nor /v1/loads" and to
    start SGLang with --enable-metrics: advice for a server that answers without those routes, not
    for one that is down (its guard says that). Once it answers, still without them, it is told."""
    up = False

    def down_then_without_routes(request: httpx.Request) -> httpx.Response:
        if not up:
            raise httpx.ConnectError("connection refused", request=request)
        return httpx.Response(404)

    async def reads() -> list[ServerSample | None]:
        nonlocal up
        reader = _mocked_reader(down_then_without_routes)
        try:
            samples = [await reader.read(), await reader.read()]
            assert not [r for r in caplog.records if r.levelname == "WARNING"]
            up = True
            return [*samples, await reader.read(), await reader.read()]
        finally:
            await reader.aclose()

    assert asyncio.run(reads()) == [None] * 4
    advice = [r for r in caplog.records if "--enable-metrics" in r.getMessage()]
    assert len(advice) == 1 and "serves neither" in advice[0].getMessage()
