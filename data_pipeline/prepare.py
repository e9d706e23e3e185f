"""`prepare`: raw text → tokenizer → packed sequences → train/validation MDS shards + manifest.

Three steps, the same whether one process does everything or the tasks of a SLURM job array share it:
1. plan: build the tokenizer, cut the sources into parts (`input_parts`) and, when a weighted
   mixture or a document cap needs it, count each part's documents to decide how many to take;
2. parts: worker processes each read, tokenize, pack and write whole parts (`part_writer`); the
   main process hands out part numbers only, so the work scales with the processes;
3. finish: merge the parts' indexes in part order, write the manifest, rename the folder into place.

Parts depend on the input alone, so the dataset is the same for any number of workers or tasks.
Unlike reading the sources one document at a time, the output is grouped by part (source by
source, file by file) rather than interleaved; the loader shuffles it, and each source contributes
exactly the number of documents that the weighted mixture draws.
"""
from __future__ import annotations

import json
import logging
import math
import os
import re
import shlex
import shutil
import sys
import tempfile
import time
from dataclasses import asdict
from itertools import chain, islice
from pathlib import Path
from typing import Any, Iterator

from core.atomic_files import (check_overwrite, mark_output, prepare_output, publish, remove_debris, write_text_atomic,
                                writer_prefix)
from core.config_io import config_to_dict
from core.errors import ConfigError, InputDataError
from core.input_paths import hub_download_folder
from core.object_store import ObjectStore, is_remote
from data_pipeline.dataset_dir import TOKENIZER, DatasetDir
from data_pipeline.config import PrepareConfig
from data_pipeline.input_parts import Part, plan_parts
from data_pipeline.mds import merge_indexes
from data_pipeline.mixture import mix, plan_takes
from data_pipeline.shard_record import record_dataset
from data_pipeline.part_writer import SPLITS, PartJob, Shared, count_part, done_marker, part_name, write_part
from data_pipeline.remote_dataset import (claim_remote_output, release_remote_output, upload_part, upload_rest,
                                         uploaded)
from data_pipeline.raw_text import ReadStats, iter_part
from data_pipeline.shards import token_dtype, write_manifest
from data_pipeline.worker_pool import WorkerPool, available_cpus

log = logging.getLogger("data_pipeline")
PLAN = "plan.json"
FAILED = "FAILED"
PROGRESS_EVERY_S = 10.0
STAGING_PREFIX = "prepare-staging-"  # in the temporary folder, for a dataset bound for a bucket


def _source_name(cfg: PrepareConfig, i: int) -> str:
    s = cfg.sources[i]
    return f"{s.kind}:{s.path}" + (f" ({s.name})" if s.name else "")


def _names(cfg: PrepareConfig) -> list[str]:
    return [_source_name(cfg, i) for i in range(len(cfg.sources))]


def _tokenizer_documents(cfg: PrepareConfig, parts: list[Part]) -> Iterator[str]:
    """The sources' documents mixed one at a time by weight (the tokenizer trains on the first
    tokenizer.max_training_documents), each source's read as the first documents of every one of its parts: its share
    of the bound spread over all of its files and parts, not drawn from the first ones (a corpus sorted by language,
    topic or date would otherwise train the tokenizer on its beginning alone)."""
    weights = [s.weight for s in cfg.sources]

    def open_source(i: int) -> Iterator[str]:
        own = [p for p in parts if p.source == i]
        per_part = max(1, math.ceil(cfg.tokenizer.max_training_documents * weights[i] / sum(weights) / len(own)))
        return chain.from_iterable(islice(iter_part(cfg.sources[i], p, cfg.encoding_errors, ReadStats()), per_part)
                                   for p in own)

    stream = mix(open_source, weights, cfg.seed, cfg.mixture_stopping, _names(cfg))
    for count, (_, doc) in enumerate(stream):
        if cfg.max_documents and count >= cfg.max_documents:
            return
        yield doc


