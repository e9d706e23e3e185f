"""A prepared dataset in object storage: publish a local folder to a bucket, fetch its metadata back.

The order of the upload is what keeps a bucket consistent: every shard of a split before that split's
`index.json`, the tokenizer after both splits, `manifest.json` last. A reader that finds the manifest
finds everything it names, and an interrupted upload leaves no index that points at a missing shard.
`prepare` uploads each part's shards as soon as the part is written (`upload_part`) and the rest at the end
(`upload_rest`), so its staging disk holds the parts in flight, not the dataset.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path

from core.atomic_files import is_temporary
from core.errors import OutputExistsError, StorageError, UserError
from core.object_store import ObjectStore
from core.shared_memory import machine_lock
from data_pipeline.dataset_dir import INDEX, MANIFEST, SPLITS, TOKENIZER
from data_pipeline.shard_record import RECORD

log = logging.getLogger("data_pipeline")


def claim_remote_output(url: str, overwrite: bool) -> ObjectStore:
    """The bucket is reachable and the prefix empty, or, with `overwrite`, emptied (its manifest first, so no reader
    takes a half-replaced prefix for a dataset): done once, before any work and before the first file goes up."""
    store = ObjectStore(url)
    store.check()
    existing = store.list()
    if existing and not overwrite:
        what = "" if MANIFEST in existing else f", no {MANIFEST}: the parts of a prepare that did not finish?"
        raise OutputExistsError(f"'{url}' already holds {len(existing)} object(s) (e.g. {existing[0]}{what}); "
                                "choose another prefix, or pass --overwrite (overwrite=true) to replace them")
    if existing:
        # The manifest in a request of its own: S3 deletes one request's keys in no set order.
        if not (store.delete([MANIFEST] if MANIFEST in existing else [])
                and store.delete([k for k in existing if k != MANIFEST])):
            raise OutputExistsError(f"cannot replace the objects under '{url}' (deleting is only supported for s3://); "
                                    "remove them with your store's tools")
        log.info("deleted the %d object(s) %s held (overwrite)", len(existing), url)
    return store


def release_remote_output(url: str) -> None:
    """Delete what a failed prepare uploaded under `url`, the prefix it claimed empty, so that the fixed rerun needs
    no --overwrite; where that fails too (the store may be what failed), say so."""
    try:
        store = ObjectStore(url)
        keys = store.list()
        if keys and store.delete(keys):
            log.info("removed the %d object(s) this prepare had uploaded to %s", len(keys), url)
        elif keys:
            log.info("warning: %s keeps the %d object(s) this prepare uploaded: remove them with your store's tools",
                     url, len(keys))
    except (UserError, OSError) as exc:
        log.info("warning: what this prepare uploaded to %s could not be removed (%s)", url, exc)


def upload_part(store: ObjectStore, local: Path, part: str) -> int:
    """Upload the shard files of one finished part (`<split>/<part>/`, every split) and remove the local copies, so a
    dataset bound for a bucket never needs the staging disk to hold it whole; return the bytes uploaded.

    The part's own index stays: the split's index is merged from it, and is uploaded after every shard it names."""
    sent = 0
    for split in SPLITS:
        folder = Path(local) / split / part
        for path in sorted(folder.iterdir()) if folder.is_dir() else []:
            if path.name == INDEX or not path.is_file():
                continue
            store.upload(local, path.relative_to(local).as_posix())
            sent += path.stat().st_size
            path.unlink()
    return sent


def upload_rest(local: Path | str, url: str) -> int:
    """Upload what a staging folder still holds: shards, then each split's index, the tokenizer, the manifest last;
    return the file count."""
    local, store = Path(local), ObjectStore(url)
    # Not the verification records: they hold this machine's file times (shard_record.py); nor what a killed writer
    # left under a temporary name.
    files = sorted(p.relative_to(local).as_posix() for p in local.rglob("*")
                   if p.is_file() and p.name != RECORD and not is_temporary(p))
    indexes = [f for f in files if f.endswith(f"/{INDEX}")]
    tokenizer = [f for f in files if f.startswith(f"{TOKENIZER}/")]
    first = [f for f in files if f not in indexes and f not in tokenizer and f != MANIFEST]
    t0 = time.time()
    order = first + indexes + tokenizer + [MANIFEST]
    for i, rel in enumerate(order, 1):
        store.upload(local, rel)
        if i % 50 == 0:
            log.info("uploaded %d / %d files to %s", i, len(order), url)
    log.info("uploaded %d files (%.1f MB) to %s in %.1fs", len(order),
             sum((local / f).stat().st_size for f in order) / 1e6, url, time.time() - t0)
    return len(order)


def upload_dataset(local: Path | str, url: str, overwrite: bool) -> int:
    """Upload a prepared folder whole: shards, then each split's index, the tokenizer, the manifest last; return the
    file count."""
    claim_remote_output(url, overwrite)
    return upload_rest(local, url)


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def shard_keys(local: Path | str) -> list[str]:
    """The keys, relative to the dataset, of the shard files a prepared folder's split indexes name (the compressed
    file where there is one: what a part's upload sends)."""
    keys = []
    for split in SPLITS:
        for shard in json.loads((Path(local) / split / INDEX).read_text())["shards"]:
            keys.append(f"{split}/{(shard.get('zip_data') or shard['raw_data'])['basename']}")
    return keys


