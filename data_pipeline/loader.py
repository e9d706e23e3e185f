"""Streaming loader over prepared MDS shards: deterministic elastic order, resumable state, padded batches.

Determinism: the global sample order depends only on the shuffle seed and algorithm and on
`num_canonical_nodes`, which is fixed in the config, so 1, 2 or 4 ranks walk the same global
order. `StreamingDataLoader.state_dict()` records how far that order was consumed, and a loader
given that state resumes mid-epoch without reading the skipped samples.

Batches are masked and padded in the loader's workers by the collate of data_pipeline/batches.py
(`MaskingCollate`, seeded per sample, so a resumed run on any number of nodes masks the same way), and
cross to the training process packed (`PackedBatch`).

Remote data: with `remote: s3://bucket/dataset` (or gs://, oci://, ...), shards are fetched on
demand by mosaicml-streaming into `path` (a local cache) and checked against their xxh64 hashes;
the manifest, tokenizer and indexes are fetched when training starts. A shard that fails its hash
or cannot be fetched stops the run with one line naming it (tested against an S3-compatible server).
"""
from __future__ import annotations

import contextlib
import fcntl
import functools
import math
import os
import random
import re
import sys
import time
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Literal, Mapping, Optional, Union

import torch

from core import distributed as dist
from core.config_io import check_range
from core.errors import ConfigError, MissingFileError
from core.seeding import MAX_SEED
from core.process_life import terminal_signals_held
from core.shared_memory import (SHM_DIR, hold_while_alive, machine_lock, owner_gone, remove_machine_lock,
                                remove_unheld_segments)
from core.streaming_import import require_streaming
from data_pipeline.batches import PackedBatch, PackingCollate
from data_pipeline.dataset_dir import INDEX
from data_pipeline.loader_worker import StartWatch, start_worker
from data_pipeline.worker_pool import available_cpus

if TYPE_CHECKING:  # streaming is imported when a loader is built (require_streaming)
    from streaming import StreamingDataLoader, StreamingDataset


@dataclass
class LoaderConfig:
    """Where the prepared data is and how it is shuffled and read."""

    path: str = "runs/data"
    # Optional remote copy of the prepared folder; `path` is then the local cache.
    remote: Optional[str] = None
    shuffle: bool = True
    shuffle_seed: int = 1234
    shuffle_algo: str = "py1e"
    # Fixed, so the global sample order does not depend on how many nodes read it.
    num_canonical_nodes: int = 1
    # Loader processes per rank that read, pad and mask batches off the training process (0: in it). auto: 1 on a
    # CPU (the other cores train), up to 4 beside a GPU (`loader_workers`).
    num_workers: Union[Literal["auto"], int] = "auto"
    # Check local shard files against their recorded hashes when training starts: those not checked as they are
    # now (data_pipeline/shard_record.py; a dataset prepared here is recorded as written, so a launch hashes nothing).
    verify_hashes: bool = True
    # Remove, at start, the streaming segments a killed run left: those no process holds, of a prefix whose lock no
    # live run holds. They would otherwise stay in /dev/shm for good and, with `remote` set, block the next run that
    # reuses its local cache ("Reused local directory"). Live runs of this tool on the machine keep theirs, in any
    # container that shares its /dev/shm (core/shared_memory.py); another program's streaming datasets in another
    # container are out of sight: where one runs, set this false.
    clean_stale_shared_memory: bool = True
    # A loader worker that has not started this long after its fork is killed and the attempt ends with exit 76
    # (data_pipeline/loader_worker.py, StartWatch): a fork can deadlock before the worker runs.
    worker_start_timeout_s: float = 60.0

    def validate(self) -> None:
        """Refuse a worker count, a shuffle or a canonical node count no loader can have, before anything starts."""
        if self.num_workers != "auto" and self.num_workers < 0:
            raise ConfigError(f"config key 'data.num_workers' must be auto or >= 0, got {self.num_workers}")
        if not (self.worker_start_timeout_s > 0 and math.isfinite(self.worker_start_timeout_s)):
            raise ConfigError(f"config key 'data.worker_start_timeout_s' must be a finite number > 0, got "
                              f"{self.worker_start_timeout_s}")
        # 0 would let streaming take the physical node count: the order would then depend on the cluster.
        check_range("data", self, ("num_canonical_nodes",), at_least=1)
        check_range("data", self, ("shuffle_seed",), at_least=0, at_most=MAX_SEED)
        if self.shuffle_algo != LoaderConfig.shuffle_algo:  # the default is streaming's own; others are looked up
            require_streaming()
            from streaming.base.shuffle import algos

            if self.shuffle_algo not in algos:
                raise ConfigError(f"config key 'data.shuffle_algo' must be one of streaming's {', '.join(sorted(algos))}, "
                                  f"got {self.shuffle_algo!r}")


