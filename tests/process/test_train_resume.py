"""2-rank ZeRO-2 training through the real CLI: the loss falls, and stop + resume equals an uninterrupted run."""
import json
import math
import re
import shutil
from pathlib import Path

import pytest
import torch
from conftest import TINY_MODEL, kjv_chapters, launch_ranks, prepare_corpus, run_cli, wait_for_step
from pretrain.run_dir import RunDir



def _args(data: Path, out: Path, *extra: str) -> list[str]:
    return [
        "train", "--config", "pretrain/configs/demo_mlm.yaml",
        f"data.path={data}", f"train.output_dir={out}", *TINY_MODEL,
        "train.micro_batch_size=4", "train.global_batch_size=16",  # 2 ranks x 4 x accumulation 2
        # Validation every 5 steps on 2 batches: what every shipped run config does, inside the resumed runs too.
        "train.max_steps=20", "train.save_every=5", "train.log_every=5", "train.eval_every=5", "train.eval_batches=2",
        # A cosine decay to a floor: the schedule a resume must rebuild is not the default's straight line.
        "train.record_samples=true", "schedule.warmup_steps=4", "optimizer.lr=3e-3", "schedule.decay=cosine",
        "schedule.min_lr_ratio=0.1",
        "model.dropout=0.1", "model.attention_dropout=0.1", *extra,
    ]


def _train_losses(run: Path) -> dict[int, float]:
    rows = RunDir(run).metric_rows()
    return {r["step"]: r["loss"] for r in rows if r["split"] == "train"}


def _validation_rows(run: Path) -> list[dict]:
    """The validation rows, less their wall-clock field."""
    return [{k: v for k, v in r.items() if k != "train_seconds"}
            for r in RunDir(run).metric_rows() if r["split"] == "validation"]


def _samples(run: Path, rank: int) -> list[dict]:
    return [json.loads(line) for line in (run / "samples" / f"rank{rank}.jsonl").read_text().splitlines()]


def _final_weights(run: Path) -> dict[str, torch.Tensor]:
    path = RunDir(run).checkpoints / "step_00000020" / "mp_rank_00_model_states.pt"
    return torch.load(path, map_location="cpu", weights_only=False)["module"]


def _fp32_master(run: Path, tag: str = "step_00000020") -> dict[str, torch.Tensor]:
    from pretrain.checkpointing.checkpoint import fp32_weights

    return fp32_weights(RunDir(run).checkpoints, tag)


