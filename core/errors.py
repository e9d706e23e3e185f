"""The errors a user can fix. The CLIs print these in one line and exit 2; any other exception is a bug
and keeps its traceback (exit 1).

Each message names the file, key or value at fault and what to do. The classes also derive from the
built-in exception a caller would expect (ValueError, FileNotFoundError, ...), so code that catches
those keeps working.
"""
from __future__ import annotations

import errno


class UserError(Exception):
    """A mistake in the user's config, data, checkpoint or environment, with a message that says which."""


class ConfigError(UserError, ValueError):
    """A config file, key or override is wrong, or two settings do not fit together; the message names the key."""


class InputDataError(UserError, ValueError):
    """Input data (text, dataset, shards, tokenizer, task file) is missing, empty, undecodable or inconsistent."""


class MissingFileError(InputDataError, FileNotFoundError):
    """A path the user gave does not exist or is not the kind of file or folder expected."""


class CheckpointError(UserError, RuntimeError):
    """A checkpoint or run folder is missing, incomplete, damaged or does not fit the model."""


class OutputExistsError(UserError, FileExistsError):
    """The output would replace something already written; the message says how to allow it."""


class SetupError(UserError, RuntimeError):
    """The environment cannot do what was asked: no network for a hub download, a launcher layout, a device feature."""


class StorageError(UserError, OSError):
    """Object storage cannot be used: no credentials, a missing bucket or object, an unreachable endpoint."""


class NoSpaceError(UserError, OSError):
    """A file system refused a write for want of room: no space left on it, a quota, or a file size limit."""


# A write refused for want of room: the file system is full, the user's quota is, or the file hit a size limit.
NO_ROOM = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def refused_for_room(exc: BaseException) -> OSError | None:
    """The OSError in `exc`'s chain (itself, then its causes and contexts) that says a write was refused for want of
    room (NO_ROOM); None when there is none."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in NO_ROOM:
            return current
        current = current.__cause__ or current.__context__
    return None


def no_room_error(exc: BaseException) -> NoSpaceError | None:
    """A write refused for want of room anywhere in `exc`'s chain, as the user's error it is (one line naming the
    file); None when there is none."""
    room = refused_for_room(exc)
    if room is None:
        return None
    files = " -> ".join(str(name) for name in (room.filename, room.filename2) if name)
    return NoSpaceError(f"a write was refused: {room.strerror}{f' ({files})' if files else ''}. Free space (or raise "
                        "the quota or file size limit), then run the same command again")


def user_error(exc: BaseException) -> UserError | None:
    """`exc` as the user's error it is: itself, or the NoSpaceError of a write refused for want of room anywhere in
    its chain; None for a bug."""
    return exc if isinstance(exc, UserError) else no_room_error(exc)


class DivergedError(RuntimeError):
    """Training diverged: a step's loss or gradient norm was inf or NaN. Neither a bug nor bad input: the CLI prints
    the message in one line and exits with its own code, and a batch script must not requeue it (it would diverge
    again from the same checkpoint and config)."""


class AttemptLostError(RuntimeError):
    """This attempt cannot go on through no fault of the input or the code (a loader worker that never started): the
    CLI ends it as one that lost a peer, one line and exit 76, and a batch script requeues it a bounded number of
    times, to resume from the last complete checkpoint."""


def one_line(exc: BaseException) -> str:
    """The message of a user error in one line, also when a DataLoader worker re-raised it with its traceback."""
    text = str(exc).strip()
    if "\n" not in text:
        return text
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not any(line.endswith("Traceback (most recent call last):") for line in lines):
        # A message that spans lines (a library's error quoted in ours): every line, the first names what is at fault.
        return " ".join(lines)
    last = lines[-1]
    prefix = f"{type(exc).__name__}: "
    for cls in type(exc).__mro__:  # the worker's traceback ends with "module.Class: message"
        if f"{cls.__name__}: " in last:
            return last.split(f"{cls.__name__}: ", 1)[1]
    return last.removeprefix(prefix)
