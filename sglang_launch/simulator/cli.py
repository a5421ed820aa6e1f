"""Command line of ``python -m sglang_launch.simulator``: one flag per ``SimConfig`` field.

Flags are generated from the config model, so a new knob needs no CLI change; ``--config-json``
takes a whole configuration (how ``SimulatorProcess`` passes one) and flags override it.
"""

from __future__ import annotations

import argparse
import json
import typing
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from sglang_launch.simulator.config import FaultConfig, SimConfig

_SCALARS: dict[Any, type] = {int: int, float: float, str: str}


def _optional_int(text: str) -> int | None:
    return None if text.lower() == "none" else int(text)


def _add_field(parser: argparse._ActionsContainer, name: str, field: FieldInfo) -> None:
    flag = "--" + name.replace("_", "-")
    kind = field.annotation
    help_text = f"{field.description or ''} (default: {field.default})".lstrip()
    if kind is bool:
        parser.add_argument(
            flag, dest=name, action=argparse.BooleanOptionalAction, default=None, help=help_text
        )
    elif typing.get_origin(kind) is typing.Literal:
        parser.add_argument(flag, dest=name, choices=typing.get_args(kind), default=None, help=help_text)
    elif kind == int | None:
        parser.add_argument(
            flag, dest=name, type=_optional_int, default=None, metavar="N|none", help=help_text
        )
    elif kind == str | None:
        parser.add_argument(flag, dest=name, type=str, default=None, help=help_text)
    else:
        parser.add_argument(flag, dest=name, type=_SCALARS[kind], default=None, help=help_text)


def _flat_fields(model: type[BaseModel]) -> dict[str, FieldInfo]:
    return {name: f for name, f in model.model_fields.items() if name != "faults"}


def build_parser() -> argparse.ArgumentParser:
    """The argument parser; ``None`` defaults mean "keep the config's value"."""
    parser = argparse.ArgumentParser(
        prog="python -m sglang_launch.simulator",
        description="An SGLang-0.5.23-compatible server that simulates the scheduler and KV cache.",
    )
    parser.add_argument("--config-json", default=None, help="a whole SimConfig as JSON; flags override it")
    for name, field in _flat_fields(SimConfig).items():
        _add_field(parser, name, field)
    faults = parser.add_argument_group("fault injection")
    for name, field in _flat_fields(FaultConfig).items():
        _add_field(faults, name, field)
    return parser


def config_from_args(argv: Sequence[str] | None = None) -> SimConfig:
    """Parse the command line into a validated ``SimConfig``."""
    args = vars(build_parser().parse_args(argv))
    config_json = args.pop("config_json")
    base: dict[str, Any] = json.loads(config_json) if config_json else {}
    given = {k: v for k, v in args.items() if v is not None}
    fault_names = set(FaultConfig.model_fields)
    faults = {**base.get("faults", {}), **{k: v for k, v in given.items() if k in fault_names}}
    top = {k: v for k, v in given.items() if k not in fault_names}
    return SimConfig.model_validate({**base, **top, "faults": faults})