def _build_tokenizer(cfg: PrepareConfig, parts: list[Part], tok_dir: Path) -> dict[str, int]:
    """Train or copy the tokenizer into `tok_dir`; return the ids the workers need."""
    from data_pipeline.tokenizer import copy_pretrained_tokenizer, save_tokenizer, tokenizer_ids, train_sentencepiece

    if cfg.tokenizer.pretrained:
        copy_pretrained_tokenizer(cfg.tokenizer.pretrained, tok_dir)
        return tokenizer_ids(tok_dir)
    t0 = time.time()
    model = train_sentencepiece(_tokenizer_documents(cfg, parts), cfg.tokenizer, cfg.seed)
    save_tokenizer(model, tok_dir, model_max_length=cfg.seq_len)
    ids = tokenizer_ids(tok_dir)
    log.info("trained a %s tokenizer (vocab %d) in %.1fs", cfg.tokenizer.model_type, ids["vocab_size"], time.time() - t0)
    if ids["vocab_size"] < cfg.tokenizer.vocab_size:  # sentencepiece stops where the corpus has no more pieces
        log.info("warning: tokenizer.vocab_size asked for %d tokens, but the corpus gave %d (every piece it has): "
                 "more text, or a smaller vocab_size, gives the size asked for", cfg.tokenizer.vocab_size,
                 ids["vocab_size"])
    return ids


def _jobs(cfg: PrepareConfig, parts: list[Part], shared: Shared, workers: int) -> tuple[list[PartJob], list[int] | None]:
    """Which documents of each part to write; with a mixture or a cap, counted and drawn by weight."""
    if len(cfg.sources) == 1 and not cfg.max_documents:
        return [PartJob(i, p) for i, p in enumerate(parts)], None
    with WorkerPool(min(workers, len(parts)), shared) as pool:
        counts = pool.map(count_part, parts)
    per_source = [sum(c for c, p in zip(counts, parts) if p.source == s) for s in range(len(cfg.sources))]
    taken = plan_takes(per_source, [s.weight for s in cfg.sources], cfg.seed, cfg.mixture_stopping, _names(cfg),
                       cfg.max_documents)
    jobs = []
    for s, (take, total) in enumerate(zip(taken, per_source)):
        passes, rest = divmod(take, total) if total else (0, 0)
        for i, (part, count) in enumerate(zip(parts, counts)):
            if part.source != s:
                continue
            extra = min(count, rest)
            rest -= extra
            if passes or extra:
                jobs.append(PartJob(i, part, passes, extra))
    return sorted(jobs, key=lambda j: j.index), taken


def _make_plan(cfg: PrepareConfig, out_dir: Path, workers: int) -> dict[str, Any]:
    """Step 1: tokenizer, parts and what to take of each; written to `out_dir/plan.json`."""
    parts, step = plan_parts(cfg)
    ids = _build_tokenizer(cfg, parts, DatasetDir(out_dir).tokenizer)
    jobs, taken = _jobs(cfg, parts, Shared(cfg, DatasetDir(out_dir).tokenizer, ids, out_dir), workers)
    plan = {"config": config_to_dict(cfg), "ids": ids, "parts": len(parts), "taken": taken, "part_bytes": step,
            "jobs": [{**asdict(j), "part": asdict(j.part)} for j in jobs]}
    write_text_atomic(out_dir / PLAN, json.dumps(plan) + "\n")
    return plan


def _load_jobs(plan: dict[str, Any]) -> list[PartJob]:
    return [PartJob(j["index"], Part(**j["part"]), j["passes"], j["extra"]) for j in plan["jobs"]]


def _job_bytes(job: PartJob) -> int:
    return max(0, job.part.stop - job.part.start) if job.part.stop >= 0 else 0


