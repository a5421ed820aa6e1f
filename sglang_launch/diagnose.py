"""Judge an SGLang server log: a verdict, the evidence, and advice with the arithmetic. Pure.

For ``datagen diagnose`` (a server is slow or did not start: what bounds it, with the numbers, and
what to change); the GPU findings beside it come from :mod:`sglang_launch.preflight`.

What bounds a running server, read from its "Decode batch" lines (the median and the 5th-95th
percentile range over lines with requests running, so warm-up does not count; the end-of-run drain,
the lines after the last admission while the last requests finish, is left out, and in a log without
"Prefill batch" lines, such as one filtered to its decode lines, the lines at its end where running
falls with nothing queued):

- ``kv_bound``: a long queue, token usage high, running below ``--max-running-requests``: new
  requests wait for KV room. More KV (memory fraction, fp8 KV) is what makes it faster.
- ``retraction_bound``: decode keeps running out of KV and evicting running requests, whose work
  is recomputed later (>= 10% of admitted requests by default).
- ``running_cap_bound``: ``--max-running-requests`` is reached while KV is not full.
- ``prefill_bound``: a long queue, KV not full, and prefill batches are full chunks: prompt
  processing is the bottleneck.
- ``reservation_bound``: a long queue, KV not full, prefill not saturated: SGLang admits a request
  only if its prompt plus its remaining ``max_tokens`` (scaled by ``new_token_ratio``) fits beside
  the running requests' reserved growth, so large ``max_tokens`` keep requests out of a half-empty pool.
- ``starved``: no real queue and KV not full: the client does not send enough; only said over at
  least ``Thresholds.min_decode_s`` of decode lines, else ``too_short``.
- ``too_short``: too little decode time to tell a starved server from a pause or the run's end (or
  the log shows only the end-of-run drain).
- ``healthy``: KV (or the running cap) used, with only a short queue.
- ``failure``: the log shows a startup/runtime failure (see :mod:`sglang_launch.logparse`).
- ``idle``: no decode batch with running requests in the log.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from sglang_launch.gpu import GpuSnapshot
from sglang_launch.judgement import DEFAULT_THRESHOLDS, EXIT_FINDINGS, EXIT_OK, Thresholds, gpu_list, size
from sglang_launch.logparse import (
    DecodeBatch,
    PrefillBatch,
    Retraction,
    ServerLog,
    StartupFailure,
    reporting_rank,
)
from sglang_launch.memory_math import (
    GIB,
    MAX_FRACTION,
    FractionChange,
    frac,
    fraction_change,
    gib,
    max_safe_fraction,
    min_fraction_for_weights,
)
from sglang_launch.preflight import GpuFinding, assess_gpus


@dataclass(frozen=True, slots=True)
class Spread:
    """5th percentile, median and 95th percentile of a series (nearest rank): the range a person
    would read off the log, without the odd warm-up or drain line."""

    low: float
    median: float
    high: float


@dataclass(frozen=True, slots=True)
class LoadSummary:
    """The decode/prefill/retraction numbers the verdict rests on (one reporting rank)."""

    lines: int
    first: datetime | None
    last: datetime | None
    reporter: str
    running: Spread
    queued: Spread
    usage: Spread | None
    throughput: Spread | None
    tokens_per_request: float | None
    in_flight_peak: int
    running_cap: int | None
    pool_tokens: int | None
    drain_lines: int
    only_drain: bool
    retractions: int
    retracted_requests: int
    admitted: int
    prefill_batches: int
    prefill_tokens_median: float | None
    chunk_size: int | None


@dataclass(frozen=True, slots=True)
class MemoryContext:
    """What the memory arithmetic can use, and where each number came from."""

    fraction: float | None
    fraction_source: str
    bytes_per_token: int | None
    bytes_per_token_source: str
    basis_bytes: int | None
    basis_source: str
    free_bytes: int | None
    total_bytes: int | None


@dataclass(frozen=True, slots=True)
class Diagnosis:
    """``datagen diagnose``'s answer: a verdict line, the evidence, numbered advice, the numbers."""

    verdict: str
    headline: str
    evidence: tuple[str, ...]
    advice: tuple[str, ...]
    load: LoadSummary | None
    memory: MemoryContext
    headroom: tuple[FractionChange, ...]
    gpu_findings: tuple[GpuFinding, ...]
    failure: StartupFailure | None
    exit_code: int

    @property
    def meaning(self) -> str:
        """The verdict in plain words, for someone who has never read SGLang's scheduler."""
        return VERDICT_MEANINGS[self.verdict]


VERDICT_MEANINGS = {
    "kv_bound": "Requests wait in the server's queue because the KV cache (the GPU memory holding every "
    "running request's tokens) is full. Sending more only lengthens the queue; more KV memory is what "
    "makes this server faster.",
    "retraction_bound": "The server admits requests, then runs out of KV cache while they generate and "
    "evicts ('retracts') some of them: their work is thrown away and redone later.",
    "running_cap_bound": "The server runs as many requests as --max-running-requests allows while its "
    "KV cache still has room.",
    "prefill_bound": "Reading the prompts in (prefill, in chunks of --chunked-prefill-size tokens) is the "
    "bottleneck: requests wait for their turn to be prefilled.",
    "reservation_bound": "Requests wait although the KV cache is not full: SGLang keeps room for the "
    "tokens running requests may still generate (up to their max_tokens), and that reservation is full.",
    "starved": "The server has room and nothing waiting: the client does not send enough requests.",
    "healthy": "The KV cache (or the running cap) is in use and only a short queue waits: the server is "
    "as busy as its settings allow.",
    "too_short": "The log covers too little of the time the client was sending to tell a server waiting "
    "for work from one between bursts or finishing the run's last requests.",
    "failure": "The server stopped; the log line below says why.",
    "idle": "The log shows no generation work.",
}


