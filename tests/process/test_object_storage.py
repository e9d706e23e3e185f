"""Data and checkpoints in object storage, against a real S3-compatible server (moto's, started here on localhost).

Nothing is mocked: prepare uploads through streaming's uploader, training reads through streaming's
downloader and boto3 over HTTP, exactly as against AWS S3 or MinIO with `S3_ENDPOINT_URL`.
"""
from __future__ import annotations

import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch
from benchmarks.prepare_staging import peak_shard_bytes, shard_bytes
from benchmarks.slow_bucket import BUCKETS, CREDENTIALS, SlowLink
from conftest import REPO, TINY_MODEL, free_port, launch_ranks, plant_payload, restored_environ, run_cli, wait_for_step
from data_pipeline.dataset_dir import INDEX, MANIFEST, TOKENIZER, DatasetDir
from data_pipeline.shard_record import RECORD
from pretrain.run_dir import RunDir



@pytest.fixture(scope="module")
def s3():
    """A moto S3 server on a free port; the environment points boto3 and streaming at it."""
    import boto3
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    with restored_environ():
        os.environ.update({"S3_ENDPOINT_URL": f"http://127.0.0.1:{port}", **CREDENTIALS})
        client = boto3.client("s3", endpoint_url=os.environ["S3_ENDPOINT_URL"])
        for bucket in BUCKETS:
            client.create_bucket(Bucket=bucket)
        yield client
    server.stop()


def _keys(client, bucket: str, prefix: str) -> list[str]:
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    return sorted(o["Key"] for page in pages for o in page.get("Contents", []))


def _cli(module: str, args: list[str], cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", **(env or {})})


def _one_line_error(proc: subprocess.CompletedProcess) -> str:
    """The error a user sees: exit 2, exactly one `error:` line, no traceback."""
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-4000:]
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, proc.stderr[-3000:]
    return lines[0]


def test_prepare_writes_the_dataset_into_the_bucket(s3, corpus_file, prepared, tmp_path, caplog, capsys, monkeypatch):
    """Shards go up part by part as each is written (the staging disk never holds the dataset whole), in an order
    that keeps the bucket consistent; the error cases are one line each and change nothing."""
    config = tmp_path / "prepare.yaml"
    config.write_text(f"sources: [{{kind: text, path: '{corpus_file}'}}]\ntokenizer: {{vocab_size: 400, "
                      "character_coverage: 1.0}\nseq_len: 64\nval_fraction: 0.1\npart_bytes: 8000\nshard_size_limit: 3000\n"
                      "num_workers: 2\n")  # several shards to a part: each goes up with its part
    work, tmp = tmp_path / "cwd", tmp_path / "tmp"
    work.mkdir(), tmp.mkdir()
    env = {"TMPDIR": str(tmp)}
    with peak_shard_bytes(tmp) as peak:
        done = _cli("data_pipeline", ["prepare", "--config", str(config), "output_dir=s3://corpus/direct"], work, env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "dataset: s3://corpus/direct" in done.stdout
    sizes = {o["Key"]: o["Size"] for o in s3.list_objects_v2(Bucket="corpus", Prefix="direct/")["Contents"]}
    uploaded = sum(size for key, size in sizes.items() if ".mds" in key)
    parts = json.loads(s3.get_object(Bucket="corpus", Key=f"direct/{MANIFEST}")["Body"].read())["parts"]
    # Two workers, at most four parts written and not yet uploaded, of 20 or more.
    assert parts >= 20 and 0 < peak[0] < uploaded / 3, (parts, peak[0], uploaded)
    assert list(work.iterdir()) == []  # no folder named after the URL
    assert not [p for p in tmp.iterdir() if "staging" in p.name]  # nor a staging copy left behind
    # The order the server received the files in: a split's shards before its index, the manifest last.
    puts = [m.split("PUT /corpus/direct/")[1].split(" ")[0] for m in caplog.messages if "PUT /corpus/direct/" in m]
    assert puts[-1] == MANIFEST
    for split in ("train", "validation"):
        shard_puts = [i for i, p in enumerate(puts) if p.startswith(f"{split}/") and ".mds" in p]
        assert shard_puts and max(shard_puts) < puts.index(f"{split}/{INDEX}")

    keys = [k.removeprefix("direct/") for k in _keys(s3, "corpus", "direct/")]
    manifest = json.loads(s3.get_object(Bucket="corpus", Key=f"direct/{MANIFEST}")["Body"].read())
    assert {f"{TOKENIZER}/{name}" for name in manifest["tokenizer"]["files"]} <= set(keys)
    for split in ("train", "validation"):
        index = json.loads(s3.get_object(Bucket="corpus", Key=f"direct/{split}/{INDEX}")["Body"].read())
        shards = [f"{split}/{s['zip_data']['basename']}" for s in index["shards"]]
        assert shards and set(shards) <= set(keys), (shards, keys)
        assert split == "validation" or len(shards) >= 2 * parts, (len(shards), parts)
        assert sum(s["samples"] for s in index["shards"]) == manifest["splits"][split]["sequences"]

    # The error cases through the command line's own entry point, in this process (each subprocess costs its imports).
    from data_pipeline.cli import main

    def refused(output: str) -> str:
        code = main(["prepare", "--config", str(config), f"output_dir={output}"])
        err = capsys.readouterr().err
        assert code == 2 and "Traceback" not in err, err[-3000:]
        lines = [line for line in err.splitlines() if line.startswith("error:")]
        assert len(lines) == 1, err[-3000:]
        return lines[0]

    monkeypatch.chdir(work)
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))  # tempfile read TMPDIR once, before this test set it
    # The staging folder a SIGKILLed prepare on this host left goes at the next start; a live prepare's (this
    # process stands in for one) stays.
    ended = subprocess.Popen(["true"])
    ended.wait()
    killed, live = (tmp / f"prepare-staging-{socket.gethostname()}-{pid}-x1" for pid in (ended.pid, os.getpid()))
    for staging in (killed, live):
        (staging / "dataset").mkdir(parents=True)
    assert "already holds" in refused("s3://corpus/direct")
    assert not killed.exists() and live.is_dir()
    shutil.rmtree(live)
    s3.put_object(Bucket="corpus", Key="partial/train/part-00000/shard.00000.mds.zstd", Body=b"from a killed prepare")
    assert "no manifest.json: the parts of a prepare that did not finish?" in refused("s3://corpus/partial")
    assert [k.removeprefix("direct/") for k in _keys(s3, "corpus", "direct/")] == keys  # nothing lost
    assert "bucket 'no-such-bucket' does not exist" in refused("s3://no-such-bucket/x")
    dead = f"http://127.0.0.1:{free_port()}"
    with monkeypatch.context() as m:
        m.setenv("S3_ENDPOINT_URL", dead)
        line = refused("s3://corpus/y")
    assert "cannot reach" in line and dead in line
    with monkeypatch.context() as m:
        for key in [k for k in os.environ if k.startswith("AWS_")]:
            m.delenv(key)
        m.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp / "none"))
        m.setenv("AWS_CONFIG_FILE", str(tmp / "none"))
        m.setenv("AWS_EC2_METADATA_DISABLED", "true")
        assert "no credentials" in refused("s3://corpus/z")
    # Bad input found late, after parts went up: what went up goes too, so the fixed rerun needs no --overwrite.
    late = tmp / "late.txt"
    late.write_text(corpus_file.read_text() + "\n\nbad bytes at the end\n", encoding="utf-8")
    with open(late, "ab") as fh:
        fh.write(b"caf\xe9\n")
    late_config = tmp_path / "late.yaml"
    late_config.write_text(f"sources: [{{kind: text, path: '{late}'}}]\ntokenizer: {{pretrained: '{DatasetDir(prepared).tokenizer}'}}\n"
                           "seq_len: 64\nval_fraction: 0.1\npart_bytes: 8000\nnum_workers: 1\n")  # no training pass
    code = main(["prepare", "--config", str(late_config), "output_dir=s3://corpus/late"])
    err = capsys.readouterr().err
    assert code == 2 and "is not valid UTF-8" in err, err[-3000:]
    assert any("PUT /corpus/late/train/" in m for m in caplog.messages)  # parts had gone up before the bad one
    assert _keys(s3, "corpus", "late/") == []
    late.unlink()
    assert list(work.iterdir()) == []
    assert list(tmp.iterdir()) == []  # no staging folder from a refused bucket either
    assert _keys(s3, "corpus", "y/") == _keys(s3, "corpus", "z/") == []

    # overwrite=true replaces what the prefix holds (an object of no dataset's included) and nothing beside it: not
    # a prefix that merely starts with the same letters.
    s3.put_object(Bucket="corpus", Key="direct/stale.txt", Body=b"from before")
    s3.put_object(Bucket="corpus", Key="direct2/keep.txt", Body=b"another dataset's")
    assert main(["prepare", "--config", str(config), "output_dir=s3://corpus/direct", "overwrite=true"]) == 0
    after = [k.removeprefix("direct/") for k in _keys(s3, "corpus", "direct/")]
    assert "stale.txt" not in after and MANIFEST in after and _keys(s3, "corpus", "direct2/") == ["direct2/keep.txt"]
    index = json.loads(s3.get_object(Bucket="corpus", Key=f"direct/train/{INDEX}")["Body"].read())
    assert {f"train/{s['zip_data']['basename']}" for s in index["shards"]} <= set(after)


