"""A lost peer is told from its pid: alive, a zombie, reaped, or reaped while its /proc entry is being read."""

import os
import subprocess
from pathlib import Path

from core import distributed


def _sleeper() -> subprocess.Popen:
    return subprocess.Popen(["sleep", "60"])


def test_a_running_process_is_not_gone():
    proc = _sleeper()
    try:
        assert not distributed.pid_gone(proc.pid)
    finally:
        proc.kill()
        proc.wait()


def test_a_killed_process_is_gone_before_and_after_it_is_reaped():
    proc = _sleeper()
    proc.kill()
    proc.wait()
    assert distributed.pid_gone(proc.pid)
    zombie = _sleeper()
    zombie.kill()
    try:
        os.waitid(os.P_PID, zombie.pid, os.WEXITED | os.WNOWAIT)  # dead, and left unreaped: a zombie
        assert Path(f"/proc/{zombie.pid}").exists()
        assert distributed.pid_gone(zombie.pid)
    finally:
        zombie.wait()


def test_a_process_reaped_between_the_open_and_the_read_of_its_stat_is_gone(monkeypatch):
    """The race CI met: the kernel answers ESRCH to a read of an entry opened while the process was there."""
    proc = _sleeper()
    handle = open(f"/proc/{proc.pid}/stat")
    proc.kill()
    proc.wait()
    monkeypatch.setattr(Path, "read_text", lambda self, *args, **kwargs: handle.read())
    try:
        assert distributed.pid_gone(proc.pid)
    finally:
        handle.close()
