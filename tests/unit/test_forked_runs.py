"""The kill helper of the kill -9 tests: it must kill a run at any moment of its start."""

from __future__ import annotations

import subprocess
import sys

from forked_runs import alive, kill_9


def test_kill_9_kills_a_child_that_has_not_yet_made_its_own_process_group() -> None:
    # A forked run killed at moment 0 may not have reached os.setsid(): it still sits in its
    # parent's process group, and no group carries its pid.
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        kill_9(child.pid, timeout_s=5)
        child.wait(timeout=5)
        assert not alive(child.pid)
        assert child.returncode == -9
    finally:
        child.kill()
        child.wait()
