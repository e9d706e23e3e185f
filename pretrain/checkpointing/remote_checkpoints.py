"""Checkpoints mirrored to object storage (train.checkpoint_remote): upload after save, download to resume.

A checkpoint counts in the bucket only once its COMPLETE marker is there, and the marker is uploaded
after every other file of the checkpoint and deleted before any of them. A download goes to a
temporary folder renamed into place once whole, so a killed transfer never looks like a checkpoint.
"""
from __future__ import annotations

import functools
import shutil
import threading
import time
from typing import Optional

from core import distributed as dist
from core.errors import StorageError, UserError
from core.object_store import ObjectStore
from pretrain.checkpointing.checkpoint_dir import COMPLETE, TAG_RE, CheckpointDir


class RemoteCheckpoints:
    """The checkpoints under one remote prefix, beside the run's local checkpoint folder."""

    def __init__(self, url: str, local: CheckpointDir) -> None:
        self.url = url.rstrip("/")
        self.local = local

    @functools.cached_property
    def store(self) -> ObjectStore:
        """The bucket's client, made at first use (a run that resumes train.resume_from reaches it at its first save)."""
        return ObjectStore(self.url)

    @functools.cached_property
    def for_uploads(self) -> "RemoteCheckpoints":
        """The same checkpoints with clients of their own, which this process's background uploads share (clients are
        thread-safe): each new client costs the loop beside it. Made anew after an upload fails or is given up
        (`renew_upload_clients`)."""
        return RemoteCheckpoints(self.url, self.local)

    def renew_upload_clients(self) -> None:
        """Let the next upload make new clients: a client keeps the credentials it was made with (a credentials file is
        read once, so keys rotated there since are not seen) and whatever else failed it, and a given-up upload still
        sends its current file on its own."""
        self.__dict__.pop("for_uploads", None)

    def complete_tags(self, keys: Optional[list[str]] = None) -> list[str]:
        """Tags whose COMPLETE marker is in the bucket (among `keys`, else a fresh listing), oldest first."""
        keys = self.store.list() if keys is None else keys
        return sorted({k.split("/", 1)[0] for k in keys
                       if k.endswith(f"/{COMPLETE}") and TAG_RE.match(k.split("/", 1)[0])})

    def upload(self, tag: str, keep_last: int, control: Optional["UploadControl"] = None) -> tuple[int, float, list[str]]:
        """Upload one complete local checkpoint (marker last), then prune the bucket to `keep_last`; once `control`
        is cancelled, stop before the next file and remove the files sent.

        Returns the number of files, the seconds taken and the tags pruned.
        """
        t0 = time.time()
        folder = self.local.tag(tag)
        names = sorted(p.relative_to(self.local.root).as_posix() for p in folder.rglob("*") if p.is_file())
        marker = f"{tag}/{COMPLETE}"
        self.store.delete([marker])  # a tag of the same name in the bucket (a branch's): not complete while it is replaced
        # And what such a tag holds that this checkpoint does not: the shards of a killed upload of the same step at
        # another world size, which a download for a resume would take with the rest.
        self.store.delete([k for k in self.store.list(f"{tag}/") if k.startswith(f"{tag}/") and k not in names])
        sent: list[str] = []
        for rel in sorted(names, key=lambda n: n == marker):
            if control is not None and control.cancelled.is_set():
                raise self._given_up(tag, sent, f"before {rel}")
            self.store.upload(self.local.root, rel)
            sent.append(rel)
        if control is not None:
            with control.lock:  # the waiter gives up before this, or sees the checkpoint whole in the bucket
                if control.cancelled.is_set():
                    raise self._given_up(tag, sent, "as its marker went")
                control.marker_sent = True
        pruned = []
        keys = self.store.list()  # one listing serves both the tags and their files
        complete = self.complete_tags(keys)
        stale = complete[:-keep_last]
        # Tags older than this one without their marker: uploads given up, or cut short by a killed rank.
        unfinished = sorted({k.split("/", 1)[0] for k in keys if TAG_RE.match(k.split("/", 1)[0])} - set(complete))
        for old in stale + [t for t in unfinished if t < tag]:
            mine = [k for k in keys if k.startswith(f"{old}/")]
            # The marker first: a prune cut short leaves files no resume takes for a checkpoint.
            if self.store.delete([f"{old}/{COMPLETE}"] if old in stale else []) and self.store.delete(
                    [k for k in mine if k != f"{old}/{COMPLETE}"]):
                pruned.append(old)
        return len(names), time.time() - t0, pruned

    def _given_up(self, tag: str, sent: list[str], when: str) -> StorageError:
        """Remove what a given-up upload of `tag` sent (its marker first, if it went); the error that says so."""
        marker = f"{tag}/{COMPLETE}"
        if marker in sent:
            self.store.delete([marker])
        self.store.delete([rel for rel in sent if rel != marker])
        return StorageError(f"the upload of {tag} was given up {when}")

    def forget_after(self, tag: str) -> list[str]:
        """Delete the markers of the bucket's complete checkpoints after `tag` (a branch from it), so that no resume
        takes the abandoned line and the prune counts the branch's alone; the tags whose markers went."""
        later = [t for t in self.complete_tags() if t > tag]
        if later and not self.store.delete([f"{t}/{COMPLETE}" for t in later]):
            return []  # a store without deletes here (only s3:// has them)
        return later

    def fetch_for_resume(self) -> Optional[str]:
        """Rank 0 fetches the newest remote checkpoint when no local one is as new (`fetch_newest`); every rank gets
        its tag (None when nothing was fetched), or the user error that stopped it."""
        def fetch() -> Optional[str]:
            self.local.root.mkdir(parents=True, exist_ok=True)
            return self.fetch_newest()

        return dist.from_rank0(fetch, f"fetching the newest checkpoint from {self.url}")

    def fetch_newest(self) -> Optional[str]:
        """Download the newest complete remote checkpoint when it is newer than every intact local one (a damaged
        local copy of it is set aside as TAG.damaged); its tag, or None."""
        remote = self.complete_tags()
        if not remote:
            return None
        newest = remote[-1]
        local = self.local.complete_tags()
        if local and local[-1] >= newest and (self.local.newest_intact()[0] or "") >= newest:
            return None
        keys = [k for k in self.store.list(f"{newest}/") if k.startswith(f"{newest}/")]
        tmp = self.local.root / f".{newest}.download"
        shutil.rmtree(tmp, ignore_errors=True)
        marker = f"{newest}/{COMPLETE}"
        for key in sorted(keys, key=lambda k: k == marker):
            self.store.download(key, tmp / key.split("/", 1)[1])
        target = self.local.root / newest
        if self.local.is_complete(newest):  # damaged: kept for a look, as a resume keeps a damaged tag
            shutil.rmtree(self.local.root / f"{newest}.damaged", ignore_errors=True)
            target.rename(self.local.root / f"{newest}.damaged")
        shutil.rmtree(target, ignore_errors=True)  # an unmarked local folder of that tag: the debris of a killed save
        tmp.rename(target)
        self.local.point_latest()
        return newest


