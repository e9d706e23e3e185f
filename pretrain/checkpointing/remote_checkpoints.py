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

    def complete_tags(self, keys: Optional[list[str]] = None) -> list[str]:
        """Tags whose COMPLETE marker is in the bucket (among `keys`, else a fresh listing), oldest first."""
        keys = self.store.list() if keys is None else keys
        return sorted({k.split("/", 1)[0] for k in keys
                       if k.endswith(f"/{COMPLETE}") and TAG_RE.match(k.split("/", 1)[0])})

    def upload(self, tag: str, keep_last: int) -> tuple[int, float, list[str]]:
        """Upload one complete local checkpoint (marker last), then prune the bucket to `keep_last`.

        Returns the number of files, the seconds taken and the tags pruned.
        """
        t0 = time.time()
        folder = self.local.tag(tag)
        names = sorted(p.relative_to(self.local.root).as_posix() for p in folder.rglob("*") if p.is_file())
        marker = f"{tag}/{COMPLETE}"
        for rel in sorted(names, key=lambda n: n == marker):
            self.store.upload(self.local.root, rel)
        pruned = []
        keys = self.store.list()  # one listing serves both the tags and their files
        stale = self.complete_tags(keys)[:-keep_last]
        if stale:
            for old in stale:
                mine = [k for k in keys if k.startswith(f"{old}/")]
                # The marker first: a prune cut short leaves files no resume takes for a checkpoint.
                if self.store.delete([f"{old}/{COMPLETE}"]) and self.store.delete(
                        [k for k in mine if k != f"{old}/{COMPLETE}"]):
                    pruned.append(old)
        return len(names), time.time() - t0, pruned

    def fetch_for_resume(self) -> Optional[str]:
        """Rank 0 fetches the newest remote checkpoint when no local one is as new (`fetch_newest`); every rank gets
        its tag (None when nothing was fetched), or the user error that stopped it."""
        def fetch() -> Optional[str]:
            self.local.root.mkdir(parents=True, exist_ok=True)
            return self.fetch_newest()

        return dist.from_rank0(fetch, f"fetching the newest checkpoint from {self.url}")

    def fetch_newest(self) -> Optional[str]:
        """Download the newest complete remote checkpoint when it is newer than every local one; its tag, or None."""
        remote = self.complete_tags()
        if not remote:
            return None
        newest = remote[-1]
        local = self.local.complete_tags()
        if local and local[-1] >= newest:
            return None
        keys = [k for k in self.store.list(f"{newest}/") if k.startswith(f"{newest}/")]
        tmp = self.local.root / f".{newest}.download"
        shutil.rmtree(tmp, ignore_errors=True)
        marker = f"{newest}/{COMPLETE}"
        for key in sorted(keys, key=lambda k: k == marker):
            self.store.download(key, tmp / key.split("/", 1)[1])
        target = self.local.root / newest
        shutil.rmtree(target, ignore_errors=True)  # an unmarked local folder of that tag: the debris of a killed save
        tmp.rename(target)
        return newest


class BackgroundUpload:
    """One checkpoint going up to the bucket from a thread of rank 0 while training goes on; `result()` waits for it."""

    def __init__(self, remote: RemoteCheckpoints, tag: str, keep_last: int) -> None:
        self.tag = tag
        self._outcome: Optional[tuple[int, float, list[str]]] = None
        self._error: Optional[BaseException] = None
        # A daemon: a rank that fails, or loses a peer, ends without waiting for it (the bucket takes no half
        # checkpoint for one: its marker goes last).
        self._thread = threading.Thread(target=self._run, args=(remote, keep_last), name=f"upload {tag}", daemon=True)
        self._thread.start()

    def _run(self, remote: RemoteCheckpoints, keep_last: int) -> None:
        try:
            self._outcome = remote.upload(self.tag, keep_last)
        except BaseException as exc:  # for the main thread: a user's error is logged there, a bug raised there
            self._error = exc

    def done(self) -> bool:
        """Whether the upload has ended, well or not."""
        return not self._thread.is_alive()

    def result(self) -> tuple[int, float, list[str]]:
        """Wait for the upload: its files, seconds and the tags pruned in the bucket, or its exception raised here."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._outcome is not None
        return self._outcome