@functools.cache
def _unpacking_loader_class():
    StreamingDataLoader = require_streaming().StreamingDataLoader

    class UnpackingStreamingDataLoader(StreamingDataLoader):
        """A StreamingDataLoader that yields the dicts its workers packed (PackingCollate), and whose workers are
        watched as they start (`start_watch`, set by build_loader when it has workers)."""

        start_watch: Optional[StartWatch] = None

        def _get_batch_size(self, batch: Any) -> int:
            return batch.rows if isinstance(batch, PackedBatch) else super()._get_batch_size(batch)

        def _get_iterator(self):
            if self.start_watch is None:  # no workers
                return super()._get_iterator()
            # A Ctrl-C or hang-up reaches the workers too: held until each, in `start_worker`, leaves it to the rank.
            with terminal_signals_held():
                iterator = super()._get_iterator()  # forks the workers
            if getattr(iterator, "_workers", None):
                self.start_watch.watch(w.pid for w in iterator._workers)
            return iterator

        def __iter__(self):
            for batch in super().__iter__():
                yield batch.unpack() if isinstance(batch, PackedBatch) else batch

        def state_dict(self) -> Optional[dict[str, Any]]:
            state = super().state_dict()
            if state is not None:  # streaming's state lacks them, and the order resumes only with them as they were
                state.update(shuffle=self.dataset.shuffle, shuffle_algo=self.dataset.shuffle_algo)
            return state

    return UnpackingStreamingDataLoader


def _indexed_dataset_class():
    StreamingDataset = require_streaming().StreamingDataset

    class IndexedStreamingDataset(StreamingDataset):
        """A StreamingDataset whose samples carry their global index as `sample_id` and the pass as `epoch`.

        The index is the sample's position in the split, so it stays unique when several
        prepare workers' shards are merged, and it identifies samples across resumes. The epoch is
        streaming's own (saved in the loader state), read where each worker starts its pass.
        """

        _epoch = 0

        def _resume_incr_epoch(self) -> tuple[int, int]:
            epoch, sample_in_epoch = super()._resume_incr_epoch()
            self._epoch = epoch
            return epoch, sample_in_epoch

        def get_item(self, sample_id: int, retry: int = 7) -> Any:
            item = super().get_item(sample_id, retry)
            item["sample_id"] = sample_id
            item["epoch"] = self._epoch
            return item

        def __iter__(self):
            # When its download thread fails, streaming ends the epoch early without a word (or raises a bare
            # RuntimeError on the next pass): a truncated epoch would pass for a whole one. Raise the reason instead.
            try:
                yield from super().__iter__()
            except RuntimeError as exc:
                if _SHARD_FAILURES:
                    raise _SHARD_FAILURES[-1] from exc
                raise
            if _SHARD_FAILURES:
                raise _SHARD_FAILURES[-1]
            if getattr(self, "_event", None) is not None and self._event.is_set():
                raise RuntimeError("streaming's shard download thread failed (its traceback is above); the epoch "
                                   "ended early")

    return IndexedStreamingDataset


# The failures of this process's shard downloads: streaming's download thread ends with a bare
# RuntimeError in the iterating thread, so the reason is kept here to be raised there instead.
_SHARD_FAILURES: list[Exception] = []


def _guarded_stream_class():
    Stream = require_streaming().Stream

    class GuardedStream(Stream):
        """A remote stream whose failed shard (a hash mismatch, a failed download) is one line naming the shard."""

        def prepare_shard(self, shard) -> int:
            try:
                return super().prepare_shard(shard)
            except Exception as exc:
                error = shard_failure(exc, self.remote or "", self.local)
                if error is None:
                    raise
                _SHARD_FAILURES.append(error)
                raise error from exc

    return GuardedStream