def _write_parts(cfg: PrepareConfig, out_dir: Path, plan: dict[str, Any], jobs: list[PartJob], workers: int) -> None:
    """Step 2: write the given parts with `workers` processes, logging progress."""
    if not jobs:
        return
    shared = Shared(cfg, DatasetDir(out_dir).tokenizer, plan["ids"], out_dir)
    total_bytes = sum(_job_bytes(j) for j in jobs)
    start = last = time.time()
    done = {"parts": 0, "bytes": 0, "uploaded": 0}
    store = ObjectStore(cfg.output_dir) if is_remote(cfg.output_dir) else None  # one client for every part

    def progress(i: int, _result: dict) -> None:
        nonlocal last
        if store is not None:  # the staging disk holds the parts being written, not the whole dataset
            done["uploaded"] += upload_part(store, out_dir, part_name(jobs[i].index))
        done["parts"] += 1
        done["bytes"] += _job_bytes(jobs[i])
        now = time.time()
        if now - last < PROGRESS_EVERY_S and done["parts"] < len(jobs):
            return
        last = now
        fraction = done["bytes"] / total_bytes if total_bytes else done["parts"] / len(jobs)
        eta = (now - start) * (1 - fraction) / fraction if fraction else 0.0
        sent = f", {done['uploaded'] / 1e6:.1f} MB of shards uploaded" if store is not None else ""
        log.info("parts %d/%d written%s, %.1f MB/s of text, ETA %.0fs", done["parts"], len(jobs), sent,
                 done["bytes"] / 1e6 / max(now - start, 1e-9), eta)

    with WorkerPool(min(workers, len(jobs)), shared) as pool:
        # Bound for a bucket, a part's shards stay on the staging disk until `progress` has uploaded them: hand out
        # no more parts than keep the workers busy meanwhile, or fast workers would fill the disk ahead of the upload.
        pool.map(write_part, jobs, on_result=progress, ahead=2 * workers if is_remote(cfg.output_dir) else None)


def _tokenizer_entry(tok_dir: Path, ids: dict[str, Any]) -> dict[str, Any]:
    """What the manifest says of the tokenizer: where, its hash, its size and special ids, its files."""
    from data_pipeline.tokenizer import tokenizer_hash

    return {"path": TOKENIZER, "hash": tokenizer_hash(tok_dir), "vocab_size": ids["vocab_size"],
            "pad_id": ids["pad_id"], "cls_id": ids["cls_id"], "sep_id": ids["sep_id"], "mask_id": ids["mask_id"],
            "special_ids": ids["special_ids"], "files": sorted(p.name for p in tok_dir.iterdir())}


def _finish(cfg: PrepareConfig, out_dir: Path, plan: dict[str, Any], command: str | None, workers: int, tasks: int,
            array_id: str | None = None) -> dict:
    """Step 3: merge the indexes, check the totals, write the manifest (publishing is the caller's)."""
    jobs = _load_jobs(plan)
    results = [json.loads(done_marker(out_dir, j.index).read_text()) for j in jobs]
    for split in SPLITS:
        (out_dir / split).mkdir(exist_ok=True)
        merge_indexes(out_dir / split, [part_name(j.index) for j in jobs])
    # (`unknown_tokens`: absent from the parts an older version wrote, which a requeued array keeps.)
    counts = {s: {k: sum(r["splits"][s].get(k, 0) for r in results)
                  for k in ("sequences", "tokens", "documents", "unknown_tokens")} for s in SPLITS}
    read = {k: sum(r["read"][k] for r in results) for k in ("documents", "characters", "replaced_characters")}
    if read["documents"] == 0:
        raise InputDataError("the corpus is empty: no source yielded any text (" + ", ".join(_names(cfg)) + ")")
    if counts["train"]["sequences"] == 0:
        raise InputDataError("the corpus produced no training sequence")
    per_source = plan["taken"] or [sum(r["read"]["documents"] for r, j in zip(results, jobs) if j.part.source == s)
                                   for s in range(len(cfg.sources))]
    manifest = {
        "format": "contrastive-pretrain/mds-v1",
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": command or " ".join(shlex.quote(a) for a in sys.argv),
        "tokenizer": _tokenizer_entry(DatasetDir(out_dir).tokenizer, plan["ids"]),
        "seq_len": cfg.seq_len,
        "packing": cfg.packing,
        "pair_task": cfg.pair_task if cfg.packing == "pairs" else None,
        "token_dtype": token_dtype(plan["ids"]["vocab_size"]).name,
        "splits": counts,
        "replaced_characters": read["replaced_characters"],
        "sources": [{**config_to_dict(s), "documents": n} for s, n in zip(cfg.sources, per_source)],
        "parts": len(jobs), "part_bytes": plan["part_bytes"], "num_workers": workers, "tasks": tasks,
        "array_id": array_id,  # which job array published it: its late tasks tell it from a dataset it replaces
        "config": config_to_dict(cfg),
    }
    for debris in out_dir.glob("*/.part-*.tmp-*"):  # from workers killed in an earlier run of an array
        shutil.rmtree(debris, ignore_errors=True)
    # The plan and done markers go last: a merge killed before here can simply be run again.
    mark_output(out_dir, DATASET)
    if not is_remote(cfg.output_dir):  # (bound for a bucket, the shards are already there, not here)
        record_dataset(out_dir)  # the shards are where they stay: a launch then hashes only what changes after this
    write_manifest(out_dir, manifest)
    for name in (PLAN, "parts"):
        path = out_dir / name
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    log.info("prepared %d train / %d validation sequences (%d documents, %d tokens, %.1f MB of text, %d part(s))",
             counts["train"]["sequences"], counts["validation"]["sequences"], read["documents"],
             counts["train"]["tokens"] + counts["validation"]["tokens"], read["characters"] / 1e6, len(jobs))
    _say_unknown_tokens(cfg, counts)
    return manifest


