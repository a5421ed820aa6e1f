"""Where a run's data lives: a local folder, or any fsspec URL (``s3://``, ``gs://``, ``memory://``).

A run's shards and manifest go to this location; the files only its own machine needs (the run
lock, the progress log, the controller timeline, the report and plots, server logs) stay in a local
folder, because a lock cannot be held on an object store and plots are read where they are drawn.
``file://`` URLs are local folders.
"""

from __future__ import annotations

from pathlib import Path

import fsspec
from fsspec.core import split_protocol

LOCAL_PROTOCOLS = (None, "file", "local")


class LocationError(ValueError):
    """A location no installed file system can open (the CLI exits 2 with this line)."""


def local_path(location: str) -> Path | None:
    """The local folder a location names; None for a remote one."""
    protocol, path = split_protocol(location)
    return Path(path) if protocol in LOCAL_PROTOCOLS else None


def join(location: str, name: str) -> str:
    """``location/name``, keeping a URL a URL (``Path`` would fold ``s3://`` into ``s3:/``)."""
    if local_path(location) is not None and split_protocol(location)[0] is None:
        return str(Path(location) / name)
    return location.rstrip("/") + "/" + name


def check_location(location: str) -> str:
    """The location, if a file system for it is known and installed; else a LocationError saying why."""
    protocol, _ = split_protocol(location)
    if protocol in LOCAL_PROTOCOLS:
        return location
    try:
        fsspec.get_filesystem_class(protocol)
    except ImportError as error:  # e.g. s3:// without s3fs
        raise LocationError(f"{protocol}:// needs a package that is not installed ({error})") from None
    except ValueError:
        raise LocationError(
            f"unknown file system {protocol!r}: use a local folder or an fsspec URL such as "
            "s3://bucket/runs, gs://bucket/runs or file:///data/runs"
        ) from None
    return location