def test_a_job_array_uploads_each_task_s_parts_as_it_writes_them(s3, corpus_file, tmp_path, caplog):
    """Two array tasks share a staging folder on their way to a bucket: each uploads its parts' shards as it writes
    them, the last one merges and uploads the indexes, the tokenizer and the manifest. The bucket then holds what one
    local prepare writes with the same compression (a bucket's default, zstd), byte for byte; the staging folder keeps
    the metadata, no shard."""
    from core.config_io import load_config
    from data_pipeline.config import PrepareConfig
    from data_pipeline.prepare import prepare, prepare_task

    def config(out: str, *extra: str) -> PrepareConfig:
        return load_config(PrepareConfig, None, [
            f"output_dir={out}", "sources=[{kind: text, path: '" + str(corpus_file) + "'}]", "tokenizer.vocab_size=400",
            "seq_len=64", "val_fraction=0.1", "num_workers=1", "part_bytes=30000", *extra])

    single = prepare(config(str(tmp_path / "single"), "compression=zstd"))
    array = config("s3://corpus/array", f"staging_dir={tmp_path / 'staging'}")
    assert prepare_task(array, 0, 2, "78") is None
    first = _keys(s3, "corpus", "array/")
    assert first and all(".mds" in key for key in first)  # task 0's shards, and nothing a reader would take
    assert prepare_task(array, 1, 2, "78") == "s3://corpus/array"
    keys = {k.removeprefix("array/") for k in _keys(s3, "corpus", "array/")}
    expected = {str(p.relative_to(single)) for p in single.rglob("*") if p.is_file() and p.name != RECORD}
    assert keys == expected
    for key in sorted(k for k in keys if ".mds" in k or k.endswith(INDEX)):
        assert s3.get_object(Bucket="corpus", Key=f"array/{key}")["Body"].read() == (single / key).read_bytes(), key
    cache = tmp_path / "staging" / "dataset"
    assert shard_bytes(tmp_path / "staging") == 0 and (cache / MANIFEST).is_file()
    # That folder is the bucket's dataset's cache (README): training's fetch finds it current and keeps it.
    from data_pipeline.remote_dataset import fetch_metadata

    def files() -> dict[str, tuple[bytes, int, int]]:  # content, and the file's identity: rewritten is not kept
        return {str(p.relative_to(cache)): (p.read_bytes(), p.stat().st_ino, p.stat().st_mtime_ns)
                for p in cache.rglob("*") if p.is_file() and p.name != MANIFEST}  # the manifest is fetched to compare

    before, manifest = files(), (cache / MANIFEST).read_bytes()
    with caplog.at_level(logging.WARNING):
        fetch_metadata("s3://corpus/array", cache)
    assert "held another dataset" not in caplog.text
    after = files()
    assert (cache / MANIFEST).read_bytes() == manifest
    assert after == before and f"train/{INDEX}" in after and f"{TOKENIZER}/tokenizer.json" in after, sorted(after)


def _train_args(data: Path, out: Path, *extra: str) -> list[str]:
    return ["train", "--config", "pretrain/configs/demo_mlm.yaml", f"data.path={data}", f"train.output_dir={out}",
            *TINY_MODEL, "train.micro_batch_size=4", "train.global_batch_size=16", "train.max_steps=10",
            "train.save_every=4", "train.log_every=2", "train.eval_every=0", "train.record_samples=true",
            "schedule.warmup_steps=2", "optimizer.lr=3e-3", "model.dropout=0.1", *extra]


def _samples(run: Path, rank: int) -> dict[int, list]:
    rows = [json.loads(line) for line in (run / "samples" / f"rank{rank}.jsonl").read_text().splitlines()]
    return {r["step"]: r["sample_ids"] for r in rows}


def _weights(run: Path, tag: str = "step_00000010") -> dict[str, torch.Tensor]:
    return torch.load(RunDir(run).checkpoints / tag / "mp_rank_00_model_states.pt", map_location="cpu",
                      weights_only=False)["module"]