def diagnose(
    log: ServerLog,
    gpus: GpuSnapshot | None = None,
    *,
    gpu_ids: Sequence[int] | None = None,
    concurrency: int | None = None,
    bytes_per_token: int | None = None,
    mem_fraction: float | None = None,
    last_minutes: float | None = None,
    thresholds: Thresholds = DEFAULT_THRESHOLDS,
    serving: tuple[frozenset[int] | None, str] | None = None,
) -> Diagnosis:
    """Say what bounds the server whose log is ``log``, with evidence and advice.

    Only the server's GPUs in ``gpus`` are judged: ``gpu_ids`` (nvidia-smi's numbers) when given,
    else those the server computes on where it still serves here (``serving``: the answer of
    ``port_gpus.logged_server_gpus``, None where not looked for), else the ones its ``server_args``
    place it on, else all (and the evidence says which).
    ``concurrency`` is how many requests the client kept in flight (the log cannot know it);
    ``bytes_per_token``/``mem_fraction`` override what the log says; ``last_minutes`` judges only
    the end of a long log (a two-day run goes through phases; the recent one is what to fix).
    """
    if last_minutes is not None:
        log = recent(log, last_minutes)
    gpus, judged = server_gpus(log, gpus, gpu_ids, serving)
    memory = memory_context(log, gpus, bytes_per_token=bytes_per_token, mem_fraction=mem_fraction)
    findings = assess_gpus(gpus, server_expected=True, thresholds=thresholds) if gpus else ()
    gpu_lines = _gpu_evidence(gpus, findings, judged)
    if log.failure is not None:
        return _failure(log, log.failure, memory, findings, gpu_lines, thresholds)
    load = summarize_load(log)
    if load is None:
        headline = "Idle: the log has no decode batch with running requests"
        advice: tuple[str, ...] = (
            "Check that the client reaches this server (URL, port, API key) and that the log covers "
            "the busy period; SGLang logs a decode batch every 40 decode steps.",
        )
        evidence = (_startup_line(log), *gpu_lines)
        return Diagnosis(
            "idle", headline, _clean(evidence), advice, None, memory, (), findings, None, EXIT_FINDINGS
        )
    verdict = _verdict(load, thresholds)
    headline = _headline(verdict, load, concurrency, thresholds)
    headroom, advice = _advice(verdict, load, memory, log, concurrency, thresholds)
    evidence = (*_load_evidence(load), _http_evidence(log), _memory_evidence(memory), *gpu_lines)
    code = EXIT_OK if verdict == "healthy" else EXIT_FINDINGS
    return Diagnosis(
        verdict, headline, _clean(evidence), advice, load, memory, headroom, findings, None, code
    )


def server_gpus(
    log: ServerLog,
    gpus: GpuSnapshot | None,
    given: Sequence[int] | None = None,
    serving: tuple[frozenset[int] | None, str] | None = None,
) -> tuple[GpuSnapshot | None, str]:
    """``gpus`` cut to the server's own GPUs, and the evidence line saying which and how they are known.

    A node runs other jobs: the GPU another job fills, or an idle one, says nothing about this
    server's headroom or balance, and the lowest free memory over all GPUs gave wrong advice.

    The log's placement counts in the server's ``CUDA_VISIBLE_DEVICES``, which a log does not show,
    and a server started with ``CUDA_VISIBLE_DEVICES=4,5,6,7`` (the common way to share a node) logs
    GPUs 0-3: judged there, another server's GPUs would say how much room this one has, advice that
    can run it out of memory. So the log's placement is taken only where the server was placed by
    SGLang's own flags (``--base-gpu-id``, ``--gpu-id-step``); else every GPU is judged (the lowest
    free memory: advice that fits them all) and the evidence says how to judge only its own.
    Before the log: where the server still serves on this machine, the GPUs its processes compute
    on (``serving``, found by its port: exact in any ``CUDA_VISIBLE_DEVICES``); where they could not
    be found so, the evidence says why.
    """
    if gpus is None:
        return None, ""
    placed = log.args.gpu_ids()
    found, how = serving if serving is not None else (None, "")
    not_here = f"; not found by its port: {how}" if serving is not None and found is None else ""
    if given is not None:
        ids, why = tuple(given), "given with --gpus"
    elif found is not None:
        ids, why = tuple(sorted(found)), f"the server's: {how}, on this machine"
    elif placed is not None and (log.args.base_gpu_id or (log.args.gpu_id_step or 1) > 1):
        ids, why = placed, f"the server's: {log.args.placement()} in its server_args"
    elif placed is not None and len(placed) < len(gpus.gpus):
        return gpus, (
            f"GPUs judged: all {len(gpus.gpus)} (the server's server_args place it on its GPUs "
            f"{gpu_list(placed)}, counted in a CUDA_VISIBLE_DEVICES the log does not show: pass --gpus "
            f"with nvidia-smi's numbers of its GPUs to judge only those{not_here})"
        )
    else:
        return gpus, (
            f"GPUs judged: all {len(gpus.gpus)} (the log does not say which the server uses: "
            f"pass --gpus to judge only its own{not_here})"
        )
    mine = gpus.only(ids)
    if not mine.gpus:
        return None, f"GPUs: the snapshot has none of the server's GPUs {gpu_list(ids)} ({why})"
    return mine, f"GPUs judged: {gpu_list(sorted(g.index for g in mine.gpus))} ({why})"


