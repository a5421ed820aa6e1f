"""Parse SGLang server logs (0.4.x-0.5.x) into dataclasses: batch stats, retractions, startup
capacity, server arguments, and the startup failure if there was one. Pure: text in, data out.

Formats handled (all seen in SGLang's scheduler source or in the real 0.5.23 logs under
``tests/fixtures/sglang-0.5.23``):

- ``Decode batch. #running-req: 46, #token: 411000, token usage: 0.86, cuda graph: True,
  gen throughput (token/s): 2210.5, #queue-req: 101,`` (0.4.x; 0.5.x writes ``Decode batch,``
  and may say ``cpu graph``; hybrid models log ``full token usage``/``swa token usage``);
- ``Prefill batch. #new-seq: 1, #new-token: 8192, #cached-token: 0, token usage: 0.5,
  #running-req: 3, #queue-req: 7,`` and the 0.4.x mixed form ``Prefill batch(mixed #running-req: 3).``;
- retractions: ``KV cache pool is full. Retract requests. #retracted_reqs: 1, ...`` (0.5.x) and
  ``Decode out of memory happened. #retracted_reqs: 1, #new_token_ratio: 0.3 -> 0.8`` (0.4.x);
- startup: ``Load weight begin. avail mem=...``, ``Load weight end. ... avail mem=..., mem usage=...``,
  ``KV Cache is allocated. #tokens: N, K size: a GB, V size: b GB`` (MLA: ``KV size``),
  ``Memory pool end. avail mem=...``, ``Capture cuda graph end. ... mem usage=... avail mem=...``,
  ``max_total_num_tokens=N, chunked_prefill_size=..., max_running_requests=..., context_len=...``,
  and the ``server_args=ServerArgs(...)`` (0.4.x) / ``server_args={...}`` (0.5.x) line.

Lines may carry a prefix such as ``[2026-11-29 10:00:00 TP0]`` or ``[... DP1 TP8]`` (and anything
before it, e.g. a container name): the timestamp and ranks are kept per record, because with tensor
parallelism every rank logs its own startup and retraction lines.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

_PREFIX = re.compile(
    r"\[(?P<ts>\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2})(?:[.,]\d+)?(?P<tags>(?:\s+[A-Za-z_]+\d+)*)\]\s?"
)
_TAG = re.compile(r"([A-Za-z_]+?)(\d+)")
_DECODE = re.compile(r"Decode batch[.,]\s*(?P<rest>.*)")
_PREFILL = re.compile(r"Prefill batch\s*(?:\(mixed #running-req: (?P<mixed>\d+)\))?[.,]\s*(?P<rest>.*)")
_RETRACT = re.compile(
    r"KV cache pool is full\. Retract requests\.|decode out of memory happened", re.IGNORECASE
)
_NUMBER = r"(-?\d+(?:\.\d+)?)"
# Uvicorn access lines for generation requests, e.g. ``"POST /v1/chat/completions HTTP/1.1" 503``.
_ACCESS = re.compile(r'"POST (?:/v1/chat/completions|/v1/completions|/generate)\S* HTTP/[\d.]+" (\d{3})')


@dataclass(frozen=True, slots=True)
class Stamp:
    """Where a record came from: 1-based line number, timestamp and ranks from the line prefix."""

    line_no: int
    time: datetime | None
    tp_rank: int | None
    dp_rank: int | None


@dataclass(frozen=True, slots=True)
class DecodeBatch:
    """One "Decode batch" line (logged every ``--decode-log-interval`` decode steps, default 40)."""

    at: Stamp
    running: int
    queued: int
    tokens: int | None
    token_usage: float | None
    gen_throughput: float | None
    graph: bool | None


@dataclass(frozen=True, slots=True)
class PrefillBatch:
    """One "Prefill batch" line: requests admitted (``new_seq``) and prompt tokens computed."""

    at: Stamp
    new_seq: int
    new_tokens: int
    cached_tokens: int | None
    running: int | None
    queued: int | None
    token_usage: float | None


@dataclass(frozen=True, slots=True)
class Retraction:
    """Decode ran out of KV: ``retracted`` requests were evicted to the queue, to be recomputed later."""

    at: Stamp
    retracted: int
    new_token_ratio_before: float | None
    new_token_ratio_after: float | None


@dataclass(frozen=True, slots=True)
class RankStartup:
    """Startup memory figures one tensor-parallel rank logged; sizes in GiB as SGLang prints them."""

    tp_rank: int | None
    init_distributed_gib: float | None = None
    avail_before_load_gib: float | None = None
    avail_after_load_gib: float | None = None
    weights_gib: float | None = None
    kv_pool_tokens: int | None = None
    kv_pool_gib: float | None = None
    avail_after_pool_gib: float | None = None
    cuda_graph_gib: float | None = None
    avail_after_graph_gib: float | None = None
    max_total_num_tokens: int | None = None
    max_running_requests: int | None = None
    context_len: int | None = None
    chunked_prefill_size: int | None = None
    max_prefill_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class ServerArgs:
    """The server arguments that matter for memory and admission, as the log echoed them."""

    mem_fraction_static: float | None = None
    tp_size: int | None = None
    dp_size: int | None = None
    kv_cache_dtype: str | None = None
    max_running_requests: int | None = None
    max_total_tokens: int | None = None
    chunked_prefill_size: int | None = None
    cuda_graph_max_bs: int | None = None
    schedule_conservativeness: float | None = None
    enable_hierarchical_cache: bool | None = None
    hicache_ratio: float | None = None
    hicache_size: int | None = None
    pp_size: int | None = None
    nnodes: int | None = None
    enable_dp_attention: bool | None = None
    base_gpu_id: int | None = None
    gpu_id_step: int | None = None
    port: int | None = None
    model_path: str | None = None
    """With ``port``: which server on this machine wrote the log, if it still serves
    (``port_gpus.logged_server_gpus``)."""

    def gpu_ids(self) -> tuple[int, ...] | None:
        """The CUDA device ids the server's ranks ran on, as SGLang places them, or None when the
        log cannot say (no ``server_args`` line, or several nodes: which ranks ran here is unknown).

        SGLang gives rank (pp, tp) of a tensor-parallel group ``base_gpu_id + pp x tp_size + tp x
        gpu_id_step``; data-parallel replicas (without DP attention, which shares the group's GPUs)
        each take the next ``tp_size x pp_size x gpu_id_step`` ids. The ids count in the server's
        ``CUDA_VISIBLE_DEVICES``, which a log does not show.
        """
        if self.tp_size is None or (self.nnodes or 1) > 1:
            return None
        tp, pp, step = self.tp_size, self.pp_size or 1, self.gpu_id_step or 1
        replicas = 1 if self.enable_dp_attention else self.dp_size or 1
        first = self.base_gpu_id or 0
        return tuple(
            first + replica * tp * pp * step + stage * tp + rank * step
            for replica in range(replicas)
            for stage in range(pp)
            for rank in range(tp)
        )

    def placement(self) -> str:
        """How :meth:`gpu_ids` follows from the arguments, in the log's words, for people."""
        parts = [f"tp_size {self.tp_size}"]
        parts += [
            f"{name} {n}" for name, n in (("pp_size", self.pp_size), ("dp_size", self.dp_size)) if n and n > 1
        ]
        step = f", gpu_id_step {self.gpu_id_step}" if (self.gpu_id_step or 1) > 1 else ""
        return f"{' x '.join(parts)} from GPU {self.base_gpu_id or 0}{step}"


@dataclass(frozen=True, slots=True)
class StartupFailure:
    """Why a server did not start: ``kind`` (see :data:`FAILURE_PATTERNS`), the log line that says
    so, and a plain-words explanation with what to try."""

    kind: str
    line: str
    explanation: str


@dataclass(frozen=True, slots=True)
class ServerLog:
    """Everything :func:`parse_log` found. Records of all ranks are kept, in log order."""

    decode: tuple[DecodeBatch, ...]
    prefill: tuple[PrefillBatch, ...]
    retractions: tuple[Retraction, ...]
    startup: tuple[RankStartup, ...]
    args: ServerArgs
    failure: StartupFailure | None
    ready: bool
    http_statuses: dict[int, int]  # generation requests answered, by HTTP status (access log lines)


# ---------------------------------------------------------------------------------------------
# Startup failures: ONE table, in priority order. A root cause (host RAM, KV budget, unbalanced
# GPUs, CUDA graphs) wins over the generic CUDA OOM and over "the scheduler died", which are
# usually consequences logged later. The launcher imports classify_startup_failure from here.
# ---------------------------------------------------------------------------------------------
_KV_FORMULA = (
    "SGLang sizes the KV cache as: free GPU memory after loading the weights - "
    "(1 - mem_fraction_static) x free GPU memory before loading."
)
FAILURE_PATTERNS: tuple[tuple[str, re.Pattern[str], str], ...] = (
    (
        "host_memory",
        re.compile(r"Not enough host memory", re.IGNORECASE),
        "The hierarchical cache (--enable-hierarchical-cache) asked for more pinned host RAM than is "
        "available. Its size applies to EVERY GPU rank (each rank's scheduler allocates its own "
        "--hicache-size GB, or --hicache-ratio x its GPU KV pool), so 48 GB with 8 GPUs needs 384 GB "
        "of host RAM. Try: a smaller --hicache-size or --hicache-ratio (check `free -g`), or no "
        "hierarchical cache: it keeps evicted shared prefixes in host RAM, it does not let more "
        "requests run at once.",
    ),
    (
        "kv_memory",
        re.compile(
            r"Not enough memory\. Please try to increase --mem-fraction-static"
            r"|leave no GPU memory for the KV cache"
            r"|max_total_num_tokens\s*(?:<=\s*0|=\s*-\d)",
            re.IGNORECASE,
        ),
        f"No GPU memory was left for the KV cache (max_total_num_tokens <= 0). {_KV_FORMULA} It came "
        "out at or below zero: the weights, plus anything else that took GPU memory meanwhile, used "
        "more than mem_fraction_static of the memory that was free. Try, in order: make sure nothing "
        "else holds GPU memory (`datagen preflight`: a stale server from a crashed run, another job); "
        "make sure all GPUs of the tensor-parallel group have the same free memory (SGLang budgets "
        "by the smallest); then raise --mem-fraction-static (`datagen diagnose` on this log computes "
        "the minimum), or use more GPUs / a smaller or quantized model. After a NCCL, driver or "
        "environment change, communication buffers can take memory that used to be free.",
    ),
    (
        "gpu_unbalanced",
        re.compile(r"memory capacity is unbalanced", re.IGNORECASE),
        "The GPUs of the tensor-parallel group do not have the same free memory (SGLang checks that "
        "none has less than 90% of another's free memory). Usually another process holds memory on "
        "some of them, often a stale server from a crashed run. Run `datagen preflight` to see which "
        "processes hold memory and stop them, or choose GPUs with equal free memory.",
    ),
    (
        "cuda_graph",
        re.compile(r"Capture (?:cuda|CUDA) graph failed|CUDA graph capture failed", re.IGNORECASE),
        "Capturing CUDA graphs at startup (one per batch size up to --cuda-graph-max-bs) failed, "
        "usually out of memory: graph buffers live outside the static pool, in the "
        "(1 - mem_fraction_static) share. Try: a smaller --cuda-graph-max-bs, or --mem-fraction-static "
        "lower by 0.02-0.05; --disable-cuda-graph confirms the cause but decodes much slower.",
    ),
    (
        "cuda_oom",
        re.compile(r"CUDA out of memory|OutOfMemoryError|CUDA error: out of memory", re.IGNORECASE),
        "The GPU ran out of memory outside the static weights+KV pool: activations of a prefill chunk, "
        "CUDA graphs or NCCL buffers, which must fit in the (1 - mem_fraction_static) share. Try: "
        "--mem-fraction-static lower by 0.02-0.03, a smaller --chunked-prefill-size or "
        "--cuda-graph-max-bs, and check with `datagen preflight` that no other process uses the GPU.",
    ),
    (
        "scheduler_died",
        re.compile(
            r"scheduler died|scheduler is dead|Scheduler hit an exception"
            r"|Initialization failed\. Please see the error messages above",
            re.IGNORECASE,
        ),
        "A scheduler process (one per GPU) crashed while starting; the cause is the traceback before "
        "this line. Common causes: out of memory, a model/config or version mismatch, NCCL failing "
        "to initialise (check NCCL_* environment variables and --dist-init-addr), a port in use.",
    ),
)
_ERROR_LINE = re.compile(r"^\s*(?:[\w.]+\.)?\w*(?:Error|Exception): .+")


def classify_startup_failure(log_text: str) -> StartupFailure | None:
    """Recognise why a server failed to start, or None when no known failure text is present.

    ``kind`` is one of ``host_memory``, ``kv_memory``, ``gpu_unbalanced``, ``cuda_graph``,
    ``cuda_oom``, ``scheduler_died``. For ``scheduler_died`` the explanation quotes the last
    ``...Error: ...`` line of the log, which is normally the real cause.
    """
    lines = log_text.splitlines()
    for kind, pattern, explanation in FAILURE_PATTERNS:
        line = next((raw for raw in lines if pattern.search(raw)), None)
        if line is None:
            continue
        if kind == "scheduler_died":
            last_error = next((raw.strip() for raw in reversed(lines) if _ERROR_LINE.match(raw)), None)
            if last_error:
                explanation = f"{explanation} Last error in the log: {last_error}"
        return StartupFailure(kind=kind, line=_message(line), explanation=explanation)
    return None


# ---------------------------------------------------------------------------------------------
# Line parsing
# ---------------------------------------------------------------------------------------------
def parse_log(text: str) -> ServerLog:
    """Parse a whole SGLang server log; unknown lines are ignored."""
    decode: list[DecodeBatch] = []
    prefill: list[PrefillBatch] = []
    retractions: list[Retraction] = []
    startup: dict[int | None, dict[str, Any]] = {}
    args = ServerArgs()
    ready = False
    statuses: dict[int, int] = {}
    for line_no, raw in enumerate(text.splitlines(), start=1):
        at, msg = _split_prefix(line_no, raw)
        if m := _DECODE.search(msg):
            decode.append(_decode(at, _fields(m["rest"])))
        elif m := _PREFILL.search(msg):
            prefill.append(_prefill(at, _fields(m["rest"])))
        elif _RETRACT.search(msg):
            retractions.append(_retraction(at, msg))
        elif "server_args=" in msg:
            args = _server_args(msg)
        elif m := _ACCESS.search(msg):
            statuses[int(m[1])] = statuses.get(int(m[1]), 0) + 1
        else:
            _startup_fields(msg, startup.setdefault(at.tp_rank, {}))
            ready = ready or "fired up and ready to roll" in msg
    ranks = [RankStartup(tp_rank=rank, **found) for rank, found in startup.items() if found]
    return ServerLog(
        decode=tuple(decode),
        prefill=tuple(prefill),
        retractions=tuple(retractions),
        startup=tuple(sorted(ranks, key=lambda r: -1 if r.tp_rank is None else r.tp_rank)),
        args=args,
        failure=_weights_oom(classify_startup_failure(_last_start(text)), ranks),
        ready=ready,
        http_statuses=dict(sorted(statuses.items())),
    )


def _weights_oom(failure: StartupFailure | None, ranks: list[RankStartup]) -> StartupFailure | None:
    """A CUDA OOM while a rank loaded its weights (begun, never ended) is ``weights_oom``: before any
    KV cache, so no ``--mem-fraction-static`` helps; the launch ladder reloaded the weights at each
    rung for nothing, and diagnose advised a lower fraction."""
    loading = any(r.avail_before_load_gib is not None and r.avail_after_load_gib is None for r in ranks)
    if failure is None or failure.kind != "cuda_oom" or not loading:
        return failure
    return StartupFailure(
        "weights_oom",
        failure.line,
        "CUDA out of memory while loading the weights, before any KV cache: no --mem-fraction-static "
        "helps. The weights do not fit the memory free on these GPUs: free it (`datagen preflight` "
        "names what holds it), or use more GPUs (--tp), an fp8 checkpoint or a smaller model.",
    )


def _last_start(text: str) -> str:
    """The log from the server's last start on (SGLang prints its ``server_args`` at each): a log
    that spans restarts (``docker logs``, a file appended to) holds the failures of the earlier
    starts, and the server that runs now is the one to diagnose."""
    start = text.rfind("server_args=")
    return text if start < 0 else text[text.rfind("\n", 0, start) + 1 :]


def _split_prefix(line_no: int, raw: str) -> tuple[Stamp, str]:
    m = _PREFIX.search(raw)
    if not m:
        return Stamp(line_no, None, None, None), raw.strip()
    tags = {name.upper(): int(num) for name, num in _TAG.findall(m["tags"])}
    time = datetime.fromisoformat(m["ts"].replace("T", " "))
    return Stamp(line_no, time, tags.get("TP"), tags.get("DP")), raw[m.end() :].strip()


def _message(raw: str) -> str:
    """A log line without its timestamp/rank prefix, for quoting to people."""
    return _split_prefix(0, raw)[1]


def _fields(rest: str) -> dict[str, str]:
    """``"#running-req: 46, token usage: 0.86, ..."`` -> ``{"#running-req": "46", ...}``."""
    out = {}
    for part in rest.split(","):
        key, sep, value = part.partition(":")
        if sep:
            out[key.strip()] = value.strip()
    return out


def _int(found: dict[str, str], key: str) -> int | None:
    value = found.get(key)
    return int(float(value)) if value not in (None, "") else None


def _float(found: dict[str, str], key: str) -> float | None:
    value = found.get(key)
    return float(value.rstrip("%")) if value not in (None, "") else None


def _usage(found: dict[str, str]) -> float | None:
    """Token usage; hybrid sliding-window models log full and SWA usage, the higher one binds."""
    values = [
        v
        for v in (_float(found, k) for k in ("token usage", "full token usage", "swa token usage"))
        if v is not None
    ]
    return max(values) if values else None


def _decode(at: Stamp, found: dict[str, str]) -> DecodeBatch:
    graph = found.get("cuda graph", found.get("cpu graph"))
    return DecodeBatch(
        at=at,
        running=_int(found, "#running-req") or 0,
        queued=_int(found, "#queue-req") or 0,
        tokens=_int(found, "#token"),
        token_usage=_usage(found),
        gen_throughput=_float(found, "gen throughput (token/s)"),
        graph=None if graph is None else graph == "True",
    )


def _prefill(at: Stamp, found: dict[str, str]) -> PrefillBatch:
    return PrefillBatch(
        at=at,
        new_seq=_int(found, "#new-seq") or 0,
        new_tokens=_int(found, "#new-token") or 0,
        cached_tokens=_int(found, "#cached-token"),
        running=_int(found, "#running-req"),
        queued=_int(found, "#queue-req"),
        token_usage=_usage(found),
    )


def _retraction(at: Stamp, msg: str) -> Retraction:
    count = re.search(r"#retracted_reqs: (\d+)", msg)
    ratio = re.search(rf"#new_token_ratio: {_NUMBER} -> {_NUMBER}", msg)
    return Retraction(
        at=at,
        retracted=int(count[1]) if count else 1,
        new_token_ratio_before=float(ratio[1]) if ratio else None,
        new_token_ratio_after=float(ratio[2]) if ratio else None,
    )


# (marker that must be in the line, regex, {group index: field name})
_STARTUP_RULES: tuple[tuple[str, re.Pattern[str], dict[int, str]], ...] = (
    ("Init torch distributed ends", re.compile(rf"mem usage={_NUMBER} GB"), {1: "init_distributed_gib"}),
    ("Load weight begin", re.compile(rf"avail mem={_NUMBER} GB"), {1: "avail_before_load_gib"}),
    (
        "Load weight end",
        re.compile(rf"avail mem={_NUMBER} GB, mem usage={_NUMBER} GB"),
        {1: "avail_after_load_gib", 2: "weights_gib"},
    ),
    ("KV Cache is allocated", re.compile(r"#tokens: (\d+)"), {1: "kv_pool_tokens"}),
    ("Memory pool end", re.compile(rf"avail mem={_NUMBER} GB"), {1: "avail_after_pool_gib"}),
    (
        "Capture cuda graph end",
        re.compile(rf"mem usage={_NUMBER} GB\.? avail mem={_NUMBER} GB"),
        {1: "cuda_graph_gib", 2: "avail_after_graph_gib"},
    ),
    ("max_total_num_tokens=", re.compile(r"max_total_num_tokens=(-?\d+)"), {1: "max_total_num_tokens"}),
    ("max_total_num_tokens=", re.compile(r"max_running_requests=(\d+)"), {1: "max_running_requests"}),
    ("max_total_num_tokens=", re.compile(r"context_len=(\d+)"), {1: "context_len"}),
    ("max_total_num_tokens=", re.compile(r"chunked_prefill_size=(-?\d+)"), {1: "chunked_prefill_size"}),
    ("max_total_num_tokens=", re.compile(r"max_prefill_tokens=(\d+)"), {1: "max_prefill_tokens"}),
)
_INT_FIELDS = frozenset(
    {
        "kv_pool_tokens",
        "max_total_num_tokens",
        "max_running_requests",
        "context_len",
        "chunked_prefill_size",
        "max_prefill_tokens",
    }
)


def _startup_fields(msg: str, into: dict[str, Any]) -> None:
    for marker, pattern, groups in _STARTUP_RULES:
        if marker in msg and (m := pattern.search(msg)):
            for group, name in groups.items():
                into[name] = int(m[group]) if name in _INT_FIELDS else float(m[group])
    if "KV Cache is allocated" in msg:
        sizes = [float(v) for v in re.findall(rf"\b[KV]{{1,2}} size: {_NUMBER} GB", msg)]
        if sizes:
            into["kv_pool_gib"] = sum(sizes)


_ARG_TYPES: dict[str, type] = {
    "mem_fraction_static": float,
    "tp_size": int,
    "dp_size": int,
    "kv_cache_dtype": str,
    "max_running_requests": int,
    "max_total_tokens": int,
    "chunked_prefill_size": int,
    "cuda_graph_max_bs": int,
    "schedule_conservativeness": float,
    "enable_hierarchical_cache": bool,
    "hicache_ratio": float,
    "hicache_size": int,
    "pp_size": int,
    "nnodes": int,
    "enable_dp_attention": bool,
    "base_gpu_id": int,
    "gpu_id_step": int,
    "port": int,
    "model_path": str,
}


def _server_args(msg: str) -> ServerArgs:
    """Pick fields out of ``server_args=ServerArgs(a=1, ...)`` or ``server_args={'a': 1, ...}``."""
    found: dict[str, Any] = {}
    for name, kind in _ARG_TYPES.items():
        m = re.search(rf"['\"]?\b{name}['\"]?\s*[=:]\s*('[^']*'|\"[^\"]*\"|[\w.+-]+)", msg)
        if m and m[1] != "None":
            value = m[1].strip("'\"")
            found[name] = (
                value == "True" if kind is bool else kind(float(value)) if kind is int else kind(value)
            )
    return ServerArgs(**found)


def reporting_rank(
    records: Iterable[DecodeBatch | PrefillBatch | Retraction],
) -> tuple[int | None, int | None]:
    """The (dp, tp) rank whose lines to read: with tensor parallelism every rank may log the same
    event, so counting all ranks would multiply it. The lowest rank is the one SGLang logs from."""
    keys = {(r.at.dp_rank, r.at.tp_rank) for r in records}
    return min(keys, key=lambda k: tuple(-1 if v is None else v for v in k)) if keys else (None, None)