@pytest.fixture(scope="module")
def uninterrupted(prepared, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("straight") / "run"
    run_cli("pretrain", _args(prepared, out), nproc=2, launcher="torchrun")  # the other tests start ranks directly
    return out


def test_two_rank_loss_falls(uninterrupted):
    losses = _train_losses(uninterrupted)
    assert sorted(losses) == list(range(1, 21))
    first, last = losses[1], sum(losses[s] for s in (18, 19, 20)) / 3
    assert first > 5.5  # ~ln(400) at initialisation
    assert last < first - 0.5, losses
    log = (uninterrupted / "train.log").read_text()
    assert "tok/s" in log and "ETA" in log and "2 rank(s)" in log and "MFU" in log
    assert "precision fp32 (set in the config)" in log
    # Validation over both ranks' batches, beside what the loss is read against (the entropy of the same tokens; its
    # arithmetic against a float64 reference: tests/unit/test_diagnostics.py), and the loss falls.
    rows = _validation_rows(uninterrupted)
    assert [r["step"] for r in rows] == [5, 10, 15, 20]
    assert all({"mlm_loss", "unigram_entropy", "mlm_loss_below_unigram"} <= set(r) for r in rows), rows
    assert all(3.0 < r["unigram_entropy"] < math.log(400) for r in rows), rows  # no more than uniform over the vocabulary
    assert rows[-1]["mlm_loss"] < rows[0]["mlm_loss"] - 0.3, rows


def _samples_per_step(run: Path) -> dict[int, list[int]]:
    """Each step's sample ids over both ranks and all micro-batches, sorted: the global batch it trained on."""
    steps: dict[int, list[int]] = {}
    for rank in (0, 1):
        for record in _samples(run, rank):
            steps.setdefault(record["step"], []).extend(i for micro in record["sample_ids"] for i in micro)
    return {step: sorted(ids) for step, ids in steps.items()}


def test_a_resume_on_smaller_micro_batches_trains_each_step_on_the_same_samples(prepared, uninterrupted, tmp_path):
    """The usual fix after a run ran out of memory: the same command with a smaller train.micro_batch_size (the
    accumulation doubles, the global batch stays). Every step after the resume trains on the global batch the
    uninterrupted run's step did: none repeated, none skipped."""
    out = tmp_path / "run"
    run_cli("pretrain", _args(prepared, out, "train.stop_after=10"), nproc=2)
    second = run_cli("pretrain", _args(prepared, out, "train.micro_batch_size=2"), nproc=2)
    assert "at step 10" in second.stdout and "accumulation 4, global batch 16" in second.stdout, second.stdout[-3000:]
    assert "train.micro_batch_size 4 -> 2" in second.stdout
    resumed, straight = _samples_per_step(out), _samples_per_step(uninterrupted)
    assert sorted(resumed) == list(range(1, 21)) and all(len(ids) == 16 for ids in resumed.values())
    assert resumed == straight


def test_tensorboard_events_hold_the_loss(uninterrupted):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(uninterrupted / "tensorboard"))
    acc.Reload()
    for tag in ("train/loss", "train/lr", "train/tokens_per_s", "train/mlm_accuracy", "train/grad_norm",
                "train/model_tflops_per_device", "train/mfu", "train/peak_memory_gib", "train/data_wait_fraction"):
        assert tag in acc.Tags()["scalars"], tag
    # MFU on a CPU: the model's TFLOP/s over the peak measured at start (logged with 3 significant digits).
    peak = float(re.search(r"MFU against ([0-9.e+-]+) TFLOP/s per device \(measured fp32 matmul",
                           (uninterrupted / "train.log").read_text()).group(1))
    for mfu, tflops in zip(acc.Scalars("train/mfu"), acc.Scalars("train/model_tflops_per_device")):
        assert 0 < mfu.value < 1 and abs(mfu.value * peak - tflops.value) <= 0.01 * tflops.value
    assert [e.step for e in acc.Scalars("train/loss")] == list(range(1, 21))
    losses = _train_losses(uninterrupted)
    assert all(abs(e.value - losses[e.step]) < 1e-5 for e in acc.Scalars("train/loss"))