UNKNOWN_SHARE_WARNED = 1e-3  # of the tokens: text the tokenizer cannot represent, which the model never sees


def _say_unknown_tokens(cfg: PrepareConfig, counts: dict[str, dict[str, int]]) -> None:
    """Warn when more than UNKNOWN_SHARE_WARNED of the tokens are [UNK], with what would keep that text."""
    unknown = sum(c["unknown_tokens"] for c in counts.values())
    tokens = sum(c["tokens"] for c in counts.values())
    if tokens and unknown / tokens > UNKNOWN_SHARE_WARNED:
        fix = ("a tokenizer made for this text" if cfg.tokenizer.pretrained else
               "tokenizer.byte_fallback=true, or tokenizer.character_coverage=1.0")
        log.info("warning: %d of the %d tokens (%.2f%%) are [UNK], text the tokenizer cannot represent and the model "
                 "never sees; %s keeps it", unknown, tokens, 100 * unknown / tokens, fix)


def _workers(cfg: PrepareConfig) -> int:
    return cfg.num_workers or available_cpus()


DATASET = "dataset"


def _reads(cfg: PrepareConfig) -> list[Path]:
    """The local files and folders preparing reads (sources, a pretrained tokenizer): overwrite never replaces them."""
    paths = [Path(cfg.tokenizer.pretrained)] if cfg.tokenizer.pretrained and Path(cfg.tokenizer.pretrained).exists() else []
    for source in cfg.sources:
        if is_remote(source.path):
            continue
        if source.kind == "hub":  # a hub id, or the folder it was downloaded to
            paths += filter(None, [hub_download_folder(source.path, "hub dataset")])
            continue
        for pattern in source.path.split(","):
            parts = Path(pattern.strip()).parts
            fixed = [p for p in parts[:next((i for i, p in enumerate(parts) if any(c in p for c in "*?[")), len(parts))]]
            if fixed:
                paths.append(Path(*fixed))
    return paths


def _legacy_dataset(folder: Path) -> bool:
    """A dataset prepared before folders carried their marker: its manifest says so."""
    try:
        return json.loads(DatasetDir(folder).manifest.read_text()).get("format", "").startswith("contrastive-pretrain/")
    except (OSError, ValueError, AttributeError):  # no manifest, or not one of ours
        return False