def memory_context(
    log: ServerLog,
    gpus: GpuSnapshot | None,
    *,
    bytes_per_token: int | None = None,
    mem_fraction: float | None = None,
) -> MemoryContext:
    """Collect the memory figures: the option given wins over the log, the log over the GPU snapshot."""
    fraction, fraction_source = mem_fraction, "given"
    if fraction is None and log.args.mem_fraction_static is not None:
        fraction, fraction_source = log.args.mem_fraction_static, "server_args in the log"
    if (
        fraction is None
        and log.failure
        and (m := re.search(r"mem[-_]fraction[-_]static=([0-9.]+)", log.failure.line))
    ):
        fraction, fraction_source = float(m[1]), "the failure message"
    bpt, bpt_source = bytes_per_token, "given"
    # SGLang prints the pool in GB with 2 decimals: below 0.01 GB (tiny CPU test pools) it says nothing.
    pool = next((r for r in log.startup if r.kv_pool_tokens and (r.kv_pool_gib or 0.0) >= 0.01), None)
    if bpt is None and pool and pool.kv_pool_gib and pool.kv_pool_tokens:
        bpt = round(pool.kv_pool_gib * GIB / pool.kv_pool_tokens)
        bpt_source = f"log: {pool.kv_pool_gib:.2f} GiB KV pool / {pool.kv_pool_tokens:,} tokens"
    befores = [r.avail_before_load_gib for r in log.startup if r.avail_before_load_gib is not None]
    basis, basis_source = None, "unknown"
    if befores:
        basis, basis_source = round(min(befores) * GIB), "free memory before loading the weights (log)"
    elif gpus:
        basis, basis_source = min(g.total_bytes for g in gpus.gpus), "GPU total memory (snapshot)"
    return MemoryContext(
        fraction=fraction,
        fraction_source=fraction_source if fraction is not None else "unknown",
        bytes_per_token=bpt,
        bytes_per_token_source=bpt_source if bpt is not None else "unknown",
        basis_bytes=basis,
        basis_source=basis_source,
        free_bytes=min(g.free_bytes for g in gpus.gpus) if gpus else None,
        total_bytes=min(g.total_bytes for g in gpus.gpus) if gpus else None,
    )


def recent(log: ServerLog, minutes: float) -> ServerLog:
    """``log`` with only the batch and retraction records of its last ``minutes`` (by timestamp;
    records without one are kept)."""
    records: list[DecodeBatch | PrefillBatch | Retraction] = [*log.decode, *log.prefill, *log.retractions]
    times = [r.at.time for r in records if r.at.time]
    if not times:
        return log
    cutoff = max(times) - timedelta(minutes=minutes)

    def keep(record: DecodeBatch | PrefillBatch | Retraction) -> bool:
        return record.at.time is None or record.at.time >= cutoff

    return replace(
        log,
        decode=tuple(filter(keep, log.decode)),
        prefill=tuple(filter(keep, log.prefill)),
        retractions=tuple(filter(keep, log.retractions)),
    )


def summarize_load(log: ServerLog) -> LoadSummary | None:
    """Numbers over the busy decode lines (``running > 0``) of the lowest reporting rank, less the
    end-of-run drain (unless the drain is all there is)."""
    rank = reporting_rank(log.decode)
    mine = [d for d in log.decode if (d.at.dp_rank, d.at.tp_rank) == rank]
    every = [d for d in mine if d.running > 0]
    if not every:
        return None
    retractions = [
        r for r in log.retractions if (r.at.dp_rank, r.at.tp_rank) == reporting_rank(log.retractions)
    ]
    prefill = [p for p in log.prefill if (p.at.dp_rank, p.at.tp_rank) == reporting_rank(log.prefill)]
    drain = _drain(every, prefill)
    only_drain = drain == len(every)
    busy = every if only_drain else every[: len(every) - drain]
    usages = [d.token_usage for d in busy if d.token_usage is not None]
    rates = [d.gen_throughput for d in busy if d.gen_throughput is not None]
    per_request = [d.tokens / d.running for d in busy if d.tokens is not None]
    startup = log.startup[0] if log.startup else None
    reporters = {(d.at.dp_rank, d.at.tp_rank) for d in log.decode}
    return LoadSummary(
        lines=len(busy),
        first=busy[0].at.time,
        last=busy[-1].at.time,
        reporter=_rank_label(rank)
        + (f" (of {len(reporters)} reporting ranks)" if len(reporters) > 1 else ""),
        running=_spread([d.running for d in busy]),
        queued=_spread([d.queued for d in busy]),
        usage=_spread(usages) if usages else None,
        throughput=_spread(rates) if rates else None,
        tokens_per_request=_spread(per_request).median if per_request else None,
        in_flight_peak=max(d.running + d.queued for d in busy),
        running_cap=log.args.max_running_requests or (startup.max_running_requests if startup else None),
        pool_tokens=(startup.max_total_num_tokens or startup.kv_pool_tokens) if startup else None,
        drain_lines=0 if only_drain else drain,
        only_drain=only_drain,
        retractions=len(retractions),
        retracted_requests=sum(r.retracted for r in retractions),
        admitted=sum(p.new_seq for p in prefill),
        prefill_batches=len(prefill),
        prefill_tokens_median=_spread([p.new_tokens for p in prefill]).median if prefill else None,
        chunk_size=_chunk_size(log),
    )


