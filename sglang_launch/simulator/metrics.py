"""``/metrics`` as SGLang 0.5.23 serves it: names, types, labels, and when gauges refresh.

SGLang's scheduler publishes its load gauges only when it logs a batch: every prefill batch and
every ``decode_log_interval`` (40) decode steps. A controller reading ``/metrics`` therefore sees
values up to 40 steps old, and the simulator keeps that staleness (``metrics_decode_interval``);
it also publishes once when it goes idle (SGLang does every 30 s while idle). The retraction
counters are absent until the first retraction, like prometheus_client's labelled counters that
were never incremented. Families SGLang has but nothing here feeds (histograms, speculative
decoding, disaggregation queues) are left out.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import generate_latest

from sglang_launch.simulator.scheduler import Scheduler, StepKind, StepResult

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
SCHEDULER_LABELS = ("engine_type", "model_name", "moe_ep_rank", "pp_rank", "tp_rank")
REQUEST_LABELS = ("engine_type", "is_streaming", "model_name")


@dataclass(frozen=True, slots=True)
class Gauges:
    """The scheduler gauges as last published."""

    num_running_reqs: int = 0
    num_queue_reqs: int = 0
    num_used_tokens: int = 0
    token_usage: float = 0.0
    gen_throughput: float = 0.0
    new_token_ratio: float = 0.0
    num_retracted_reqs: int = 0  # requests retracted since the previous refresh


class GaugeBoard:
    """Publishes the scheduler's state on SGLang's schedule (every prefill, every N decode steps).

    ``gen_throughput`` is tokens per wall second over the simulated time since the previous
    throughput refresh (simulated seconds x ``time_scale``), refreshed with the decode log only.
    """

    def __init__(self, decode_interval: int, time_scale: float, init_new_token_ratio: float) -> None:
        self.decode_interval = decode_interval
        self.time_scale = time_scale
        self.gauges = Gauges(new_token_ratio=init_new_token_ratio)
        self._decode_steps = 0
        self._tokens_mark = 0
        self._clock_mark = 0.0
        self._last_retracted = 0

    def observe(self, result: StepResult, scheduler: Scheduler) -> bool:
        """Account for one step; True when it refreshed the gauges (SGLang logs a batch line)."""
        if result.retraction is not None:
            self._last_retracted = len(result.retraction.rids)
        if result.kind is StepKind.PREFILL:
            self.publish(scheduler, with_throughput=False)
            return True
        self._decode_steps += 1
        if self._decode_steps % self.decode_interval == 0:
            self.publish(scheduler, with_throughput=True)
            return True
        return False

    def publish(self, scheduler: Scheduler, with_throughput: bool) -> None:
        """Copy the scheduler's current state into the published gauges (idle: throughput 0)."""
        throughput = self.gauges.gen_throughput
        if with_throughput or scheduler.idle:
            elapsed = (scheduler.clock_s - self._clock_mark) * self.time_scale
            generated = scheduler.counters.generated_tokens - self._tokens_mark
            throughput = generated / elapsed if elapsed > 0 and not scheduler.idle else 0.0
            self._clock_mark, self._tokens_mark = scheduler.clock_s, scheduler.counters.generated_tokens
        self.gauges = Gauges(
            num_running_reqs=len(scheduler.running),
            num_queue_reqs=len(scheduler.waiting),
            num_used_tokens=scheduler.used_tokens,
            token_usage=round(scheduler.token_usage, 2),
            gen_throughput=throughput,
            new_token_ratio=scheduler.new_token_ratio,
            num_retracted_reqs=self._last_retracted,
        )
        self._last_retracted = 0


@dataclass(slots=True)
class RequestTotals:
    """Per-``is_streaming`` totals SGLang's tokenizer manager counts when a request finishes."""

    requests: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0


@dataclass(slots=True)
class HttpCounts:
    """``sglang:http_requests_total`` and ``sglang:http_responses_total``."""

    requests: Counter[tuple[str, str]] = field(default_factory=Counter)
    responses: Counter[tuple[str, str, str]] = field(default_factory=Counter)

    def record(self, endpoint: str, method: str, status: int) -> None:
        """Count one answered request."""
        self.requests[(endpoint, method)] += 1
        self.responses[(endpoint, method, str(status))] += 1


@dataclass(frozen=True, slots=True)
class MetricsView:
    """Everything one ``/metrics`` rendering reads."""

    model_name: str
    max_total_tokens: int
    context_length: int
    gauges: Gauges
    scheduler: Scheduler
    totals: dict[bool, RequestTotals]
    http: HttpCounts


