"""What a server says about its load: SGLang's and vLLM's ``/metrics``, SGLang's ``/v1/loads``.

Parsing is pure (text in, a ``ServerSample`` out) and tested on captured responses; ``SignalReader``
is the only part that does I/O. It polls about once a second: on a 2-core machine, polling
``/metrics`` and ``/v1/loads`` at 10 Hz slowed SGLang about 12x. Every signal is optional: a server
without ``--enable-metrics`` falls back to ``/v1/loads`` (SGLang 0.5.8+), and a server with neither
leaves the law with the client's own counts, after one warning that says how to enable metrics.

On SGLang both are read each poll: ``/metrics`` for the counters (retractions, generated tokens) and
the decode rate, ``/v1/loads`` for the load now. SGLang 0.5.23 refreshes its ``/metrics`` gauges when
it logs a batch, every 40 decode steps, and publishes the snapshot ``/v1/loads`` reads (shared memory,
read by the HTTP process: the scheduler is not asked) every 15 decode steps and at every prefill
(``--load-snapshot-publish-interval``). At the start of a run on the CPU SGLang the cache grew a tenth
of the pool a second while the gauges were up to 2 s old: the law read 0.72-0.84 at the retractions
(bench/README, eighteenth session).
"""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import dataclass, replace
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from flows.say import SAY
from sglang_launch.probe import auth_headers, endpoint_http

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServerSample:
    """One reading of a server's load. ``None``: the server does not say."""

    source: str
    """``sglang-metrics``, ``vllm-metrics``, ``sglang-loads``, or ``sglang-metrics+loads`` (both)."""
    kv_usage: float | None = None
    """Share of the KV pool in use, 0..1 (SGLang: excludes evictable prefix cache)."""
    running: int | None = None
    queued: int | None = None
    preemptions_total: float | None = None
    """SGLang retractions or vLLM preemptions since the server started (absent before the first: 0)."""
    capacity_tokens: int | None = None
    """KV pool size in tokens."""
    block_tokens: int | None = None
    """The pool's unit of allocation in tokens (vLLM's ``block_size``, SGLang's ``page_size``): a
    request holds whole blocks, so each wastes about half a block beside its tokens."""
    max_running: int | None = None
    generation_tokens_total: float | None = None
    """Output tokens the server generated since it started (the benchmarks' throughput counter;
    SGLang counts an answer's tokens when it ends)."""
    decode_tokens_per_s: float | None = None
    """Output tokens per second over the server's last decode steps (SGLang's ``gen_throughput``):
    over the requests that ran then, how fast each request decodes now (``decode_clock.py``)."""
    decode_running: int | None = None
    """The requests running when ``decode_tokens_per_s`` was measured, where that is not ``running``
    (SGLang's two readings in one: the rate from ``/metrics``, the load from ``/v1/loads``)."""
    decode_steps: float | None = None
    """Decode steps the scheduler ran since it started, the mean over DP ranks (SGLang's ``/v1/loads``,
    0.5.2x): each running request makes one token a step, so between two readings their difference
    is what every request running all the while made (``decode_clock.py``)."""
    busy_us: float | None = None
    """Microseconds the scheduler spent in decode and prefill steps since it started, the mean over
    DP ranks (SGLang's ``/v1/loads`` counters, 0.5.2x): between two readings, the share of the time
    the server computed, whatever its queue and cache say."""

    @property
    def lags(self) -> bool:
        """Whether the reading is about a tick old: SGLang refreshes its ``/metrics`` gauges only every
        ~40 decode steps; its ``/v1/loads`` and vLLM's gauges are read as they are now."""
        return self.source == "sglang-metrics"


LOAD_METRICS = frozenset(
    {
        "sglang:token_usage",
        "sglang:num_running_reqs",
        "sglang:num_queue_reqs",
        "sglang:num_retracted_requests_total",
        "sglang:max_total_num_tokens",
        "sglang:generation_tokens_total",
        "sglang:gen_throughput",
        "vllm:kv_cache_usage_perc",
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:num_preemptions_total",
        "vllm:generation_tokens_total",
        "vllm:cache_config_info",
    }
)


def _name(line: str) -> str:
    return line.split("{", 1)[0].split(" ", 1)[0]


def _wanted(line: str) -> bool:
    """The load metrics' samples and TYPE lines: SGLang serves ~90 KB, of which these are ~1 KB."""
    if line.startswith("# TYPE "):
        name = _name(line[7:])
        return name in LOAD_METRICS or f"{name}_total" in LOAD_METRICS
    return not line.startswith("#") and _name(line) in LOAD_METRICS


def _samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Parsed with prometheus-client's parser, after dropping the lines of metrics we do not read."""
    kept = "\n".join(line for line in text.splitlines() if _wanted(line)) + "\n"
    return [
        (sample.name, sample.labels, sample.value)
        for family in text_string_to_metric_families(kept)
        for sample in family.samples
        if _is_load(sample.value)
    ]