def _drain(busy: Sequence[DecodeBatch], prefill: Sequence[PrefillBatch]) -> int:
    """How many of the last busy decode lines are the end-of-run drain: after the last admission
    (``Prefill batch`` line), nothing waiting, the running requests finishing without replacement.

    A fed server admits again soon; one whose client has stopped can only drain, which says nothing
    about what bounded the run: over a long drain the median running count fell below the cap and the
    empty queue read as a starved server. Without prefill lines (a log filtered to its decode lines)
    the decode lines tell it themselves (``_drain_without_admissions``).
    """
    if not prefill:
        return _drain_without_admissions(busy)
    last_admission = max(p.at.line_no for p in prefill)
    after = 0
    for line in reversed(busy):
        if line.at.line_no < last_admission or line.queued:
            break
        after += 1
    tail = busy[len(busy) - after :]
    return after if tail and tail[-1].running < tail[0].running else 0


def _drain_without_admissions(busy: Sequence[DecodeBatch]) -> int:
    """The drain told from decode lines alone: in the last lines with nothing queued, after running
    last rose (an admission, the last the decode lines show), those below the count they began at.

    The lines at that first count stay: a client keeping exactly that many in flight (at the cap, say)
    shows the same flat count with nothing queued, and its whole run is not a drain.
    """
    tail: list[DecodeBatch] = []  # from the last line backwards
    for line in reversed(busy):
        if line.queued or (tail and line.running < tail[-1].running):
            break
        tail.append(line)
    return sum(1 for line in tail if line.running < tail[-1].running) if tail else 0


def _shortfall(load: LoadSummary, t: Thresholds) -> str:
    """What the judged decode lines lack to call a server starved, in the headline's words ("" when
    they are enough)."""
    if load.only_drain:
        return "only the end-of-run drain"
    span = load.last - load.first if load.first and load.last else None
    before = " before the end-of-run drain" if load.drain_lines else ""
    if load.lines < t.min_decode_lines:
        over = f" over {_duration(span)}" if span is not None else ""
        return f"{load.lines} decode lines{over}{before}"
    if span is not None and span.total_seconds() < t.min_decode_s:
        return f"{_duration(span)} of decode lines{before}"
    return ""


def _queue_long(load: LoadSummary, t: Thresholds) -> bool:
    """More waiting than the short "ready" queue a saturated server should keep."""
    return load.queued.median > max(2, t.short_queue * load.running.median)


def _verdict(load: LoadSummary, t: Thresholds) -> str:
    if load.only_drain:
        return "too_short"
    queue_long = _queue_long(load, t)
    kv_full = load.usage is not None and load.usage.high >= t.high_usage
    at_cap = load.running_cap is not None and load.running.median >= t.near_cap * load.running_cap
    share = load.retracted_requests / load.admitted if load.admitted else 1.0
    if load.retracted_requests >= t.min_retractions and share >= t.retraction_share:
        return "retraction_bound"
    if at_cap and not kv_full:
        return "running_cap_bound"
    if not queue_long or at_cap:
        if kv_full or at_cap:
            return "healthy"
        return "too_short" if _shortfall(load, t) else "starved"
    if kv_full:
        return "kv_bound"
    saturated = (
        load.chunk_size is not None
        and load.prefill_tokens_median is not None
        and load.prefill_tokens_median >= t.prefill_saturation * load.chunk_size
    )
    return "prefill_bound" if saturated else "reservation_bound"


