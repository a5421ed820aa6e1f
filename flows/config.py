"""The run configuration: one TOML file, validated before any GPU time is spent.

Every error names the key that is wrong and what to write instead, because the person reading it is
about to rent eight GPUs and should not have to read a pydantic traceback to find a typo.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import re
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    StrictInt,
    ValidationError,
    field_validator,
    model_validator,
)

from flows.client.sampling import check_extra_body
from flows.store.location import check_location, join, local_path
from prompts.categories import WRITTEN_SOURCE, expand
from sglang_launch.server_config import ServerConfig

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_BLOCK_NAME = re.compile(r"^[a-z0-9][a-z0-9-]*$")  # Prefect's rule for block document names
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def _safe_name(value: str) -> str:
    """Names become folder names: no slashes, no dots first, nothing a shell would trip on."""
    if not _NAME.fullmatch(value):  # fullmatch: `$` alone would let a trailing newline through
        raise ValueError("use letters, digits, '_', '-' or '.', starting with a letter or digit")
    return value


SafeName = Annotated[str, AfterValidator(_safe_name)]


def _vram_source(value: str) -> str:
    """Where free GPU memory is read: the same four kinds for the run and for one endpoint."""
    if value in ("auto", "nvml", "off") or value.startswith(("http://", "https://")):
        return value
    raise ValueError("must be auto, nvml, off, or a DCGM exporter URL (http://host:9400/metrics)")


VramSource = Annotated[str, AfterValidator(_vram_source)]

LOCAL_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
"""Hosts that are this machine: only there can NVML read a server's GPUs (``vram = "auto"``)."""


def on_this_machine(url: str) -> bool:
    """Whether ``url``'s server runs here (by its host name): only then is "auto" NVML."""
    return urlsplit(url).hostname in LOCAL_HOSTS


class ConfigError(ValueError):
    """A config problem, already phrased for a person: key, problem, fix."""


class _Strict(BaseModel):
    """Unknown keys refused (a typo is not a default), and numbers finite: TOML writes ``inf`` and
    ``nan``, and a temperature of ``inf`` passed ``ge = 0``, went into every request, and every prompt
    became a final reject."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class GenerationConfig(_Strict):
    """Sampling settings; every field optional so a category can override only what it needs."""

    max_tokens: int | None = Field(default=None, gt=0, description="Answer length cap per request.")
    temperature: float | None = Field(default=None, ge=0)
    top_p: float | None = Field(default=None, gt=0, le=1)
    chat_template_kwargs: dict[str, Any] | None = None
    separate_reasoning: bool | None = None
    extra_body: dict[str, Any] | None = None

    @field_validator("extra_body")
    @classmethod
    def _sendable(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is not None:
            check_extra_body(value)
        return value

    def merged_over(self, base: GenerationConfig) -> GenerationConfig:
        """This config's set fields on top of ``base`` (category over run defaults)."""
        return base.model_copy(update=self.model_dump(exclude_none=True))


DEFAULT_GENERATION = GenerationConfig(max_tokens=2048, temperature=0.7, top_p=1.0)


class RunSection(_Strict):
    name: SafeName = Field(description="Run name: the folder under output_dir.")
    output_dir: Annotated[str, AfterValidator(check_location)] = Field(
        default="output",
        description="Where the run's folder goes: a local folder or an fsspec URL "
        "(file:///data/runs, s3://bucket/runs, gs://bucket/runs).",
    )
    local_dir: Path = Field(
        default=Path("output"),
        description="For an output_dir URL: the local folder of the run's own files (lock, progress "
        "log, controller timeline, report, server logs).",
    )