class _Collector:
    """A prometheus_client collector over one ``MetricsView`` snapshot."""

    def __init__(self, view: MetricsView) -> None:
        self.view = view
        self.labels = ["unified", view.model_name, "0", "0", "0"]

    def _gauge(self, name: str, doc: str, value: float) -> GaugeMetricFamily:
        family = GaugeMetricFamily(f"sglang:{name}", doc, labels=SCHEDULER_LABELS)
        family.add_metric(self.labels, value)
        return family

    def _counter(self, name: str, doc: str, value: float) -> CounterMetricFamily:
        family = CounterMetricFamily(f"sglang:{name}", doc, labels=SCHEDULER_LABELS)
        family.add_metric(self.labels, value)
        return family

    def collect(self) -> Iterator[Metric]:
        yield from self._http_families()
        yield from self._request_families()
        yield from self._scheduler_families()

    def _http_families(self) -> Iterator[Metric]:
        http = self.view.http
        requests = CounterMetricFamily(
            "sglang:http_requests_total",
            "Total number of HTTP requests by endpoint and method",
            labels=["endpoint", "method"],
        )
        for (endpoint, method), count in http.requests.items():
            requests.add_metric([endpoint, method], count)
        responses = CounterMetricFamily(
            "sglang:http_responses_total",
            "Total number of HTTP responses by endpoint and status code",
            labels=["endpoint", "method", "status_code"],
        )
        for (endpoint, method, status), count in http.responses.items():
            responses.add_metric([endpoint, method, status], count)
        yield requests
        yield responses

    def _request_families(self) -> Iterator[Metric]:
        specs = (
            ("prompt_tokens", "Number of prefill tokens processed.", "prompt_tokens"),
            ("generation_tokens", "Number of generation tokens processed.", "generation_tokens"),
            ("num_requests", "Number of requests processed.", "requests"),
        )
        for name, doc, attr in specs:
            family = CounterMetricFamily(f"sglang:{name}", doc, labels=REQUEST_LABELS)
            for streaming, totals in sorted(self.view.totals.items()):
                if totals.requests:
                    labels = ["unified", "true" if streaming else "false", self.view.model_name]
                    family.add_metric(labels, getattr(totals, attr))
            yield family

    def _scheduler_families(self) -> Iterator[Metric]:
        view, g = self.view, self.view.gauges
        counters = view.scheduler.counters
        retracted = GaugeMetricFamily(
            "sglang:num_retracted_reqs",
            "The number of retracted requests.",
            labels=["engine_type", "model_name", "moe_ep_rank", "pid", "pp_rank", "tp_rank"],
        )
        retracted.add_metric(
            ["unified", view.model_name, "0", str(os.getpid()), "0", "0"], g.num_retracted_reqs
        )
        yield retracted
        yield self._gauge(
            "max_total_num_tokens",
            "Maximum total number of tokens in the KV cache pool.",
            view.max_total_tokens,
        )
        yield self._gauge("context_len", "Maximum context length.", view.context_length)
        yield self._gauge("num_running_reqs", "The number of running requests.", g.num_running_reqs)
        yield self._gauge("num_queue_reqs", "The number of requests in the waiting queue.", g.num_queue_reqs)
        yield self._gauge("gen_throughput", "The generation throughput (token/s).", g.gen_throughput)
        yield self._gauge("cache_hit_rate", "The prefix cache hit rate.", 0.0)
        yield self._gauge("token_usage", "The token usage.", g.token_usage)
        yield self._gauge(
            "full_token_usage",
            "The token usage for full attention layers.",
            g.num_used_tokens / view.max_total_tokens,
        )
        yield self._gauge("num_used_tokens", "The number of used tokens.", g.num_used_tokens)
        yield self._gauge(
            "kv_used_tokens", "Number of actively used token slots in the KV cache pool.", g.num_used_tokens
        )
        yield self._gauge(
            "kv_available_tokens",
            "Number of free token slots in the KV cache pool.",
            view.max_total_tokens - g.num_used_tokens,
        )
        yield self._gauge("new_token_ratio", "The new token ratio.", g.new_token_ratio)
        if counters.retractions:
            yield self._counter(
                "num_retracted_requests", "Total number of retracted requests.", counters.retracted_requests
            )
            yield self._counter(
                "num_retracted_input_tokens",
                "Total number of retracted input tokens.",
                counters.retracted_input_tokens,
            )
            yield self._counter(
                "num_retracted_output_tokens",
                "Total number of retracted output tokens.",
                counters.retracted_output_tokens,
            )


def render_metrics(view: MetricsView) -> bytes:
    """The Prometheus text exposition of one snapshot."""
    return generate_latest(_Collector(view))