def test_stop_and_resume_is_exact(prepared, uninterrupted, tmp_path):
    out = tmp_path / "run"
    first = run_cli("pretrain", _args(prepared, out, "train.stop_after=12"), nproc=2)
    assert "stopping after 12 steps" in first.stdout
    assert sorted(p.name for p in (RunDir(out).checkpoints).glob("step_*")) == ["step_00000005", "step_00000010", "step_00000012"]
    # As if the job died while saving step 12: without its marker that checkpoint does not count.
    (RunDir(out).checkpoints / "step_00000012" / "COMPLETE").unlink()
    # ... and while appending step 13's rows: each file ends in a line cut short, which the resume must not trip on.
    for path in (RunDir(out).metrics, RunDir(out).samples(0), RunDir(out).samples(1)):
        with open(path, "a") as fh:
            fh.write('{"step": 13, "spl')
    # As a checkpoint of the version before the loader's state recorded data.shuffle and data.shuffle_algo: they are
    # read from the config it was saved with.
    import torch

    from pretrain.checkpointing.checkpoint_dir import COMPLETE, file_manifest

    tag = RunDir(out).checkpoints / "step_00000010"
    states = torch.load(tag / "mp_rank_00_model_states.pt", weights_only=False)
    assert {states["loader"].pop("shuffle"), states["loader"].pop("shuffle_algo")} == {True, "py1e"}
    torch.save(states, tag / "mp_rank_00_model_states.pt")
    marker = json.loads((tag / COMPLETE).read_text())
    (tag / COMPLETE).write_text(json.dumps({**marker, "files": file_manifest(tag)}))
    # The resume asks for another sample order: the loader's state keeps the one the run started with, and says so.
    second = run_cli("pretrain", _args(prepared, out, "data.num_canonical_nodes=2", "data.shuffle_seed=99",
                                       "data.shuffle_algo=py1s", "data.shuffle=false"), nproc=2)
    assert "resumed from" in second.stdout and "at step 10" in second.stdout
    assert ("note: data.shuffle, data.shuffle_seed, data.shuffle_algo, data.num_canonical_nodes differ from "
            "checkpoint step_00000010's (data.shuffle true -> false, data.shuffle_seed 1234 -> 99, data.shuffle_algo "
            "\"py1e\" -> \"py1s\", data.num_canonical_nodes 1 -> 2), but the loader's state keeps the checkpoint's") \
        in second.stdout, second.stdout[-3000:]
    assert "(train.stop_after 12 -> 0); the current one applies" in second.stdout  # the keys a resume does take

    assert _train_losses(out) == _train_losses(uninterrupted)  # every step, exactly
    # Step s runs at 3e-3 * s/4 in the warmup, then on cosine from 3e-3 down to its floor 3e-4 at step 21.
    lrs = {r["step"]: r["lr"] for r in RunDir(out).metric_rows() if r["split"] == "train"}
    expected = {s: 3e-3 * (s / 4 if s <= 4 else 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (s - 5) / 16)))
                for s in range(1, 21)}
    assert all(abs(lrs[s] - expected[s]) <= 1e-9 for s in expected), (lrs, expected)
    assert _validation_rows(out) == _validation_rows(uninterrupted)  # step 10's from the first launch, once
    rows = RunDir(out).metric_rows()
    assert [r["step"] for r in rows if r["split"] == "train"] == list(range(1, 21))  # steps 11-12 not logged twice
    for rank in (0, 1):
        assert _samples(out, rank) == _samples(uninterrupted, rank)
    a, b = _samples(out, 0), _samples(out, 1)
    seen = [i for rec in a + b for micro in rec["sample_ids"] for i in micro]
    assert len(seen) == len(set(seen)) == 20 * 16  # no sample twice within this (sub-epoch) run

    wa, wb = _final_weights(uninterrupted), _final_weights(out)
    assert wa.keys() == wb.keys()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    ma, mb = _fp32_master(uninterrupted), _fp32_master(out)
    assert all(torch.equal(ma[k], mb[k]) for k in ma)
    # keep_last=3 pruned the oldest checkpoints; only complete ones remain.
    assert sorted(p.name for p in (RunDir(out).checkpoints).glob("step_*")) == ["step_00000010", "step_00000015", "step_00000020"]
    assert all((p / "COMPLETE").is_file() for p in (RunDir(out).checkpoints).glob("step_*"))
    # TensorBoard was rewound too: the redone steps 11-12 appear once.
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(out / "tensorboard"))
    acc.Reload()
    assert [e.step for e in acc.Scalars("train/loss")] == list(range(1, 21))
    refused = run_cli("pretrain", _args(prepared, out, "train.resume=never"), nproc=1, check=False)
    assert refused.returncode == 2 and "resume=never" in refused.stderr


def test_sigusr1_on_one_rank_saves_marks_and_resumes_exactly(prepared, uninterrupted, tmp_path):
    import signal

    from pretrain.lifecycle.exit_status import EXIT_PREEMPTED

    out = tmp_path / "run"
    procs = launch_ranks(_args(prepared, out), 2, tmp_path / "logs")
    wait_for_step(out, 6, procs)
    procs[1].send_signal(signal.SIGUSR1)  # only one rank is told; the flag is OR-reduced
    codes = [p.wait(timeout=120) for p in procs]
    logs = (tmp_path / "logs" / "rank0.log").read_text()
    assert codes == [EXIT_PREEMPTED, EXIT_PREEMPTED], logs[-3000:]
    marker = json.loads((out / "PREEMPTED").read_text())
    assert marker["reason"] == "SIGUSR1 on rank 1"  # rank 0 learned it, and from whom, through the reduction
    step = marker["step"]
    assert 6 <= step < 20
    assert (RunDir(out).checkpoints / ckpt_tag(step) / "COMPLETE").is_file()
    assert "exiting with code 75" in logs
    resumed = run_cli("pretrain", _args(prepared, out), nproc=2)
    assert f"at step {step}" in resumed.stdout
    assert not (out / "PREEMPTED").exists()
    assert _train_losses(out) == _train_losses(uninterrupted)
    assert _validation_rows(out) == _validation_rows(uninterrupted)
    wa, wb = _final_weights(uninterrupted), _final_weights(out)
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def ckpt_tag(step: int) -> str:
    from pretrain.checkpointing.checkpoint_dir import tag_for

    return tag_for(step)