def _sglang_ranks(samples: list[tuple[str, dict[str, str], float]]) -> dict[str, dict[str, float]]:
    """SGLang's load metrics by DP rank (``dp_rank``, absent with one rank), tp_rank 0's only: with
    TP > 1 the other TP ranks repeat or zero the gauges. Generated tokens are summed over their
    ``is_streaming`` series."""
    ranks: dict[str, dict[str, float]] = {}
    for name, labels, value in samples:
        if not name.startswith("sglang:") or labels.get("tp_rank", "0") != "0":
            continue
        rank = ranks.setdefault(labels.get("dp_rank", "0"), {})
        if name == "sglang:generation_tokens_total":
            rank[name] = rank.get(name, 0.0) + value
        else:
            rank.setdefault(name, value)
    return ranks


def _over_ranks(ranks: dict[str, dict[str, float]]) -> ServerSample:
    """One sample for the whole server, as ``/v1/loads`` sums its ranks: the client's requests in
    flight are spread over every DP rank, so the counts, the pools, the rates and the retractions
    are summed, and the KV usage is the ranks' used tokens over their pools. (Rank 0 alone, as
    before: with ``--dp-size N`` the budget was one rank's pool for the requests of N.)"""

    def total(name: str) -> float | None:
        values = [rank[name] for rank in ranks.values() if name in rank]
        return sum(values) if values else None

    usage_name, pool_name = "sglang:token_usage", "sglang:max_total_num_tokens"
    usages = [rank[usage_name] for rank in ranks.values() if usage_name in rank]
    pools = [rank.get(pool_name) for rank in ranks.values() if usage_name in rank]
    if len(usages) == 1 or not usages:
        usage = usages[0] if usages else None
    elif all(pool for pool in pools):
        usage = sum(u * (p or 0.0) for u, p in zip(usages, pools, strict=True)) / sum(p or 0.0 for p in pools)
    else:
        usage = sum(usages) / len(usages)  # pools unsaid: alike, as SGLang sizes them
    return ServerSample(
        source="sglang-metrics",
        kv_usage=usage,
        running=_int(total("sglang:num_running_reqs")),
        queued=_int(total("sglang:num_queue_reqs")),
        preemptions_total=total("sglang:num_retracted_requests_total") or 0.0,
        capacity_tokens=_int(total(pool_name)),
        generation_tokens_total=total("sglang:generation_tokens_total"),
        decode_tokens_per_s=total("sglang:gen_throughput"),
    )


def parse_metrics(text: str) -> ServerSample | None:
    """SGLang or vLLM Prometheus text -> a sample; None when neither engine's load metrics are there."""
    samples = _samples(text)
    ranks = _sglang_ranks(samples)
    if any("sglang:token_usage" in rank or "sglang:num_running_reqs" in rank for rank in ranks.values()):
        return _over_ranks(ranks)
    values: dict[str, float] = {}
    totals: dict[str, float] = {}
    vllm_cache: dict[str, str] = {}
    for name, labels, value in samples:
        if name == "vllm:cache_config_info":
            vllm_cache = vllm_cache or labels
            continue
        if name == "vllm:generation_tokens_total":
            totals[name] = totals.get(name, 0.0) + value  # one series per is_streaming label
        else:
            values.setdefault(name, value)
    if "vllm:kv_cache_usage_perc" in values or "vllm:num_requests_running" in values:
        return ServerSample(
            source="vllm-metrics",
            kv_usage=values.get("vllm:kv_cache_usage_perc"),
            running=_int(values.get("vllm:num_requests_running")),
            queued=_int(values.get("vllm:num_requests_waiting")),
            preemptions_total=values.get("vllm:num_preemptions_total", 0.0),
            capacity_tokens=_vllm_capacity(vllm_cache),
            block_tokens=_positive(vllm_cache.get("block_size", "")),
            generation_tokens_total=totals.get("vllm:generation_tokens_total"),
        )
    return None


def _positive(label: str) -> int | None:
    return int(label) if label.isdigit() and int(label) > 0 else None


def _vllm_capacity(cache_config: dict[str, str]) -> int | None:
    """vLLM's KV pool in tokens, from the labels of ``vllm:cache_config_info`` (its value is always 1):
    ``kv_cache_size_tokens`` (0.32), else ``num_gpu_blocks`` x ``block_size``. Without it the law has
    no token budget on vLLM and admits by the usage gauge alone."""
    size = cache_config.get("kv_cache_size_tokens", "")
    if size.isdigit():
        return int(size)
    blocks, block = cache_config.get("num_gpu_blocks", ""), cache_config.get("block_size", "")
    return int(blocks) * int(block) if blocks.isdigit() and block.isdigit() else None


