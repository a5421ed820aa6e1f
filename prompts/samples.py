"""Where the bundled sample prompt sets live, found through the package rather than a relative path.

``importlib.resources`` resolves them inside the installed package, so the demo works from any
working directory and from an installed wheel, not only from a source checkout.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

_SAMPLES = files("prompts").joinpath("samples")


def sample_names() -> list[str]:
    """The bundled sample files, e.g. ``ultrachat_sample.jsonl``."""
    return sorted(entry.name for entry in _SAMPLES.iterdir() if entry.name.endswith(".jsonl"))


def sample_path(name: str) -> Path:
    """The path of bundled sample ``name``; an unknown name lists the available ones."""
    if name not in sample_names():
        raise FileNotFoundError(f"no bundled sample {name!r}; available: {', '.join(sample_names())}")
    return Path(str(_SAMPLES.joinpath(name)))
