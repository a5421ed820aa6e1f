from __future__ import annotations

import math
from pathlib import Path

import pytest

from flows.config import ConfigError, fingerprint, load_config, parse_config
from flows.control.adaptive import LawSettings
from flows.control.wiring import law_settings

BASE = {
    "run": {"name": "r1"},
    "endpoints": [{"url": "http://127.0.0.1:30000/v1/"}],
    "categories": [{"name": "chat", "source": "x.jsonl", "format": "messages"}],
}


def _with(**changes: object) -> dict:
    data = {k: (v.copy() if isinstance(v, dict) else [dict(i) for i in v]) for k, v in BASE.items()}
    data.update(changes)
    return data


def test_minimal_config_gets_defaults_and_normalised_url() -> None:
    cfg = parse_config(_with())
    assert cfg.endpoints[0].url == "http://127.0.0.1:30000"
    assert cfg.concurrency.adaptive and cfg.concurrency.limit is None  # no [concurrency]: adaptive
    assert cfg.run_dir == Path("output/r1")
    gen = cfg.generation_for(cfg.categories[0])
    assert (gen.max_tokens, gen.temperature, gen.top_p) == (2048, 0.7, 1.0)


def test_category_generation_overrides_run_defaults_field_by_field() -> None:
    data = _with(generation={"max_tokens": 1000, "temperature": 0.2})
    data["categories"][0]["generation"] = {"max_tokens": 300, "chat_template_kwargs": {"thinking": True}}
    cfg = parse_config(data)
    gen = cfg.generation_for(cfg.categories[0])
    assert gen.max_tokens == 300
    assert gen.temperature == 0.2
    assert gen.chat_template_kwargs == {"thinking": True}


def test_typo_names_the_key_and_suggests_the_fix() -> None:
    data = _with()
    data["categories"][0]["max_token"] = 5
    with pytest.raises(ConfigError) as info:
        parse_config(data, source="run.toml")
    text = str(info.value)
    assert "categories[0].max_token: unknown key — did you mean" in text
    assert "run.toml" in text


def test_missing_and_invalid_values_name_the_key() -> None:
    data = _with()
    del data["categories"][0]["format"]
    data["concurrency"] = {"limit": 0}
    with pytest.raises(ConfigError) as info:
        parse_config(data)
    text = str(info.value)
    assert "categories[0].format: required" in text
    assert "concurrency.limit:" in text


def test_api_key_value_is_refused_without_echoing_it() -> None:
    data = _with()
    data["endpoints"][0]["api_key"] = "sk-secret-123"
    with pytest.raises(ConfigError) as info:
        parse_config(data)
    assert "api_key_env" in str(info.value)
    assert "sk-secret-123" not in str(info.value)


def test_api_key_env_must_be_a_variable_name_and_is_not_echoed() -> None:
    data = _with()
    data["endpoints"][0]["api_key_env"] = "sk-live key"
    with pytest.raises(ConfigError) as info:
        parse_config(data)
    assert "NAME of an environment variable" in str(info.value)
    assert "sk-live key" not in str(info.value)


def test_api_key_secret_names_a_prefect_block_and_is_kept_as_a_name() -> None:
    data = _with()
    data["endpoints"][0]["api_key_secret"] = "sglang-key"
    config = parse_config(data)
    assert config.model_dump(mode="json")["endpoints"][0]["api_key_secret"] == "sglang-key"


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"api_key_secret": "sk-Live_KEY.123"}, "NAME of a Prefect Secret block"),
        ({"api_key_secret": "sk-live-key", "api_key_env": "KEY"}, "not both"),
    ],
    ids=["a-pasted-key", "both-sources"],
)
def test_a_bad_api_key_secret_is_refused_without_echoing_it(fields: dict[str, str], message: str) -> None:
    data = _with()
    data["endpoints"][0].update(fields)
    with pytest.raises(ConfigError) as info:
        parse_config(data)
    assert message in str(info.value)
    assert "sk-Live_KEY.123" not in str(info.value) and "sk-live-key" not in str(info.value)


def test_no_endpoint_and_no_launch_is_an_error_with_the_fix() -> None:
    with pytest.raises(ConfigError, match=r"\[\[endpoints\]\]"):
        parse_config(_with(endpoints=[]))


def test_duplicate_category_names_are_refused() -> None:
    data = _with()
    data["categories"].append(dict(data["categories"][0]))
    with pytest.raises(ConfigError, match="repeated: chat"):
        parse_config(data)