def _local_output(cfg: PrepareConfig, array: bool = False) -> tuple[Path, Path | None]:
    """The local folder the dataset is built in, and the temporary folder to remove afterwards (remote output only)."""
    if not is_remote(cfg.output_dir):
        return Path(cfg.output_dir), None
    if cfg.staging_dir:
        return Path(cfg.staging_dir) / "dataset", None
    if array:
        raise ConfigError(f"output_dir={cfg.output_dir} from a job array needs staging_dir: a folder on a "
                          "filesystem every task of the array shares, where the dataset is built before the upload")
    # Named for this host and process: the next prepare on this host removes what a killed one left (a SIGKILL, an
    # OOM kill; a SIGTERM or Ctrl-C removes its own).
    staging = Path(tempfile.gettempdir())
    remove_debris(staging, STAGING_PREFIX)
    tmp = Path(tempfile.mkdtemp(prefix=writer_prefix(STAGING_PREFIX), dir=staging))  # mkdtemp's tail has no '-'
    return tmp / "dataset", tmp


def _upload(cfg: PrepareConfig, local: Path, temporary: Path | None) -> Path | str:
    """Upload what is left of a finished dataset (the shards went part by part) to `output_dir` when it is a bucket;
    return where the dataset is."""
    if not is_remote(cfg.output_dir):
        return local
    upload_rest(local, cfg.output_dir)
    if temporary is not None:  # a staging_dir the user named keeps the dataset's metadata: a cache for data.remote
        shutil.rmtree(temporary, ignore_errors=True)
    return cfg.output_dir


def prepare(cfg: PrepareConfig, command: str | None = None) -> Path | str:
    """Build the dataset described by `cfg` in this process and its workers (then upload it); return its folder,
    or its URL when `output_dir` is a bucket."""
    final_dir, temporary = _local_output(cfg)
    claimed = False
    try:
        if is_remote(cfg.output_dir):
            # Before hours of tokenizing, not after; with overwrite the old objects go now, before the first part goes
            # up. Inside the try: a refused bucket leaves no staging folder behind.
            claim_remote_output(cfg.output_dir, cfg.overwrite)
            claimed = True
        # Bound for a bucket, the bucket's prefix is what must be new (checked above); the staging copy is replaced.
        tmp_dir = prepare_output(final_dir, cfg.overwrite or is_remote(cfg.output_dir), DATASET, _reads(cfg),
                                 _legacy_dataset)
    except BaseException:
        if temporary is not None:
            shutil.rmtree(temporary, ignore_errors=True)
        raise
    try:
        t0 = time.time()
        workers = _workers(cfg)
        plan = _make_plan(cfg, tmp_dir, workers)
        _write_parts(cfg, tmp_dir, plan, _load_jobs(plan), workers)
        _finish(cfg, tmp_dir, plan, command, workers, tasks=1)
        publish(tmp_dir, final_dir)
        log.info("dataset written in %.1fs with %d worker(s) -> %s", time.time() - t0, min(workers, plan["parts"]), final_dir)
        return _upload(cfg, final_dir, temporary)
    except BaseException:
        shutil.rmtree(tmp_dir, ignore_errors=True)
        if temporary is not None:
            shutil.rmtree(temporary, ignore_errors=True)
        if claimed:  # the parts already uploaded: a failed run leaves nothing behind there either
            release_remote_output(cfg.output_dir)
        raise


# A job array's id becomes part of a folder name: SLURM's are numbers; letters, '.', '_' and '-' are allowed too.
ARRAY_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")


def staging_dir(cfg: PrepareConfig, array_id: str) -> Path:
    """Where the tasks of one job array build the dataset together (kept across requeues)."""
    if not isinstance(array_id, str) or not ARRAY_ID.fullmatch(array_id):
        raise ConfigError(f"--array-id {array_id!r} is not a plain name (letters, digits, '.', '_', '-'; "
                          "SLURM_ARRAY_JOB_ID is one): it names the array's staging folder")
    final_dir, _ = _local_output(cfg, array=True)
    return final_dir.with_name(f".{final_dir.name}.array-{array_id}")


def _attempt() -> str:
    """Which run of the array this is: SLURM counts requeues, so a requeued array ignores the last run's state."""
    return os.environ.get("SLURM_RESTART_COUNT", "0")