@pytest.mark.parametrize("precision", ["bf16"])
def test_kill_9_at_random_moments(prepared, tmp_path, precision):
    """Four SIGKILLs (two while a checkpoint is being written): the run always resumes from the last
    complete checkpoint and ends bit-identical to an uninterrupted run. In bf16 (autocast: fp32 weights, bf16
    matmuls), the default mixed precision; fp32 stop and resume are tested below."""
    import random
    import time

    args = lambda out: _args(prepared, out, "train.max_steps=16", "train.save_every=2", "train.micro_batch_size=4",  # noqa: E731
                             "train.global_batch_size=8", "train.record_samples=true", f"train.precision={precision}",
                             "train.log_every=1")
    straight = tmp_path / "straight"
    run_cli("pretrain", args(straight), nproc=1)
    out = tmp_path / "killed"
    rng = random.Random(0)
    mid_save = 0
    for attempt in range(4):
        log = tmp_path / f"logs{attempt}" / "rank0.log"
        (proc,) = launch_ranks(args(out), 1, log.parent)
        deadline = time.time() + 60
        # Mid-save kills come first: a kill after the last step would leave nothing for the later attempts to do.
        if attempt % 2 == 0:  # kill as soon as a checkpoint folder exists without its marker
            killed = False
            while time.time() < deadline and not killed:
                assert proc.poll() is None, f"attempt {attempt} ended before its kill"  # every kill lands in a live run
                ckdir = RunDir(out).checkpoints
                pending = [p for p in ckdir.glob("step_*") if not (p / "COMPLETE").exists()] if ckdir.is_dir() else []
                if pending:
                    proc.kill()
                    killed = True
                    time.sleep(0.05)
                    mid_save += any(not (p / "COMPLETE").exists() for p in pending)
                time.sleep(0.002)
        else:  # at a random moment of its training: a random part of a step after the k-th step this attempt logs
            k = rng.randint(1, 4)
            while time.time() < deadline and len(re.findall(r" step \d+/16 \|", log.read_text() if log.is_file() else "")) < k:
                assert proc.poll() is None, log.read_text()[-3000:]
                time.sleep(0.01)
            time.sleep(rng.uniform(0.0, 0.3))
            assert proc.poll() is None, f"attempt {attempt} ended before its kill"  # every kill lands in a live run
        proc.kill()
        proc.wait()
    run_cli("pretrain", args(out), nproc=1)
    assert mid_save >= 1  # at least one kill landed inside a save
    assert _train_losses(out) == _train_losses(straight)
    assert [r["step"] for r in _validation_rows(out)] == [5, 10, 15]
    assert _validation_rows(out) == _validation_rows(straight)
    path = lambda run: RunDir(run).checkpoints / "step_00000016" / "mp_rank_00_model_states.pt"  # noqa: E731
    wa = torch.load(path(straight), map_location="cpu", weights_only=False)["module"]
    wb = torch.load(path(out), map_location="cpu", weights_only=False)["module"]
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert {v.dtype for v in wa.values() if v.is_floating_point()} == {torch.float32}  # autocast keeps fp32 weights
    ma, mb = _fp32_master(straight, "step_00000016"), _fp32_master(out, "step_00000016")
    assert all(torch.equal(ma[k], mb[k]) for k in ma)
    assert _samples(out, 0) == _samples(straight, 0)