def test_two_ranks_from_the_bucket_resume_exactly_after_the_node_is_lost(s3, prepared, tmp_path):
    """Killed, its data cache and run folder wiped (a requeue onto another node), the run resumes from the
    bucket's checkpoint and ends with the weights and sample order of an uninterrupted run on local shards."""
    from data_pipeline.remote_dataset import upload_dataset

    upload_dataset(prepared, "s3://corpus/shards", overwrite=False)
    reference = tmp_path / "reference"
    run_cli("pretrain", _train_args(prepared, reference), nproc=2)

    cache, run = tmp_path / "cache", tmp_path / "run"
    args = _train_args(cache, run, "data.remote=s3://corpus/shards", "train.checkpoint_remote=s3://ckpt/run")
    procs = launch_ranks(args, 2, tmp_path / "logs")
    try:
        wait_for_step(run, 6, procs, timeout=240)
        # Rank 0 uploads in the background while training goes on: the kill waits for checkpoint 4 in the bucket.
        deadline = time.time() + 120
        while "uploaded checkpoint step_00000004" not in (tmp_path / "logs" / "rank0.log").read_text():
            assert time.time() < deadline and all(p.poll() is None for p in procs), "checkpoint 4 never uploaded"
            time.sleep(0.2)
    finally:
        for p in procs:
            p.send_signal(signal.SIGKILL)
            p.wait()
    assert "uploaded checkpoint step_00000004 to s3://ckpt/run" in (tmp_path / "logs" / "rank0.log").read_text()
    # On a slow machine the kill can land after step 8's save began: what it uploaded goes, as if the node had died
    # first, so the resume below is from step 4 whatever the timing.
    for key in _keys(s3, "ckpt", "run/"):
        if key.split("/")[1] != "step_00000004":
            s3.delete_object(Bucket="ckpt", Key=key)
    assert "run/step_00000004/COMPLETE" in _keys(s3, "ckpt", "run/")

    shutil.rmtree(cache), shutil.rmtree(run)
    # A newer checkpoint whose upload never finished (no COMPLETE marker) must not be taken.
    s3.put_object(Bucket="ckpt", Key="run/step_00000008/mp_rank_00_model_states.pt", Body=b"half")

    resumed = run_cli("pretrain", args, nproc=2)
    assert "downloaded checkpoint step_00000004 from s3://ckpt/run" in resumed.stdout
    assert "resumed from" in resumed.stdout and "at step 4" in resumed.stdout
    wa, wb = _weights(reference), _weights(run)
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    for rank in (0, 1):
        want = {s: ids for s, ids in _samples(reference, rank).items() if s > 4}
        assert _samples(run, rank) == want
    # The bucket holds the newest complete checkpoints (keep_last=3) with their markers.
    tags = {k.split("/")[1] for k in _keys(s3, "ckpt", "run/") if k.endswith("/COMPLETE")}
    assert tags == {"step_00000004", "step_00000008", "step_00000010"}

    # The resumed run folder exports like any other.
    out = tmp_path / "export"
    run_cli("pretrain", ["export", "--checkpoint", str(run), "--out", str(out)])
    assert (out / "config.json").is_file()

    # The local newest damaged after its upload (a failing disk): the bucket's copy of that step is taken, not an
    # older local one; the damaged copy is set aside for a look.
    states = RunDir(run).checkpoints / "step_00000010" / "mp_rank_00_model_states.pt"
    body = bytearray(states.read_bytes())
    body[len(body) // 2] ^= 0xFF
    states.write_bytes(bytes(body))
    again = run_cli("pretrain", args, nproc=2)
    assert "downloaded checkpoint step_00000010 from s3://ckpt/run (no intact local checkpoint was as new)" in again.stdout
    assert "at step 10" in again.stdout and (RunDir(run).checkpoints / "step_00000010.damaged").is_dir()
    wc = _weights(run)
    assert all(torch.equal(wa[k], wc[k]) for k in wa)


def test_a_checkpoint_in_the_bucket_that_holds_code_is_refused_at_resume(s3, prepared, tmp_path):
    """Whoever can write to the bucket rewrites the newest checkpoint (and its marker) to carry a pickled call; the
    requeued run, on a node with no local copy, downloads it and refuses it unread: exit 2, one line."""
    from pretrain.checkpointing.checkpoint_dir import COMPLETE

    run = tmp_path / "run"
    args = _train_args(prepared, run, "train.max_steps=4", "train.checkpoint_remote=s3://ckpt/hostile")
    run_cli("pretrain", args)
    tag, ran = RunDir(run).checkpoints / "step_00000004", tmp_path / "the-payload-ran"
    model_file = plant_payload(tag, ran)
    for name in (model_file.name, COMPLETE):
        s3.put_object(Bucket="ckpt", Key=f"hostile/step_00000004/{name}", Body=(tag / name).read_bytes())

    shutil.rmtree(run)
    proc = run_cli("pretrain", [*args, "train.max_steps=6"], check=False)
    line = _one_line_error(proc)
    assert "mp_rank_00_model_states.pt' holds more than weights and plain data (io.open)" in line, line
    assert "train.trust_checkpoint=true" in line and not ran.exists()


def test_a_bucket_key_that_climbs_out_of_its_prefix_is_refused_before_it_is_written(s3, prepared, tmp_path):
    """Whoever can write to the bucket adds `step_N/../../../escape` to the newest checkpoint: joined to the download
    folder, that key names a file outside the run folder. The requeued run refuses it in one line, writing nothing
    there."""
    run = tmp_path / "run"
    args = _train_args(prepared, run, "train.max_steps=2", "train.save_every=2", "train.checkpoint_remote=s3://ckpt/climb")
    run_cli("pretrain", args)
    s3.put_object(Bucket="ckpt", Key="climb/step_00000002/../../../escape", Body=b"written by the bucket's key")
    shutil.rmtree(run)
    line = _one_line_error(run_cli("pretrain", [*args, "train.max_steps=4"], check=False))
    assert "s3://ckpt/climb/step_00000002/../../../escape': a key that climbs out of its prefix" in line, line
    assert not (tmp_path / "escape").exists() and not list(tmp_path.rglob("escape"))
    from core.errors import StorageError
    from core.object_store import ObjectStore

    # An empty part makes the rest an absolute path once joined (`tmp / "/home/u/.bashrc"`); '.' and a trailing '/'
    # name no file of the prefix either.
    for key in (f"step_00000002//{tmp_path / 'absolute'}", "step_00000002/./x", "step_00000002/"):
        with pytest.raises(StorageError, match="a key that climbs out of its prefix"):
            ObjectStore("s3://ckpt/climb").download(key, tmp_path / "download" / "x")
    assert not (tmp_path / "absolute").exists() and not (tmp_path / "download").exists()


def test_a_damaged_shard_in_the_bucket_stops_the_run_with_one_line(s3, prepared, tmp_path):
    from data_pipeline.remote_dataset import upload_dataset

    upload_dataset(prepared, "s3://corpus/damaged", overwrite=False)
    shards = [key.removeprefix("damaged/") for key in _keys(s3, "corpus", "damaged/") if ".mds" in key]
    assert any(k.startswith("train/") for k in shards) and any(k.startswith("validation/") for k in shards)
    for key in shards:  # every shard object, as a bad upload or a broken bucket leaves them
        body = bytearray(s3.get_object(Bucket="corpus", Key=f"damaged/{key}")["Body"].read())
        body[len(body) // 2] ^= 0xFF
        s3.put_object(Bucket="corpus", Key=f"damaged/{key}", Body=bytes(body))
    before = _keys(s3, "corpus", "damaged/")
    cache, run = tmp_path / "cache", tmp_path / "run"
    # A relative data.path, as the shipped configs give: streaming names the damaged file relative to the cache too.
    relative = Path(os.path.relpath(cache, REPO))
    proc = run_cli("pretrain", _train_args(relative, run, "data.remote=s3://corpus/damaged", "train.max_steps=2"),
                   check=False)
    line = _one_line_error(proc)  # and no traceback from streaming's download threads either
    (shard,) = [key for key in shards if f"'s3://corpus/damaged/{key}'" in line]
    assert "does not match" in line and "Checksum failure" not in proc.stderr, proc.stderr[-3000:]
    assert not any((cache / key).exists() for key in shards)  # no damaged copy is left for the next run to read
    assert _keys(s3, "corpus", "damaged/") == before
    assert not (RunDir(run).checkpoints).exists() or not any((RunDir(run).checkpoints).glob("step_*"))
    # Two ranks under torchrun, which ends the other rank with SIGTERM once one exits: that rank says it was ended,
    # in one line; no traceback of this project's code or of streaming's download threads reaches the user.
    shutil.rmtree(cache, ignore_errors=True), shutil.rmtree(run, ignore_errors=True)
    two = run_cli("pretrain", _train_args(cache, run, "data.remote=s3://corpus/damaged", "train.max_steps=2"),
                  nproc=2, launcher="torchrun", check=False)
    assert two.returncode != 0
    errors = [line for line in two.stderr.splitlines() if line.startswith("error:")]
    assert errors and all("does not match" in line for line in errors), two.stderr[-4000:]
    assert "Checksum failure" not in two.stderr, two.stderr[-4000:]
    ours = re.compile(r'File "[^"]*/(pretrain|data_pipeline|core|model|streaming)/')
    assert not ours.search(two.stderr), two.stderr[-4000:]
    assert len(errors) == 2 or "terminated: rank" in two.stderr, two.stderr[-4000:]


def test_a_missing_bucket_or_an_unreachable_endpoint_is_one_line(s3, tmp_path):
    missing = run_cli("pretrain", _train_args(tmp_path / "cache", tmp_path / "run", "data.remote=s3://no-such-bucket/d"),
                      check=False)
    assert "bucket 'no-such-bucket' does not exist" in _one_line_error(missing)
    absent = run_cli("pretrain", _train_args(tmp_path / "cache", tmp_path / "run", "data.remote=s3://corpus/never-prepared"),
                     check=False)
    assert "no prepared dataset at s3://corpus/never-prepared" in _one_line_error(absent)
    dead = f"http://127.0.0.1:{free_port()}"
    os.environ["S3_ENDPOINT_URL"], live = dead, os.environ["S3_ENDPOINT_URL"]
    try:
        unreachable = run_cli("pretrain", _train_args(tmp_path / "cache", tmp_path / "run", "data.remote=s3://corpus/d"),
                              check=False)
    finally:
        os.environ["S3_ENDPOINT_URL"] = live
    line = _one_line_error(unreachable)
    assert "cannot reach" in line and dead in line
    os.environ["S3_ENDPOINT_URL"] = "storage.example:9000"  # no scheme: botocore refuses it when the client is made
    try:
        malformed = run_cli("pretrain", _train_args(tmp_path / "cache", tmp_path / "run", "data.remote=s3://corpus/d"),
                            check=False)
    finally:
        os.environ["S3_ENDPOINT_URL"] = live
    assert ("S3_ENDPOINT_URL 'storage.example:9000' is not an endpoint URL (for s3://corpus/d/manifest.json)"
            in _one_line_error(malformed))
    # The server checks every request's signature from now on (moto's own switch, /moto-api/reset-auth; its IAM knows
    # no key at all), as a store does for keys that are wrong or lack permission: a 403.
    import urllib.request

    def enforce_auth(after: str) -> str:
        """Check signatures after `after` more requests ("inf": never); the previous setting."""
        request = urllib.request.Request(f"{os.environ['S3_ENDPOINT_URL']}/moto-api/reset-auth", data=after.encode(),
                                         method="POST", headers={"Content-Type": "text/plain"})
        with urllib.request.urlopen(request, timeout=30) as answer:
            return json.loads(answer.read())["PREVIOUS_INITIAL_NO_AUTH_ACTION_COUNT"]

    previous = "inf"  # the fixture's server never checks
    try:
        previous = enforce_auth("0")
        denied = run_cli("pretrain", _train_args(tmp_path / "cache", tmp_path / "run", "data.remote=s3://corpus/d"),
                         check=False)
    finally:
        enforce_auth(previous)  # the module's other tests share the server
    line = _one_line_error(denied)
    assert "access denied to s3://corpus/d" in line and "credentials" in line, line


def test_a_failed_checkpoint_upload_is_logged_and_the_run_goes_on(s3, prepared, tmp_path):
    """The bucket cannot take the upload (it does not exist; a run branched with train.resume_from reaches the bucket
    only at its first save): a warning and a `checkpoint_upload_failed` row, and the run trains on to its end with
    whole local checkpoints."""
    run = tmp_path / "run"
    run_cli("pretrain", _train_args(prepared, run, "train.max_steps=4"))
    proc = run_cli("pretrain", _train_args(prepared, run, "train.resume_from=4",
                                           "train.checkpoint_remote=s3://no-such-bucket/run"))
    assert re.search(r"warning: checkpoint step_00000008 was not uploaded to s3://no-such-bucket/run: .*no-such-bucket",
                     proc.stdout), proc.stdout[-3000:]
    assert "warning: checkpoint step_00000010 was not uploaded" in proc.stdout and "finished at step 10" in proc.stdout
    # Each row at the step its failure was known: checkpoint 8's, uploaded in the background, at the first logging
    # step after it failed (train.log_every=2: step 10, not step 9, whose metrics row comes later).
    failed = [row for row in RunDir(run).metric_rows("checkpoint") if "checkpoint_upload_failed" in row]
    assert [(row["step"], row["checkpoint_upload_failed"]) for row in failed] == [(10, 1.0), (10, 1.0)], failed
    from pretrain.checkpointing.checkpoint_dir import COMPLETE

    assert all((RunDir(run).checkpoint(tag) / COMPLETE).is_file() for tag in ("step_00000008", "step_00000010"))


# A bug at the very end of each rank: after its last save, in destroy_process_group.
_BUG_AT_THE_END = """import torch.distributed


def _bug(*args, **kwargs):
    raise RuntimeError("a bug after the last save")


torch.distributed.destroy_process_group = _bug
"""
# A bug in each rank's step 3, while checkpoint 2 uploads in the background: 2 s after the step, when the upload's
# small files are in and its model states are on their way.
_BUG_AT_STEP_3 = """import time

from pretrain.observe.metrics import MetricsReporter

drain = MetricsReporter.drain


def _drain(self, step, *args):
    if step == 3:
        time.sleep(2)
        raise RuntimeError("a bug at step 3")
    return drain(self, step, *args)


MetricsReporter.drain = _drain
"""


def _rank_with_a_bug(tmp_path: Path, bug: str) -> str:
    """A script that runs a rank as `python -m pretrain` does, `bug` planted first."""
    script = tmp_path / "rank_with_a_bug.py"
    script.write_text(bug + '\nimport runpy\n\nrunpy.run_module("pretrain", run_name="__main__", alter_sys=True)\n')
    return str(script)


def _ends(procs) -> dict[int, float]:
    """When each rank's process ended (polled), once all have."""
    ended: dict[int, float] = {}
    deadline = time.time() + 300
    while len(ended) < len(procs) and time.time() < deadline:
        ended.update({rank: time.time() for rank, p in enumerate(procs) if rank not in ended and p.poll() is not None})
        time.sleep(0.05)
    return ended


@pytest.mark.parametrize("case", ["slower than init_timeout_s", "past checkpoint_upload_timeout_s",
                                  "past its bound, then a bug"])
def test_a_slow_upload_is_waited_for_within_its_own_bound(s3, prepared, tmp_path, case):
    """A bucket behind a slow link. The other ranks wait for rank 0's upload up to train.checkpoint_upload_timeout_s,
    not train.init_timeout_s (which would end them as if a peer were lost): the last save's, and, before it, the
    background upload of the checkpoint before. Past that bound rank 0 gives the upload up with a warning, and the run
    goes on with its whole local checkpoint. A bug that ends the ranks after that keeps its traceback, and rank 0's
    exit is not held by the given-up upload's file in flight either."""
    port = int(os.environ["S3_ENDPOINT_URL"].rsplit(":", 1)[1])
    slow, bug = case == "slower than init_timeout_s", case.endswith("a bug")
    module = _rank_with_a_bug(tmp_path, _BUG_AT_THE_END) if bug else "pretrain"
    link = SlowLink(port, bytes_per_s=40_000 if slow else 20_000)  # a checkpoint here is 0.6 MB: 15 s at 40 KB/s
    run = tmp_path / "run"
    bound = "train.init_timeout_s=12" if slow else "train.checkpoint_upload_timeout_s=1.5"
    prefix = "slow" if slow else "given-up-then-a-bug" if bug else "given-up"
    last = 5 if slow else 4  # slow: checkpoint 4 uploads in the background, step 5's save waits for it
    try:
        procs = launch_ranks(_train_args(prepared, run, f"train.max_steps={last}", "train.save_every=4", bound,
                                         f"train.checkpoint_remote=s3://ckpt/{prefix}"), 2, tmp_path / "logs",
                             module=module, env={"S3_ENDPOINT_URL": f"http://127.0.0.1:{link.port}"})
        ended = _ends(procs)
        codes = [p.wait(timeout=10) for p in procs]
    finally:
        link.close()
    log = (tmp_path / "logs" / "rank0.log").read_text()
    assert codes == ([1, 1] if bug else [0, 0]), log[-3000:] + (tmp_path / "logs" / "rank1.log").read_text()[-3000:]
    assert f"finished at step {last}" in log, log[-3000:]
    if bug:  # the interpreter's traceback, as any bug's
        assert re.search(r"Traceback \(most recent call last\):\n(.*\n)+.*RuntimeError: a bug after the last save\n", log), \
            log[-3000:]
    # A given-up upload's file still in flight does not hold rank 0's exit (srun's --wait would kill it, a node lost).
    assert ended[0] - ended[1] < 4, ended
    complete = {k.split("/")[1] for k in _keys(s3, "ckpt", f"{prefix}/") if k.endswith("/COMPLETE")}
    if slow:
        assert "waiting for the upload of checkpoint step_00000004" in log, log[-3000:]
        for tag in ("step_00000004", "step_00000005"):
            uploaded = re.search(rf"uploaded checkpoint {tag} to s3://ckpt/slow \(\d+ files, ([\d.]+)s\)", log)
            assert uploaded and float(uploaded[1]) > 12, log[-3000:]  # longer than the others' init_timeout_s
        assert complete == {"step_00000004", "step_00000005"}
    else:
        assert (f"warning: checkpoint step_00000004 was not uploaded to s3://ckpt/{prefix}: it did not finish within "
                "train.checkpoint_upload_timeout_s (1.5 s)") in log, log[-3000:]
        assert not complete  # the marker, last, never went
    from pretrain.checkpointing.checkpoint_dir import COMPLETE

    assert (RunDir(run).checkpoint("step_00000004") / COMPLETE).is_file()


def test_a_bug_while_a_checkpoint_uploads_in_the_background_ends_the_ranks_at_once(s3, prepared, tmp_path):
    """A bug at step 3 while checkpoint 2 crawls to the bucket: every rank ends with its traceback, and rank 0's exit is
    not held by the upload's file in flight; the checkpoint does not count in the bucket."""
    port = int(os.environ["S3_ENDPOINT_URL"].rsplit(":", 1)[1])
    link = SlowLink(port, bytes_per_s=20_000)  # 30 s a checkpoint
    try:
        procs = launch_ranks(_train_args(prepared, tmp_path / "run", "train.save_every=2", "train.log_every=1",
                                         "train.checkpoint_remote=s3://ckpt/bug-in-background"), 2, tmp_path / "logs",
                             module=_rank_with_a_bug(tmp_path, _BUG_AT_STEP_3),
                             env={"S3_ENDPOINT_URL": f"http://127.0.0.1:{link.port}"})
        ended = _ends(procs)
        codes = [p.wait(timeout=10) for p in procs]
    finally:
        link.close()
    log = (tmp_path / "logs" / "rank0.log").read_text()
    assert codes == [1, 1], log[-3000:]
    assert "saved checkpoint" in log and "uploaded checkpoint" not in log, log[-3000:]
    assert re.search(r"Traceback \(most recent call last\):\n(.*\n)+.*RuntimeError: a bug at step 3\n", log), log[-3000:]
    assert ended[0] - ended[1] < 4, ended
    assert not [k for k in _keys(s3, "ckpt", "bug-in-background/") if k.endswith("/COMPLETE")]


def _preempt_over_a_slow_link(args: list[str], logs: Path, bytes_per_s: int, when: str) -> list[int]:
    """Two ranks train through a throttled link to the bucket; both get SIGUSR1 once rank 0's log says `when`."""
    port = int(os.environ["S3_ENDPOINT_URL"].rsplit(":", 1)[1])
    link = SlowLink(port, bytes_per_s=bytes_per_s)
    try:
        procs = launch_ranks(args, 2, logs, env={"S3_ENDPOINT_URL": f"http://127.0.0.1:{link.port}"})
        deadline = time.time() + 180
        while when not in (logs / "rank0.log").read_text():
            assert time.time() < deadline and all(p.poll() is None for p in procs), (logs / "rank0.log").read_text()
            time.sleep(0.05)
        for p in procs:
            p.send_signal(signal.SIGUSR1)
        return [p.wait(timeout=180) for p in procs]
    finally:
        link.close()


def test_training_goes_on_while_a_checkpoint_uploads(s3, prepared, tmp_path):
    """Rank 0 uploads a scheduled checkpoint in the background: every rank trains the next steps meanwhile (their
    devices would otherwise idle for the whole upload), and the next save waits for it. A preemption that comes
    during that save stops the run on the checkpoint it writes, once its upload is in."""
    run, logs = tmp_path / "run", tmp_path / "logs"
    # A checkpoint here is 0.6 MB: 7 s, against some 0.1-0.5 s a step. The signal comes during step 6's save, which
    # waits for checkpoint 3's upload first.
    codes = _preempt_over_a_slow_link(_train_args(prepared, run, "train.max_steps=1000", "train.save_every=3",
                                                  "train.log_every=1", "train.checkpoint_remote=s3://ckpt/background"),
                                      logs, 90_000, when="waiting for the upload of checkpoint step_00000003")
    log = (logs / "rank0.log").read_text()
    assert codes == [75, 75], log[-3000:]
    lines = log.splitlines()
    # Saved, then two steps trained while it uploads; step 6's save after that upload ended; the stop on step 6 once
    # its own upload is in.
    order = [next((i for i, line in enumerate(lines) if text in line), -1) for text in (
        "step_00000003 in ", "step 4/1000 |", "step 5/1000 |", "step 6/1000 |",
        "uploaded checkpoint step_00000003 to s3://ckpt/background", "step_00000006 in ",
        "uploaded checkpoint step_00000006 to s3://ckpt/background", "preempted (SIGUSR1) at step 6")]
    assert -1 not in order and order == sorted(order), (order, log[-3000:])
    assert json.loads((run / "PREEMPTED").read_text())["step"] == 6
    complete = {k.split("/")[1] for k in _keys(s3, "ckpt", "background/") if k.endswith("/COMPLETE")}
    assert complete == {"step_00000003", "step_00000006"}


def test_a_preemption_while_a_checkpoint_uploads_stops_at_once_and_uploads_its_own(s3, prepared, tmp_path):
    """SLURM's USR1 while rank 0 uploads a scheduled checkpoint over a slow link: the ranks stop after the next step,
    and that stop's save gives the older upload up rather than wait for it (the signal's grace is short), then uploads
    its own checkpoint, the newer, while the others wait."""
    run, logs = tmp_path / "run", tmp_path / "logs"
    # Some 10 s an upload; the signal comes a step after checkpoint 3's save, while it uploads.
    codes = _preempt_over_a_slow_link(_train_args(prepared, run, "train.max_steps=1000", "train.save_every=3",
                                                  "train.log_every=1", "train.checkpoint_remote=s3://ckpt/preempted"),
                                      logs, 60_000, when="step 4/1000 |")
    log = (logs / "rank0.log").read_text()
    assert codes == [75, 75], log[-3000:]
    stopped = json.loads((run / "PREEMPTED").read_text())["step"]
    assert stopped >= 4, log[-3000:]  # signalled once step 4 was logged, while checkpoint 3 uploads
    tag = f"step_{stopped:08d}"
    assert ("warning: checkpoint step_00000003 was not uploaded to s3://ckpt/preempted: given up for the newer "
            "checkpoint this stop saves") in log, log[-3000:]
    assert f"uploaded checkpoint {tag} to s3://ckpt/preempted" in log, log[-3000:]
    complete = {k.split("/")[1] for k in _keys(s3, "ckpt", "preempted/") if k.endswith("/COMPLETE")}
    assert complete == {tag}, complete


def _stall(store) -> tuple:
    """Make `store`'s next uploader (the bucket is asked as it is made) wait for the returned `answer` event; `asked`
    is set once it waits. A dead endpoint holds a client's making as long, through botocore's retries."""
    import threading

    asked, answer = threading.Event(), threading.Event()
    real = store._new_uploader

    def stalled(staging):
        asked.set()
        answer.wait(120)
        return real(staging)

    store._new_uploader = stalled
    return asked, answer


def _checkpoint(local, step: int) -> str:
    """A two-file local checkpoint (its marker one of them); its tag."""
    from pretrain.checkpointing.checkpoint_dir import COMPLETE

    tag = f"step_{step:08d}"
    local.tag(tag).mkdir(parents=True)
    for name in ("mp_rank_00_model_states.pt", COMPLETE):
        (local.tag(tag) / name).write_bytes(b"x" * 1000)
    return tag


def test_a_run_s_uploads_share_one_set_of_clients(s3, tmp_path, monkeypatch):
    """Each new client reads botocore's service models again, in the interpreter the training loop needs: a run's
    background uploads make their clients (an uploader, a lister, a deleter) once, not at every upload, and the
    clients of the caller's own RemoteCheckpoints stay apart from them."""
    import boto3

    from pretrain.checkpointing.checkpoint_dir import CheckpointDir
    from pretrain.checkpointing.remote_checkpoints import RemoteCheckpoints, Upload

    made = []
    real = boto3.session.Session.client
    monkeypatch.setattr(boto3.session.Session, "client", lambda self, *a, **k: made.append(a) or real(self, *a, **k))
    local = CheckpointDir(RunDir(tmp_path).checkpoints)
    remote = RemoteCheckpoints("s3://ckpt/shared", local)
    for step in (2, 4, 6, 8):
        files, _, _ = Upload(remote, _checkpoint(local, step), keep_last=2, bound_s=60).wait()
        assert files == 2
    assert len(made) == 3, made
    assert remote.complete_tags() == ["step_00000006", "step_00000008"]
    assert len(made) == 4  # the caller's listing: a client of its own


def test_a_client_being_made_keeps_no_other_thread_waiting(s3):
    """Another thread's call whose client is made already (a preemption's upload deleting its marker) does not wait
    while a thread makes an uploader (which asks the bucket: against a dead endpoint, through all of botocore's
    retries)."""
    import threading

    from core.object_store import ObjectStore

    store = ObjectStore("s3://ckpt/making")
    assert store.delete(["nothing"])  # its deleter is made
    asked, answer = _stall(store)
    listing = threading.Thread(target=store.list)
    listing.start()
    try:
        assert asked.wait(30)
        deleting = threading.Thread(target=store.delete, args=(["other"],))
        deleting.start()
        deleting.join(15)
        assert not deleting.is_alive(), "a delete waited for another thread's uploader to be made"
    finally:
        answer.set()
        listing.join(60)
    assert store.list() == []


def test_an_upload_after_a_failed_one_makes_its_clients_anew(s3, tmp_path, monkeypatch):
    """A client keeps the credentials it was made with (a credentials file is read once per client): an upload that
    found no keys fails with one line, and the next, with the keys in place again (as a site's rotation writes them),
    goes through instead of failing on the first upload's clients."""
    from core.errors import StorageError
    from pretrain.checkpointing.checkpoint_dir import CheckpointDir
    from pretrain.checkpointing.remote_checkpoints import RemoteCheckpoints, Upload

    local = CheckpointDir(RunDir(tmp_path).checkpoints)
    remote = RemoteCheckpoints("s3://ckpt/renewed", local)
    keys = {name: os.environ[name] for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
    for name in keys:
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    with pytest.raises(StorageError, match="no credentials for s3://ckpt/renewed"):
        Upload(remote, _checkpoint(local, 2), keep_last=2, bound_s=60).wait()
    for name, value in keys.items():
        monkeypatch.setenv(name, value)
    files, _, _ = Upload(remote, _checkpoint(local, 4), keep_last=2, bound_s=60).wait()
    assert files == 2 and remote.complete_tags() == ["step_00000004"]


def test_the_upload_after_a_given_up_one_has_clients_of_its_own(s3, tmp_path):
    """A given-up upload goes on sending its current file: the next upload (the stop's own checkpoint) shares no client
    with it, and the given-up one, once its call returns, stops before its next file, leaving nothing in the bucket."""
    from core.errors import StorageError
    from pretrain.checkpointing.checkpoint_dir import CheckpointDir
    from pretrain.checkpointing.remote_checkpoints import RemoteCheckpoints, Upload

    local = CheckpointDir(RunDir(tmp_path).checkpoints)
    remote = RemoteCheckpoints("s3://ckpt/given-up", local)
    given_up = remote.for_uploads
    asked, answer = _stall(given_up.store)
    upload = Upload(remote, _checkpoint(local, 2), keep_last=2, bound_s=60)
    try:
        assert asked.wait(30)
        with pytest.raises(StorageError, match="given up for the test's stop"):
            upload.wait("given up for the test's stop")
        assert remote.for_uploads is not given_up
        files, _, _ = Upload(remote, _checkpoint(local, 4), keep_last=2, bound_s=60).wait()
    finally:
        answer.set()
        upload.thread.join(60)
    assert files == 2 and not upload.thread.is_alive()
    assert "given up before" in str(upload.outcome["error"])
    assert _keys(s3, "ckpt", "given-up/") == [f"given-up/step_00000004/{name}" for name in
                                              ("COMPLETE", "mp_rank_00_model_states.pt")]


def test_an_upload_to_a_malformed_endpoint_fails_with_one_line(s3, tmp_path, monkeypatch):
    """An upload's first request deletes its marker (a run branched with train.resume_from reaches the bucket there
    first): a malformed S3_ENDPOINT_URL, refused as that client is made, is the user's one line, not a bug that
    every rank raises at the next save."""
    from core.errors import StorageError
    from pretrain.checkpointing.checkpoint_dir import CheckpointDir
    from pretrain.checkpointing.remote_checkpoints import RemoteCheckpoints, Upload

    monkeypatch.setenv("S3_ENDPOINT_URL", "storage.example:9000")
    local = CheckpointDir(RunDir(tmp_path).checkpoints)
    upload = Upload(RemoteCheckpoints("s3://ckpt/malformed", local), _checkpoint(local, 2), keep_last=2, bound_s=60)
    with pytest.raises(StorageError, match="S3_ENDPOINT_URL 'storage.example:9000' is not an endpoint URL"):
        upload.wait()
    assert not upload.ended_on_a_bug


def test_an_upload_deletes_what_its_tag_held_in_the_bucket_that_the_checkpoint_does_not(s3, tmp_path):
    """A killed upload of the same step at another world size left a shard under the tag: the new upload deletes it,
    so that a resume's download takes this checkpoint's files only."""
    from pretrain.checkpointing.checkpoint_dir import COMPLETE, CheckpointDir
    from pretrain.checkpointing.remote_checkpoints import RemoteCheckpoints

    local = CheckpointDir(RunDir(tmp_path).checkpoints)
    local.tag("step_00000004").mkdir(parents=True)
    for name in ("mp_rank_00_model_states.pt", COMPLETE):
        (local.tag("step_00000004") / name).write_bytes(b"new")
    s3.put_object(Bucket="ckpt", Key="reused/step_00000004/zero_pp_rank_1_mp_rank_00_optim_states.pt", Body=b"old")
    RemoteCheckpoints("s3://ckpt/reused", local).upload("step_00000004", keep_last=3)
    assert _keys(s3, "ckpt", "reused/") == [f"reused/step_00000004/{COMPLETE}",
                                            "reused/step_00000004/mp_rank_00_model_states.pt"]


def test_a_branch_takes_the_abandoned_line_s_checkpoints_out_of_the_bucket(s3, prepared, tmp_path):
    """train.resume_from=4 after a run that uploaded 4 and 8: the bucket's 8 stops counting (its marker goes), so the
    bucket's newest checkpoint is the branch's, and a relaunch on a node without the run folder resumes the branch."""
    run = tmp_path / "run"
    remote = "train.checkpoint_remote=s3://ckpt/branched"
    run_cli("pretrain", _train_args(prepared, run, remote, "train.max_steps=8"))
    branch = run_cli("pretrain", _train_args(prepared, run, remote, "train.max_steps=6", "train.resume_from=4"))
    assert "step_00000008 in s3://ckpt/branched no longer count as checkpoints" in branch.stdout, branch.stdout[-3000:]
    complete = {k.split("/")[1] for k in _keys(s3, "ckpt", "branched/") if k.endswith("/COMPLETE")}
    assert complete == {"step_00000004", "step_00000006"}, complete
    shutil.rmtree(run)
    relaunched = run_cli("pretrain", _train_args(prepared, run, remote, "train.max_steps=6"))
    assert "downloaded checkpoint step_00000006 from s3://ckpt/branched" in relaunched.stdout, relaunched.stdout[-3000:]


def test_a_transfer_refused_midway_is_one_line_naming_its_cause(s3, tmp_path):
    """boto3 wraps a request refused during a transfer (here: a bucket that does not exist) in S3UploadFailedError:
    it reads as the request's own one-line error, not as a bug."""
    import boto3

    from core.object_store import describe

    (tmp_path / "f").write_bytes(b"x")
    client = boto3.client("s3", endpoint_url=os.environ["S3_ENDPOINT_URL"])
    with pytest.raises(Exception) as failed:
        client.upload_file(str(tmp_path / "f"), "no-such-bucket", "k")
    assert type(failed.value).__name__ == "S3UploadFailedError"
    assert describe(failed.value, "s3://no-such-bucket/run") == (
        f"bucket 'no-such-bucket' does not exist at {os.environ['S3_ENDPOINT_URL']} (for s3://no-such-bucket/run)")

def test_a_cache_holding_another_dataset_is_replaced_not_read(s3, prepared, tmp_path):
    """Streaming reads a local index without asking the bucket; a cache filled from another dataset must not be used."""

    from data_pipeline.remote_dataset import fetch_metadata, upload_dataset

    other = tmp_path / "other"
    shutil.copytree(prepared, other)
    manifest = json.loads((DatasetDir(other).manifest).read_text())
    manifest["note"] = "another dataset"
    (DatasetDir(other).manifest).write_text(json.dumps(manifest))
    name = manifest["tokenizer"]["files"][0]
    (DatasetDir(other).tokenizer / name).write_bytes((DatasetDir(other).tokenizer / name).read_bytes() + b"\n")
    upload_dataset(prepared, "s3://corpus/first", overwrite=False)
    upload_dataset(other, "s3://corpus/second", overwrite=False)

    cache = tmp_path / "cache"
    fetch_metadata("s3://corpus/first", cache)
    (cache / "train" / "shard.from-first").write_text("a shard of the first dataset")
    fetch_metadata("s3://corpus/second", cache)
    assert json.loads((DatasetDir(cache).manifest).read_text())["note"] == "another dataset"
    assert (DatasetDir(cache).tokenizer / name).read_bytes() == (DatasetDir(other).tokenizer / name).read_bytes()
    assert not (cache / "train" / "shard.from-first").exists()
    assert (DatasetDir(cache).index("train")).read_bytes() == (DatasetDir(other).index("train")).read_bytes()


def test_fetches_into_one_cache_at_once_take_turns_and_a_second_live_reader_is_one_line(s3, prepared, tmp_path):
    """Two jobs on one cache (one node, or a shared file system): their metadata fetches take turns, each finding the
    dataset whole; a second live reader of that cache from the bucket is refused naming data.path, where streaming
    would raise its own ValueError from inside the dataset."""
    import fcntl
    import threading

    from core.errors import ConfigError
    from data_pipeline.loader import LoaderConfig, build_dataset
    from core.shared_memory import machine_lock
    from data_pipeline.remote_dataset import fetch_lock_name, fetch_metadata, upload_dataset

    upload_dataset(prepared, "s3://corpus/shared", overwrite=False)
    cache = tmp_path / "cache"
    cache.mkdir()
    other = machine_lock(fetch_lock_name(cache))  # another job's fetch, under way
    fcntl.flock(other, fcntl.LOCK_EX)
    fetch = threading.Thread(target=fetch_metadata, args=("s3://corpus/shared", cache))
    fetch.start()
    fetch.join(timeout=2)
    assert fetch.is_alive() and not DatasetDir(cache).manifest.exists()  # it waits its turn
    os.close(other)
    fetch.join(timeout=60)
    assert not fetch.is_alive()
    assert DatasetDir(cache).manifest.read_bytes() == DatasetDir(prepared).manifest.read_bytes()
    assert not [p.name for p in cache.iterdir() if p.name.startswith(f".{MANIFEST}.remote")]
    cfg = LoaderConfig(path=str(cache), remote="s3://corpus/shared")
    first = build_dataset(cfg, "train", 4)
    with pytest.raises(ConfigError, match=f"^data.path '{re.escape(str(cache))}' is the cache of another live run"):
        build_dataset(cfg, "train", 4)
    del first


def test_a_requeued_array_finishes_a_failed_upload_and_leaves_a_finished_one_in_place(s3, corpus_file, tmp_path,
                                                                                      monkeypatch, caplog):
    """The merging task publishes the dataset in its staging folder, then its upload fails: the task fails, the array
    with it, and the user requeues it. Task 0 uploads what is left and the bucket holds the dataset; another requeue
    changes nothing, --overwrite or not (a task 0 that claimed the prefix again emptied it)."""
    import data_pipeline.prepare as prepare_module
    from core.config_io import load_config
    from core.errors import StorageError
    from data_pipeline.config import PrepareConfig
    from data_pipeline.prepare import prepare_task

    array = load_config(PrepareConfig, None, [
        "output_dir=s3://corpus/requeued", f"staging_dir={tmp_path / 'staging'}", "overwrite=true",
        "sources=[{kind: text, path: '" + str(corpus_file) + "'}]", "tokenizer.vocab_size=400", "seq_len=64",
        "val_fraction=0.1", "num_workers=1", "part_bytes=30000"])
    caplog.set_level(logging.INFO, logger="data_pipeline")
    real_upload_rest = prepare_module.upload_rest

    def refused(local, url):
        raise StorageError(f"cannot upload to {url}: the store refused it")

    assert prepare_task(array, 0, 2, "81") is None
    monkeypatch.setattr(prepare_module, "upload_rest", refused)
    with pytest.raises(StorageError, match="the store refused it"):
        prepare_task(array, 1, 2, "81")
    shards_only = _keys(s3, "corpus", "requeued/")
    assert shards_only and not any(k.endswith(MANIFEST) or k.endswith(INDEX) for k in shards_only), shards_only
    monkeypatch.setattr(prepare_module, "upload_rest", real_upload_rest)
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    assert prepare_task(array, 1, 2, "81") is None  # SLURM reran it first: task 0 finishes the upload
    assert _keys(s3, "corpus", "requeued/") == shards_only and "task 0 finishes its upload" in caplog.text
    assert prepare_task(array, 0, 2, "81") == "s3://corpus/requeued"
    assert "its upload to s3://corpus/requeued did not end: uploading the rest" in caplog.text
    local = tmp_path / "staging" / "dataset"
    keys = _keys(s3, "corpus", "requeued/")
    assert f"requeued/{MANIFEST}" in keys and f"requeued/train/{INDEX}" in keys and set(shards_only) < set(keys)
    assert s3.get_object(Bucket="corpus", Key=f"requeued/{MANIFEST}")["Body"].read() == (local / MANIFEST).read_bytes()
    objects = {k: s3.head_object(Bucket="corpus", Key=k)["ETag"] for k in keys}
    monkeypatch.setenv("SLURM_RESTART_COUNT", "2")
    caplog.clear()
    assert prepare_task(array, 0, 2, "81") is None and prepare_task(array, 1, 2, "81") is None
    assert caplog.text.count("the dataset is already published") == 2
    assert {k: s3.head_object(Bucket="corpus", Key=k)["ETag"] for k in _keys(s3, "corpus", "requeued/")} == objects
    assert sorted(p.name for p in (tmp_path / "staging").iterdir()) == ["dataset"]  # no new staging folder
    # What the rest of an upload cannot make whole is refused: shards gone from the bucket (their local copies are
    # too), or another dataset's manifest in its place.
    monkeypatch.setenv("SLURM_RESTART_COUNT", "3")
    s3.delete_object(Bucket="corpus", Key=f"requeued/{MANIFEST}")
    shard = next(k for k in keys if ".mds" in k)
    s3.delete_object(Bucket="corpus", Key=shard)
    with pytest.raises(StorageError, match=rf"lacks 1 shard\(s\) of the dataset published in .* \(e\.g\. {shard.removeprefix('requeued/')}\)"):
        prepare_task(array, 0, 2, "81")
    s3.put_object(Bucket="corpus", Key=f"requeued/{MANIFEST}", Body=b'{"another": "dataset"}')
    from core.errors import OutputExistsError

    with pytest.raises(OutputExistsError, match="holds another dataset than the one published in"):
        prepare_task(array, 0, 2, "81")