def _published_by(final_dir: Path, array_id: str, cfg: PrepareConfig) -> bool:
    """Whether `final_dir` holds the dataset this job array published (not an earlier one it is to replace): its id,
    and its config (job ids start again on a new SLURM controller, and --array-id may be given by hand)."""
    if not DatasetDir(final_dir).is_complete():
        return False
    try:
        manifest = json.loads(DatasetDir(final_dir).manifest.read_text())
        return manifest.get("array_id") == array_id and _same_config(manifest.get("config", {}), config_to_dict(cfg))
    except (OSError, ValueError, AttributeError):
        return False


def _await_plan(staging: Path, final_dir: Path, timeout_s: float, array_id: str,
                cfg: PrepareConfig) -> dict[str, Any] | None:
    """The plan task 0 wrote (None when this array already published the dataset), or an error when task 0 failed.
    A dataset already in `final_dir` from before is the one task 0 replaces (--overwrite) or refuses: not a reason to
    stop, which would leave this task's parts unwritten and the array ending with the old dataset in place."""
    deadline = time.time() + timeout_s
    while not (staging / PLAN).is_file():
        try:
            attempt, _, message = (staging / FAILED).read_text().partition("\n")
        except FileNotFoundError:  # none, or a requeued task 0 removed it since
            attempt = message = ""
        if attempt and attempt == _attempt():
            raise InputDataError(message.strip())  # task 0's plan or the merge failed
        if not staging.exists() and _published_by(final_dir, array_id, cfg):
            return None  # the other tasks finished and published before this one started
        if time.time() > deadline:
            raise InputDataError(f"no plan from task 0 in '{staging}' after {timeout_s:.0f}s; is task 0 running?")
        time.sleep(1.0)
    return json.loads((staging / PLAN).read_text())