def shard_failure(exc: Exception, remote: str, local: str) -> Optional[Exception]:
    """The user-facing error for a shard that could not be brought into the cache, None for a bug."""
    from core.object_store import describe, join
    from data_pipeline.shards import CorruptShardError

    message = str(exc)
    if isinstance(exc, ValueError) and message.startswith("Checksum failure: "):
        named = message.split(": ", 1)[1].strip()  # streaming names the local file
        # streaming joins the stream's local folder, relative when data.path is, and the shard's name.
        basename = os.path.relpath(os.path.abspath(named), os.path.abspath(local))
        (Path(local) / basename).unlink(missing_ok=True)  # else the next run would read the damaged copy again
        return CorruptShardError(f"shard '{join(remote, basename)}' does not match the hash in its index (damaged in "
                                 "the store or in transit); the local copy was removed. Upload a good copy (prepare "
                                 "again) or set data.verify_hashes=false to read it unchecked")
    from core.errors import StorageError, no_room_error

    room = no_room_error(exc)  # the cache's disk or quota is full: the user's to free, not a bug
    if room is not None:
        return room
    line = describe(exc, join(remote, "")) if remote else None
    if line is None:
        return None

    return StorageError(f"fetching a shard: {line}")


@contextlib.contextmanager
def shared_memory_registration() -> Iterator[None]:
    """Hold a machine-wide lock (local leaders) while streaming picks and creates its shared memory.

    streaming has every rank scan for the first free prefix, then the local leader creates it and
    the other ranks open it: two runs starting together on one machine (two jobs on a node, two
    test workers) pick the same prefix (FileExistsError), or a rank scans while another run's leader
    is creating and so picks another prefix than its own leader ("shared memory registered does not
    match local leader"). Every local leader takes its machine's lock before any rank goes on
    (`_lock_every_machine`). Only leaders lock, so a run's own ranks never wait on each other for it.
    Another run's segments can still vanish (a run that ends) between two ranks' scans, so every rank
    takes its local leader's scan instead of its own (`_leaders_shm_prefix`).
    """
    require_streaming()
    import streaming.base.dataset as streaming_dataset

    # In /dev/shm, beside the segments it guards: a job's own TMPDIR (SLURM's per-job /tmp) would hide it from the
    # next job.
    lock = machine_lock("contrastive_pretrain_streaming.lock") if is_local_leader() else None
    own = streaming_dataset.get_shm_prefix
    try:
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            _lock_every_machine(lock)
            streaming_dataset.get_shm_prefix = _leaders_shm_prefix
        elif lock is not None:
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield
    finally:
        streaming_dataset.get_shm_prefix = own
        if lock is not None:
            fcntl.flock(lock, fcntl.LOCK_UN)
            os.close(lock)


def _lock_every_machine(lock: Optional[int]) -> None:
    """Every local leader of the run holds its machine's lock (`lock`; None on the other ranks), or none does.

    A leader that blocked on its lock while holding another machine's would deadlock two multi-node runs that share
    two machines and took them in opposite orders. So each leader only tries; unless all succeeded, those that did
    let go, and all try again after a random pause.
    """
    pause = random.Random()  # not the seeded global generator: two runs must not pause alike
    while True:
        held = False
        if lock is not None:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                held = True
            except BlockingIOError:
                pass
        if all(dist.all_gather_object(held or lock is None)):
            return
        if held:
            fcntl.flock(lock, fcntl.LOCK_UN)
        time.sleep(pause.uniform(0.01, 0.2))


def _leaders_shm_prefix(streams_local: list[str], streams_remote: list, world, retry: int = 100):
    """streaming's `get_shm_prefix`, with each rank using its local leader's scan for a free prefix (gathered from
    every rank) where streaming has each rank scan on its own."""
    from streaming.base.shared import prefix

    scan = prefix._check_and_find_retrying
    leader = world.rank - world.rank_of_node

    def leaders_scan(local: list[str], remote: list, shm_name: str, retry: int) -> int:
        mine = scan(local, remote, shm_name=shm_name, retry=retry) if world.is_local_leader else -1
        scans: list[Any] = [None] * torch.distributed.get_world_size()
        torch.distributed.all_gather_object(scans, mine)
        return scans[leader]

    prefix._check_and_find_retrying = leaders_scan
    try:
        return prefix.get_shm_prefix(streams_local, streams_remote, world, retry)
    finally:
        prefix._check_and_find_retrying = scan


