"""Free GPU memory: the controller's out-of-memory guard and restart detector (not its KV signal).

SGLang preallocates its KV pool, so free memory says nothing about KV use; it says whether something
else is eating the headroom SGLang's activations need (then fewer requests in flight), and a jump up
means the server let go of its pool (it died or restarts). Read through NVML for GPUs on this
machine, or from a DCGM exporter's ``DCGM_FI_DEV_FB_FREE`` for a remote server. The tightest GPU
counts: one GPU out of memory stops a tensor-parallel server.

Only the server's own GPUs count where they can be known: those its endpoint's ``gpus`` names
(read through NVML or DCGM), else through NVML those whose compute processes belong to the process
tree listening on the endpoint's port, else, for a server the run launched, those it placed it on
(``sglang_launch.placement``: in a container NVML lists host pids, which its /proc does not show);
a server the run launched is found so through DCGM too, its GPUs' series found by NVML's UUIDs.
Read over every GPU of the node, another job's full GPU backed a server off at every tick, one of
eight servers (one per GPU) out of memory backed off all eight, and the full GPU hid the server's
own memory being let go.
"""

from __future__ import annotations

import asyncio
import logging
import math
import urllib.parse
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from flows.say import SAY
from sglang_launch.gpu import GpuUnavailableError, read_gpus, read_memory, read_uuids
from sglang_launch.placement import Placement
from sglang_launch.port_gpus import gpus_of
from sglang_launch.port_owner import serving_processes
from sglang_launch.probe import endpoint_http
from sglang_launch.procfs import PROC

log = logging.getLogger(__name__)
MIB = 1024 * 1024


@dataclass(frozen=True)
class VramSample:
    """The GPU with the least free memory: its free and total bytes."""

    free_bytes: int
    total_bytes: int


def tightest(readings: list[tuple[int, int]]) -> VramSample | None:
    """(free, total) per GPU -> the one with the least free memory."""
    if not readings:
        return None
    free, total = min(readings)
    return VramSample(free, total)


class MissingGpus(ValueError):
    """A DCGM exporter has no series for a GPU the reader is to read."""


@dataclass(frozen=True)
class DcgmSeries:
    """Whose memory one of a DCGM exporter's series is: its ``gpu`` label (DCGM's number of the GPU,
    nvidia-smi's on its node), its ``UUID`` label (``uuid`` under dcgm-exporter's
    ``--use-old-namespace``) where it has one, and for a GPU in MIG mode, which has a series per GPU
    instance (each with the GPU's labels), the instance's ``GPU_I_ID``."""

    gpu: str
    uuid: str | None
    instance: str | None

    def of(self, index: int, uuids: Sequence[str]) -> bool:
        """Whether it is a series of GPU ``index``: by its UUID where it has one and ``uuids`` (NVML's
        by index: ``index`` is nvidia-smi's number on this machine) name that GPU's, for a UUID names
        a GPU whatever number the exporter's node gives it (a container renumbers its GPUs from 0);
        else by its gpu label."""
        if self.uuid is not None and index < len(uuids):
            return self.uuid == uuids[index]
        return self.gpu == str(index)


def parse_dcgm(
    text: str, gpus: Collection[int] | None = None, uuids: Sequence[str] = ()
) -> VramSample | None:
    """A DCGM exporter's metrics (framebuffer sizes in MiB, one series per GPU, or per MIG
    instance): the tightest of the GPUs ``gpus`` names, or of every GPU. ``gpus`` are nvidia-smi's
    numbers, matched with the exporter's gpu label; with ``uuids`` (NVML's UUIDs of this machine's
    GPUs, by index) those of this machine, matched by UUID where the series have one.

    A GPU without a series raises :class:`MissingGpus`: the tightest of the others could be another
    server's (``gpus`` counted in a CUDA_VISIBLE_DEVICES, or the exporter of another node)."""
    memory = _dcgm_memory(text)
    if gpus is None:
        return tightest(list(memory.values()))
    readings = {
        index: [m for series, m in memory.items() if series.of(index, uuids)] for index in sorted(gpus)
    }
    missing = [index for index, found in readings.items() if not found]
    if missing:
        named = (", " if uuids else ",").join(
            f"{index} (UUID {uuids[index]})" if index < len(uuids) else str(index) for index in missing
        )
        listed = sorted({series.gpu for series in memory}, key=lambda label: (len(label), label))
        raise MissingGpus(
            f"has no DCGM_FI_DEV_FB_FREE series for GPU {named} (it lists GPU {','.join(listed) or 'none'})"
        )
    return tightest([reading for found in readings.values() for reading in found])