def _same_config(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Equal in everything the dataset depends on (the number of workers per task is not)."""
    return {k: v for k, v in a.items() if k != "num_workers"} == {k: v for k, v in b.items() if k != "num_workers"}


def _differences(planned: dict[str, Any], mine: dict[str, Any]) -> str:
    """The keys `_same_config` compares that differ, each with both values."""
    keys = sorted(k for k in set(planned) | set(mine) if k != "num_workers" and planned.get(k) != mine.get(k))
    return ", ".join(f"{k}: planned {planned.get(k)!r}, this task {mine.get(k)!r}" for k in keys)


def _already_published(cfg: PrepareConfig, task: int, tasks: int, final_dir: Path) -> Path | str | None:
    """The end of a task that starts after this array published the dataset (a requeued array's): nothing to write,
    task 0 included (it would take the dataset for an older one and refuse it, or, bound for a bucket with
    --overwrite, empty the bucket). A bucket's copy is in place once the bucket holds its manifest, the upload's last
    file: an upload that failed after the local copy was published (every shard there, no manifest) is finished by
    task 0, which returns the URL."""
    if is_remote(cfg.output_dir) and not uploaded(cfg.output_dir, final_dir):
        if task != 0:
            log.info("task %d/%d: the dataset is published in %s; task 0 finishes its upload", task, tasks, final_dir)
            return None
        log.info("task 0/%d: the dataset is published in %s but its upload to %s did not end: uploading the rest",
                 tasks, final_dir, cfg.output_dir)
        return _upload(cfg, final_dir, None)
    log.info("task %d/%d: the dataset is already published -> %s", task, tasks, final_dir)
    return None


def _record_failure(staging: Path, message: str) -> None:
    """Tell the tasks waiting on this run's plan to stop with `message`; where even that cannot be written (the disk
    that failed the work), say so and leave the work's own error to go on."""
    try:
        write_text_atomic(staging / FAILED, f"{_attempt()}\n{message}\n")
    except OSError as exc:
        log.warning("the array's failure could not be recorded in '%s' (%s): its other tasks wait for "
                    "plan_timeout_s", staging, exc)


def _merging() -> str:
    """This run's merge lock, a folder in the staging folder: a requeued run takes a new one, so a merge killed in an
    earlier run blocks nothing."""
    return f"merging-{_attempt()}"


def _merge(cfg: PrepareConfig, staging: Path, final_dir: Path, plan: dict[str, Any], command: str | None,
           workers: int, task: int, tasks: int, array_id: str) -> Path | str | None:
    """The task that ended last merges and publishes, one per run of the array even when several end at once; where
    the dataset is, else None."""
    try:
        (staging / _merging()).mkdir()
    except (FileExistsError, FileNotFoundError):  # another task merges, or has already published
        return None
    (staging / FAILED).unlink(missing_ok=True)  # an earlier run's failed merge: not to be published with the dataset
    try:
        _finish(cfg, staging, plan, command, workers, tasks, array_id)
        check_overwrite(final_dir, cfg.overwrite or is_remote(cfg.output_dir), DATASET, _reads(cfg), _legacy_dataset)
        publish(staging, final_dir)
    except Exception as exc:  # a late task 0 finds no plan (the merge removes it) and waits for one: it must stop
        if staging.is_dir():
            _record_failure(staging, f"task {task} of this array could not merge the parts: {type(exc).__name__}: {exc}")
        raise
    for leftover in final_dir.glob("merging-*"):
        leftover.rmdir()
    log.info("task %d/%d merged %d parts -> %s", task, tasks, len(_load_jobs(plan)), final_dir)
    return _upload(cfg, final_dir, None)


def prepare_task(cfg: PrepareConfig, task: int, tasks: int, array_id: str, command: str | None = None,
                 plan_timeout_s: float = 24 * 3600.0) -> Path | str | None:
    """One task of a job array: task 0 plans; every task writes parts task, task + tasks, ...; the last one to end
    merges and publishes. Returns the dataset folder from the task that published it, else None."""
    if not 0 <= task < tasks:
        raise ConfigError(f"--task must be in 0..--tasks - 1, got task {task} of {tasks}")
    final_dir, staging = _local_output(cfg, array=True)[0], staging_dir(cfg, array_id)
    workers = _workers(cfg)
    if not staging.exists() and _published_by(final_dir, array_id, cfg):
        return _already_published(cfg, task, tasks, final_dir)
    # Not while this run's merge is under way: it removes the plan before it publishes the dataset.
    if task == 0 and not (staging / PLAN).is_file() and not (staging / _merging()).exists():
        if not staging.exists() and _published_by(final_dir, array_id, cfg):  # the merge published since the check
            return _already_published(cfg, task, tasks, final_dir)  # above: in this order no window is left
        try:
            check_overwrite(final_dir, cfg.overwrite or is_remote(cfg.output_dir), DATASET, _reads(cfg), _legacy_dataset)
            if is_remote(cfg.output_dir):  # before the plan: no task uploads a part before the prefix is claimed
                claim_remote_output(cfg.output_dir, cfg.overwrite)
            staging.mkdir(parents=True, exist_ok=True)
            (staging / FAILED).unlink(missing_ok=True)
            _make_plan(cfg, staging, workers)
        except Exception as exc:  # any failure: the waiting tasks must stop too, not hold their nodes for a day
            staging.mkdir(parents=True, exist_ok=True)
            _record_failure(staging, f"task 0 of this array could not plan the dataset: {type(exc).__name__}: {exc}")
            raise
    plan = _await_plan(staging, final_dir, plan_timeout_s, array_id, cfg)
    if plan is None:
        log.info("task %d/%d: the dataset is already published -> %s", task, tasks, final_dir)
        return None
    if not _same_config(plan["config"], config_to_dict(cfg)):
        raise ConfigError(f"this task's config differs from the one task 0 planned '{staging}' with "
                          f"({_differences(plan['config'], config_to_dict(cfg))}); give every task the same")
    jobs = _load_jobs(plan)
    mine = [j for k, j in enumerate(jobs) if k % tasks == task and not done_marker(staging, j.index).is_file()]
    log.info("task %d/%d: %d of %d parts to write (the others are done or belong to other tasks)", task, tasks, len(mine), len(jobs))
    _write_parts(cfg, staging, plan, mine, workers)
    missing = [j.index for j in jobs if not done_marker(staging, j.index).is_file()]
    if missing:
        log.info("task %d/%d done; %d part(s) still being written by other tasks", task, tasks, len(missing))
        return None
    return _merge(cfg, staging, final_dir, plan, command, workers, task, tasks, array_id)