def _headline(verdict: str, load: LoadSummary, concurrency: int | None, t: Thresholds) -> str:
    running = _span(load.running.low, load.running.high)
    of = (
        f"of {concurrency} sent"
        if concurrency
        else f"of ~{load.in_flight_peak} in flight (running + queued, peak)"
    )
    queued = f"{load.queued.median:g} queued"
    usage = (
        f"token usage {_span(load.usage.low, load.usage.high, '.2f')}"
        if load.usage
        else "token usage not logged"
    )
    cap = f"--max-running-requests {load.running_cap}" if load.running_cap else "the running cap"
    lines = {
        "kv_bound": f"KV-bound: {running} running {of}, {queued}, {usage}",
        "retraction_bound": (
            f"Retraction-bound: {_count(load.retractions, 'retraction')} evicted "
            f"{_count(load.retracted_requests, 'running request')} (of {load.admitted} admitted); "
            f"{running} running, {queued}, {usage}"
        ),
        "running_cap_bound": f"Running-cap-bound: {running} running = {cap}, {queued}, only {usage}",
        "prefill_bound": (
            f"Prefill-bound: prefill batches are full chunks (median {load.prefill_tokens_median or 0:,.0f} "
            f"of {load.chunk_size or 0:,} tokens), {queued}, {usage}, {running} running"
        ),
        "reservation_bound": (
            f"Admission-bound: {queued} while {usage} and {running} running {of}: SGLang holds KV back "
            "for the running requests' remaining max_tokens"
        ),
        "starved": f"Starved: {running} running {of}, {queued}, {usage}: the server waits for work",
        "healthy": f"Healthy: {running} running {of}, {queued}, {usage}",
    }
    if verdict == "too_short":
        return f"Too short a log to tell ({_shortfall(load, t)}); run it on a longer tail"
    return lines[verdict]


def _advice(
    verdict: str,
    load: LoadSummary,
    memory: MemoryContext,
    log: ServerLog,
    concurrency: int | None,
    t: Thresholds,
) -> tuple[tuple[FractionChange, ...], tuple[str, ...]]:
    fit = round(load.running.median + max(2, 0.2 * load.running.median))
    sent = concurrency or load.in_flight_peak
    client = (
        f"The client keeps {sent} requests in flight but ~{load.running.median:g} run: a client limit of "
        f"~{fit} gives the same throughput with shorter waits (the server queue only adds latency)."
    )
    max_tokens = (
        "Send realistic max_tokens per category: SGLang admits a request only if its prompt plus its "
        "remaining max_tokens (scaled by new_token_ratio, which starts at 0.7 and decays) fits beside the "
        "running requests' reserved growth, so a generous max_tokens keeps requests out."
    )
    advice: list[str] = []
    headroom: tuple[FractionChange, ...] = ()
    if verdict == "kv_bound":
        headroom, more_kv = _more_kv(memory, load, t)
        advice = [more_kv, *_pool_options(log, load), max_tokens, client]
        advice.append(
            "A hierarchical cache (--enable-hierarchical-cache) keeps evicted prefixes in host RAM: it helps "
            "prompts that share prefixes, not the number of requests that fit at once."
        )
    elif verdict == "retraction_bound":
        headroom, more_kv = _more_kv(memory, load, t)
        conservativeness = log.args.schedule_conservativeness or 1.0
        advice = [
            f"Each retraction throws away a running request's KV, recomputed later: lower the client's "
            f"concurrency to ~{fit}, or raise --schedule-conservativeness ({conservativeness:g} -> "
            f"{conservativeness + 0.3:g}) so SGLang admits fewer requests that it cannot finish.",
            max_tokens,
            more_kv,
        ]
    elif verdict == "running_cap_bound" and load.running_cap:
        high = load.usage.high if load.usage and load.usage.high > 0 else None
        target = (
            min(2 * load.running_cap, round(load.running_cap * t.high_usage / high))
            if high
            else 2 * load.running_cap
        )
        advice = [
            f"Raise --max-running-requests {load.running_cap} -> ~{target}: at {load.running_cap} running "
            f"the KV pool is only {high or 0:.0%} used, so ~{target} fit before it reaches "
            f"{t.high_usage:.0%}.",
            client,
        ]
    elif verdict == "prefill_bound" and load.chunk_size:
        advice = [
            f"Raise --chunked-prefill-size {load.chunk_size} -> {2 * load.chunk_size}: more prompt tokens "
            "per prefill batch (needs more activation memory: keep the margin, see `datagen preflight`).",
            "--enable-mixed-chunk lets decode steps ride along with prefill chunks, so running requests "
            "do not stall while long prompts are processed.",
        ]
    elif verdict == "reservation_bound":
        advice = [
            max_tokens,
            "Or lower --schedule-conservativeness (e.g. 0.7): SGLang then reserves less room for growth "
            "that answers which stop early never use.",
        ]
    elif verdict == "starved":
        advice = [_starved_advice(load, concurrency)]
    elif verdict == "too_short":
        advice = [
            f"Run it on a longer tail: at least {t.min_decode_s:g} s of decode lines "
            f"({t.min_decode_lines} or more) from while the client was sending, not only the end of the "
            "run when the last requests finish (a larger --last-minutes, or more of the log)."
        ]
    elif verdict == "healthy" and _queue_long(load, t):
        advice = [client]
    if refused := log.http_statuses.get(503):
        advice.append(
            f"{_count(refused, 'request')} got HTTP 503 (request queue full, --max-queued-requests): the "
            "client must retry those; keep the client's concurrency near running + a short queue instead."
        )
    return headroom, tuple(advice)


