"""Bad input to `datagen launch`, `datagen preflight` and a launching `datagen run`: one line and exit 2,
never a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flows.cli.main import app

FIXTURES = Path(__file__).parents[1] / "fixtures"
CSV = str(FIXTURES / "logs" / "seeds_nvidia_smi.csv")
runner = CliRunner()


def _one_line(args: list[str]) -> str:
    result = runner.invoke(app, args)
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.exit_code == 2, result.output
    assert result.output.startswith(("error: ", "Usage: ")), result.output  # ours, or typer's
    return result.output


def test_launch_without_a_model_path(tmp_path: Path) -> None:
    assert "model_path" in _one_line(["launch", "--engine", "sglang", "--log-dir", str(tmp_path), "--check"])


def test_launch_with_the_key_variable_unset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DATAGEN_TEST_UNSET_KEY", raising=False)
    args = [
        "launch",
        "--model-path",
        "m",
        "--api-key-env",
        "DATAGEN_TEST_UNSET_KEY",
        "--log-dir",
        str(tmp_path),
    ]
    assert "DATAGEN_TEST_UNSET_KEY" in _one_line([*args, "--check"])


LAUNCHING = """
[run]
name = "r"
output_dir = "{out}"

[server]
launch = true
{server}

[[categories]]
name = "chat"
source = "p.jsonl"
format = "messages"
"""


@pytest.mark.parametrize(
    ("server", "said"),
    [
        ("", "[server] launch = true needs model_path"),
        ('model_path = "m"\npython = "/no/such/python"', "/no/such/python"),
        ('model_path = "m"\napi_key_env = "DATAGEN_TEST_UNSET_KEY"', "DATAGEN_TEST_UNSET_KEY"),
    ],
    ids=["no model_path", "no such python", "the key variable unset"],
)
def test_a_run_whose_server_cannot_be_launched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, server: str, said: str
) -> None:
    """Nothing was started, so no fraction can help: exit 2 like `datagen launch`, not a traceback."""
    monkeypatch.delenv("DATAGEN_TEST_UNSET_KEY", raising=False)
    (tmp_path / "p.jsonl").write_text('{"messages": [{"role": "user", "content": "hi"}]}\n')
    config = tmp_path / "run.toml"
    config.write_text(LAUNCHING.format(out=tmp_path / "out", server=server))
    output = _one_line(["run", str(config), "--no-prefect"])
    assert said in output and len(output.strip().splitlines()) == 1, output


@pytest.mark.parametrize("text", [None, "[server\nmodel_path = "])
def test_launch_with_a_missing_or_broken_config(tmp_path: Path, text: str | None) -> None:
    config = tmp_path / "run.toml"
    if text is not None:
        config.write_text(text)
    assert "cannot read" in _one_line(["launch", "--config", str(config), "--check"])


def test_preflight_with_tp_zero(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"num_hidden_layers": 2, "num_attention_heads": 8, "hidden_size": 512}))
    _one_line(
        ["preflight", "--gpu-csv", CSV, "--model-config", str(config), "--tp", "0", "--fraction", "0.8"]
    )


def test_preflight_with_server_info_that_is_not_an_object(tmp_path: Path) -> None:
    info = tmp_path / "info.json"
    info.write_text("[]")
    assert "not a /get_server_info answer" in _one_line(
        ["preflight", "--gpu-csv", CSV, "--server-info", str(info)]
    )