def clean_stale_shared_memory(cfg: LoaderConfig) -> list[str]:
    """Remove the streaming segments killed runs left on this machine and no process holds (see LoaderConfig), and
    the prefix lock files of runs that ended; the segments' names removed (by the local leader; the other ranks wait
    for it and get none)."""
    if not cfg.clean_stale_shared_memory:
        return []
    require_streaming()
    from streaming.base.constant import SHM_TO_CLEAN

    # streaming's own clean-up unlinks every prefix's segments, a live run's beside this one too: its loader
    # workers then fail to attach, or its resume state is lost and its epoch silently restarts.
    pattern = re.compile(rf"\d{{6}}_(?:{'|'.join(map(re.escape, SHM_TO_CLEAN))})")
    removed: list[str] = []
    with shared_memory_registration():  # no other run's leader is creating its segments meanwhile
        if is_local_leader():
            names = [path.name for path in SHM_DIR.glob("*")]
            with contextlib.ExitStack() as stack:
                # A live run's prefix lock is held (in any process namespace): its segments stay, even one that no
                # process maps for a moment while streaming hands it from one process to another. The locks of the
                # prefixes with segments are held across the one scan of /proc (a few: the live runs', a killed one's).
                prefixes = {n[:6] for n in names if pattern.fullmatch(n)}
                dead = {p for p in prefixes if stack.enter_context(owner_gone(_prefix_lock(int(p))))}
                removed = remove_unheld_segments(lambda name: bool(pattern.fullmatch(name)) and name[:6] in dead)
                for p in dead:
                    remove_machine_lock(_prefix_lock(int(p)))
            # The lock files of runs that ended well, their segments gone with them (not reported: each run leaves one
            # per dataset, which a node's /dev/shm would collect for ever), one at a time: there may be thousands.
            # Removed while held, and while this leader holds the registration lock: a run opens one only while its
            # local leader holds that lock, or once the lock file is held by its leader (build_dataset).
            for p in {m.group(1) for m in map(PREFIX_LOCK.fullmatch, names) if m} - prefixes:
                with owner_gone(_prefix_lock(int(p))) as gone:
                    if gone:
                        remove_machine_lock(_prefix_lock(int(p)))
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.barrier()  # no rank scans for its prefix before the leader's clean-up is done
    return removed