def _dcgm_memory(text: str) -> dict[DcgmSeries, tuple[int, int]]:
    """(free, total) bytes of each series. A value that is no size (NaN, ±Inf, below zero) leaves
    its series out: an infinite one raised at every tick, a negative one read as the tightest GPU.
    A MIG instance is a series of its own: read as one series per GPU, the last instance listed
    stood for its GPU."""
    free: dict[DcgmSeries, float] = {}
    used: dict[DcgmSeries, float] = {}
    reserved: dict[DcgmSeries, float] = {}
    wanted = {"DCGM_FI_DEV_FB_FREE": free, "DCGM_FI_DEV_FB_USED": used, "DCGM_FI_DEV_FB_RESERVED": reserved}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in wanted and math.isfinite(sample.value) and sample.value >= 0:
                labels = sample.labels
                uuid = labels.get("UUID", labels.get("uuid"))
                series = DcgmSeries(labels.get("gpu", "0"), uuid, labels.get("GPU_I_ID"))
                wanted[sample.name][series] = sample.value
    totals = {series: f + used.get(series, 0.0) + reserved.get(series, 0.0) for series, f in free.items()}
    return {series: (int(f * MIB), int(totals[series] * MIB)) for series, f in free.items()}


def server_gpus(port: int, proc_root: Path = PROC) -> tuple[frozenset[int] | None, str]:
    """The GPUs whose NVML compute processes belong to the process tree listening on ``port`` (a
    server's schedulers are children of its HTTP server), or None and why they cannot be known.

    Raises :class:`GpuUnavailableError` when NVML cannot be read."""
    pids = serving_processes(port, proc_root)
    if not pids:
        return None, f"no process seen listening on port {port} (another user's, or another container's)"
    return gpus_of(pids, port, read_gpus(proc_root))


