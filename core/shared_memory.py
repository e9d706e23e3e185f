"""POSIX shared-memory segments (/dev/shm) that no process holds any more: what a killed process leaves behind.

A segment is held while a process maps it or keeps a descriptor of it open; a live run's segments always are (the
creator opens, then maps, and keeps the mapping until it unlinks), a killed run's are not. Removing only the
segments nobody holds cleans up after a killed run without taking the names of a live one beside it. Only the
processes /proc shows can be asked: a container with its own process namespace but this machine's /dev/shm is
invisible here, so its segments would look unheld. A lock file in /dev/shm is seen from every namespace that shares
it, and the kernel releases a lock when its holder dies, however it dies: so a live owner also holds one
(`hold_while_alive`), and what it owns is taken for a dead run's only where that lock is free (`owner_gone`).
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterator, Optional

SHM_DIR = Path("/dev/shm")

FileId = tuple[int, int, int]  # device major, device minor, inode: a file whatever path or namespace names it


def _file_id(st: os.stat_result) -> FileId:
    return os.major(st.st_dev), os.minor(st.st_dev), st.st_ino


def held_files() -> Optional[set[FileId]]:
    """The files some process of this machine maps or holds open; None when a process of this user could not be
    read (its holdings unknown, nothing may be taken as unheld)."""
    held: set[FileId] = set()
    me = os.getuid()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        # A process may end at any point of this (ENOENT, ESRCH): what it held is then free.
        try:
            maps = (proc / "maps").read_text()
        except PermissionError:
            try:
                if me != 0 and proc.stat().st_uid == me:
                    return None
            except OSError:
                pass
            continue  # another user's: its segments are its own, never removed here (not ours to unlink)
        except OSError:
            continue
        for line in maps.splitlines():
            fields = line.split(maxsplit=5)  # address, perms, offset, dev (hex major:minor), inode, path
            if len(fields) == 6 and fields[4] != "0":
                major, _, minor = fields[3].partition(":")
                held.add((int(major, 16), int(minor, 16), int(fields[4])))
        try:
            fds = os.listdir(proc / "fd")
        except OSError:
            continue
        for fd in fds:
            try:
                held.add(_file_id(os.stat(proc / "fd" / fd)))
            except OSError:  # closed since it was listed
                continue
    return held


def remove_unheld_segments(matches: Callable[[str], bool], shm_dir: Path = SHM_DIR) -> list[str]:
    """Unlink this user's segments whose name `matches` and that no process holds; the names removed."""
    candidates: dict[FileId, str] = {}
    try:
        entries = list(os.scandir(shm_dir))
    except FileNotFoundError:  # no /dev/shm here
        return []
    for entry in entries:
        try:
            if matches(entry.name) and entry.is_file(follow_symlinks=False):
                st = entry.stat(follow_symlinks=False)
                if st.st_uid == os.getuid():
                    candidates[_file_id(st)] = entry.name
        except FileNotFoundError:  # unlinked since it was listed
            continue
    if not candidates:
        return []
    # Listed before /proc is read: a segment that exists now is held by its creator from before it existed
    # (created and opened in one call) until its owner unlinks it, so the scan below sees every live one.
    held = held_files()
    if held is None:
        return []
    removed = []
    for file_id, name in candidates.items():
        if file_id in held:
            continue
        try:
            (shm_dir / name).unlink()
            removed.append(name)
        except FileNotFoundError:  # its owner, or another run's clean-up, was first
            continue
    return removed


def _lock_path(name: str) -> Path:
    """Where the machine-wide lock file `name` is: /dev/shm, or the temporary folder where there is none."""
    return (SHM_DIR if SHM_DIR.is_dir() else Path(tempfile.gettempdir())) / name


def machine_lock(name: str) -> int:
    """A read-only descriptor of the lock file `name` in /dev/shm (the temporary folder where there is none), one
    for every user's processes on this machine, for `fcntl.flock`; created, when missing, readable by all."""
    path = _lock_path(name)
    refused = 0
    while True:
        try:
            # Read-only, without O_CREAT: another user's file in a sticky folder opens so (flock needs no more), where
            # opening it for writing, or with O_CREAT under fs.protected_regular, is refused.
            return os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            pass
        except PermissionError:
            # Another user's process created it a moment ago and has not made it readable by all yet.
            refused += 1
            if refused > 50:
                raise
            time.sleep(0.01)
            continue
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:  # another process created it meanwhile: open that one
            continue
        os.fchmod(fd, 0o644)  # whatever this user's umask, the next user's processes can open it
        return fd


def remove_machine_lock(name: str) -> bool:
    """Unlink this user's lock file `name` (where `machine_lock` keeps it); whether it was removed. Only for a lock
    the caller holds exclusively (`owner_gone`) where no process can open it meanwhile: one that had opened the old
    file would lock a name nobody else sees."""
    path = _lock_path(name)
    try:
        if path.stat().st_uid != os.getuid():  # another user's: not ours to unlink (the sticky folder refuses it)
            return False
        path.unlink()
    except FileNotFoundError:
        return False
    return True


_HELD: dict[str, int] = {}  # the lock files this process holds until it exits, by name


def hold_while_alive(name: str) -> None:
    """Hold a shared lock on the machine-wide lock file `name` until this process and the children it forks end: a
    sign of life that every process namespace sharing /dev/shm sees."""
    if name not in _HELD:
        fd = machine_lock(name)
        fcntl.flock(fd, fcntl.LOCK_SH)
        _HELD[name] = fd


@contextlib.contextmanager
def owner_gone(name: str) -> Iterator[bool]:
    """True, holding `name` exclusively until the block ends, when no live process holds it; else False."""
    fd = machine_lock(name)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