def parse_loads(document: object) -> ServerSample | None:
    """SGLang's ``/v1/loads`` JSON (fresher than the gauges, no retraction counter): summed over DP ranks.

    A field that is absent, null or not a finite number counts as 0 in a sum (a rank that does not
    say it), as before for absent ones; a document that is not the expected object reads as None
    (a proxy's or a restarting server's answer), never as an error that would stop the controller."""
    loads = rank_loads(document)
    if not loads:
        return None
    used = _sum_of(loads, "num_used_tokens") or 0.0
    capacity = int(_sum_of(loads, "max_total_num_tokens") or 0)
    max_running = int(_sum_of(loads, "max_running_requests") or 0)
    return ServerSample(
        source="sglang-loads",
        kv_usage=used / capacity if capacity > 0 else None,
        running=int(_sum_of(loads, "num_running_reqs") or 0),
        queued=int(_sum_of(loads, "num_waiting_reqs") or 0),
        capacity_tokens=capacity if capacity > 0 else None,
        max_running=max_running if max_running > 0 else None,
        decode_tokens_per_s=_sum_of(loads, "gen_throughput"),
        busy_us=_mean_over_ranks([_busy_us(e) for e in loads]),
        decode_steps=_mean_over_ranks([decode_moment(e, 0) for e in loads]),
    )


def rank_loads(document: object) -> list[dict[str, Any]]:
    """The per-DP-rank entries of a ``/v1/loads`` answer (none where it is not one)."""
    entries = document.get("loads") if isinstance(document, dict) else None
    return [entry for entry in entries if isinstance(entry, dict)] if isinstance(entries, list) else []


def with_loads(metrics: ServerSample, loads: ServerSample | None) -> ServerSample:
    """SGLang's two readings as one: the load (KV usage, running, queued, the pool) as ``/v1/loads``
    says it, a snapshot 15 decode steps old at most against the gauges' 40, summed over DP ranks as
    the client's requests in flight are; the counters and the decode rate (with the requests it was
    measured over) from ``/metrics``. ``loads`` None: the gauges alone.

    The pool too, as the snapshot says it: where the gauges lack it, ``/get_server_info``'s is one DP
    rank's, and with ``--dp-size N`` the budget was 1/N of the pools that the requests in flight, the
    usage and the running count (all summed) were measured in."""
    if loads is None:
        return metrics
    return replace(
        metrics,
        source="sglang-metrics+loads",
        capacity_tokens=loads.capacity_tokens or metrics.capacity_tokens,
        kv_usage=loads.kv_usage if loads.kv_usage is not None else metrics.kv_usage,
        running=loads.running,
        queued=loads.queued,
        max_running=loads.max_running,
        decode_running=metrics.running,
        decode_steps=loads.decode_steps,
        busy_us=loads.busy_us,
    )


def _is_load(value: float) -> bool:
    """Whether a reading can be a load: NaN and ±Inf are valid exposition, and no count, usage or
    counter is below zero (a negative running count made a negative decode rate per request)."""
    return math.isfinite(value) and value >= 0


def _finite(value: object) -> float | None:
    """A JSON value as a load, where it is one (a number, not a bool: ``_is_load``)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not _is_load(value):
        return None
    return float(value)


def _sum_of(loads: list[dict[str, Any]], key: str) -> float | None:
    """The ranks' values of ``key`` summed; None where no rank says it (an older server)."""
    values = [v for v in (_finite(e.get(key)) for e in loads) if v is not None]
    return sum(values) if values else None


def decode_moment(load: dict[str, Any], index: int) -> float | None:
    """One rank's ``decode_moments[index]``: the moments are [steps, sum of batch sizes, sum of step
    µs, ...] (absent before the first decode step: 0); None where the server has no such counters
    (before 0.5.2x, which also counts its prefill time) or says them as no number."""
    if _finite(load.get("total_prefill_busy_us")) is None:
        return None
    moments = load.get("decode_moments")
    if not isinstance(moments, list) or len(moments) <= index:
        return 0.0
    return _finite(moments[index])


def _busy_us(load: dict[str, Any]) -> float | None:
    """One rank's decode and prefill step time so far."""
    prefill, decode = _finite(load.get("total_prefill_busy_us")), decode_moment(load, 2)
    return None if prefill is None or decode is None else prefill + decode


def _mean_over_ranks(values: list[float | None]) -> float | None:
    """The ranks' mean of a per-rank counter; None where any rank lacks it (an older server)."""
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known and len(known) == len(values) else None


def _int(value: float | None) -> int | None:
    return None if value is None else int(value)


METRICS_HINT = (
    "start SGLang with --enable-metrics (datagen launch always does) so the controller sees KV usage, "
    "the queue and retractions"
)