class EndpointConfig(_Strict):
    url: str = Field(description="Base URL of the server, e.g. http://127.0.0.1:30000")
    model: str | None = Field(default=None, description="Served model name; read from /v1/models if absent.")
    api_key_env: str | None = Field(default=None, description="NAME of the env var that holds the API key.")
    api_key_secret: str | None = Field(
        default=None,
        description="NAME of a Prefect Secret block holding the API key, read at run time (needs Prefect).",
    )
    stream: bool = Field(
        default=False,
        description="Stream answers (measures time to first token). Off by default: measured on "
        "10,000 requests (bench.client_cpu), streaming cost the client about 6x the CPU (a chunk per "
        "token: 66-92 s vs 13 s) and the controller needs no per-token signal.",
    )
    ca_bundle: str | None = Field(
        default=None,
        description="PEM file of the CA(s) that signed an https endpoint's certificate (a private CA); "
        "when set, only these are trusted, for its DCGM exporter (vram) too. Relative paths are relative "
        "to the config file.",
    )
    vram: VramSource | None = Field(
        default=None,
        description="Free GPU memory for this endpoint's OOM guard, as [concurrency] vram (auto, nvml, "
        "off, or a DCGM exporter URL: its own node's); None: [concurrency] vram.",
    )
    gpus: list[StrictInt] | None = Field(
        default=None,
        description="The server's GPUs as nvidia-smi and DCGM's `gpu` label number them (not counted in "
        "its CUDA_VISIBLE_DEVICES), e.g. [4, 5, 6, 7]: the OOM guard reads only these. None: through "
        "NVML, those of the processes listening on its port; through DCGM, every GPU of the node.",
    )

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https://, e.g. http://127.0.0.1:30000")
        parts = urlsplit(value)
        if parts.username is not None or parts.password is not None or parts.query:
            # the URL is in the manifest, every row's `endpoint`, the report and the live line
            raise ValueError(
                "must not carry credentials or a query (user:password@, ?key=): it is written into "
                "every row and report; put the key in an environment variable named by api_key_env"
            )
        value = value.rstrip("/")
        return value.removesuffix("/v1")

    @field_validator("api_key_env")
    @classmethod
    def _env_name(cls, value: str | None) -> str | None:
        if value is not None and not _ENV_NAME.match(value):
            # Never echo the value: it may be the key itself pasted by mistake.
            raise ValueError(
                "must be the NAME of an environment variable (e.g. SGLANG_API_KEY), not the key itself"
            )
        return value

    @field_validator("api_key_secret")
    @classmethod
    def _block_name(cls, value: str | None) -> str | None:
        if value is not None and not _BLOCK_NAME.match(value):
            # Never echo the value: it may be the key itself pasted by mistake.
            raise ValueError(
                "must be the NAME of a Prefect Secret block (lowercase letters, digits, dashes), "
                "not the key itself"
            )
        return value

    @model_validator(mode="after")
    def _one_key_source(self) -> EndpointConfig:
        if self.api_key_env is not None and self.api_key_secret is not None:
            raise ValueError("set api_key_env or api_key_secret, not both")
        return self

    @field_validator("gpus")
    @classmethod
    def _gpu_indices(cls, gpus: list[int] | None) -> list[int] | None:
        if gpus is None:
            return None
        if not gpus:
            raise ValueError(
                "list at least one GPU (the server's, as nvidia-smi numbers them, e.g. [4, 5, 6, 7]), "
                "or leave gpus out"
            )
        for index in gpus:
            if index < 0:
                raise ValueError(f"{index} is no GPU index: nvidia-smi and DCGM number GPUs from 0")
            if gpus.count(index) > 1:
                raise ValueError(f"GPU {index} is listed twice: list each of the server's GPUs once")
        return gpus

    @field_validator("ca_bundle")
    @classmethod
    def _existing_file(cls, value: str | None) -> str | None:
        # Checked here, not at the first request: a typo must stop the run before it starts.
        if value is not None and not Path(value).expanduser().is_file():
            raise ValueError(f"no such file: {value} (a PEM file with the CA certificate(s))")
        return value


