"""POSIX shared-memory segments (/dev/shm) that no process holds any more: what a killed process leaves behind.

A segment is held while a process maps it or keeps a descriptor of it open; a live run's segments always are (the
creator opens, then maps, and keeps the mapping until it unlinks), a killed run's are not. Removing only the
segments nobody holds cleans up after a killed run without taking the names of a live one beside it.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Callable

SHM_DIR = Path("/dev/shm")


def held_segments(shm_dir: Path = SHM_DIR) -> set[str]:
    """Names under `shm_dir` that some process on this machine maps or holds open (as far as /proc shows it)."""
    prefix = f"{shm_dir}/"
    held: set[str] = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        # Any of these reads may meet a process that ended (ENOENT, ESRCH) or another user's (EACCES): skip it.
        try:
            for line in (proc / "maps").read_text().splitlines():
                fields = line.split(maxsplit=5)
                if len(fields) == 6 and fields[5].startswith(prefix):
                    held.add(fields[5][len(prefix):].removesuffix(" (deleted)"))
        except OSError:
            pass
        try:
            for fd in os.listdir(proc / "fd"):
                target = os.readlink(proc / "fd" / fd)
                if target.startswith(prefix):
                    held.add(target[len(prefix):].removesuffix(" (deleted)"))
        except OSError:
            pass
    return held


def remove_unheld_segments(matches: Callable[[str], bool], shm_dir: Path = SHM_DIR) -> list[str]:
    """Unlink this user's segments whose name `matches` and that no process holds; the names removed."""
    candidates = []
    try:
        entries = list(os.scandir(shm_dir))
    except FileNotFoundError:  # no /dev/shm here
        return []
    for entry in entries:
        try:
            if matches(entry.name) and entry.stat(follow_symlinks=False).st_uid == os.getuid():
                candidates.append(entry.name)
        except FileNotFoundError:  # unlinked since it was listed
            continue
    if not candidates:
        return []
    # Listed before /proc is read: a segment that exists now is held by its creator from before it existed
    # (created and opened in one call) until its owner unlinks it, so the scan below sees every live one.
    held = held_segments(shm_dir)
    removed = []
    for name in candidates:
        if name in held:
            continue
        try:
            (shm_dir / name).unlink()
            removed.append(name)
        except FileNotFoundError:  # its owner, or another run's clean-up, was first
            continue
    return removed


def machine_lock(name: str) -> int:
    """A read-only descriptor of the lock file `name` in /dev/shm (the temporary folder where there is none), one
    for every user's processes on this machine, for `fcntl.flock`; created, when missing, readable by all."""
    path = (SHM_DIR if SHM_DIR.is_dir() else Path(tempfile.gettempdir())) / name
    while True:
        try:
            # Read-only, without O_CREAT: another user's file in a sticky folder opens so (flock needs no more), where
            # opening it for writing, or with O_CREAT under fs.protected_regular, is refused.
            return os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            pass
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:  # another process created it meanwhile: open that one
            continue
        os.fchmod(fd, 0o644)  # whatever this user's umask, the next user's processes can open it
        return fd