class SignalReader:
    """Reads one endpoint's load: ``/metrics`` first, ``/v1/loads`` where metrics are not served.

    Which source answers is found once and kept; a source that stops answering is looked for again
    at the next read. Failures (a restarting server) read as ``None``: the law then holds or uses
    the client's own counts, and the endpoint guard deals with the outage. With ``/metrics`` as the
    source, ``/v1/loads`` is read too (``with_loads``) where the server has it; a server that
    answers without it (vLLM, SGLang before 0.5.8) is not asked again.
    """

    def __init__(
        self, url: str, api_key: str | None = None, *, timeout_s: float = 2.0, ca_bundle: str | None = None
    ) -> None:
        self.url = url.rstrip("/")
        self._http = httpx.AsyncClient(
            timeout=timeout_s, headers=auth_headers(api_key), **endpoint_http(ca_bundle)
        )
        self._source: str | None = None
        self._answered = False
        """Some source has answered: a read that fails now is an outage, not a server without them."""
        self._warned = False
        self._heard = False
        """Some HTTP answer came back during this read (a 404 too): a server is there, not down."""
        self._has_loads: bool | None = None
        self._pool: int | None = None
        """The pool as ``/v1/loads`` last said it (all DP ranks): kept through a snapshot that failed,
        or a pool said otherwise (one rank's, by ``/get_server_info`` where the gauges lack it) would
        read as a resized pool, the law's sign of a restart."""
        self.read_seconds = 0.0
        """Wall time spent reading signals, so the cost of polling is measured, not guessed."""
        self.reads = 0

    async def read(self) -> ServerSample | None:
        started = time.perf_counter()
        self._heard = False
        try:
            for source in [self._source] if self._source else ["metrics", "loads"]:
                sample = await self._read(source)
                if sample is not None:
                    self._source, self._answered = source, True
                    if source == "metrics" and self._has_loads is not False:
                        loads = await self.loads()
                        sample = with_loads(sample, loads)
                        if loads is None and self._pool is not None:
                            sample = replace(sample, capacity_tokens=self._pool)
                    return sample
            self._source = None
            if self._answered or self._heard:  # a server down is its guard's to tell, not ours
                self._warn_once()
            return None
        finally:
            self.read_seconds += time.perf_counter() - started
            self.reads += 1

    async def _read(self, source: str) -> ServerSample | None:
        try:
            if source == "metrics":
                response = await self._http.get(f"{self.url}/metrics")
                self._heard = True
                return parse_metrics(response.text) if response.status_code == 200 else None
            response = await self._http.get(f"{self.url}/v1/loads")
            self._heard = True
            if response.status_code != 200:
                return None
            return parse_loads(response.json())
        except (httpx.HTTPError, ValueError, json.JSONDecodeError):
            return None

    @property
    def has_loads(self) -> bool | None:
        """Whether the server serves ``/v1/loads``: None until it answered."""
        return self._has_loads

    async def loads(self) -> ServerSample | None:
        """``/v1/loads``, where the server has it. A server without the route (404, 405, an answer that
        is not JSON) is not asked again; one that cannot answer now (a restart, a proxy's error, a
        document without loads) is asked next time."""
        try:
            response = await self._http.get(f"{self.url}/v1/loads")
            if response.status_code in (404, 405):
                self._has_loads = False
                return None
            if response.status_code != 200:
                return None
            document = response.json()
        except httpx.HTTPError:
            return None
        except ValueError:  # not JSON: a server of another kind
            self._has_loads = False
            return None
        loads = parse_loads(document)
        if loads is not None:
            self._has_loads = True
            self._pool = loads.capacity_tokens or self._pool
        return loads

    def _warn_once(self) -> None:
        """One warning; the advice to enable metrics only for a server that answers but never served
        them (a restart's outage told a server that had served them all along to start with them, and
        a URL where nothing listens was told the same)."""
        if self._warned:
            return
        self._warned = True
        if self._answered:
            log.warning(
                "%s stopped answering /metrics and /v1/loads (a restart?): the concurrency controller uses "
                "the client's own counts until it answers again",
                self.url,
                extra=SAY,
            )
            return
        log.warning(
            "%s serves neither /metrics nor /v1/loads: the concurrency controller uses the client's own "
            "counts only; %s",
            self.url,
            METRICS_HINT,
            extra=SAY,
        )

    async def aclose(self) -> None:
        await self._http.aclose()


def with_pool(sample: ServerSample | None, capacity: int | None, block: int | None) -> ServerSample | None:
    """Fill the KV pool's size and block from ``/get_server_info`` where the sample does not say them."""
    if sample is None:
        return None
    if sample.capacity_tokens is None and capacity is not None:
        sample = replace(sample, capacity_tokens=capacity)
    if sample.block_tokens is None and block is not None:
        sample = replace(sample, block_tokens=block)
    return sample