def test_a_server_listed_twice_in_endpoints_is_refused_naming_it() -> None:
    """Listed twice (here once with /v1), one server got two lanes, each with its own adaptive
    controller that counted only its own requests against the whole KV cache: together they asked
    for twice the pool, and the server retracted."""
    twice = [{"url": "http://127.0.0.1:30000/v1/"}, {"url": "http://127.0.0.1:30000"}]
    with pytest.raises(ConfigError, match=r"^config: endpoints: http://127\.0\.0\.1:30000 is listed twice"):
        parse_config(_with(endpoints=twice))


def test_fingerprint_follows_prompts_and_sampling_not_endpoints_or_concurrency() -> None:
    a = parse_config(_with())
    moved = parse_config(_with(endpoints=[{"url": "http://10.0.0.2:1"}], concurrency={"limit": 7}))
    hotter = parse_config(_with(generation={"temperature": 1.0}))
    assert fingerprint(a, "m") == fingerprint(moved, "m")
    assert fingerprint(a, "m") != fingerprint(hotter, "m")
    assert fingerprint(a, "m") != fingerprint(a, "other-model")


def test_load_config_resolves_sources_relative_to_the_file(tmp_path: Path) -> None:
    (tmp_path / "prompts.jsonl").write_text("{}\n")
    (tmp_path / "run.toml").write_text(
        '[run]\nname = "x"\n[[endpoints]]\nurl = "http://127.0.0.1:1"\n'
        '[[categories]]\nname = "c"\nsource = "prompts.jsonl"\nformat = "messages"\n'
    )
    cfg = load_config(tmp_path / "run.toml")
    assert cfg.categories[0].source == str((tmp_path / "prompts.jsonl").resolve())