class ConcurrencyConfig(_Strict):
    """How many requests may be in flight per endpoint: adaptive (the default) unless ``limit`` fixes it."""

    mode: Literal["adaptive", "fixed"] | None = Field(
        default=None, description="Implied: fixed when `limit` is set, adaptive otherwise."
    )
    limit: int | None = Field(default=None, gt=0, le=100_000, description="A fixed number in flight.")
    target_kv_usage: float = Field(
        default=0.90,
        gt=0.1,
        le=0.99,
        description="Adaptive: the share of the server's KV pool to fill; the token budget's projected "
        "peak may reach 0.04 above it (never 0.99, where the law backs off).",
    )
    initial_limit: int = Field(default=8, ge=1, le=100_000)
    min_limit: int = Field(default=1, ge=1, le=100_000)
    max_limit: int = Field(default=1024, ge=1, le=100_000)
    poll_s: float = Field(default=1.0, ge=0.2, le=60.0, description="Seconds between load readings.")
    vram: VramSource = Field(
        default="auto",
        description="Free GPU memory for the OOM guard: auto (NVML for a server on this machine), "
        "nvml, off, or a DCGM exporter's metrics URL.",
    )
    min_free_vram_gib: float = Field(default=1.0, ge=0.0, le=1024.0)
    pace_admissions: bool = Field(
        default=True,
        description="After the slow start, while the answers are of about one length and long beside "
        "their prompts (a third or more of a request's KV), admit a steady stream: as fast as requests "
        "end, averaged over a request's life, plus the way to the aim over a life (and no faster "
        "than the KV budget's projection allows), so a burst of answers that finish together is not "
        "admitted back as a burst; false admits at once.",
    )
    pace_factor: float = Field(
        default=1.1,
        ge=1.0,
        le=100.0,
        description="With pacing: the stream aims at this many times the limit (at most what the KV "
        "budget holds with the requests' ages spread), so the limit binds and grows while there is room.",
    )

    @model_validator(mode="after")
    def _consistent(self) -> ConcurrencyConfig:
        if self.mode == "fixed" and self.limit is None:
            raise ValueError('mode = "fixed" needs a `limit`')
        if self.mode == "adaptive" and self.limit is not None:
            raise ValueError(
                '`limit` fixes the number in flight: set mode = "fixed", or drop `limit` to run adaptive'
            )
        if self.min_limit > self.max_limit:
            raise ValueError("min_limit is larger than max_limit")
        return self

    @property
    def adaptive(self) -> bool:
        return self.limit is None

    def vram_for(self, own: str | None) -> str:
        """An endpoint's source of free GPU memory: its own ``vram``, else the run's."""
        return own if own is not None else self.vram

    @property
    def ceiling(self) -> int:
        """The most requests one endpoint may ever have in flight."""
        return self.limit if self.limit is not None else self.max_limit


class RetryConfig(_Strict):
    """Backoff for transient failures; sized so a server restart of a few minutes costs no prompt."""

    max_attempts: int = Field(default=8, ge=1)
    initial_wait_s: float = Field(default=1.0, gt=0)
    max_wait_s: float = Field(default=60.0, gt=0)
    max_total_s: float = Field(default=900.0, gt=0)
    read_timeout_s: float = Field(default=3600.0, gt=0, description="Per request; long reasoning answers.")
    outage_patience_s: float = Field(
        default=1800.0, gt=0, description="Wait this long for a silent server before stopping the run."
    )
    failover_after_s: float = Field(
        default=60.0, gt=0, description="With several endpoints: move a prompt off a silent one after this."
    )


class StoreConfig(_Strict):
    flush_rows: int = Field(default=256, gt=0, description="Write a parquet shard every N rows ...")
    flush_seconds: float = Field(default=30.0, gt=0, description="... or every N seconds, whichever first.")
    shard_prompts: int = Field(default=1000, gt=0, description="Prompts per Prefect shard task.")


