"""write_text_atomic: a reader sees the old text or the new one, whole, even with several writers at once."""
import errno
import os
import threading
from pathlib import Path

import pytest

from core.atomic_files import is_temporary, write_text_atomic


def test_writers_of_one_file_at_once_never_fail_and_leave_one_whole_text(tmp_path):
    target = tmp_path / "verified.json"
    texts = [f'{{"writer": {w}, "pad": "{"x" * 20000}"}}\n' for w in range(4)]
    errors: list[BaseException] = []
    torn: list[str] = []

    def write(text: str) -> None:
        try:
            for _ in range(150):
                write_text_atomic(target, text)
                seen = target.read_text()
                if seen not in texts:
                    torn.append(seen[:80])
        except BaseException as exc:  # noqa: BLE001 - reported below, with the writer's traceback lost to the thread
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(t,)) for t in texts]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors[:3]
    assert not torn, torn[:3]
    assert target.read_text() in texts
    assert [p.name for p in tmp_path.iterdir()] == ["verified.json"]  # no temporary file left


def _no_hard_links(monkeypatch, code: int) -> None:
    """os.link answering as on a file system without hard links (a FUSE mount of a bucket: EPERM or ENOTSUP)."""
    def refused(src, dst, *args, **kwargs):
        raise OSError(code, os.strerror(code), str(src), None, str(dst))

    monkeypatch.setattr(os, "link", refused)