def test_modernbert_stop_and_resume_is_exact(prepared, tmp_path):
    """The demo's backbone (ModernBERT, with dropout on so the RNG state matters) resumes bit for bit too. The
    uninterrupted run computes its rotary cos/sin as transformers does (train.rotary_tables=false), the stopped and
    resumed one reads them from the tables (the default): they hold the same values, so the runs still agree bit for
    bit."""
    modern = ["model.architecture=modernbert", "model.dropout=0.1", "model.attention_dropout=0.1", "masking.mask_prob=0.3"]
    straight, out = tmp_path / "straight", tmp_path / "run"
    computed = run_cli("pretrain", _args(prepared, straight, *modern, "train.rotary_tables=false"), nproc=2)
    assert "rotary cos/sin" not in computed.stdout
    stopped = run_cli("pretrain", _args(prepared, out, *modern, "train.stop_after=12"), nproc=2)
    assert "rotary cos/sin read from tables in 1 ModernBERT encoder(s) (train.rotary_tables)" in stopped.stdout
    resumed = run_cli("pretrain", _args(prepared, out, *modern), nproc=2)
    assert "at step 12" in resumed.stdout
    assert _train_losses(out) == _train_losses(straight)
    assert _validation_rows(out) == _validation_rows(straight)
    for rank in (0, 1):
        assert _samples(out, rank) == _samples(straight, rank)
    wa, wb = _final_weights(straight), _final_weights(out)
    assert any(k.startswith("model.model.layers.") for k in wa)  # it really is ModernBERT
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_compiled_step_stop_resume_and_export_exactly(prepared, tmp_path):
    """train.compile=true (the objective's whole step through torch.compile, with dropout) and train.fused_qkv: a
    resume from the step-3 checkpoint in a new process equals an uninterrupted run bit for bit, the log says what was
    compiled, and the export (the same parameter names as uncompiled) loads in AutoModelForMaskedLM. (The resumed
    folder is the straight run's with its step-6 tag removed: a stop saves the same tag as save_every=3, which the
    eager tests stop at; a third compiled process would cost a compile and check nothing more.)"""
    from pretrain.exporting.export import export

    compiled = ["train.compile=true", "train.fused_qkv=true", "train.zero_stage=auto", "train.max_steps=6",
                "train.save_every=3", "train.log_every=3", "train.global_batch_size=8"]
    straight, out = tmp_path / "straight", tmp_path / "run"
    first = run_cli("pretrain", _args(prepared, straight, *compiled), nproc=1)
    assert "compiled the objective's step (encoders, heads and losses) with torch.compile" in first.stdout
    # The whole step compiled: train.unpadded_mask=auto hands the encoders the mask (measured faster there).
    assert "unpadded batches keep their attention mask (train.unpadded_mask=auto, train.compile=true)" in first.stdout
    shutil.copytree(straight, out)
    shutil.rmtree(RunDir(out).checkpoints / "step_00000006")
    resumed = run_cli("pretrain", _args(prepared, out, *compiled), nproc=1)
    assert re.search(r"resumed from \S+step_00000003 at step 3", resumed.stdout), resumed.stdout[-2000:]
    assert "compiled the objective's step (encoders, heads and losses) with torch.compile" in resumed.stdout
    assert _train_losses(out) == _train_losses(straight) and sorted(_train_losses(out)) == list(range(1, 7))
    # Validation through the compiled step (step 5, after the resume).
    assert [r["step"] for r in _validation_rows(out)] == [5] and _validation_rows(out) == _validation_rows(straight)
    assert _samples(out, 0) == _samples(straight, 0)
    path = lambda run: RunDir(run).checkpoints / "step_00000006" / "mp_rank_00_model_states.pt"  # noqa: E731
    wa = torch.load(path(straight), map_location="cpu", weights_only=False)["module"]
    wb = torch.load(path(out), map_location="cpu", weights_only=False)["module"]
    assert wa.keys() == wb.keys() and not any("_orig_mod" in k for k in wa)
    assert "model.bert.encoder.layer.0.attention.self.query.weight" in wa  # transformers' layout, unfused
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    from conftest import restored_environ
    from transformers import AutoModelForMaskedLM

    with restored_environ():
        folder = export(out, tmp_path / "hf")
    model = AutoModelForMaskedLM.from_pretrained(str(folder), local_files_only=True)
    assert torch.equal(model.bert.embeddings.word_embeddings.weight, wb["model.bert.embeddings.word_embeddings.weight"])


def test_a_run_stopped_exactly_at_the_end_of_a_pass_resumes_into_the_next(tmp_path):
    """A checkpoint taken at the last step of a pass (SLURM's USR1 can land there) holds a loader state with every
    sample of that pass taken: the resumed loader's first pass is empty, and the run goes on into the next pass with
    the same losses and samples as one that was not stopped (it once stopped with "no full batch per epoch")."""
    from data_pipeline.shards import read_manifest

    # A corpus of 8 chapters (a tenth of the session's): a pass is a few steps, not fifty.
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(kjv_chapters(8)) + "\n", encoding="utf-8")
    prepared = prepare_corpus(tmp_path / "data", corpus)
    steps_per_pass = read_manifest(prepared)["splits"]["train"]["sequences"] // 8
    assert steps_per_pass >= 3
    args = ["train.micro_batch_size=8", "train.global_batch_size=8", f"train.max_steps={steps_per_pass + 3}",
            f"train.save_every={steps_per_pass}", "train.log_every=1"]
    straight, out = tmp_path / "straight", tmp_path / "run"
    run_cli("pretrain", _args(prepared, straight, *args), nproc=1)
    run_cli("pretrain", _args(prepared, out, *args, f"train.stop_after={steps_per_pass}"), nproc=1)
    run_cli("pretrain", _args(prepared, out, *args), nproc=1)
    assert _train_losses(out) == _train_losses(straight) and max(_train_losses(out)) == steps_per_pass + 3
    assert _samples(out, 0) == _samples(straight, 0)
