"""Outputs are never half-written: files and folders are written under a temporary name, then renamed."""
from __future__ import annotations

import contextlib
import errno
import glob
import json
import os
import re
import secrets
import shutil
import socket
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional, Sequence

from core.errors import OutputExistsError, refused_for_room
from core.process_life import stops_deferred

if TYPE_CHECKING:  # annotations only: matplotlib is the plotting callers' import
    from matplotlib.figure import Figure


def is_temporary(path: Path) -> bool:
    """Whether this is the name write_text_atomic writes under before the rename (a killed writer may leave one)."""
    name = Path(path).name
    return name.startswith(".") and name.endswith(".tmp")


def write_text_atomic(path: Path, text: str, fsync: bool = False, replace: bool = True) -> bool:
    """Write a text file under a temporary name and rename it into place (with `fsync`, the file before the rename and
    its folder after it); with `replace` False, only where no such file is (one already there stays); whether it was
    written."""
    path = Path(path)
    # A name of this writer's own: two processes writing one file (the leaders of several nodes recording a shared
    # dataset's checks) would otherwise rename each other's temporary file away, and the second rename fail.
    tmp = path.with_name(f".{path.name}.{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}.tmp")
    fh = open(tmp, "x", encoding="utf-8")  # (where it cannot be created, there is nothing to remove)
    try:
        with fh:
            fh.write(text)
            if fsync:
                fh.flush()
                os.fsync(fh.fileno())
        if replace:
            tmp.replace(path)
            if fsync:
                fsync_folder(path.parent)
            return True
        try:
            os.link(tmp, path)  # unlike a rename, refused where the name exists, and as atomic
        except FileExistsError:
            return False
        except OSError as exc:
            if exc.errno not in NO_HARD_LINKS:
                raise
            written = _claim_then_rename(tmp, path)
        else:
            written = True
        finally:
            tmp.unlink(missing_ok=True)
        if written and fsync:
            fsync_folder(path.parent)
        return written
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def fsync_folder(folder: Path) -> None:
    """Flush a folder's entries to stable storage: a rename (or a new file) in it survives a crash of the machine
    only once the folder itself is synced, not the file alone."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(folder: Path) -> None:
    """Flush every file and folder under `folder`, the folder, and its entry in the folder above to stable storage."""
    for path in sorted(Path(folder).rglob("*"), reverse=True):  # a folder's own entries before the folder
        if path.is_dir():
            fsync_folder(path)
        elif path.is_file():
            with open(path, "rb") as fh:
                os.fsync(fh.fileno())
    fsync_folder(folder)
    fsync_folder(Path(folder).parent)


# What link(2) answers on a file system without hard links (some FUSE mounts of object storage, SMB): EPERM,
# ENOTSUP/EOPNOTSUPP, ENOSYS.
NO_HARD_LINKS = {errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS}


def _claim_then_rename(tmp: Path, path: Path) -> bool:
    """`replace=False` without hard links: the name claimed empty with O_EXCL (refused where it exists), then the
    whole text renamed over the claim; a reader in between sees an empty file, never a part of the text (a replacing
    writer's text that lands in between is lost, where a link would have kept it: the window is one rename)."""
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    claim = os.fstat(fd).st_ino
    os.close(fd)
    try:
        tmp.replace(path)
    except BaseException:
        # The claim, while still this writer's and empty, goes with it, so that a later writer can write the text
        # (only a writer killed between the two steps leaves an empty file).
        with contextlib.suppress(OSError):
            st = path.stat()
            if st.st_ino == claim and st.st_size == 0:
                path.unlink()
        raise
    return True


def room_refusal(folder: Path, size: int = 1 << 20) -> OSError | None:
    """Why `size` bytes cannot be written in `folder` now, when it is for want of room (a full disk, a quota, a file
    size limit), else None. torch's writer reports such a failure without its errno ("iostream error"): a write
    of our own asks the file system again."""
    probe = Path(folder) / f".room-probe-{socket.gethostname()}-{os.getpid()}.tmp"
    try:
        with open(probe, "wb") as fh:
            fh.write(os.urandom(size))  # zeros a compressing file system (ZFS, btrfs) might not store
            fh.flush()
            os.fsync(fh.fileno())
    except OSError as exc:
        return refused_for_room(exc)
    finally:
        probe.unlink(missing_ok=True)
    return None


def save_figure_atomic(fig: Figure, path: Path, dpi: int = 120) -> None:
    """Save a matplotlib figure as PNG under a temporary name and rename it into place."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    fig.savefig(tmp, format="png", dpi=dpi, bbox_inches="tight")
    tmp.replace(path)


# Marks a folder this tool wrote as a whole (an export, a prepared dataset): --overwrite replaces only those.
OUTPUT_MARKER = ".contrastive-pretrain.json"


def mark_output(folder: Path, kind: str) -> None:
    """Say that `folder` is a whole `kind` (export, dataset) written by this tool, so --overwrite may replace it."""
    write_text_atomic(Path(folder) / OUTPUT_MARKER, json.dumps({"kind": kind}) + "\n")


def output_kind(folder: Path) -> Optional[str]:
    """The kind of tool-written folder this is, None when it carries no readable marker."""
    try:
        return json.loads((Path(folder) / OUTPUT_MARKER).read_text()).get("kind")
    except (OSError, ValueError, AttributeError):
        return None


def check_folder_path(path: Path, what: str) -> None:
    """Refuse a folder path that names a file or lies inside one, in one line naming `what` and the file."""
    for place in (Path(path), *Path(path).parents):
        if place.exists():
            if not place.is_dir():
                raise OutputExistsError(f"{what} '{path}': '{place}' is a file, not a folder")
            return


def check_overwrite(final_dir: Path, overwrite: bool, kind: Optional[str] = None, reads: Sequence[Path] = (),
                    legacy: Optional[Callable[[Path], bool]] = None) -> None:
    """Refuse to clobber an existing output unless asked; asked, replace only a `kind` folder this tool wrote (its
    marker, or `legacy(folder)` for one written before markers), never one that holds or lies inside what is read."""
    final_dir = Path(final_dir)
    check_folder_path(final_dir, "the output")  # a file there: --overwrite would not be the answer
    if not final_dir.exists():
        return
    if not overwrite:
        raise OutputExistsError(f"output folder '{final_dir}' already exists; pass --overwrite to replace it")
    if kind is None:
        return
    final = final_dir.resolve()
    for path in reads:
        read = Path(path).resolve()
        if read == final or final in read.parents or read in final.parents:
            raise OutputExistsError(f"--overwrite: '{final_dir}' holds or lies inside '{path}', which this command reads; "
                                    "write the output to another folder")
    if output_kind(final_dir) != kind and not (legacy is not None and legacy(final_dir)):
        raise OutputExistsError(f"--overwrite replaces only a {kind} folder this tool wrote, and '{final_dir}' is not one "
                                f"(no {OUTPUT_MARKER} naming a {kind}): remove it yourself, or write to another folder")


def writer_prefix(prefix: str) -> str:
    """The start of a temporary name that `remove_debris` traces to this host and process: `{prefix}{host}-{pid}-`,
    to be followed by a tail without '-'."""
    return f"{prefix}{socket.gethostname()}-{os.getpid()}-"


def remove_debris(folder: Path, prefix: str) -> list[Path]:
    """Remove what killed writers on this host left in `folder` under `writer_prefix(prefix)` names (their pid is
    gone; the tail has no '-', so another host's `{host}-12` is not this one); the paths removed."""
    name = re.compile(re.escape(prefix + socket.gethostname()) + r"-(\d{1,9})-[^-]+")
    removed = []
    for tmp in Path(folder).glob(f"{glob.escape(prefix)}*"):
        match = name.fullmatch(tmp.name)
        if match is None:
            continue
        try:
            os.kill(int(match.group(1)), 0)
        except ProcessLookupError:
            shutil.rmtree(tmp, ignore_errors=True)
            if not tmp.exists():
                removed.append(tmp)
        except PermissionError:  # another user's live process
            continue
    return removed


def prepare_output(final_dir: Path, overwrite: bool, kind: Optional[str] = None, reads: Sequence[Path] = (),
                   legacy: Optional[Callable[[Path], bool]] = None) -> Path:
    """Refuse to clobber an existing output unless asked (check_overwrite); return a fresh temporary folder beside it."""
    check_overwrite(final_dir, overwrite, kind, reads, legacy)  # and a file in the output's place or above it
    final_dir.parent.mkdir(parents=True, exist_ok=True)
    remove_debris(final_dir.parent, f".{final_dir.name}.tmp-")
    if final_dir.exists():  # else a swap killed between its renames left the only copy there: kept for the user
        remove_debris(final_dir.parent, f".{final_dir.name}.old-")  # a swap's replaced output, killed before removal
    tmp = final_dir.with_name(f"{writer_prefix(f'.{final_dir.name}.tmp-')}{int(time.time())}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    return tmp


def readable_as_umask_allows(folder: Path) -> None:
    """Give every file under `folder` the mode a plain new file gets (0o666 less the umask): some writers (safetensors'
    through transformers) make theirs 0o600, which other users of a shared file system cannot load."""
    mask = os.umask(0)
    os.umask(mask)
    for path in Path(folder).rglob("*"):
        if path.is_file() and not path.is_symlink():
            try:
                os.chmod(path, 0o666 & ~mask)
            except OSError:  # a mount that keeps its own modes (FUSE, SMB): the files are as readable as it makes them
                pass


def publish(tmp_dir: Path, final_dir: Path) -> None:
    """Swap a finished temporary folder into place; an old dataset is removed only after that."""
    if final_dir.exists():
        old = final_dir.with_name(f"{writer_prefix(f'.{final_dir.name}.old-')}swap")  # a killed swap's: remove_debris
        try:
            # A Ctrl-C or SLURM's SIGTERM between the two renames would leave neither folder under its name (the
            # caller's clean-up removes the new one): the swap is whole, the stop acted on after it.
            with stops_deferred():
                final_dir.rename(old)
                try:
                    tmp_dir.rename(final_dir)
                except BaseException:
                    old.rename(final_dir)
                    raise
        finally:
            if old.exists() and final_dir.exists():
                shutil.rmtree(old)
    else:
        tmp_dir.rename(final_dir)
