"""Configuration of the SGLang-compatible simulator.

One flat model (plus the fault knobs) so that it can be passed whole to a subprocess as JSON,
turned into command-line flags field by field, and patched at run time (``POST /sim/faults``).
The defaults describe one GPU-sized SGLang server; tests shrink the pool and ``time_scale``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

DEFAULT_CONTEXT_LENGTH = 32768
DEFAULT_POOL_TOKENS = 116000


class FaultConfig(BaseModel):
    """Faults injected on purpose, so that client retry and recovery paths can be exercised.

    Every random decision is drawn from one generator seeded by ``SimConfig.seed`` in arrival
    order, so a run with the same arrivals fails the same requests.
    """

    model_config = ConfigDict(extra="forbid")

    error_503_rate: float = Field(
        default=0.0, ge=0.0, le=1.0, description='share of requests answered 503 "The request queue is full."'
    )
    cut_stream_rate: float = Field(
        default=0.0, ge=0.0, le=1.0, description="share of streams cut mid-answer without [DONE]"
    )
    extra_latency_s: float = Field(
        default=0.0, ge=0.0, description="wall seconds added before each request is queued"
    )
    restart_downtime_s: float = Field(
        default=2.0, ge=0.0, description="wall seconds /sim/restart keeps the server unavailable"
    )
    error_500_rate: float = Field(
        default=0.0,
        ge=0.0,
        le=1.0,
        description="share of requests answered HTTP 500 with a plain-text body (a crashed handler)",
    )
    stall_stream_rate: float = Field(
        default=0.0, ge=0.0, le=1.0, description="share of streams that go silent mid-answer for stall_s"
    )
    stall_s: float = Field(
        default=60.0, ge=0.0, description="wall seconds a stalled stream sends nothing (connection kept open)"
    )
    first_token_delay_s: float = Field(
        default=0.0, ge=0.0, description="wall seconds every stream waits after its headers before any token"
    )
    crash_on_text: str | None = Field(
        default=None,
        description="a request whose messages contain this text brings the server process down at once "
        "(a kernel fault on one input: every connection reset); for a simulator in its own process",
    )


class SimConfig(BaseModel):
    """Everything the simulator needs: HTTP identity, KV pool, scheduler, timing, answers, faults.

    Times (``*_s``) are seconds of simulated GPU time; they are multiplied by ``time_scale`` to get
    wall seconds, so a 116k-token pool answering 4096-token requests can run in seconds.
    """

    model_config = ConfigDict(extra="forbid")

    host: str = "127.0.0.1"
    port: int = Field(default=30000, ge=0, le=65535)
    model_name: str = Field(default="sim-model", description="served model name (/v1/models, responses)")
    model_path: str = "/models/sim-model"

    max_total_tokens: int = Field(default=DEFAULT_POOL_TOKENS, gt=0, description="KV pool size in tokens")
    max_running_requests: int = Field(default=1024, gt=0)
    context_length: int = Field(
        default=DEFAULT_CONTEXT_LENGTH,
        gt=0,
        description="the pool size instead when that is smaller and none is given",
    )
    max_queued_requests: int | None = Field(default=None, gt=0, description="None = unbounded queue")
    max_prefill_tokens: int = Field(
        default=16384, gt=0, description="input tokens one prefill batch may take"
    )
    clip_max_new_tokens: int = Field(default=4096, gt=0, description="SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION")
    init_new_token_ratio: float = Field(default=0.7, gt=0.0, le=1.0)
    min_new_token_ratio_factor: float = Field(default=0.14, gt=0.0, le=1.0)
    new_token_ratio_decay_steps: int = Field(default=600, gt=0)
    retract_decode_steps: int = Field(
        default=20, ge=0, description="tokens per request the post-retraction ratio assumes"
    )

    time_scale: float = Field(default=1.0, gt=0.0, description="wall seconds per simulated second")
    decode_base_s: float = Field(default=0.02, ge=0.0, description="fixed cost of one decode step")
    decode_per_request_s: float = Field(
        default=0.0002, ge=0.0, description="decode step cost per running request"
    )
    decode_per_kv_token_s: float = Field(
        default=5e-8, ge=0.0, description="decode step cost per KV token attended"
    )
    prefill_base_s: float = Field(default=0.005, ge=0.0, description="fixed cost of one prefill batch")
    prefill_per_token_s: float = Field(default=5e-5, ge=0.0, description="prefill cost per input token")
    stream_interval_s: float = Field(
        default=0.05,
        gt=0.0,
        description="wall seconds between token deliveries to streams (coalesces chunks)",
    )
    metrics_decode_interval: int = Field(
        default=40, gt=0, description="gauges refresh every prefill and every N decode steps (SGLang: 40)"
    )

    stop_probability: float = Field(
        default=0.1, ge=0.0, le=1.0, description="share of answers that stop before max_tokens"
    )
    stop_length_mean: float | None = Field(
        default=None,
        gt=0.0,
        description="an answer that stops does so at an exponential length of this mean (a long tail, "
        "as reasoning chains have; past max_tokens it runs to the cap); unset: at a uniform point below "
        "max_tokens",
    )
    reasoning: bool = Field(
        default=False, description="emit reasoning_content first (as with --reasoning-parser)"
    )
    reasoning_fraction: float = Field(
        default=0.5, ge=0.0, le=1.0, description="share of the answer spent reasoning"
    )
    tool_calls: bool = Field(default=False, description="answer with a tool call when tools are offered")
    tool_call_probability: float = Field(
        default=0.5, ge=0.0, le=1.0, description='chance of a call when tool_choice is "auto"'
    )
    startup_delay_s: float = Field(
        default=0.0, ge=0.0, description="wall seconds /health answers 503 after start"
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        default="info", description="info shows SGLang's batch lines; warning keeps only retractions"
    )

    api_key: str | None = Field(
        default=None,
        description="as SGLang's --api-key: requests without 'Bearer KEY' get 401, except /health and "
        "/metrics (SGLang leaves them open for probes and scrapers)",
    )
    key_on_health: bool = Field(
        default=False,
        description="with api_key: /health wants the key too, as behind a gateway that checks it on "
        "every path (LiteLLM's proxy does on /health)",
    )
    faults: FaultConfig = Field(default_factory=FaultConfig)
    seed: int = 0

    @model_validator(mode="before")
    @classmethod
    def _default_context(cls, data: Any) -> Any:
        """Without a context length, shrink the default to the pool so ``--max-total-tokens`` alone works."""
        if isinstance(data, dict) and data.get("context_length") is None:
            pool = int(data.get("max_total_tokens", DEFAULT_POOL_TOKENS))
            return {**data, "context_length": min(DEFAULT_CONTEXT_LENGTH, pool)}
        return data

    @model_validator(mode="after")
    def _context_fits(self) -> SimConfig:
        """A context larger than the pool would let one request outgrow the KV cache alone."""
        if self.context_length > self.max_total_tokens:
            raise ValueError(
                f"context_length ({self.context_length}) must not exceed "
                f"max_total_tokens ({self.max_total_tokens})"
            )
        return self