def check_partition(num_canonical_nodes: int, world: int, ranks_per_node: int, batch_size: int,
                    initial_physical_nodes: Optional[int] = None) -> None:
    """Refuse, in one line naming data.num_canonical_nodes, an order this job's nodes cannot share (neither count
    divides the other; after a resume on another node count, a batch the first count's devices cannot split):
    streaming would stop at the first batch, inside a loader worker, after the engine was built. The conditions are
    those of streaming's `relaxed` partition (the dataset's default), checked without building one."""
    ncn, nodes = num_canonical_nodes, max(1, world // max(1, ranks_per_node))
    divides = ncn % nodes == 0 or nodes % ncn == 0
    problem = advice = ""
    if initial_physical_nodes in (None, nodes) or divides:
        if not divides:
            problem = ("Either canonical or physical nodes must be evenly divisible by the other (streaming's "
                       "partition)")
            advice = "give a multiple or a divisor of the node count (1, the default, fits every count)"
    elif ncn % initial_physical_nodes and initial_physical_nodes % ncn:  # the first launch's partition, redrawn
        problem = ("Either canonical or physical nodes must be evenly divisible by the other (streaming's partition, "
                   f"over the {initial_physical_nodes} node(s) the run started on)")
        advice = "resume on the node count the run started on"
    elif (nodes * ranks_per_node * batch_size) % (initial_physical_nodes * ranks_per_node):
        problem = (f"A global batch size of {nodes * ranks_per_node * batch_size} is not evenly divisible by the "
                   f"initial total number of devices of {initial_physical_nodes * ranks_per_node} (streaming's "
                   "relaxed partition)")
        advice = "resume on a node count whose ranks' batches the first count's ranks divide, or on the first count"
    if problem:
        started = (f" (the run started on {initial_physical_nodes})" if initial_physical_nodes not in (None, nodes)
                   else "")
        raise ConfigError(f"data.num_canonical_nodes={ncn} does not fit {nodes} node(s) of {ranks_per_node} "
                          f"rank(s){started}: {problem}; {advice}")


def check_loader_partition(loader: Any) -> None:
    """`check_partition` for a training loader, as it stands after any resume, on this job's ranks."""
    dataset = loader.dataset
    check_partition(dataset.num_canonical_nodes, dist.world_size(), dist.local_world_size(), dataset.batch_size,
                    dataset.initial_physical_nodes)


def build_dataset(cfg: LoaderConfig, split: str, batch_size: int, shuffle: Optional[bool] = None) -> StreamingDataset:
    """A StreamingDataset over one split of a prepared dataset."""
    split_dir = Path(cfg.path) / split
    if not cfg.remote and not (split_dir / INDEX).is_file():
        raise MissingFileError(f"no '{split}' split in '{cfg.path}' (missing {split_dir / INDEX})")
    with shared_memory_registration():
        where = {"local": str(split_dir)}
        if cfg.remote:
            where = {"streams": [_guarded_stream_class()(remote=f"{cfg.remote.rstrip('/')}/{split}", local=str(split_dir))]}
        try:
            dataset = _indexed_dataset_class()(
                **where,
                batch_size=batch_size,
                shuffle=cfg.shuffle if shuffle is None else shuffle,
                shuffle_seed=cfg.shuffle_seed,
                shuffle_algo=cfg.shuffle_algo,
                num_canonical_nodes=cfg.num_canonical_nodes,
                validate_hash="xxh64" if cfg.remote and cfg.verify_hashes else None,
            )
        except ValueError as exc:
            if not str(exc).startswith("Reused local directory"):
                raise
            # streaming keeps one live reader per remote cache on a machine: another run's downloads would land in it.
            raise ConfigError(f"data.path '{cfg.path}' is the cache of another live run on this machine that reads "
                              f"from the bucket too; give each run its own data.path") from None
        # Inside the registration: no run's clean-up sees these segments before their owner's lock is held, and none
        # removes the lock file between this rank's open and its lock (clean_stale_shared_memory).
        hold_while_alive(_prefix_lock(dataset._shm_prefix_int))
    _SHARED_MEMORY_PREFIXES.add(dataset._shm_prefix_int)
    _DATASETS.add(dataset)
    return dataset


def _prefix_lock(prefix: int) -> str:
    """The lock file a live run holds for its streaming prefix (core.shared_memory.hold_while_alive)."""
    return f"contrastive_pretrain_streaming_{prefix:06}.lock"


PREFIX_LOCK = re.compile(r"contrastive_pretrain_streaming_(\d{6})\.lock")  # `_prefix_lock`'s names


# streaming's shared-memory prefixes of the datasets this process opened, and those datasets (release_shared_memory).
_SHARED_MEMORY_PREFIXES: set[int] = set()
_DATASETS: "weakref.WeakSet[StreamingDataset]" = weakref.WeakSet()


def release_shared_memory() -> list[str]:
    """Unlink the shared memory of every dataset this process opened; returns the names removed.

    streaming unlinks it at exit, in the process that created it. A rank that leaves without its exit handlers (a
    lost peer: tearing down a broken process group can hang) calls this instead. Every rank of the node leaves then,
    so whichever gets here first removes the node's segments for all, also those of a local leader that was killed.
    """
    removed = []
    for prefix in sorted(_SHARED_MEMORY_PREFIXES):
        for path in sorted(SHM_DIR.glob(f"{prefix:06}_*")):
            try:
                path.unlink()
                removed.append(path.name)
            except FileNotFoundError:  # another rank of the node was first
                continue
    _forget_created()
    return removed


def _forget_created() -> None:
    """Tell this process's resource tracker that the segments it created and that are gone (unlinked here or by
    another rank of the node, which may come first) are gone: once the process ends without streaming's exit handler,
    the tracker would report each as leaked (a warning per name) and fail to unlink it again. Only the creator
    registers a segment (streaming keeps attaching processes out of the tracker)."""
    memory = sys.modules.get("streaming.base.shared.memory")
    if memory is None:
        return
    from multiprocessing import resource_tracker

    for wrapper in _shared_memory_of(list(_DATASETS), memory.SharedMemory):
        for segment in list(wrapper.created_shms):
            if not (SHM_DIR / segment.name).exists():
                wrapper.created_shms.remove(segment)  # once: the tracker refuses a name it no longer has
                resource_tracker.unregister(segment._name, "shared_memory")


def _shared_memory_of(datasets: list, kind: type) -> Iterator[Any]:
    """streaming's SharedMemory objects that `datasets` hold: in their fields, or in the fields of the shared arrays,
    scalars and barriers they hold (`_shared_barrier._arr.shm`), three levels at most."""
    seen: set[int] = set()

    def walk(obj: Any, depth: int) -> Iterator[Any]:
        if id(obj) in seen or depth > 3:
            return
        seen.add(id(obj))
        if type(obj) is kind:
            yield obj
            return
        for value in getattr(obj, "__dict__", {}).values():
            if depth == 0 or type(value).__module__.startswith("streaming."):
                yield from walk(value, depth + 1)

    for dataset in datasets:
        yield from walk(dataset, 0)


def loader_workers(requested: Union[str, int], gpu: bool, cpus: int) -> int:
    """Loader processes per rank for `data.num_workers` (`auto`: 1 on a CPU, up to 4 beside a GPU), given the CPUs
    this rank may use.

    Beside a GPU one worker masks fewer sequences a second than a base-size encoder trains on (BENCHMARKS.md, "BERT-base
    on one GPU"), so several run. On a CPU the training process needs the cores, and one worker keeps pace with it.
    """
    if requested != "auto":
        return int(requested)
    return max(1, min(4, cpus - 1)) if gpu else 1


def cpus_per_rank(cpus: Optional[int] = None, local_ranks: Optional[int] = None,
                  environ: Optional[Mapping[str, str]] = None) -> int:
    """The CPUs this rank may use: its task's own when srun started one task per rank and pinned it to
    --cpus-per-task, else its share of the CPUs this process may use (the ranks a launcher starts inherit one
    affinity). Unset arguments are read from this process."""
    cpus = available_cpus() if cpus is None else cpus
    local_ranks = dist.local_world_size() if local_ranks is None else local_ranks
    environ = os.environ if environ is None else environ
    per_task = environ.get("SLURM_CPUS_PER_TASK", "")
    if dist.rank_is_slurm_task(environ) and per_task.isdigit() and cpus <= int(per_task):
        return max(1, cpus)
    return max(1, cpus // max(1, local_ranks))


def build_loader(cfg: LoaderConfig, split: str, batch_size: int, collate_fn: Callable, shuffle: Optional[bool] = None,
                 pin_memory: bool = False) -> StreamingDataLoader:
    """A StreamingDataLoader whose `state_dict()` resumes mid-epoch without replaying batches.

    `collate_fn` is the per-batch transform its workers run (a MaskingCollate); `pin_memory` (GPU) lets the training
    process copy batches to the device with `non_blocking`.
    """
    dataset = build_dataset(cfg, split, batch_size, shuffle)
    workers = loader_workers(cfg.num_workers, torch.cuda.is_available(), cpus_per_rank())
    watch = StartWatch(cfg.worker_start_timeout_s) if workers > 0 else None
    loader = _unpacking_loader_class()(
        dataset,
        batch_size=batch_size,
        collate_fn=PackingCollate(collate_fn) if workers > 0 else collate_fn,
        num_workers=workers,
        pin_memory=pin_memory,
        # Every rank must take the same number of steps, or the collectives hang.
        drop_last=True,
        persistent_workers=False,
        # Without its own generator, each new iterator draws a seed from the global torch RNG and
        # shifts every dropout mask after it; a resumed run creates its iterator at another point.
        generator=torch.Generator().manual_seed(cfg.shuffle_seed),
        worker_init_fn=functools.partial(start_worker, os.getpid(), watch.started_fd) if watch else None,
    )
    loader.start_watch = watch
    if watch is not None:  # its pipe goes with the loader: a process may build loaders again and again
        weakref.finalize(loader, watch.close)
    return loader


def is_local_leader() -> bool:
    """True on one process per node (streaming's and torchrun's LOCAL_RANK)."""
    return int(os.environ.get("LOCAL_RANK", "0")) == 0
