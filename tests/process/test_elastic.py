"""Elastic resume: a checkpoint from 2 ranks resumes on 1 and vice versa, through DeepSpeed's universal checkpoint
(ZeRO 1-3), or directly (stage 0 saves whole states)."""
import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from conftest import TINY_MODEL, run_cli
from pretrain.run_dir import RunDir



def _args(data, out, *extra):
    return ["train", "--config", "pretrain/configs/demo_mlm.yaml", f"data.path={data}", f"train.output_dir={out}", *TINY_MODEL,
            "train.micro_batch_size=4", "train.global_batch_size=16", "train.max_steps=12", "train.save_every=3",
            "train.keep_last=10", "train.eval_every=0", "train.record_samples=true", "schedule.warmup_steps=2", "optimizer.lr=2e-3", *extra]


def _global_steps(run: Path, ranks: int) -> dict[int, list[int]]:
    """Sample ids of each step over all ranks."""
    steps: dict[int, list[int]] = {}
    for rank in range(ranks):
        for line in (run / "samples" / f"rank{rank}.jsonl").read_text().splitlines():
            rec = json.loads(line)
            steps.setdefault(rec["step"], []).extend(i for micro in rec["sample_ids"] for i in micro)
    return {k: sorted(v) for k, v in steps.items()}


def _fp32(run: Path, tag: str) -> dict[str, torch.Tensor]:
    from pretrain.checkpointing.checkpoint import fp32_weights

    return fp32_weights(RunDir(run).checkpoints, tag)


@pytest.fixture(scope="module")
def straight_run(prepared, tmp_path_factory) -> Path:
    """12 steps on 2 ranks, a checkpoint every 3 (all kept)."""
    out = tmp_path_factory.mktemp("elastic") / "straight"
    run_cli("pretrain", _args(prepared, out), nproc=2)
    return out


@pytest.fixture(scope="module")
def straight(straight_run):
    return _global_steps(straight_run, 2)


def _rewound_copy(run: Path, dest: Path, step: int) -> Path:
    """A copy of the run as it was after saving `step`: later checkpoints gone (the trainer rewinds the logs)."""
    shutil.copytree(run, dest)
    for tag in (RunDir(dest).checkpoints).glob("step_*"):
        if int(tag.name.split("_")[1]) > step:
            shutil.rmtree(tag)
    return dest


def test_two_to_one_rank(prepared, straight_run, straight, tmp_path):
    out = _rewound_copy(straight_run, tmp_path / "run", 6)
    probe = _rewound_copy(straight_run, tmp_path / "probe", 6)
    resumed = run_cli("pretrain", _args(prepared, out), nproc=1)
    assert "converting it to a universal checkpoint" in resumed.stdout and "at step 6" in resumed.stdout
    assert "accumulation 4" in resumed.stdout  # the global batch stayed 16
    # Steps 1-6 came from two ranks, 7-12 from one: together they are the uninterrupted run's global batches.
    assert _global_steps(out, 2) == straight
    # Nothing of the conversion stays: the copy, nor ds_to_universal's pointer to its temporary name.
    assert not [p.name for p in (RunDir(out).checkpoints).iterdir() if "universal" in p.name]
    # The converted weights load exactly: one more step at lr 0 leaves the fp32 weights bit-identical.
    run_cli("pretrain", _args(prepared, probe, "optimizer.lr=0", "schedule.warmup_steps=0", "train.stop_after=1"), nproc=1)
    before, after = _fp32(probe, "step_00000006"), _fp32(probe, "step_00000007")
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)


def test_one_to_two_ranks(prepared, straight, tmp_path):
    out = tmp_path / "run"
    run_cli("pretrain", _args(prepared, out, "train.stop_after=6"), nproc=1)
    resumed = run_cli("pretrain", _args(prepared, out), nproc=2)
    assert "at step 6" in resumed.stdout and "accumulation 2" in resumed.stdout
    combined = _global_steps(out, 2)
    assert combined == straight


def test_stage_change_is_refused(prepared, straight_run, tmp_path):
    out = _rewound_copy(straight_run, tmp_path / "run", 6)
    proc = run_cli("pretrain", _args(prepared, out, "train.zero_stage=3"), nproc=1, check=False)
    assert proc.returncode == 2
    assert "ZeRO stage 2" in proc.stderr and "stage 3" in proc.stderr