def test_bad_toml_is_reported_with_the_path(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text("[run\nname=")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(path)


def test_concurrency_limit_means_fixed_and_contradictions_are_config_errors() -> None:
    fixed = parse_config(_with(concurrency={"limit": 32})).concurrency
    assert not fixed.adaptive and fixed.ceiling == 32
    adaptive = parse_config(_with(concurrency={"max_limit": 300})).concurrency
    assert adaptive.adaptive and adaptive.ceiling == 300
    for bad, words in [
        ({"mode": "fixed"}, "needs a `limit`"),
        ({"mode": "adaptive", "limit": 8}, 'set mode = "fixed", or drop `limit`'),
        ({"min_limit": 10, "max_limit": 5}, "min_limit"),
        ({"target_kv_usage": 1.5}, "target_kv_usage"),
    ]:
        with pytest.raises(ConfigError, match=words):
            parse_config(_with(concurrency=bad))


def test_admissions_are_paced_unless_turned_off() -> None:
    paced = law_settings(parse_config(_with()).concurrency)
    assert paced.pace_factor == LawSettings().pace_factor and paced.pace_factor is not None
    unpaced = law_settings(parse_config(_with(concurrency={"pace_admissions": False})).concurrency)
    assert unpaced.pace_factor is None
    faster = law_settings(parse_config(_with(concurrency={"pace_factor": 2.0})).concurrency)
    assert faster.pace_factor == 2.0
    with pytest.raises(ConfigError, match="pace_factor"):
        parse_config(_with(concurrency={"pace_factor": 0.5}))  # slower than the turnover would starve


def test_the_target_kv_usage_reaches_the_law_with_its_budget_peak() -> None:
    settings = law_settings(parse_config(_with(concurrency={"target_kv_usage": 0.8})).concurrency)
    assert settings.target_kv == 0.8
    assert settings.peak_kv == pytest.approx(0.84)


def test_endpoints_do_not_stream_unless_asked() -> None:
    """Non-streaming is the default: half the client CPU, and the controller needs no per-token signal."""
    cfg = parse_config(_with())
    assert cfg.endpoints[0].stream is False
    streamed = _with()
    streamed["endpoints"] = [{"url": "http://127.0.0.1:30000", "stream": True}]
    assert parse_config(streamed).endpoints[0].stream is True


def test_output_dir_may_be_a_url_and_the_run_keeps_its_own_files_locally() -> None:
    remote = parse_config(
        _with(run={"name": "r1", "output_dir": "memory://bucket/runs/", "local_dir": "/var/dg"})
    )
    assert (remote.run_location, remote.run_dir) == ("memory://bucket/runs/r1", Path("/var/dg/r1"))
    local_url = parse_config(_with(run={"name": "r1", "output_dir": "file:///data/runs"}))
    assert (local_url.run_location, local_url.run_dir) == ("file:///data/runs/r1", Path("/data/runs/r1"))
    plain = parse_config(_with())
    assert (plain.run_location, plain.run_dir) == ("output/r1", Path("output/r1"))


@pytest.mark.parametrize(
    ("section", "key", "value"),
    [
        ("generation", "temperature", math.inf),
        ("generation", "temperature", math.nan),
        ("retry", "max_total_s", math.inf),
        ("concurrency", "min_free_vram_gib", math.nan),
    ],
)
def test_an_infinite_or_nan_number_names_its_key(section: str, key: str, value: float) -> None:
    """TOML writes ``inf`` and ``nan``: a temperature of inf passed `ge = 0`, went into every request
    as `Infinity`, and every prompt of the run became a final reject a resume never asks again."""
    with pytest.raises(ConfigError) as info:
        parse_config(_with(**{section: {key: value}}))
    assert f"{section}.{key}:" in str(info.value)
    assert "finite" in str(info.value)


def test_an_endpoint_names_its_own_vram_source_and_its_gpus() -> None:
    """Several servers on several nodes: each node has its own DCGM exporter, and one server's GPUs
    are some of its node's. One `[concurrency] vram` read one node's exporter, every GPU of it, for
    every endpoint."""
    cfg = parse_config(
        _with(
            concurrency={"vram": "http://node-a:9400/metrics"},
            endpoints=[
                {"url": "http://node-a:30000"},
                {"url": "http://node-b:30000", "vram": "http://node-b:9400/metrics", "gpus": [4, 5, 6, 7]},
                {"url": "http://127.0.0.1:30001", "vram": "nvml", "gpus": [0]},
            ],
        )
    )
    assert [(e.vram, e.gpus) for e in cfg.endpoints] == [
        (None, None),  # None: [concurrency] vram
        ("http://node-b:9400/metrics", [4, 5, 6, 7]),
        ("nvml", [0]),
    ]


@pytest.mark.parametrize(
    ("entry", "words"),
    [
        ({"vram": "dcgm"}, r"endpoints\[0\]\.vram: must be auto, nvml, off, or a DCGM exporter URL"),
        ({"gpus": []}, r"endpoints\[0\]\.gpus: .*at least one GPU"),
        ({"gpus": [4, 5, 4]}, r"endpoints\[0\]\.gpus: .*GPU 4 is listed twice"),
        ({"gpus": [-1, 0]}, r"endpoints\[0\]\.gpus: .*-1 is no GPU index"),
        ({"gpus": [0.5]}, r"endpoints\[0\]\.gpus\[0\]"),
        ({"gpus": [True]}, r"endpoints\[0\]\.gpus\[0\]"),
        ({"vram": "off", "gpus": [0]}, r"endpoints\[0\]: gpus names the GPUs the OOM guard reads, but vram"),
    ],
)
def test_a_bad_endpoint_vram_or_gpus_names_the_key_and_why(entry: dict[str, object], words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        parse_config(_with(endpoints=[{"url": "http://127.0.0.1:30000", **entry}]))


def test_gpus_with_the_oom_guard_off_or_reading_nothing_is_refused_saying_why() -> None:
    """GPUs named for a guard that reads none would be a silent no-guard: `[concurrency] vram = "off"`
    left in place, or "auto" for a server on another machine (NVML sees only this machine's GPUs)."""
    off = _with(concurrency={"vram": "off"}, endpoints=[{"url": "http://127.0.0.1:30000", "gpus": [0]}])
    with pytest.raises(
        ConfigError, match=r'^config: endpoints\[0\]: gpus .* vram is "off" \(\[concurrency\] vram\)'
    ):
        parse_config(off)
    remote = _with(endpoints=[{"url": "http://10.0.0.2:30000", "gpus": [0]}])
    with pytest.raises(ConfigError, match=r"endpoints\[0\]: gpus .* DCGM exporter URL"):
        parse_config(remote)
    # its own source wins over [concurrency]'s
    on = _with(
        concurrency={"vram": "off"},
        endpoints=[{"url": "http://10.0.0.2:1", "vram": "http://10.0.0.2:9400/metrics", "gpus": [0]}],
    )
    assert parse_config(on).endpoints[0].gpus == [0]