def _more_kv(
    memory: MemoryContext, load: LoadSummary, t: Thresholds
) -> tuple[tuple[FractionChange, ...], str]:
    """The "raise --mem-fraction-static" advice with its arithmetic, or what is missing for it."""
    missing = [
        what
        for what, value in (
            ("the current --mem-fraction-static (pass --mem-fraction)", memory.fraction),
            ("GPU free memory (pass --gpu-csv, or run on the GPU host)", memory.free_bytes),
            ("the memory the fraction applies to", memory.basis_bytes),
        )
        if value is None
    ]
    if missing:
        return (
            (),
            "Give the KV cache more memory (--mem-fraction-static); to compute how much, this needs "
            + "; ".join(missing)
            + ".",
        )
    assert memory.fraction is not None and memory.free_bytes is not None and memory.basis_bytes is not None
    current, basis, free = memory.fraction, memory.basis_bytes, memory.free_bytes
    safe = max_safe_fraction(current, basis_bytes=basis, free_bytes=free, min_margin_bytes=t.min_margin_bytes)
    too_far = round(safe + 0.02, 2)
    over = fraction_change(
        current, too_far, basis_bytes=basis, free_bytes=free, bytes_per_token=memory.bytes_per_token
    )
    beyond = (
        f" {frac(too_far)} would add ~{size(over.extra_kv_bytes)} but leave ~{size(over.margin_bytes)}: "
        "too little for activation peaks and CUDA graphs (expect CUDA out of memory)."
    )
    if safe <= current:
        return (over,), (
            f"No room to raise --mem-fraction-static {frac(current)}: only {size(free)} free per GPU, and "
            f"{size(t.min_margin_bytes)} should stay free.{beyond} More KV needs fp8 KV, more GPUs, or a "
            "smaller model."
        )
    change = fraction_change(
        current, safe, basis_bytes=basis, free_bytes=free, bytes_per_token=memory.bytes_per_token
    )
    tokens = ""
    if change.extra_kv_tokens is not None:
        tokens = f", ~{change.extra_kv_tokens:,} tokens"
        if load.tokens_per_request:
            per = load.tokens_per_request
            tokens += (
                f" (~{change.extra_kv_tokens / per:.0f} more running requests at ~{per:,.0f} tokens each)"
            )
    return (change, over), (
        f"--mem-fraction-static {frac(current)} -> {frac(safe)} adds ~{size(change.extra_kv_bytes)} of KV "
        f"per GPU{tokens}; margin ~{size(change.margin_bytes)} free per GPU ({size(free)} free now - "
        f"{size(change.extra_kv_bytes)}).{beyond} If {frac(safe)} fails at startup (CUDA graph capture), "
        "lower --cuda-graph-max-bs."
    )


def _pool_options(log: ServerLog, load: LoadSummary) -> list[str]:
    out = []
    if log.args.max_total_tokens:
        out.append(
            f"--max-total-tokens {log.args.max_total_tokens:,} caps the KV pool: remove it (or raise it) to "
            "let SGLang use what --mem-fraction-static gives."
        )
    if (log.args.kv_cache_dtype or "auto") == "auto":
        pool = f" ({load.pool_tokens:,} -> ~{2 * load.pool_tokens:,} tokens)" if load.pool_tokens else ""
        out.append(
            f"--kv-cache-dtype fp8_e4m3 stores each token in half the bytes: the same memory holds ~2x the "
            f"tokens{pool}; check answer quality on a sample first."
        )
    return out


def _starved_advice(load: LoadSummary, concurrency: int | None) -> str:
    room = ""
    if load.pool_tokens and load.usage and load.tokens_per_request:
        free_tokens = load.pool_tokens * (1 - load.usage.high)
        room = (
            f" The KV pool ({load.pool_tokens:,} tokens) is at most {load.usage.high:.0%} used: "
            f"~{free_tokens / load.tokens_per_request:.0f} more requests of ~{load.tokens_per_request:,.0f} "
            "tokens fit."
        )
    if load.running_cap is None:  # a tail cut after the startup lines
        room += (
            " The log does not show --max-running-requests (it begins after the startup lines): if it is "
            f"{load.running.high:g}, the server runs at its cap, and raising the cap, not the client's "
            "concurrency, is what helps."
        )
    if concurrency and load.in_flight_peak < 0.8 * concurrency:
        return (
            f"The client says {concurrency} in flight but the server saw at most {load.in_flight_peak}: "
            "requests are slow to arrive (client-side tokenisation, a connection-pool limit, errors and "
            f"retries): look at the client's errors and connection limits.{room}"
        )
    return f"Raise the client's concurrency: the server has room and nothing waiting.{room}"


def _failure(
    log: ServerLog,
    failure: StartupFailure,
    memory: MemoryContext,
    findings: tuple[GpuFinding, ...],
    gpu_lines: tuple[str, ...],
    t: Thresholds,
) -> Diagnosis:
    when = "after serving" if log.decode else "at startup"
    headline = f"Failed {when} ({failure.kind}): {failure.line}"
    advice: list[str] = []
    warnings = [
        f.message for f in findings if f.severity == "warning" or f.kind in ("process", "unattributed")
    ]
    if warnings and failure.kind in ("kv_memory", "cuda_oom", "weights_oom", "cuda_graph", "gpu_unbalanced"):
        advice.append("First free the GPUs: " + "; ".join(w.rstrip(".") for w in warnings) + ".")
    if failure.kind == "kv_memory":
        advice.extend(_kv_failure_advice(log, memory, t))
    if failure.kind == "host_memory" and log.args.hicache_size:
        tp = log.args.tp_size or 1
        advice.append(
            f"--hicache-size {log.args.hicache_size} GB on each of {tp} GPU ranks = "
            f"{log.args.hicache_size * tp} GB of host RAM: with F GB available (`free -g`), use at most "
            f"~F / {tp} per rank, minus headroom for the server itself."
        )
    advice.append(failure.explanation)
    evidence = (
        f"log line: {failure.line}",
        _startup_line(log),
        *_rank_memory_lines(log),
        _memory_evidence(memory),
        *gpu_lines,
    )
    return Diagnosis(
        "failure",
        headline,
        _clean(evidence),
        tuple(advice),
        None,
        memory,
        (),
        findings,
        failure,
        EXIT_FINDINGS,
    )