def test_stage_zero_resumes_on_another_rank_count_without_conversion(prepared, straight, tmp_path):
    """`zero_stage: auto` picks 0 on one rank and keeps it when the run resumes on two: the same global batches.
    In bf16 (autocast over fp32 weights): the precision mode changes nothing a resume loads."""
    out, probe = tmp_path / "run", tmp_path / "probe"
    auto = lambda *extra: _args(prepared, out, "train.zero_stage=auto", "train.precision=bf16", *extra)  # noqa: E731
    first = run_cli("pretrain", auto("train.stop_after=6"), nproc=1)
    assert "ZeRO stage 0 (train.zero_stage=auto: one rank" in first.stdout
    assert re.search(r"\d loader worker\(s\) per rank \(data.num_workers=auto\)", first.stdout)
    shutil.copytree(out, probe)
    resumed = run_cli("pretrain", auto(), nproc=2)
    assert "ZeRO stage 0 (train.zero_stage=auto: the run's checkpoints were saved at stage 0)" in resumed.stdout
    assert "universal" not in resumed.stdout and "at step 6" in resumed.stdout and "accumulation 2" in resumed.stdout
    assert _global_steps(out, 2) == straight
    # The whole states load exactly on the other rank count: one more step at lr 0 leaves every weight as saved.
    run_cli("pretrain", _args(prepared, probe, "train.zero_stage=auto", "train.precision=bf16", "optimizer.lr=0",
                              "schedule.warmup_steps=0", "train.stop_after=1"), nproc=2)
    before, after = _fp32(probe, "step_00000006"), _fp32(probe, "step_00000007")
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)


@pytest.mark.parametrize("stage,before,after", [(1, 2, 1), (2, 2, 1), (3, 1, 2)])
def test_a_frozen_generator_and_its_stage_survive_a_resume_on_another_rank_count(prepared, tmp_path, stage, before,
                                                                               after):
    """ELECTRA two-stage, switched at step 3, resumed at 6 on another number of ranks: DeepSpeed's universal load
    restores the trained parameters only, so the frozen generator and the stage flag come from the checkpoint's own
    files (ZeRO 1-2: the module file; ZeRO-3: every rank's fragments, gathered and written on 2 ranks). The generator
    stays as frozen at the switch (it was switched again, from the discriminator's encoder, before)."""
    out = tmp_path / "run"
    two_stage = [f"train.zero_stage={stage}", "objective.name=electra", "objective.electra.generator_width=1.0",
                 "objective.electra.two_stage_generator_steps=3", "train.max_steps=9"]
    run_cli("pretrain", _args(prepared, out, *two_stage, "train.stop_after=6"), nproc=before)
    resumed = run_cli("pretrain", _args(prepared, out, *two_stage), nproc=after)
    assert "converting it to a universal checkpoint" in resumed.stdout and "at step 6" in resumed.stdout
    at_resume, end = _fp32(out, "step_00000006"), _fp32(out, "step_00000009")
    generator = [k for k in at_resume if k.startswith("generator.")]
    loaded = re.search(r"loaded (\d+) buffer\(s\) and frozen parameter\(s\) from step_00000006 itself", resumed.stdout)
    assert loaded and int(loaded.group(1)) > 1 and generator  # the generator's parameters and its stage flag
    discriminator = [k for k in at_resume if k.startswith("discriminator.") and k.endswith(".weight")]
    assert [k for k in generator if not torch.equal(at_resume[k], end[k])] == []
    assert discriminator and any(not torch.equal(at_resume[k], end[k]) for k in discriminator)  # it trained on
    stages = {row["step"]: row["electra_stage"] for row in RunDir(out).metric_rows("train")}
    assert stages == {step: 1.0 if step <= 3 else 2.0 for step in range(1, 10)}
    if stage == 1:
        # The same run resumed as joint ELECTRA (no stage-one generator, the generator trained): refused in one line
        # before anything is converted or moved (DeepSpeed's load raised a state-dict error, or on another number
        # of ranks a missing file inside its universal load).
        joint = [a for a in two_stage if "two_stage" not in a] + ["train.max_steps=12"]
        refused = run_cli("pretrain", _args(prepared, out, *joint), nproc=after, check=False)
        errors = [line for line in refused.stderr.splitlines() if line.startswith("error:")]
        assert refused.returncode == 2 and len(errors) == 1, refused.stderr[-3000:]
        assert re.search(r"step_00000009 holds other parameters than this launch builds: \d+ in the checkpoint but not "
                         r"built here \(stage_one\..*\d+ trained here but frozen in the checkpoint \(generator\..*"
                         r"objective\.electra\.two_stage_generator_steps 3 -> 0", errors[0]), errors[0]
        assert "Traceback" not in refused.stderr
        assert sorted(p.name for p in RunDir(out).checkpoints.glob("step_*")) == [
            "step_00000003", "step_00000006", "step_00000009"]
