"""Command line of the simulator (``datagen sim``, ``python -m sglang_launch.simulator``).

One flag per ``SimConfig`` field, generated from the config model so a new knob needs no CLI change,
built with click (the framework under typer, which the rest of ``datagen`` uses). ``--config-json``
takes a whole configuration (how ``SimulatorProcess`` passes one) and flags override it.
"""

from __future__ import annotations

import json
import typing
from collections.abc import Sequence
from typing import Any

import click
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from sglang_launch.simulator.config import FaultConfig, SimConfig

PROG = "datagen sim"


class _OptionalInt(click.ParamType):
    name = "N|none"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int | None:
        if value is None or (isinstance(value, str) and value.lower() == "none"):
            return None
        try:
            return int(value)
        except ValueError:
            self.fail(f"{value!r} is not a whole number or 'none'", param, ctx)


def _option(name: str, field: FieldInfo) -> click.Option:
    flag = "--" + name.replace("_", "-")
    kind = field.annotation
    help_text = f"{field.description or ''} (default: {field.default})".lstrip()
    if kind is bool:
        return click.Option([f"{flag}/--no-{flag[2:]}", name], default=None, help=help_text)
    if typing.get_origin(kind) is typing.Literal:
        return click.Option(
            [flag, name], type=click.Choice(typing.get_args(kind)), default=None, help=help_text
        )
    if kind == int | None:
        return click.Option([flag, name], type=_OptionalInt(), default=None, help=help_text)
    if kind == str | None:
        return click.Option([flag, name], type=str, default=None, help=help_text)
    if kind == float | None:  # unset: the default (None)
        return click.Option([flag, name], type=float, default=None, help=help_text)
    return click.Option([flag, name], type=kind, default=None, help=help_text)


def _flat_fields(model: type[BaseModel]) -> dict[str, FieldInfo]:
    return {name: f for name, f in model.model_fields.items() if name != "faults"}


def _config(config_json: str | None, **given: Any) -> SimConfig:
    base: dict[str, Any] = json.loads(config_json) if config_json else {}
    given = {k: v for k, v in given.items() if v is not None}
    fault_names = set(FaultConfig.model_fields)
    faults = {**base.get("faults", {}), **{k: v for k, v in given.items() if k in fault_names}}
    top = {k: v for k, v in given.items() if k not in fault_names}
    return SimConfig.model_validate({**base, **top, "faults": faults})


def command() -> click.Command:
    """The click command; its callback returns the validated ``SimConfig``."""
    params: list[click.Parameter] = [
        click.Option(
            ["--config-json", "config_json"],
            default=None,
            help="a whole SimConfig as JSON; flags override it",
        )
    ]
    params += [_option(name, field) for name, field in _flat_fields(SimConfig).items()]
    params += [_option(name, field) for name, field in _flat_fields(FaultConfig).items()]
    return click.Command(
        PROG,
        params=params,
        callback=_config,
        help="An SGLang-0.5.23-compatible server that simulates the scheduler and KV cache (fault "
        "knobs: --error-503-rate, --cut-stream-rate, --extra-latency-s, --restart-downtime-s).",
    )


def config_from_args(argv: Sequence[str] | None = None) -> SimConfig:
    """Parse the command line into a validated ``SimConfig``; a usage error or ``--help`` exits."""
    try:
        result = command().main(
            args=list(argv) if argv is not None else None, prog_name=PROG, standalone_mode=False
        )
    except click.ClickException as error:
        error.show()
        raise SystemExit(error.exit_code) from None
    if not isinstance(result, SimConfig):  # --help was printed
        raise SystemExit(0)
    return result
