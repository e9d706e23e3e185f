"""Parallel prepare equals serial prepare; corrupt shards are caught and named."""
import json
import os
from collections import Counter
from pathlib import Path

import pytest
from conftest import PROCESS_ENV, TINY_MODEL, launch_ranks, python_process, run_cli

from core.config_io import load_config
from core.errors import ConfigError
from data_pipeline.cli import main as data_main
from data_pipeline.config import PrepareConfig
from data_pipeline.prepare import prepare
from data_pipeline.shards import CorruptShardError, verify_split
from data_pipeline.dataset_dir import MANIFEST, DatasetDir
from data_pipeline.shard_record import RECORD
from pretrain.run_dir import RunDir


def _tokens(out, specials):
    from streaming import StreamingDataset

    from data_pipeline.loader import shared_memory_registration

    counts = {}
    for split in ("train", "validation"):
        with shared_memory_registration():  # other test workers register datasets at the same time
            ds = StreamingDataset(local=str(out / split), shuffle=False, batch_size=1)
        c = Counter()
        for i in range(ds.num_samples):
            c.update(int(t) for t in ds[i]["input_ids"] if int(t) not in specials)
        counts[split] = c
    return counts


def _files(root: Path) -> dict[str, bytes]:
    """Every file's bytes but the manifest (timings) and the verification record (this machine's mtimes)."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file() and p.name not in (MANIFEST, RECORD)}


def test_any_number_of_workers_writes_the_same_dataset(tmp_path, corpus_file):
    """Parts depend on the input only: 1 or 3 workers write the same files, byte for byte; a part larger than
    `shard_size_limit` is written as several shards, which the merged index lists in order and a reader reads whole."""
    outs = {}
    for workers in (1, 3):
        cfg = load_config(PrepareConfig, None, [
            f"output_dir={tmp_path / f'w{workers}'}", "sources=[{kind: text, path: '" + str(corpus_file) + "'}]",
            "tokenizer.vocab_size=400", "seq_len=64", "val_fraction=0.1", f"num_workers={workers}", "part_bytes=20000",
            "shard_size_limit=3000"])
        outs[workers] = prepare(cfg)
    m1, m3 = (json.loads((DatasetDir(outs[w]).manifest).read_text()) for w in (1, 3))
    assert m1["parts"] == m3["parts"] >= 6 and (m1["num_workers"], m3["num_workers"]) == (1, 3)
    shards = json.loads(DatasetDir(outs[3]).index("train").read_text())["shards"]
    assert len(shards) >= 2 * m1["parts"], (len(shards), m1["parts"])
    assert _files(outs[1]) == _files(outs[3])
    assert m1["splits"] == m3["splits"]
    # Every document once across the parts: the tokens are those of encoding each document alone.
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(DatasetDir(outs[3]).tokenizer / "spm.model"))
    docs = [d.strip() for d in corpus_file.read_text().split("\n\n") if d.strip()]
    specials = set(m1["tokenizer"]["special_ids"])  # [UNK] included: _tokens drops them
    expected = Counter(t for ids in sp.encode(docs) for t in ids if t not in specials)
    counts = _tokens(outs[3], specials)
    assert counts["train"] + counts["validation"] == expected
    assert m1["splits"]["train"]["documents"] + m1["splits"]["validation"]["documents"] == len(docs) == 60
    assert data_main(["verify", str(outs[3])]) == 0


def _array_cfg(out, corpus_file, *extra):
    return load_config(PrepareConfig, None, [
        f"output_dir={out}", "sources=[{kind: text, path: '" + str(corpus_file) + "'}]", "tokenizer.vocab_size=400",
        "seq_len=64", "val_fraction=0.1", "num_workers=1", "part_bytes=30000", *extra])


def test_array_tasks_write_what_one_process_writes(tmp_path, corpus_file, caplog):
    """Task 0 plans and writes its parts, task 1 writes the rest and publishes; a rerun of a task skips done parts."""
    import logging

    from data_pipeline.prepare import prepare_task, staging_dir

    caplog.set_level(logging.INFO, logger="data_pipeline")
    single = prepare(_array_cfg(tmp_path / "single", corpus_file))
    cfg = _array_cfg(tmp_path / "array", corpus_file)
    assert prepare_task(cfg, 0, 2, "77") is None
    assert prepare_task(cfg, 0, 2, "77") is None  # requeued: its parts are done, nothing to write
    assert "task 0/2: 0 of" in caplog.text
    assert not (tmp_path / "array").exists() and staging_dir(cfg, "77").is_dir()
    # A task given another config is refused, and told which key differs.
    with pytest.raises(ConfigError, match=r"\(compression: planned None, this task 'zstd'\)"):
        prepare_task(_array_cfg(tmp_path / "array", corpus_file, "compression=zstd"), 1, 2, "77")
    assert prepare_task(cfg, 1, 2, "77") == tmp_path / "array"
    assert not staging_dir(cfg, "77").exists()
    assert _files(single) == _files(tmp_path / "array")
    manifest = json.loads((DatasetDir(tmp_path / "array").manifest).read_text())
    assert manifest["tasks"] == 2 and manifest["parts"] >= 4
    assert prepare_task(cfg, 1, 2, "77", plan_timeout_s=5) is None  # started after the others published: done
    # Task 0 too, requeued with the array after task 1 published (SLURM reran it second): not an older dataset to
    # refuse without --overwrite, which failed the array and any job waiting on it with afterok.
    published = _files(tmp_path / "array")
    caplog.clear()
    assert prepare_task(cfg, 0, 2, "77", plan_timeout_s=5) is None
    assert "task 0/2: the dataset is already published" in caplog.text and _files(tmp_path / "array") == published


def test_array_task_stops_when_task_0_cannot_plan(tmp_path, corpus_file, monkeypatch):
    from core.errors import InputDataError
    from data_pipeline.prepare import prepare_task

    cfg = _array_cfg(tmp_path / "out", tmp_path / "corpus.txt")
    with pytest.raises(InputDataError, match="corpus.txt"):
        prepare_task(cfg, 0, 2, "5")
    with pytest.raises(InputDataError, match="task 0 of this array could not plan.*corpus.txt"):
        prepare_task(cfg, 1, 2, "5", plan_timeout_s=30)
    # The user adds the file and requeues the array: the last run's failure no longer stops the tasks.
    (tmp_path / "corpus.txt").write_text(corpus_file.read_text())
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    assert prepare_task(cfg, 0, 2, "5") is None
    assert prepare_task(cfg, 1, 2, "5", plan_timeout_s=30) == tmp_path / "out"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus.txt", "out"]


def test_an_array_replacing_a_dataset_writes_every_part_whichever_task_starts_first(tmp_path, corpus_file):
    """With --overwrite over a finished dataset, a task that starts before task 0 has planned waits for the plan:
    before, it took the old dataset for this array's and ended at once, its parts unwritten, and the array ended with
    the old dataset in place and every task's exit 0 (a job chained with afterok then trained on the old data)."""
    import threading

    from core.atomic_files import OutputExistsError
    from core.errors import InputDataError
    from data_pipeline.prepare import prepare_task, staging_dir

    old_corpus = tmp_path / "old.txt"
    old_corpus.write_text("\n\n".join(corpus_file.read_text().split("\n\n")[:10]) + "\n")
    out = tmp_path / "out"
    prepare(_array_cfg(out, old_corpus))
    # Without --overwrite, task 1 stops with task 0's refusal instead of taking the old dataset for this array's.
    refused = _array_cfg(out, corpus_file)
    with pytest.raises(OutputExistsError, match="pass --overwrite"):
        prepare_task(refused, 0, 2, "8")
    with pytest.raises(InputDataError, match="task 0 of this array could not plan.*pass --overwrite"):
        prepare_task(refused, 1, 2, "8", plan_timeout_s=30)
    cfg = _array_cfg(out, corpus_file, "overwrite=true")
    results = {}

    def task1() -> None:
        try:
            results["task1"] = prepare_task(cfg, 1, 2, "9", plan_timeout_s=120)
        except BaseException as exc:  # seen by the assertions below, not lost with the thread
            results["task1_error"] = exc

    late = threading.Thread(target=task1, daemon=True)
    late.start()  # task 1 first: staging_dir does not exist yet, and the old dataset is complete
    late.join(timeout=3)
    assert late.is_alive(), results  # waiting for task 0's plan, not ended
    results["task0"] = prepare_task(cfg, 0, 2, "9")
    late.join(timeout=120)
    assert not late.is_alive() and "task1_error" not in results, results
    assert {results["task0"], results["task1"]} == {None, out}, results  # one task merged and published
    single = prepare(_array_cfg(tmp_path / "single", corpus_file))
    assert _files(single) == _files(out) and not staging_dir(cfg, "9").exists()
    assert json.loads(DatasetDir(out).manifest.read_text())["array_id"] == "9"