class QuotaConfig(_Strict):
    """How much of a source to take, sampled by a seeded hash of each prompt's id.

    Hash sampling is stable across runs (the same rows are chosen whatever the row order, and
    whatever the other categories do) and needs no shuffle buffer: a fraction is decided row by row;
    a count takes the ``count`` rows with the smallest hashes, which costs one extra pass over the
    source to find them.
    """

    count: int | None = Field(default=None, gt=0)
    fraction: float | None = Field(default=None, gt=0, le=1)
    seed: int = 0

    @model_validator(mode="after")
    def _one_of(self) -> QuotaConfig:
        if (self.count is None) == (self.fraction is None):
            raise ValueError("set exactly one of count (e.g. 20000) or fraction (e.g. 0.1)")
        return self


RegenMode = Literal["first_turn", "all_turns", "tool_replay"]


class CategoryConfig(_Strict):
    name: SafeName
    source: str = Field(description="Local file/dir (relative to the config file) or a Hugging Face id.")
    format: str = Field(description="Converter name, e.g. 'messages' or 'sharegpt'.")
    split: str = "train"
    subset: str | None = None
    mode: RegenMode = Field(default="first_turn", description="What is regenerated of each conversation.")
    send_tools: bool = Field(default=True, description="Send the prompt's tools with the request.")
    system_prompt: str | None = Field(default=None, description="Replaces the prompt's system message(s).")
    filters: dict[str, Any] = Field(default_factory=dict, description="Format-specific row filters.")
    columns: dict[str, str] = Field(
        default_factory=dict,
        description="The format's column name -> the source's, e.g. {conversations = 'conversation'}.",
    )
    quota: QuotaConfig | None = None
    limit: int | None = Field(default=None, gt=0, description="Take at most this many prompts.")
    generation: GenerationConfig = GenerationConfig()
    _source_as_written: str | None = PrivateAttr(default=None)
    """A local ``source`` as written, relative to its file (``source`` is the absolute path)."""

    @model_validator(mode="after")
    def _known_format(self) -> CategoryConfig:
        from prompts.filters import check_filters
        from prompts.formats import known_formats

        if self.format not in known_formats():
            raise ValueError(f"format {self.format!r} is unknown; known: {', '.join(known_formats())}")
        check_filters(self.format, self.filters)
        return self


class RunConfig(_Strict):
    run: RunSection
    endpoints: list[EndpointConfig] = Field(default_factory=list)
    server: ServerConfig | None = None
    concurrency: ConcurrencyConfig = ConcurrencyConfig()
    retry: RetryConfig = RetryConfig()
    store: StoreConfig = StoreConfig()
    generation: GenerationConfig = DEFAULT_GENERATION
    categories: list[CategoryConfig] = Field(min_length=1)

    @field_validator("endpoints")
    @classmethod
    def _each_server_once(cls, endpoints: list[EndpointConfig]) -> list[EndpointConfig]:
        """Each endpoint gets its own lane and adaptive controller, which counts only its own requests
        against the server's whole KV cache: two on one server ask for twice the pool together."""
        urls = [e.url for e in endpoints]  # normalised: no trailing slash, no /v1
        twice = sorted({url for url in urls if urls.count(url) > 1})
        if twice:
            raise ValueError(
                f"{', '.join(twice)} is listed twice: each entry gets its own concurrency limit, and two "
                "on one server overfill its KV cache; list each server once (raise [concurrency] instead)"
            )
        return endpoints

    @model_validator(mode="after")
    def _consistent(self) -> RunConfig:
        names = [c.name for c in self.categories]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"category names must be unique; repeated: {', '.join(dupes)}")
        launching = self.server is not None and self.server.launch
        if not self.endpoints and not launching:
            raise ValueError(
                'no endpoint: add [[endpoints]] with url = "http://HOST:PORT", '
                "or [server] launch = true to start one"
            )
        # checked here, not when the server is started: by then the run directory is made and locked
        if (
            self.server is not None
            and launching
            and self.server.engine == "sglang"
            and not self.server.model_path
        ):
            raise ValueError(
                "[server] launch = true needs model_path (the target model: a Hub id or a directory)"
            )
        for index, endpoint in enumerate(self.endpoints):
            self._gpus_are_read(index, endpoint)
        return self

    def _gpus_are_read(self, index: int, endpoint: EndpointConfig) -> None:
        """GPUs named for an OOM guard that reads none would be a guard silently missing: vram "off"
        (its own, or ``[concurrency]``'s left in place), or "auto" for a server on another machine,
        where NVML cannot see its GPUs."""
        if endpoint.gpus is None:
            return
        vram = self.concurrency.vram_for(endpoint.vram)
        whose = "this endpoint's vram" if endpoint.vram is not None else "[concurrency] vram"
        said = f'endpoints[{index}]: gpus names the GPUs the OOM guard reads, but vram is "{vram}" ({whose})'
        if vram == "off":
            raise ValueError(
                f'{said}, which reads no GPU: leave gpus out, or set this endpoint\'s vram to "nvml" '
                "(a server on this machine) or its node's DCGM exporter URL"
            )
        if vram == "auto" and not on_this_machine(endpoint.url):
            raise ValueError(
                f"{said}, which reads no GPU for a server on another machine (NVML sees this machine's "
                "only): set vram to its node's DCGM exporter URL (http://HOST:9400/metrics)"
            )

    def generation_for(self, category: CategoryConfig) -> GenerationConfig:
        return category.generation.merged_over(self.generation.merged_over(DEFAULT_GENERATION))

    def category(self, name: str) -> CategoryConfig:
        for category in self.categories:
            if category.name == name:
                return category
        raise KeyError(name)

    @property
    def run_location(self) -> str:
        """Where the run's data goes (manifest, shards): a local path or a URL."""
        return join(self.run.output_dir, self.run.name)

    @property
    def run_dir(self) -> Path:
        """The local folder of the run's own files: the run's folder itself when its data is local."""
        local = local_path(self.run_location)
        return local if local is not None else self.run.local_dir / self.run.name