def uploaded(url: str, local: Path | str) -> bool:
    """Whether the bucket at `url` holds the dataset of the prepared folder `local`: True when its manifest, the
    upload's last file, has the same bytes there; False when only the rest is to go (no manifest, every shard the
    indexes name in place). Anything else (another dataset's manifest, shards gone) is refused: the rest of the
    upload would not make it whole."""
    store = ObjectStore(url)
    with tempfile.TemporaryDirectory(prefix="manifest-") as scratch:
        try:
            remote = store.download(MANIFEST, Path(scratch) / MANIFEST)
        except StorageError as exc:
            if "not found" not in str(exc):
                raise
        else:
            if _digest(remote) == _digest(Path(local) / MANIFEST):
                return True
            raise OutputExistsError(f"'{url}' holds another dataset than the one published in '{local}': prepare "
                                    "again with a new array (overwrite=true replaces it)")
    listed = set(store.list())
    missing = [key for key in shard_keys(local) if key not in listed]
    if missing:
        raise StorageError(f"'{url}' lacks {len(missing)} shard(s) of the dataset published in '{local}' (e.g. "
                           f"{missing[0]}), whose local copies are gone: prepare again with a new array")
    return False


FETCH_WAIT_S = 600.0  # another fetch into the cache held longer than this is taken for stuck: this one goes on


def fetch_lock_name(cache: Path) -> str:
    """The machine-wide lock (core.shared_memory.machine_lock) of fetches into one cache folder."""
    return "contrastive-pretrain-fetch-" + hashlib.sha256(str(Path(cache).resolve()).encode()).hexdigest()[:16]


def fetch_metadata(url: str, cache: Path) -> None:
    """Bring the manifest, tokenizer and split indexes of a remote dataset into the local cache folder.

    A cache that holds another dataset's index would be read silently by streaming (its local index always
    wins), so each index is compared with the bucket's and replaced, with the shards it names, where they differ.
    """
    store = ObjectStore(url)
    cache.mkdir(parents=True, exist_ok=True)
    # Two jobs on one machine with one cache fetch one at a time: the second finds the first's files, and neither
    # replaces the manifest, or removes a split, under the other. The lock is the machine's (a shared file system's
    # locks may be missing or slow); each fetch downloads to a name of its own besides.
    fd = machine_lock(fetch_lock_name(cache))
    try:
        deadline = time.monotonic() + FETCH_WAIT_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    log.warning("another fetch into %s has held it for %.0f s: fetching beside it", cache, FETCH_WAIT_S)
                    break
                time.sleep(0.2)
        _fetch_metadata(store, url, cache)
    finally:
        os.close(fd)  # and with it the lock


def _fetch_metadata(store: ObjectStore, url: str, cache: Path) -> None:
    fresh = cache / f".{MANIFEST}.remote-{os.getpid()}"
    try:
        store.download(MANIFEST, fresh)
    except StorageError as exc:
        if "not found" not in str(exc):
            raise
        store.check()  # a missing bucket says so
        raise StorageError(f"no prepared dataset at {url} (no {MANIFEST} there); write one with "
                           f"`python -m data_pipeline prepare ... output_dir={url}`") from exc
    manifest_path = cache / MANIFEST
    if manifest_path.is_file() and _digest(manifest_path) != _digest(fresh):
        log.warning("the local cache %s held another dataset than %s: replacing it", cache, url)
        for stale in (*SPLITS, TOKENIZER):  # its shards, indexes and tokenizer all go
            shutil.rmtree(cache / stale, ignore_errors=True)
    fresh.replace(manifest_path)
    # The manifest is uploaded last, so everything it names is listed; the manifest is read (and checked) once, by
    # the caller, from the cache.
    tokenizer = [key for key in store.list(f"{TOKENIZER}/") if key.startswith(f"{TOKENIZER}/")]
    for key in (*tokenizer, *(f"{split}/{INDEX}" for split in SPLITS)):
        store.download(key, cache / key, overwrite=False)