def _corrupt_copy(prepared, tmp_path):
    import shutil

    copy = tmp_path / "data"
    shutil.copytree(prepared, copy)
    shard = sorted((copy / "train").rglob("shard.*"))[0]
    raw = bytearray(shard.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    shard.write_bytes(bytes(raw))
    return copy, shard


def test_corrupt_shard_is_named(prepared, tmp_path, capsys):
    assert verify_split(prepared / "train") >= 1
    copy, shard = _corrupt_copy(prepared, tmp_path)
    with pytest.raises(CorruptShardError, match=shard.name):
        verify_split(copy / "train")
    assert data_main(["verify", str(copy)]) == 2
    assert shard.name in capsys.readouterr().err


def test_training_refuses_a_corrupt_shard(prepared, tmp_path):
    copy, shard = _corrupt_copy(prepared, tmp_path)
    proc = run_cli("pretrain", ["train", "--config", "pretrain/configs/demo_mlm.yaml", f"data.path={copy}",
                                f"train.output_dir={tmp_path / 'run'}", *TINY_MODEL], check=False)
    assert proc.returncode == 2
    assert str(shard) in proc.stderr and "hash" in proc.stderr
    assert not (RunDir(tmp_path / "run").checkpoints).exists()


def test_failing_parallel_prepare_exits_cleanly(tmp_path, prepared):
    """A bad file met after many batches were queued: a clear error, an exit, no output left."""
    from conftest import kjv_chapters

    src = tmp_path / "src"
    src.mkdir()
    (src / "a_good.txt").write_text("\n\n".join(kjv_chapters(1189)) + "\n")
    (src / "b_bad.txt").write_bytes(b"caf\xe9\n")
    proc = run_cli("data_pipeline", ["prepare", "--config", "data_pipeline/configs/demo.yaml", f"output_dir={tmp_path / 'out'}",
                                     f"sources=[{{kind: text, path: '{src}/*.txt'}}]", "num_workers=2",
                                     f"tokenizer.pretrained={DatasetDir(prepared).tokenizer}"], check=False, timeout=120)
    assert proc.returncode == 2
    assert "b_bad.txt" in proc.stderr and "UTF-8" in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]


