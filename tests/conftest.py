"""Shared test helpers: fixture paths and the location of the real CPU engines."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture
def fixtures_dir() -> Path:
    return FIXTURES


def engines_home() -> Path:
    """Where ../shared/engines/setup.sh put the venvs and tiny models (ENGINES_HOME overrides)."""
    return Path(os.environ.get("ENGINES_HOME", Path.home() / ".cache" / "cpu-engines"))