def _kv_failure_advice(log: ServerLog, memory: MemoryContext, t: Thresholds) -> list[str]:
    """``max_total_num_tokens <= 0`` explained with this log's own numbers (the binding rank's)."""
    loaded = [r for r in log.startup if r.avail_before_load_gib and r.avail_after_load_gib is not None]
    if not loaded:
        return []
    rank = min(loaded, key=lambda r: r.avail_after_load_gib or 0.0)
    before = min(r.avail_before_load_gib or 0.0 for r in loaded) * GIB
    after = (rank.avail_after_load_gib or 0.0) * GIB
    advice = []
    if rank.weights_gib is not None and before - after - rank.weights_gib * GIB > GIB:
        extra = before - after - rank.weights_gib * GIB
        init = rank.init_distributed_gib
        init_note = (
            f" CUDA/NCCL initialisation had already taken {init:.2f} GiB before loading."
            if init is not None and init >= 1.0
            else ""
        )
        advice.append(
            f"Loading took {size(before - after)} on {_rank_label((None, rank.tp_rank))} but the weights "
            f"are {rank.weights_gib:.2f} GiB: {size(extra)} more was allocated meanwhile, by another "
            "process on the GPU or by communication buffers (NCCL settings changed since the last good "
            f"start, NVLS, custom all-reduce).{init_note} Freeing that memory gives it back to the KV cache."
        )
    needed = min_fraction_for_weights(round(before), round(after))
    step_bytes = 0.01 * before
    per_step = f" (~{step_bytes / memory.bytes_per_token:,.0f} tokens)" if memory.bytes_per_token else ""
    was = f" (it was {frac(memory.fraction)})" if memory.fraction is not None else ""
    suggest = math.ceil(needed * 100) / 100 + 0.02
    margin = (1 - suggest) * before
    floor = (
        f"The weights (and whatever else was allocated meanwhile) took {size(before - after)} of the "
        f"{size(before)} free before loading, so --mem-fraction-static must be above "
        f"1 - {gib(after):.2f}/{gib(before):.2f} = {needed:.3f}{was}."
    )
    if suggest > MAX_FRACTION:  # no fraction leaves the activations their room
        advice.append(
            f"{floor} No fraction up to {MAX_FRACTION:.2f} leaves KV beside them with room for activations: "
            "the model does not fit these GPUs as loaded; use more GPUs (a larger --tp), an fp8 "
            "checkpoint, or a smaller model."
        )
        return advice
    warn = (
        f" That leaves only {size(margin)} for activations: too tight, use more GPUs or a smaller model."
        if margin < t.min_margin_bytes
        else ""
    )
    advice.append(
        f"{floor} Each 0.01 above that buys {size(step_bytes)} of KV{per_step}; e.g. {suggest:.2f} gives "
        f"~{size((suggest - needed) * before)} of KV and leaves {size(margin)} for activations.{warn}"
    )
    return advice


# ---------------------------------------------------------------------------------------------
# Evidence lines and small helpers
# ---------------------------------------------------------------------------------------------
def _load_evidence(load: LoadSummary) -> list[str]:
    span = ""
    if load.first and load.last:
        span = (
            f", {load.first:%Y-%m-%d %H:%M:%S} to {load.last:%H:%M:%S} ({_duration(load.last - load.first)})"
        )
    cap = f" (cap --max-running-requests {load.running_cap})" if load.running_cap else ""
    lines = [
        f"{load.lines} decode log lines with requests running{span}, read from {load.reporter}",
        f"the {load.lines} decode lines all come after the last admission: the end-of-run drain"
        if load.only_drain
        else "",
        _drain_evidence(load),
        "no Prefill batch lines in the log (filtered to its decode lines?): admissions are unknown, so the "
        "drain is read from the decode lines alone, prefill-bound is not told from admission-bound, and "
        "retractions show only if their lines were kept"
        if not load.prefill_batches
        else "",
        f"running {_span(load.running.low, load.running.high)}, median {load.running.median:g}{cap}",
        f"queued {_span(load.queued.low, load.queued.high)}, median {load.queued.median:g}; "
        f"running + queued peak {load.in_flight_peak}",
    ]
    if load.usage:
        pool = f" of a {load.pool_tokens:,}-token KV pool" if load.pool_tokens else ""
        per = (
            f"; ~{load.tokens_per_request:,.0f} tokens per running request" if load.tokens_per_request else ""
        )
        lines.append(f"token usage {_span(load.usage.low, load.usage.high, '.2f')}{pool}{per}")
    if load.throughput:
        lines.append(
            f"generation throughput {_span(load.throughput.low, load.throughput.high, ',.0f')} tok/s"
        )
    lines.append(
        f"retractions: {load.retractions} "
        f"({_count(load.retracted_requests, 'request')} evicted and recomputed)"
        if load.retractions
        else "retractions: none"
    )
    if load.prefill_batches:
        chunk = f" (chunk size {load.chunk_size:,})" if load.chunk_size else ""
        lines.append(
            f"prefill: {load.prefill_batches} batches admitted {load.admitted} requests; median "
            f"{load.prefill_tokens_median or 0:,.0f} new tokens per batch{chunk}"
        )
    return lines