def _holder(tmp_path: Path, code: str, **env: str):
    """Another run's process on this machine running `code` (forked from the preloaded server); it prints 'held'
    once it holds the registration lock: (the process, its output file)."""
    script, out = tmp_path / "holder.py", tmp_path / "holder.out"
    script.write_text(code)
    with open(out, "w") as stdout:
        return python_process([str(script)], {**os.environ, **PROCESS_ENV, **env}, stdout=stdout), out


def _wait_until_said(out: Path, word: str, proc, timeout: float = 60) -> None:
    """Until the process's output has a line `word` (failing if it exits first)."""
    import time

    deadline = time.time() + timeout
    while word not in out.read_text().split("\n"):
        assert proc.poll() is None and time.time() < deadline, out.read_text()
        time.sleep(0.02)


def test_streaming_registration_is_serialised_across_runs(prepared, tmp_path):
    """Two runs starting together on one machine must not pick the same shared-memory prefix: while one
    run's leader registers (lock held, here for 3 s), another run's dataset construction waits."""
    import time

    from data_pipeline.loader import LoaderConfig, build_dataset

    holder, said = _holder(tmp_path, (
        "import time\n"
        "from data_pipeline.loader import shared_memory_registration\n"
        "with shared_memory_registration():\n"
        "    print('held', flush=True)\n"
        "    time.sleep(3)\n"), LOCAL_RANK="0")
    try:
        _wait_until_said(said, "held", holder)
        start = time.time()
        dataset = build_dataset(LoaderConfig(path=str(prepared)), "train", batch_size=4)
        waited = time.time() - start
    finally:
        holder.wait(timeout=60)
    assert len(dataset) > 0 and waited > 2.0