@pytest.mark.parametrize("links", ["hard links", "no hard links"])
def test_writers_that_must_not_replace_leave_the_first_text_and_the_last_replacing_writer_wins(tmp_path, monkeypatch,
                                                                                                links):
    """Several ranks record one failure at once: those that must not replace it (`replace=False`) leave the text
    already there, whoever wrote it, and say so; a replacing writer (rank 0) takes its place at any time. The same
    where the file system has no hard links."""
    if links == "no hard links":
        _no_hard_links(monkeypatch, errno.EPERM)
    target = tmp_path / "FAILED"
    results: list[bool] = []
    threads = [threading.Thread(target=lambda w=w: results.append(write_text_atomic(target, f"rank {w}\n", replace=False)))
               for w in range(1, 5)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(results) == [False, False, False, True]
    first = target.read_text()
    assert first in [f"rank {w}\n" for w in range(1, 5)]
    assert write_text_atomic(target, "rank 9\n", replace=False) is False and target.read_text() == first
    assert write_text_atomic(target, "rank 0\n") is True and target.read_text() == "rank 0\n"
    assert write_text_atomic(target, "rank 5\n", replace=False) is False and target.read_text() == "rank 0\n"
    assert [p.name for p in tmp_path.iterdir()] == ["FAILED"]  # no temporary file left


def test_a_link_refused_for_another_reason_is_raised_and_leaves_nothing(tmp_path, monkeypatch):
    """Only the answers of a file system without hard links take the other way: an I/O error is the caller's."""
    _no_hard_links(monkeypatch, errno.EIO)
    with pytest.raises(OSError) as raised:
        write_text_atomic(tmp_path / "FAILED", "rank 1\n", replace=False)
    assert raised.value.errno == errno.EIO and list(tmp_path.iterdir()) == []
    _no_hard_links(monkeypatch, errno.ENOTSUP)
    # A rename that fails after the name was claimed takes the empty claim with it: the next writer writes the text.
    real_replace = Path.replace

    def failing_replace(self, target):
        raise OSError(errno.EIO, "disk gone")

    monkeypatch.setattr(Path, "replace", failing_replace)
    with pytest.raises(OSError, match="disk gone"):
        write_text_atomic(tmp_path / "FAILED", "rank 2\n", replace=False)
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setattr(Path, "replace", real_replace)
    assert write_text_atomic(tmp_path / "FAILED", "rank 1\n", replace=False) is True
    assert [(p.name, p.read_text()) for p in tmp_path.iterdir()] == [("FAILED", "rank 1\n")]


def test_a_write_cut_short_leaves_a_name_uploads_know_as_temporary(tmp_path, monkeypatch):
    """A writer that fails after creating its temporary file removes it; the name it had is one `is_temporary` knows
    (remote_dataset.upload_rest skips such names, which a killed writer leaves)."""
    created = []
    real_replace = Path.replace

    def failing_replace(self, target):
        created.append(self)
        raise OSError("disk gone")

    monkeypatch.setattr(Path, "replace", failing_replace)
    with pytest.raises(OSError, match="disk gone"):
        write_text_atomic(tmp_path / "verified.json", "{}\n")
    monkeypatch.setattr(Path, "replace", real_replace)
    assert len(created) == 1 and is_temporary(created[0]) and not is_temporary(tmp_path / "verified.json")
    assert list(tmp_path.iterdir()) == []


def test_an_output_inside_a_file_is_refused_in_one_line_before_anything_is_made(tmp_path):
    from core.atomic_files import prepare_output
    from core.errors import OutputExistsError

    notes = tmp_path / "notes.txt"
    notes.write_text("kept")
    for out in (notes / "export", notes / "deeper" / "export"):
        with pytest.raises(OutputExistsError, match=f"the output '{out}': '{notes}' is a file, not a folder"):
            prepare_output(out, overwrite=False)
    # The output itself a file: said so, not "already exists; pass --overwrite" (which would not help).
    for overwrite in (False, True):
        with pytest.raises(OutputExistsError, match=f"the output '{notes}': '{notes}' is a file, not a folder"):
            prepare_output(notes, overwrite=overwrite, kind="export")
    assert notes.read_text() == "kept" and sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_debris_of_a_dead_writer_on_this_host_goes_and_nothing_else(tmp_path):
    """`{prefix}{host}-{pid}-{tail}`: a dead pid's folder goes; a live writer's, another host's whose name starts with
    this one's (`{host}-12`), and a name of another form stay."""
    import os
    import socket

    from core.atomic_files import remove_debris

    host, dead = socket.gethostname(), 999999999  # above any pid_max: no such process
    gone = tmp_path / f".out.tmp-{host}-{dead}-1796050000"
    kept = [tmp_path / f".out.tmp-{host}-{os.getpid()}-1796050000",  # this process: alive
            tmp_path / f".out.tmp-{host}-12-{dead}-1796050000",  # host '{host}-12', not this one
            tmp_path / f".out.tmp-{host}-{dead}",  # no tail
            tmp_path / f".other.tmp-{host}-{dead}-1796050000"]  # another prefix
    for folder in (gone, *kept):
        (folder / "part").mkdir(parents=True)
    assert remove_debris(tmp_path, ".out.tmp-") == [gone]
    assert not gone.exists() and all(folder.is_dir() for folder in kept)


def _record_fsyncs(monkeypatch, target: Path) -> list[tuple[str, str | None]]:
    """os.fsync, still called, recording each call as (what it synced: 'file' or the folder's path, `target`'s text
    at that moment, or None where it is not there yet)."""
    import stat

    calls: list[tuple[str, str | None]] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        st = os.fstat(fd)
        synced = os.readlink(f"/proc/self/fd/{fd}") if stat.S_ISDIR(st.st_mode) else "file"
        calls.append((synced, target.read_text() if target.exists() else None))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return calls


@pytest.mark.parametrize("replace", [True, False])
def test_a_synced_write_syncs_its_folder_after_the_rename(tmp_path, monkeypatch, replace):
    """With fsync, the rename is made durable too (the folder synced once the new name is in it): a machine crash after
    the call returned must not bring back the old text, or no file, where a later launch reads it (trackers.json, a
    checkpoint's COMPLETE marker)."""
    target = tmp_path / "trackers.json"
    calls = _record_fsyncs(monkeypatch, target)
    assert write_text_atomic(target, '{"name": "run"}\n', fsync=True, replace=replace) is True
    assert calls == [("file", None), (str(tmp_path), '{"name": "run"}\n')]
    calls.clear()
    write_text_atomic(target, "unsynced\n", replace=True)
    assert calls == []  # without fsync, nothing is synced
    _no_hard_links(monkeypatch, errno.ENOTSUP)  # the claim-then-rename way
    target.unlink()
    assert write_text_atomic(target, "claimed\n", fsync=True, replace=False) is True
    assert calls == [("file", None), (str(tmp_path), "claimed\n")]


def test_a_synced_tree_syncs_each_folder_after_its_entries_and_the_folder_that_holds_it(tmp_path, monkeypatch):
    """A checkpoint is marked complete only after its files, its folders, and its own name in the checkpoints folder
    are on stable storage (the folder a save created is otherwise lost in a crash, marker and all)."""
    from core.atomic_files import fsync_tree

    tag = tmp_path / "ckpts" / "step_00000010"
    (tag / "zero").mkdir(parents=True)
    for name in ("mp_rank_00_model_states.pt", "zero/optim_states.pt"):
        (tag / name).write_bytes(b"x" * 10)
    calls = _record_fsyncs(monkeypatch, tag / "marker")
    fsync_tree(tag)
    synced = [what for what, _ in calls]
    assert synced.count("file") == 2 and len(synced) == 5, synced
    folders = [what for what in synced if what != "file"]
    assert folders == [str(tag / "zero"), str(tag), str(tag.parent)]
    assert synced.index(str(tag / "zero")) == 1  # after zero/optim_states.pt, its one file, before the folder above


def test_a_stop_during_the_swap_leaves_the_new_output_in_place_and_no_old_copy(tmp_path):
    """SLURM's SIGTERM (a handler that raises SystemExit, as the commands install) landing between publish's two
    renames: acted on once the new output is in place and the replaced one removed, not between them, where neither
    would be under its name and the caller's clean-up would remove the new one."""
    import signal

    from core.atomic_files import publish

    final, tmp = tmp_path / "out", tmp_path / ".out.tmp-x"
    for folder, text in ((final, "old"), (tmp, "new")):
        folder.mkdir()
        (folder / "v").write_text(text)

    class Signalling(type(Path())):
        def rename(self, target):
            done = super().rename(target)
            os.kill(os.getpid(), signal.SIGTERM)  # right after the first rename
            return done

    def stop(signum, frame):
        raise SystemExit(143)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        with pytest.raises(SystemExit):
            publish(tmp, Signalling(final))
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert (final / "v").read_text() == "new" and [p.name for p in tmp_path.iterdir()] == ["out"]