def _drain_evidence(load: LoadSummary) -> str:
    if not load.drain_lines:
        return ""
    if not load.prefill_batches:
        return (
            f"{load.drain_lines} decode lines at the end of the log, running falling with nothing queued, "
            "are the end-of-run drain, not counted"
        )
    return f"{load.drain_lines} decode lines after the last admission are the end-of-run drain, not counted"


def _http_evidence(log: ServerLog) -> str:
    if not log.http_statuses:
        return ""
    counts = ", ".join(f"{status} x {n}" for status, n in log.http_statuses.items())
    return f"generation requests answered (HTTP status x count): {counts}"


def _memory_evidence(memory: MemoryContext) -> str:
    fraction = (
        f"{frac(memory.fraction)} ({memory.fraction_source})" if memory.fraction is not None else "unknown"
    )
    bpt = (
        f"{memory.bytes_per_token:,} B ({memory.bytes_per_token_source})"
        if memory.bytes_per_token
        else "unknown"
    )
    return f"mem_fraction_static {fraction}; KV bytes per token per GPU {bpt}"


def _gpu_evidence(gpus: GpuSnapshot | None, findings: tuple[GpuFinding, ...], judged: str) -> tuple[str, ...]:
    if gpus is None:
        return (judged or "GPUs: no snapshot (no NVML here and no --gpu-csv)",)
    free = [g.free_bytes for g in gpus.gpus]
    total = [g.total_bytes for g in gpus.gpus]
    head = (
        f"GPUs ({gpus.source}): {len(gpus.gpus)} x {_span(gib(min(total)), gib(max(total)), '.1f')} GiB, "
        f"free {_span(gib(min(free)), gib(max(free)), '.1f')} GiB"
    )
    return (judged, head, *(f.message for f in findings))


def _startup_line(log: ServerLog) -> str:
    if not log.startup:
        return "startup: no capacity lines in the log"
    first = log.startup[0]
    parts = [f"{first.max_total_num_tokens:,} tokens KV pool" if first.max_total_num_tokens else ""]
    if first.max_running_requests:
        parts.append(f"max_running_requests {first.max_running_requests}")
    if first.context_len:
        parts.append(f"context_len {first.context_len:,}")
    parts.append("server ready" if log.ready else "server never reported ready")
    return "startup: " + ", ".join(p for p in parts if p)


def _rank_memory_lines(log: ServerLog) -> list[str]:
    """Startup memory per TP rank; ranks with the same figures share one line."""
    groups: dict[str, list[int | None]] = {}
    for r in log.startup:
        figures = ", ".join(
            f"{label} {value:.1f} GiB"
            for label, value in (
                ("taken by CUDA/NCCL init", r.init_distributed_gib),
                ("free before loading", r.avail_before_load_gib),
                ("weights", r.weights_gib),
                ("free after loading", r.avail_after_load_gib),
            )
            if value is not None
        )
        if figures:
            groups.setdefault(figures, []).append(r.tp_rank)
    return [f"{_ranks_label(ranks)}: {figures}" for figures, ranks in groups.items()]


def _ranks_label(ranks: list[int | None]) -> str:
    if ranks == [None]:
        return "startup"
    numbers = [r for r in ranks if r is not None]
    if len(numbers) > 2 and numbers == list(range(numbers[0], numbers[-1] + 1)):
        return f"TP{numbers[0]}-TP{numbers[-1]}"
    return ", ".join(f"TP{r}" for r in numbers)


def _chunk_size(log: ServerLog) -> int | None:
    size = log.args.chunked_prefill_size or next(
        (r.chunked_prefill_size for r in log.startup if r.chunked_prefill_size), None
    )
    return size if size and size > 0 else None


def _spread(values: Sequence[float]) -> Spread:
    ordered = sorted(values)
    low, mid, high = (ordered[round(q * (len(ordered) - 1))] for q in (0.05, 0.5, 0.95))
    return Spread(low, mid, high)


def _span(low: float, high: float, fmt: str = "g") -> str:
    a, b = format(low, fmt), format(high, fmt)
    return a if a == b else f"{a}-{b}"


def _duration(delta: timedelta) -> str:
    seconds = int(delta.total_seconds())
    return f"{seconds // 60} min {seconds % 60} s" if seconds >= 60 else f"{seconds} s"


def _rank_label(rank: tuple[int | None, int | None]) -> str:
    dp, tp = rank
    label = " ".join(f"{name}{value}" for name, value in (("DP", dp), ("TP", tp)) if value is not None)
    return label or "the log (no rank prefix)"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _clean(lines: Sequence[str]) -> tuple[str, ...]:
    return tuple(line for line in lines if line)
