"""A nice-19 busy loop pinned to the client's core, kept running for every setting of a benchmark.

Why: these machines are VMs, and a server whose threads sleep between steps (OpenMP passive wait)
wakes slowly on a halted vCPU. An idle client core therefore slows the server, and a thrifty client
would measure slower than a wasteful, busy-waiting one. With the spinner every setting sees the same
busy core (see ``../shared/engines/README.md``); at nice 19 it takes only what nothing else wants.

The spinner stays in the benchmark's session on purpose. With the kernel's autogroups (on here:
``/proc/sys/kernel/sched_autogroup_enabled``) nice only ranks tasks of one session against each
other; a spinner in a session of its own competed with the client as an equal and took half of the
client's core (measured: 50 % each), whatever its nice.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator


@contextlib.contextmanager
def busy_core(core: int) -> Iterator[None]:
    spinner = subprocess.Popen(
        ["taskset", "-c", str(core), "nice", "-n", "19", sys.executable, "-c", "while True: pass"]
    )
    try:
        yield
    finally:
        spinner.kill()
        spinner.wait()
