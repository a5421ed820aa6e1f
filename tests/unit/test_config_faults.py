"""Bad configs: each field with a wrong type or out of range, unknown keys, an empty file.

`datagen run` must answer every one with exit 2 and one line naming the key, before anything
starts; and no generated config, however odd, may end in a traceback.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from flows.cli.main import app
from flows.config import ConfigError, RunConfig, load_config, parse_config

GOOD = """
[run]
name = "r"

[[endpoints]]
url = "http://127.0.0.1:9"

[[categories]]
name = "chat"
source = "p.jsonl"
format = "messages"
"""


def _with(section: str, line: str) -> str:
    """GOOD with ``line`` added under ``[section]`` (created when missing)."""
    if f"[{section}]" in GOOD:
        return GOOD.replace(f"[{section}]\n", f"[{section}]\n{line}\n", 1)
    return GOOD + f"\n[{section}]\n{line}\n"


CASES = [
    ("empty file", "", "the config is empty"),
    ("comments only", "# nothing here\n", "the config is empty"),
    ("not TOML", "[run\nname = 1", "not valid TOML"),
    ("unknown top-level table", GOOD + "\n[runn]\nname = 'x'\n", "runn: unknown key"),
    ("unknown key in a table", _with("concurrency", "limt = 4"), "concurrency.limt: unknown key"),
    ("sampling key at the top", _with("run", "max_tokens = 4"), "run.max_tokens: unknown key"),
    ("unknown key in a category", GOOD + 'formt = "x"\n', "categories[0].formt: unknown key"),
    ("run is not a table", GOOD.replace('[run]\nname = "r"', 'run = "r"'), "run: Input should be"),
    ("run name a number", GOOD.replace('name = "r"', "name = 5"), "run.name: Input should be"),
    ("run name escapes", GOOD.replace('name = "r"', 'name = "../x"'), "run.name: use letters"),
    (
        "endpoints not a list",
        'endpoints = "x"\n' + GOOD.replace('[[endpoints]]\nurl = "http://127.0.0.1:9"', ""),
        "endpoints: Input should be",
    ),
    ("url not http", GOOD.replace("http://127.0.0.1:9", "ftp://h"), "endpoints[0].url: must start"),
    (
        "url with a password",  # it would be written into every row, the manifest and the report
        GOOD.replace("http://127.0.0.1:9", "http://user:s3cret@127.0.0.1:9"),
        "endpoints[0].url: must not carry credentials",
    ),
    (
        "url with a key query",
        GOOD.replace("http://127.0.0.1:9", "http://h:9/?key=s3cret"),
        "endpoints[0].url: must not",
    ),
    (
        "stream not a bool",
        GOOD.replace('url = "http://127.0.0.1:9"', 'url = "http://h"\nstream = "maybe"'),
        "endpoints[0].stream",
    ),
    (
        "api key env holds a key",
        GOOD.replace('url = "http://127.0.0.1:9"', 'url = "http://h"\napi_key_env = "sk-1"'),
        "endpoints[0].api_key_env: must be the NAME",
    ),
    (
        "an api key in the file",
        GOOD.replace('url = "http://127.0.0.1:9"', 'url = "http://h"\napi_key = "k"'),
        "api_key_env",
    ),
    ("limit a string", _with("concurrency", 'limit = "many"'), "concurrency.limit: Input should be"),
    ("limit zero", _with("concurrency", "limit = 0"), "concurrency.limit: Input should be greater than 0"),
    ("limit huge", _with("concurrency", "limit = 10000000"), "concurrency.limit: Input should be less"),
    ("target usage above 1", _with("concurrency", "target_kv_usage = 1.5"), "concurrency.target_kv_usage"),
    ("poll too fast", _with("concurrency", "poll_s = 0.001"), "concurrency.poll_s"),
    (
        "output_dir of an unknown file system",
        _with("run", 'output_dir = "nope://bucket/runs"'),
        "run.output_dir: Value error, unknown file system 'nope'",
    ),
    ("max attempts zero", _with("retry", "max_attempts = 0"), "retry.max_attempts"),
    ("read timeout negative", _with("retry", "read_timeout_s = -1"), "retry.read_timeout_s"),
    ("read timeout a date", _with("retry", "read_timeout_s = 1979-05-27"), "retry.read_timeout_s"),
    ("flush rows negative", _with("store", "flush_rows = -5"), "store.flush_rows"),
    ("flush seconds a list", _with("store", "flush_seconds = [1]"), "store.flush_seconds"),
    ("max tokens zero", _with("generation", "max_tokens = 0"), "generation.max_tokens"),
    ("top_p above 1", _with("generation", "top_p = 2"), "generation.top_p"),
    ("temperature negative", _with("generation", "temperature = -1"), "generation.temperature"),
    (
        "template kwargs not a table",
        _with("generation", "chat_template_kwargs = 3"),
        "generation.chat_template_kwargs",
    ),
    (
        "extra_body overriding a named field",
        _with("generation", "extra_body = { max_tokens = 5 }"),
        "generation.extra_body: extra_body must not set ['max_tokens']",
    ),
    (
        "extra_body asking several answers",
        GOOD + "generation = { extra_body = { n = 2 } }\n",
        "categories[0].generation.extra_body: extra_body must not set ['n'] above 1",
    ),
    (
        "categories empty",
        "categories = []\n" + GOOD.split("[[categories]]")[0],
        "categories: List should have",
    ),
    ("category format unknown", GOOD.replace('"messages"', '"csv"'), "categories[0]: Value error, format"),
    ("category mode unknown", GOOD + 'mode = "everything"\n', "categories[0].mode: Input should be"),
    ("category limit zero", GOOD + "limit = 0\n", "categories[0].limit"),
    ("quota fraction zero", GOOD + "quota = { fraction = 0 }\n", "categories[0].quota.fraction"),
    ("quota both", GOOD + "quota = { count = 3, fraction = 0.5 }\n", "categories[0].quota: set exactly one"),
    ("server tp a string", GOOD + '\n[server]\ntp = "eight"\n', "server.tp"),
]


@pytest.mark.parametrize(("text", "key"), [(t, k) for _, t, k in CASES], ids=[c[0] for c in CASES])
def test_a_bad_config_exits_2_with_one_line_naming_the_key(tmp_path: Path, text: str, key: str) -> None:
    (tmp_path / "p.jsonl").write_text('{"messages": [{"role": "user", "content": "hi"}]}\n')
    config = tmp_path / "run.toml"
    config.write_text(text)
    result = CliRunner().invoke(app, ["run", str(config), "--no-prefect"])
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2, result.output
    assert len(lines) == 1, result.output
    assert lines[0].startswith("error: ") and key.split(": ")[0] in lines[0], lines[0]
    if ": " in key:  # the problem is said too, not only the key
        assert key.replace("Value error, ", "").split(": ", 1)[1] in lines[0], lines[0]
    assert "Traceback" not in result.output and not (tmp_path / "output").exists()


def test_a_config_that_is_not_utf8_is_one_line(tmp_path: Path) -> None:
    config = tmp_path / "run.toml"
    config.write_bytes(GOOD.encode().replace(b'"r"', b'"r\xff"'))
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_config(config)


# --- fuzz ------------------------------------------------------------------------------------------

SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(["http://127.0.0.1:9", "messages", "fixed", "adaptive", "first_turn", "B1_glaive", ".."]),
)
KEYS = st.one_of(
    st.sampled_from(
        [
            *RunConfig.model_fields,
            "name",
            "url",
            "model",
            "api_key_env",
            "stream",
            "limit",
            "mode",
            "max_tokens",
            "source",
            "format",
            "quota",
            "count",
            "fraction",
            "use",
            "generation",
            "filters",
            "columns",
            "launch",
            "engine",
            "tp",
            "extra_args",
            "env",
            "max_attempts",
            "flush_rows",
            "output_dir",
            "api_key",
        ]
    ),
    st.text(max_size=8),
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(KEYS, inner, max_size=4)),
    max_leaves=12,
)
SECTIONS = st.fixed_dictionaries(
    {},
    optional={
        "run": st.one_of(st.fixed_dictionaries({"name": VALUES}, optional={"output_dir": VALUES}), VALUES),
        "endpoints": st.one_of(st.lists(st.dictionaries(KEYS, VALUES, max_size=4), max_size=2), VALUES),
        "server": st.one_of(st.dictionaries(KEYS, VALUES, max_size=4), VALUES),
        "concurrency": st.one_of(st.dictionaries(KEYS, VALUES, max_size=4), VALUES),
        "retry": st.dictionaries(KEYS, VALUES, max_size=4),
        "store": st.dictionaries(KEYS, VALUES, max_size=4),
        "generation": st.one_of(st.dictionaries(KEYS, VALUES, max_size=4), VALUES),
        "categories": st.one_of(st.lists(st.dictionaries(KEYS, VALUES, max_size=6), max_size=3), VALUES),
    },
)


# Hypothesis warns when the global `random` moves during a draw, taking it for a strategy's own use.
# Here another thread moves it: at this test, the default tier's process still runs Prefect's
# in-process threads, left by the sim tier's Prefect runs (GlobalEventLoopThread, the events and log
# workers: listed on such a run), and Prefect's client draws jitter from the global `random` (e.g.
# its reconnect backoff, `prefect._internal._observation_delivery`). Nothing in this test or in
# `parse_config` draws from it.
@pytest.mark.filterwarnings("ignore:Do not use the `random` module inside strategies")
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.one_of(SECTIONS, st.dictionaries(KEYS, VALUES, max_size=5)))
def test_no_generated_config_ends_in_a_traceback(data: dict[str, Any]) -> None:
    try:
        parse_config(data, source="fuzz.toml", base=Path("/nonexistent"))
    except ConfigError as error:
        assert str(error).startswith("fuzz.toml") and "Traceback" not in str(error)


@settings(max_examples=200, deadline=None)
@given(text=st.text(alphabet=st.sampled_from(list("[]{}=.\"'\n #abc123_-:,")), max_size=80))
def test_no_generated_config_text_ends_in_a_traceback(
    tmp_path_factory: pytest.TempPathFactory, text: str
) -> None:
    config = tmp_path_factory.mktemp("fuzz") / "run.toml"
    config.write_text(text)
    with pytest.raises(ConfigError):
        load_config(config)  # none of these texts is a whole valid config


@pytest.mark.parametrize("part", ["0/2", "3/2", "2", "x/y", "1/0"])
def test_a_part_that_does_not_exist_exits_2_with_one_line(tmp_path: Path, part: str) -> None:
    (tmp_path / "p.jsonl").write_text('{"messages": [{"role": "user", "content": "hi"}]}\n')
    config = tmp_path / "run.toml"
    config.write_text(GOOD)
    result = CliRunner().invoke(app, ["run", str(config), "--no-prefect", "--part", part])
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1, result.output
    assert lines[0].startswith("error: ") and "i/K" in lines[0], lines[0]
    assert not (tmp_path / "output").exists()


def test_a_refused_endpoint_url_is_not_echoed(tmp_path: Path) -> None:
    (tmp_path / "p.jsonl").write_text('{"messages": [{"role": "user", "content": "hi"}]}\n')
    config = tmp_path / "run.toml"
    config.write_text(GOOD.replace("http://127.0.0.1:9", "http://user:s3cret@127.0.0.1:9"))
    result = CliRunner().invoke(app, ["run", str(config), "--no-prefect"])
    assert result.exit_code == 2 and "s3cret" not in result.output


@pytest.mark.parametrize("where", ["a file", "under a file"])
def test_an_output_dir_that_cannot_be_made_exits_2_with_one_line(tmp_path: Path, where: str) -> None:
    """It ended in a 55-line NotADirectoryError traceback from the run lock's mkdir, exit 1."""
    (tmp_path / "p.jsonl").write_text('{"messages": [{"role": "user", "content": "hi"}]}\n')
    (tmp_path / "afile").write_text("")
    output = tmp_path / "afile" if where == "a file" else tmp_path / "afile" / "runs"
    config = tmp_path / "run.toml"
    config.write_text(GOOD.replace('name = "r"', f'name = "r"\noutput_dir = "{output}"'))
    result = CliRunner().invoke(app, ["run", str(config), "--no-prefect"])
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1, result.output
    assert lines[0].startswith("error: cannot use the run directory ") and "output_dir" in lines[0], lines[0]
    assert "Not a directory" in lines[0]


def test_a_limit_beside_mode_adaptive_is_told_the_fix_that_differs_from_what_it_set(tmp_path: Path) -> None:
    """It said: drop it, or mode = "adaptive", the mode the user had set."""
    config = tmp_path / "run.toml"
    config.write_text(_with("concurrency", 'mode = "adaptive"\nlimit = 8'))
    (tmp_path / "p.jsonl").write_text("")
    with pytest.raises(ConfigError, match=r'set mode = "fixed", or drop `limit` to run adaptive'):
        load_config(config)