def test_a_rank_picks_its_leaders_prefix_while_another_run_registers(prepared, tmp_path):
    """Another run's leader holds the lock and registers its dataset while a 2-rank run starts: the
    non-leader must not scan for a free prefix before its own leader holds the lock, or the two pick
    different prefixes ("shared memory registered does not match local leader")."""
    import shutil

    other = tmp_path / "other"  # the other run's own copy of the data: a different `local` path
    shutil.copytree(prepared, other)
    holder, said = _holder(tmp_path, (
        "import time\n"
        "from data_pipeline.loader import LoaderConfig, _indexed_dataset_class, shared_memory_registration\n"
        "with shared_memory_registration():\n"
        "    print('held', flush=True)\n"
        "    time.sleep(9)  # the 2-rank run starts and reaches its datasets meanwhile; then this run registers\n"
        f"    dataset = _indexed_dataset_class()(local='{other}/train', batch_size=4, shuffle=False)\n"
        "print('registered', flush=True)\n"
        "time.sleep(12)  # keep the segment alive while the other run registers\n"), LOCAL_RANK="0", RANK="0", WORLD_SIZE="1")
    _wait_until_said(said, "held", holder)
    try:
        _two_ranks_build_a_dataset(prepared, tmp_path / "ranks")
    finally:
        holder.kill()
        holder.wait()


def _two_ranks_build_a_dataset(data: Path, logs: Path, before: str = "") -> None:
    """Two ranks of one run on this machine (forked from the preloaded server), each running `before`, then building
    the training split's dataset; both must end well, having built it."""
    script = logs.parent / f"{logs.name}.py"
    script.write_text(
        "import torch.distributed as dist\n"
        "dist.init_process_group('gloo')\n"
        f"{before}"
        "from data_pipeline.loader import LoaderConfig, build_dataset\n"
        f"dataset = build_dataset(LoaderConfig(path='{data}'), 'train', batch_size=4)\n"
        "print('ok', len(dataset), flush=True)\n"
        "dist.barrier()\n")
    for rank, proc in enumerate(launch_ranks([], 2, logs, str(script))):
        code, log = proc.wait(timeout=120), (logs / f"rank{rank}.log").read_text()
        assert code == 0 and any(line.startswith("ok ") for line in log.splitlines()), log[-3000:]


def test_the_ranks_of_a_node_take_their_leaders_free_prefix_when_their_own_scans_differ(prepared, tmp_path):
    """Another run's shared memory can vanish (the run ends) between two ranks' scans for a free prefix, so the
    non-leader finds another prefix than its leader ("... was not registered by local leader"). Here the scans differ
    on purpose: rank r's scan answers the free prefix plus r. Every rank must register at its leader's."""
    skew = ("from streaming.base.shared import prefix\n"
            "scan = prefix._check_and_find_retrying\n"
            "prefix._check_and_find_retrying = lambda *a, **k: scan(*a, **k) + dist.get_rank()\n")
    _two_ranks_build_a_dataset(prepared, tmp_path / "ranks", skew)


def test_a_task_0_that_starts_during_the_merge_waits_for_it_and_plans_nothing(tmp_path, corpus_file, monkeypatch,
                                                                              caplog):
    """Requeued, task 0 (its parts done in the last run) may start while task 1 merges: after the plan is removed,
    before the dataset is published. It must not take the planless staging folder for a new array: planning again
    retrained the tokenizer into the dataset being published, or rebuilt its parts into an orphaned staging folder
    (and, bound for a bucket with --overwrite, emptied it)."""
    import logging
    import threading

    import data_pipeline.prepare as prepare_module
    from data_pipeline.prepare import prepare_task, staging_dir

    caplog.set_level(logging.INFO, logger="data_pipeline")
    single = prepare(_array_cfg(tmp_path / "single", corpus_file))
    cfg = _array_cfg(tmp_path / "array", corpus_file)
    assert prepare_task(cfg, 0, 2, "83") is None
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    decided, results = threading.Event(), []
    for name in ("_await_plan", "_make_plan"):  # where the late task 0 goes: it waits (right) or plans (wrong)
        real = getattr(prepare_module, name)
        monkeypatch.setattr(prepare_module, name, lambda *a, _real=real, **k: (
            threading.current_thread().name == "late task 0" and decided.set(), _real(*a, **k))[1])
    real_publish = prepare_module.publish

    def publish_with_task_0_arriving(staging, final):
        assert not (staging / "plan.json").exists()  # the window: no plan, no dataset yet
        late = threading.Thread(target=lambda: results.append(prepare_task(cfg, 0, 2, "83", plan_timeout_s=60)),
                                name="late task 0")
        late.start()
        assert decided.wait(60)
        real_publish(staging, final)
        late.join(60)

    monkeypatch.setattr(prepare_module, "publish", publish_with_task_0_arriving)
    assert prepare_task(cfg, 1, 2, "83") == tmp_path / "array"
    assert results == [None] and "task 0/2: the dataset is already published" in caplog.text
    assert not staging_dir(cfg, "83").exists() and _files(single) == _files(tmp_path / "array")