def fingerprint(config: RunConfig, model: str, *, absolute_sources: bool = False) -> str:
    """Hash of everything that decides WHAT is generated (prompts, sampling, model).

    Endpoints, concurrency, retries and store tuning are left out on purpose: moving a run to another
    server or changing its concurrency must not block a resume, but changing the prompts or sampling
    must not silently mix two datasets in one run. A local source counts as written in its file
    (relative to it), not by where the project lies: a run resumed from a new clone or another node
    is the same run. ``absolute_sources``: the hash as made before (local sources by absolute path),
    which the runs started then still carry in their manifests.
    """
    covered = fingerprinted(config, model, absolute_sources=absolute_sources)
    canonical = json.dumps(covered, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def fingerprinted(config: RunConfig, model: str, *, absolute_sources: bool = False) -> dict[str, Any]:
    """What ``fingerprint`` hashes; the manifest keeps it, so a refusal can name what changed."""

    def covered(c: CategoryConfig) -> dict[str, Any]:
        written = None if absolute_sources else c._source_as_written
        return {
            **c.model_dump(mode="json", exclude={"generation"}),
            **({"source": written} if written is not None else {}),
            "generation": config.generation_for(c).model_dump(mode="json"),
        }

    return {"model": model, "categories": [covered(c) for c in config.categories]}


def _loc(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _known_keys(model: type[BaseModel], loc: tuple[int | str, ...]) -> list[str]:
    """Field names valid at ``loc``, to suggest the closest one for a typo."""
    current: type[BaseModel] = model
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        field = current.model_fields.get(part)
        if field is None:
            return []
        annotation = field.annotation
        args = getattr(annotation, "__args__", ()) or (annotation,)
        nested = [a for a in args if isinstance(a, type) and issubclass(a, BaseModel)]
        if not nested:
            return []
        current = nested[0]
    return list(current.model_fields)


def _suggest(key: str, known: list[str]) -> str:
    """The closest valid key here, or a sampling key that belongs under ``generation``."""
    close = difflib.get_close_matches(key, known, n=1)
    if close:
        return f" — did you mean '{close[0]}'?"
    sampling = difflib.get_close_matches(key, list(GenerationConfig.model_fields), n=1)
    if sampling and "generation" in known:
        return f" — did you mean 'generation.{sampling[0]}'? (sampling settings go under generation)"
    return " — remove it or check the README"


def explain(error: ValidationError, source: str) -> ConfigError:
    """Turn pydantic's errors into lines a person can act on: key, problem, fix.

    One problem is one line (``run.toml: concurrency.limit: ...``); several get a line each.
    """
    problems = []
    for item in error.errors():
        loc = tuple(item["loc"])
        key = _loc(loc)
        if item["type"] == "extra_forbidden":
            problems.append(f"{key}: unknown key{_suggest(str(loc[-1]), _known_keys(RunConfig, loc))}")
        elif item["type"] == "missing":
            problems.append(f"{key}: required — add it")
        else:
            message = item["msg"].removeprefix("Value error, ")
            problems.append(f"{key}: {message}" if key else message)  # the whole config's: says its keys
    if len(problems) == 1:
        return ConfigError(f"{source}: {problems[0]}")
    return ConfigError("\n".join([f"{source}: the config is not valid:", *(f"  {p}" for p in problems)]))


def _resolve_sources(data: dict[str, Any], base: Path) -> None:
    """Relative local paths (category sources, endpoint CA bundles) are relative to the config
    file, so a config works from any cwd."""
    for section, key in (("categories", "source"), ("endpoints", "ca_bundle")):
        entries = data.get(section)
        for entry in entries if isinstance(entries, list) else []:
            path = entry.get(key) if isinstance(entry, dict) else None
            if isinstance(path, str) and not Path(path).is_absolute():
                candidate = base / path
                if candidate.exists():
                    entry[key] = str(candidate.resolve())
                    if section == "categories":
                        entry[WRITTEN_SOURCE] = path


def _expand_categories(data: dict[str, Any], base: Path | None, source: str) -> None:
    """Entries that name a category file get the file's settings underneath their own."""
    entries = data.get("categories")
    if not isinstance(entries, list):
        return
    extra = [base / "categories"] if base is not None else []
    for index, entry in enumerate(entries):
        if not isinstance(entry, dict):
            continue
        try:
            entries[index] = expand(entry, extra)
        except LookupError as error:
            raise ConfigError(f"{source}: categories[{index}].use: {error.args[0]}") from None


def parse_config(data: dict[str, Any], *, source: str = "config", base: Path | None = None) -> RunConfig:
    if base is not None:
        _resolve_sources(data, base)
    _expand_categories(data, base, source)
    named = json.dumps(_keys_only(data)).replace("api_key_env", "").replace("api_key_secret", "")
    if "api_key" in named:
        raise ConfigError(
            f"{source}: an 'api_key' value is in the config file. Put the key in an environment variable "
            'and name that variable with api_key_env = "SGLANG_API_KEY", or in a Prefect Secret block '
            'named with api_key_secret = "sglang-key".'
        )
    entries = data.get("categories")
    listed = entries if isinstance(entries, list) else []
    written = [entry.pop(WRITTEN_SOURCE, None) if isinstance(entry, dict) else None for entry in listed]
    try:
        config = RunConfig.model_validate(data)
    except ValidationError as error:
        raise explain(error, source) from None
    for category, as_written in zip(config.categories, written, strict=True):
        category._source_as_written = as_written
    return config


def _keys_only(data: Any) -> Any:
    """The key structure without values, so secrets are never compared or echoed."""
    if isinstance(data, dict):
        return {k: _keys_only(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_keys_only(v) for v in data]
    return None


def load_config(path: Path) -> RunConfig:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise ConfigError(f"{path}: cannot read the config ({error.strerror})") from None
    except UnicodeDecodeError as error:
        raise ConfigError(f"{path}: not UTF-8 text (byte {error.start}): save the config as UTF-8") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{path}: not valid TOML: {error}") from None
    if not data:
        raise ConfigError(
            f'{path}: the config is empty: it needs at least [run] name = "..." and one [[categories]] '
            "(see the README's example)"
        )
    return parse_config(data, source=str(path), base=path.parent)