class UploadControl:
    """What the thread that waits for an upload and the thread that uploads share: a request to give up, and whether
    the marker went (past it, the checkpoint is in the bucket, whatever follows)."""

    def __init__(self) -> None:
        self.cancelled = threading.Event()
        self.marker_sent = False
        self.lock = threading.Lock()


_RUNNING: list[threading.Thread] = []  # every upload's thread: the ones alive at an exit are not waited for


def uploads_running() -> bool:
    """Whether a checkpoint upload still sends a file (one given up, or one in the background when an error ends the
    process): the process must not wait for it at its exit."""
    return any(thread.is_alive() for thread in _RUNNING)


class Upload:
    """One checkpoint's upload, started now in a thread of its own (with the uploads' client, not the caller's: a
    given-up upload may outlive its waiter) and waited for later, within `bound_s` of its start.

    A bucket slower than the bound is a warning, not a rank that never answers: given up, the upload stops before
    its next file and removes what it sent (its marker, last, never went)."""

    def __init__(self, remote: RemoteCheckpoints, tag: str, keep_last: int, bound_s: float) -> None:
        self.tag, self.bound_s, self.remote = tag, bound_s, remote
        self.control = UploadControl()
        self.outcome: dict[str, object] = {}
        own = remote.for_uploads
        self.local = remote.local
        self.thread = threading.Thread(target=self._run, args=(own, keep_last), name=f"upload {tag}", daemon=True)
        self.started, self.ended = time.time(), None
        _RUNNING[:] = [t for t in _RUNNING if t.is_alive()] + [self.thread]
        self.thread.start()

    def _run(self, own: RemoteCheckpoints, keep_last: int) -> None:
        try:
            self.outcome["value"] = own.upload(self.tag, keep_last, self.control)
        except BaseException as exc:  # for the waiting thread: a user's error is logged there, a bug raised there
            self.outcome["error"] = exc
        finally:
            self.ended = time.time()

    @property
    def done(self) -> bool:
        """Whether the upload has ended (sent, failed or stopped after a give-up): `wait` returns at once."""
        return not self.thread.is_alive()

    @property
    def ended_on_a_bug(self) -> bool:
        """Whether it ended on an error other than a user's (a StorageError is one): `wait` raises it."""
        error = self.outcome.get("error")
        return self.done and error is not None and not isinstance(error, UserError)

    @property
    def elapsed(self) -> float:
        """Seconds from its start to its end, or to now while it runs."""
        return (self.ended or time.time()) - self.started

    def wait(self, give_up: Optional[str] = None) -> tuple[int, float, list[str]]:
        """Its files, seconds and tags pruned, once it has ended: waited for until its bound, or, with `give_up` (why),
        not at all. Past that it is given up (a StorageError), unless its marker went (then it is whole in the bucket
        and only its prune goes on). After a failure, or a give-up before the marker went, the next upload makes new
        clients."""
        try:
            return self._wait(give_up)
        except UserError:
            self.remote.renew_upload_clients()
            raise

    def _wait(self, give_up: Optional[str]) -> tuple[int, float, list[str]]:
        """`wait`'s outcome, without the renewal."""
        if give_up is None:
            self.thread.join(max(0.0, self.bound_s - self.elapsed))
        if self.thread.is_alive():
            with self.control.lock:
                if self.control.marker_sent:
                    return sum(1 for p in self.local.tag(self.tag).rglob("*") if p.is_file()), self.elapsed, []
                self.control.cancelled.set()
            why = give_up or (f"it did not finish within train.checkpoint_upload_timeout_s ({self.bound_s:g} s), so "
                              "it was given up")
            raise StorageError(f"{why}: what it sent goes when its current file ends, or at the next upload")
        if "error" in self.outcome:
            raise self.outcome["error"]
        return self.outcome["value"]