def test_a_failed_merge_stops_a_task_0_that_starts_after_it(tmp_path, corpus_file, monkeypatch):
    """The merge fails after it removed the plan (here the output folder appeared meanwhile): a task 0 that starts
    then finds no plan and a merge lock; it stops with the merge's error instead of waiting a day for a plan."""
    from core.errors import InputDataError, OutputExistsError
    from data_pipeline.prepare import prepare_task

    cfg = _array_cfg(tmp_path / "array", corpus_file)
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    assert prepare_task(cfg, 0, 2, "85") is None
    (tmp_path / "array").mkdir()
    (tmp_path / "array" / "notes.txt").write_text("a user's folder")
    with pytest.raises(OutputExistsError):
        prepare_task(cfg, 1, 2, "85")
    with pytest.raises(InputDataError, match="task 1 of this array could not merge the parts: OutputExistsError"):
        prepare_task(cfg, 0, 2, "85", plan_timeout_s=30)
    assert (tmp_path / "array" / "notes.txt").read_text() == "a user's folder"


def test_a_task_0_whose_start_straddles_the_publish_plans_nothing(tmp_path, corpus_file, monkeypatch, caplog):
    """Requeued, task 0 finds the staging folder (not yet published), then, a moment later, neither a plan nor a merge
    lock: the merge has renamed the folder into place between its two looks. It must see the dataset published, not
    plan a new one beside it (refused without --overwrite: the array failed; with it, bound for a bucket, the prefix
    was emptied under the upload)."""
    import logging
    import threading

    import data_pipeline.prepare as prepare_module
    from data_pipeline.prepare import prepare_task, staging_dir

    caplog.set_level(logging.INFO, logger="data_pipeline")
    single = prepare(_array_cfg(tmp_path / "single", corpus_file))
    cfg = _array_cfg(tmp_path / "array", corpus_file)
    assert prepare_task(cfg, 0, 2, "87") is None
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    at_lock_check, published, results = threading.Event(), threading.Event(), []
    real_merging, real_publish = prepare_module._merging, prepare_module.publish

    def merging() -> str:  # task 0's look for the lock: the merge publishes just before it
        if threading.current_thread().name == "late task 0":
            at_lock_check.set()
            assert published.wait(60)
        return real_merging()

    def publish_while_task_0_looks(staging, final):
        late = threading.Thread(target=lambda: results.append(prepare_task(cfg, 0, 2, "87", plan_timeout_s=30)),
                                name="late task 0")
        late.start()
        assert at_lock_check.wait(60)
        real_publish(staging, final)
        published.set()
        late.join(60)

    monkeypatch.setattr(prepare_module, "_merging", merging)
    monkeypatch.setattr(prepare_module, "publish", publish_while_task_0_looks)
    assert prepare_task(cfg, 1, 2, "87") == tmp_path / "array"
    assert results == [None] and "task 0/2: the dataset is already published" in caplog.text
    assert not staging_dir(cfg, "87").exists() and _files(single) == _files(tmp_path / "array")


def test_an_earlier_run_s_failed_merge_is_not_published_with_the_dataset(tmp_path, corpus_file, monkeypatch):
    """A merge that failed before it removed the plan (here its index merge) leaves FAILED in the staging folder; the
    requeued run's merge publishes the dataset without it (it went into the dataset, and into the bucket)."""
    import data_pipeline.prepare as prepare_module
    from data_pipeline.prepare import prepare_task

    cfg = _array_cfg(tmp_path / "array", corpus_file)
    assert prepare_task(cfg, 0, 2, "89") is None
    real_merge = prepare_module.merge_indexes

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(prepare_module, "merge_indexes", full_disk)
    with pytest.raises(OSError, match="No space left"):
        prepare_task(cfg, 1, 2, "89")
    monkeypatch.setattr(prepare_module, "merge_indexes", real_merge)
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    assert prepare_task(cfg, 1, 2, "89") == tmp_path / "array"
    assert not (tmp_path / "array" / "FAILED").exists() and DatasetDir(tmp_path / "array").is_complete()