class VramReader:
    """``nvml`` (GPUs on this machine) or a DCGM exporter URL; a source that fails warns once, reads None.

    ``gpus`` given (the endpoint's, nvidia-smi's numbers): both read those GPUs only, and neither
    looks for the server. Else NVML reads the GPUs of the server at ``server_url`` (see
    ``server_gpus``), found at the first reading and again at the first after ``relocate``: finding
    them walks /proc and lists every GPU's processes, too heavy for every tick. Where they cannot be
    found so, it reads those of ``placement`` (where the run launched the server itself: the lookup
    by port is exact, the placement only as sure as its CUDA device order), else every GPU.
    ``placement`` is asked there only, of the server serving then: after a restart, the new
    process's (``LaunchedEngine.placement`` reads each start's log once).

    DCGM reads every GPU of its node, but for a server the run launched (``placement`` given: on this
    machine), whose GPUs it finds as NVML does and reads their series, found by NVML's UUIDs
    (``DcgmSeries.of``): read over the node, another job's full GPU held the lane at every tick.

    An exporter is reached as the endpoint is (``endpoint_http``): directly, trusting ``ca_bundle``
    (the endpoint's) where given. It is on the server's node, which a proxy set for downloads does not
    reach, and behind the same private CA where the server is."""

    def __init__(
        self,
        source: str,
        *,
        timeout_s: float = 2.0,
        server_url: str | None = None,
        proc_root: Path = PROC,
        gpus: frozenset[int] | None = None,
        ca_bundle: str | None = None,
        placement: Callable[[], Placement] | None = None,
    ) -> None:
        self.source = source
        self.server_url = server_url
        self.proc_root = proc_root
        self.placement = placement
        self._http = (
            httpx.AsyncClient(timeout=timeout_s, **endpoint_http(ca_bundle)) if source != "nvml" else None
        )
        self._warned = False
        self._warned_missing = False
        """Warned once each: an exporter's passing failure must not hide that ``gpus`` names GPUs
        it has no series for."""
        self._worker: asyncio.Future[list[tuple[int, int]]] | None = None
        """The reading under way in a worker thread: one at a time (see ``_in_worker``)."""
        self.gpus: frozenset[int] | None = gpus
        """The GPUs read: the endpoint's ``gpus``, or the server's own once found (nvidia-smi's numbers
        on this machine); None reads every GPU."""
        self._uuids: list[str] = []
        """NVML's UUIDs of this machine's GPUs by index, read with the server's GPUs where an exporter
        reads them: its series of those GPUs are found by UUID."""
        self._given = gpus is not None
        self._find_gpus = False
        """Find the server's GPUs before the next reading: at the first, and after a restart."""
        if gpus is not None:
            log.info(
                "%s: the OOM guard reads GPU %s (its gpus in [[endpoints]]) through %s",
                server_url or source,
                _indices(gpus),
                source,
            )
        self.relocate()

    def relocate(self) -> None:
        """Find the server's GPUs before the next reading (again, after a restart: the server's
        processes are new, and may run on other GPUs); not GPUs given, which it keeps. Through NVML,
        and through DCGM for a server the run launched (another's may be on another machine)."""
        looks = self._http is None or self.placement is not None
        self._find_gpus = looks and self.server_url is not None and not self._given

    async def read(self) -> VramSample | None:
        try:
            if self._http is None:
                return tightest(await self._in_worker())
            if self._find_gpus:
                await self._in_worker()
            response = await self._http.get(self.source)
            response.raise_for_status()
            return parse_dcgm(response.text, self.gpus, self._uuids)
        except MissingGpus as error:
            if not self._warned_missing:
                self._warned_missing = True
                whose = (
                    "the endpoint's gpus are nvidia-smi's numbers of the server's GPUs, on the node whose "
                    "exporter this is"
                    if self._given
                    else f"the GPUs of this machine that {self.server_url} computes on (is it the "
                    "exporter of another node?)"
                )
                log.warning("%s %s: %s. No OOM guard while it has none", self.source, error, whose, extra=SAY)
            return None
        except (GpuUnavailableError, httpx.HTTPError, ValueError) as error:
            if not self._warned:
                self._warned = True
                # httpx's status errors add a line (a link to MDN): the warning is one line
                why = str(error).splitlines()[0] if str(error) else type(error).__name__
                log.warning(
                    "free GPU memory cannot be read from %s (%s): no OOM guard", self.source, why, extra=SAY
                )
            return None

    async def _in_worker(self) -> list[tuple[int, int]]:
        """``_worker_reading`` in a worker thread, never two at once. An NVML call that hangs cannot
        be cancelled (its thread stays blocked): started again at every tick the controller gave up
        waiting, the hung calls would take every thread of the loop's executor, shard writes
        included. So a caller that gave up leaves the reading under way, and the next one waits
        for that same reading."""
        if self._worker is None or self._worker.done():
            self._worker = asyncio.ensure_future(asyncio.to_thread(self._worker_reading))
        return await asyncio.shield(self._worker)

    def _worker_reading(self) -> list[tuple[int, int]]:
        """In the worker thread: the server's GPUs found first when due (a reading that waits
        for them is bounded by the controller's deadline like any other), then through NVML their
        memory (none for an exporter: it is read over HTTP, on the loop)."""
        if self._find_gpus and self.server_url is not None:
            self._find_gpus = False
            self._locate(self.server_url)
        return read_memory(self.gpus) if self._http is None else []

    def _locate(self, server_url: str) -> None:
        """Set ``gpus`` to the server's, with one line in the log saying which. A restarted server
        not found (not listening yet) keeps the GPUs it was found on: the same command starts it
        again on the same GPUs, and reading every GPU meanwhile would make one back-off per tick of
        another job's full GPU, or a jump up a false restart."""
        url = urllib.parse.urlsplit(server_url)
        port = url.port or (443 if url.scheme == "https" else 80)
        uuids: list[str] = []
        try:
            gpus, why = server_gpus(port, self.proc_root)
            if self._http is not None or (gpus is None and self.placement is not None):
                uuids = read_uuids()
            if gpus is None and self.placement is not None:
                placed, how = self.placement().nvml_gpus(uuids)
                gpus, why = (placed, f"{how}: {why}") if placed is not None else (None, f"{why}; {how}")
        except GpuUnavailableError as error:
            gpus, why = None, str(error)
        if gpus is not None:
            self.gpus, self._uuids = gpus, uuids
            log.info("%s: the OOM guard reads GPU %s, %s", server_url, self._named(gpus), why)
        elif self.gpus is not None:
            log.info("%s: the OOM guard still reads GPU %s: %s", server_url, self._named(self.gpus), why)
        else:
            node = "this machine" if self._http is None else f"the node of {self.source}"
            log.info("%s: the OOM guard reads every GPU of %s: %s", server_url, node, why)

    def _named(self, gpus: frozenset[int]) -> str:
        """The server's GPUs as its log line names them: through an exporter, with the UUIDs its
        series are found by (its node may number them otherwise: a container's GPUs count from 0)."""
        if self._http is None:
            return _indices(gpus)
        uuids = ", ".join(self._uuids[index] for index in sorted(gpus) if index < len(self._uuids))
        return f"{_indices(gpus)} of this machine ({uuids}) through {self.source}"

    async def aclose(self) -> None:
        if self._http is not None:
            await self._http.aclose()


def _indices(gpus: frozenset[int]) -> str:
    return ",".join(str(index) for index in sorted(gpus))
