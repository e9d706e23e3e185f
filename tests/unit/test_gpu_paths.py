"""benchmarks/gpu_paths.py's verdicts, on rows written here: the fp16 check fails a resume that lost the loss scale,
a run that skipped no step, a non-finite loss; a comparison fails on a step missing; the float64 reference of
DeepSpeed's FusedLamb is its formula, worked by hand; the NCCL check says how the survivor ended; only a missing
toolkit makes a check "not run". Every run the checks start loads as a run config. Without a GPU the check stops in
one line; a check that raises fails and the next one runs, the results written after each."""
import json
import math

import pytest
import torch

import benchmarks.gpu_paths as gpu_paths
from benchmarks.gpu_paths import FAIL, FP16_SCALE_POWER, PASS, fp16_verdict, losses_agree

TOP = 2.0 ** FP16_SCALE_POWER


def _fp16_rows(steps: int = 20) -> list[dict]:
    """An fp16 run's rows: the scale lowered by overflowing steps early on, then doubled after 10 steps without one;
    the loss falls."""
    scales, scale = [], TOP
    for step in range(1, steps + 1):
        if step <= 6 and step % 2 == 0:
            scale /= 2
        elif step == 17:
            scale *= 2
        scales.append(scale)
    return [{"step": s, "loss": 6.0 - 0.1 * s, "loss_scale": scales[s - 1]} for s in range(1, steps + 1)]


def test_the_fp16_verdict_passes_a_run_that_resumed_where_it_stopped():
    whole = _fp16_rows()
    resumed = [dict(r) for r in whole]  # the second invocation's rows: the first half's, then its own
    outcome = fp16_verdict(whole, resumed, 20, 10, 1e-3)
    assert outcome.verdict == PASS, outcome.detail
    assert outcome.figures["loss_scales"] == [TOP / 8, TOP / 4, TOP / 2, TOP]


def test_the_fp16_verdict_fails_a_resume_that_lost_the_loss_scale():
    whole = _fp16_rows()
    # A resume that started the scaler afresh: the scale back at 2^24 from step 11, then falling again.
    resumed = [dict(r) for r in whole[:10]] + [{**r, "loss_scale": TOP} for r in whole[10:]]
    outcome = fp16_verdict(whole, resumed, 20, 10, 1e-3)
    assert outcome.verdict == FAIL
    assert "after the resume the loss scale differs from the uninterrupted run's at steps [11, 12, 13, 14, 15]" in \
        outcome.detail


@pytest.mark.parametrize("change, said", [
    (lambda rows: [{**r, "loss_scale": TOP} for r in rows], "no overflowing step was skipped"),
    (lambda rows: [{**r, "loss": math.inf if r["step"] == 3 else r["loss"]} for r in rows], "not finite"),
    (lambda rows: [{**r, "loss": 4.0 + 0.1 * r["step"]} for r in rows], "not below the first 5's"),
    (lambda rows: [{k: v for k, v in r.items() if k != "loss_scale"} for r in rows], "without a loss scale"),
    (lambda rows: rows[:-1], "19 of 20 steps logged")])
def test_the_fp16_verdict_fails_what_fp16_training_must_not_do(change, said):
    whole = change(_fp16_rows())
    outcome = fp16_verdict(whole, [dict(r) for r in whole], 20, 10, 1e-3)
    assert outcome.verdict == FAIL and said in outcome.detail, outcome.detail


def test_a_comparison_fails_on_a_missing_step_or_a_loss_past_the_tolerance():
    a = [{"step": s, "loss": 5.0} for s in range(1, 11)]
    assert losses_agree("x", a, [{**r, "loss": 5.0 * (1 + 9e-4)} for r in a], 10, 1e-3).verdict == PASS
    assert losses_agree("x", a, [{**r, "loss": 5.0 * (1 + 2e-3)} for r in a], 10, 1e-3).verdict == FAIL
    short = losses_agree("x", a, a[:9], 10, 1e-3)
    assert short.verdict == FAIL and "over 9 of 10 steps" in short.detail


def test_without_a_gpu_the_check_stops_in_one_line(monkeypatch, capsys):
    monkeypatch.setattr(gpu_paths, "visible_gpus", lambda: (0, ""))  # as on this CPU, on any host
    with pytest.raises(SystemExit) as stopped:
        gpu_paths.main(["--checks", "fp16"])
    assert stopped.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "error: benchmarks.gpu_paths checks what only a GPU runs, and torch sees no GPU here "
        "(torch.cuda.is_available() is False): run it on a GPU node"]


def test_a_check_that_raises_fails_and_the_next_runs_with_the_results_written_after_each(monkeypatch, tmp_path,
                                                                                       capsys):
    (tmp_path / "data" / "train").mkdir(parents=True)
    out = tmp_path / "results.json"
    written = []

    def broken(args, work, gpus):
        raise RuntimeError("CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported")

    def gone(args, work, gpus):  # benchmarks.peer_loss_time's way to give up
        raise SystemExit("a rank ended before step 5: see /tmp/logs")

    def fine(args, work, gpus):
        written.append(json.loads(out.read_text()))  # what the two before it left
        return gpu_paths.Outcome("workers", PASS, "as expected")

    monkeypatch.setattr(gpu_paths, "visible_gpus", lambda: (1, "NVIDIA H200"))
    monkeypatch.setattr(gpu_paths, "CHECKS", {"fp16": broken, "nccl-peer-loss": gone, "workers": fine})
    with pytest.raises(SystemExit) as stopped:
        gpu_paths.main(["--checks", "fp16", "nccl-peer-loss", "workers", "--data", str(tmp_path / "data"),
                        "--out", str(out), "--work", str(tmp_path / "work")])
    assert stopped.value.code == 1
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(" (")[0] for line in lines] == ["fp16: FAIL", "nccl-peer-loss: FAIL", "workers: pass"]
    assert lines[0].endswith("the check raised RuntimeError: CUDA kernel errors might be asynchronously reported")
    assert lines[1].endswith("the check raised SystemExit: a rank ended before step 5: see /tmp/logs")
    (before,) = written
    assert [o["check"] for o in before["outcomes"]] == ["fp16", "nccl-peer-loss"]
    assert before["not_yet_run"] == ["workers"] and before["device"] == "NVIDIA H200"
    after = json.loads(out.read_text())
    assert [o["verdict"] for o in after["outcomes"]] == [FAIL, FAIL, PASS] and after["not_yet_run"] == []


@pytest.mark.parametrize("start, after", [
    # u = m / sqrt(v) = 0.1 / sqrt(0.02) per element, ||u|| = 1; ratio ||p|| / ||u|| = 5; step size
    # 0.1 * sqrt(1 - 0.98) / (1 - 0.9) = 0.1 * sqrt(2): p -= 0.1 * sqrt(2) * 5 * (1 / sqrt(2)) = 0.5 per element.
    ([3.0, 4.0], [2.5, 3.5]),
    ([300.0, 400.0], [299.0, 399.0]),  # ratio 500, clamped to 10: p -= 1
    ([0.003, 0.004], [0.002, 0.003]),  # ratio 0.005, clamped to 0.01: p -= 0.001
    ([0.0, 0.0], [-0.1, -0.1])])  # ||p|| = 0: ratio 1, p -= 0.1 * sqrt(2) / sqrt(2)
def test_the_fused_lamb_reference_is_deepspeeds_formula_worked_by_hand(start, after):
    (p,) = gpu_paths.fused_lamb_reference([torch.tensor(start)], [[torch.tensor([1.0, 1.0])]], lr=0.1,
                                          betas=(0.9, 0.98), eps=0.0, weight_decay=0.0)
    assert torch.allclose(p, torch.tensor(after, dtype=torch.float64), rtol=1e-9, atol=1e-9), p


def test_the_fused_lamb_reference_over_steps_with_weight_decay_and_eps():
    """A constant gradient g: m_t = (1 - b1^t) g and v_t = (1 - b2^t) g^2 in closed form, worked here in Python floats
    for p = (3, 4), g = (1, -2), three steps, weight decay 0.1, eps 0.01 (no clamp reached)."""
    b1, b2, lr, wd, eps, g = 0.9, 0.98, 0.05, 0.1, 0.01, (1.0, -2.0)
    p = [3.0, 4.0]
    for t in (1, 2, 3):
        m = [(1 - b1 ** t) * gi for gi in g]
        v = [(1 - b2 ** t) * gi * gi for gi in g]
        u = [mi / (vi ** 0.5 + eps) + wd * pi for mi, vi, pi in zip(m, v, p)]
        ratio = (sum(x * x for x in p) ** 0.5) / (sum(x * x for x in u) ** 0.5)
        assert 0.01 < ratio < 10
        p = [pi - lr * (1 - b2 ** t) ** 0.5 / (1 - b1 ** t) * ratio * ui for pi, ui in zip(p, u)]
    (got,) = gpu_paths.fused_lamb_reference([torch.tensor([3.0, 4.0])], [[torch.tensor(g)]] * 3, lr=lr,
                                            betas=(b1, b2), eps=eps, weight_decay=wd)
    assert torch.allclose(got, torch.tensor(p, dtype=torch.float64), rtol=1e-12, atol=0), (got, p)


def _one_case_results(results: dict):
    """benchmarks.peer_loss_time.one_case as it returns (its rank 0's end per case), with the extra overrides kept."""
    calls = []

    def one_case(case, data, work, at_step, batch, limit_s, extra=()):
        calls.append(extra)
        code, seconds = results[case]
        return {"case": case, "exit_code": code, "seconds": seconds, "left_after_5s": 0,
                "line": "peer lost: rank 0 of 2, step 5, backend nccl: ..." if code == 76 else ""}
    return one_case, calls


def test_the_nccl_verdict_says_how_the_survivor_ended(monkeypatch, tmp_path):
    args = gpu_paths.build_parser().parse_args(["--data", str(tmp_path), "--work", str(tmp_path)])
    dumps = tmp_path / "nccl" / "run_sigstop" / "flight_recorder"
    dumps.mkdir(parents=True)
    (dumps / "rank_0").write_text("a dump")
    one_case, calls = _one_case_results({"sigkill": (76, 0.4), "sigstop": (-6, 31.2)})
    monkeypatch.setattr("benchmarks.peer_loss_time.one_case", one_case)
    outcome = gpu_paths.check_nccl_peer_loss(args, tmp_path, 2)
    assert outcome.verdict == PASS, outcome.detail
    assert outcome.detail == ("sigkill: exit 76 after 0.4 s, 0 flight-recorder dump(s); "
                              "sigstop: killed by SIGABRT after 31.2 s, 1 flight-recorder dump(s)")
    assert all("train.step_timeout_s=30" in extra for extra in calls) and len(calls) == 2

    one_case, _ = _one_case_results({"sigkill": (-6, 31.0), "sigstop": (None, 150.0)})
    monkeypatch.setattr("benchmarks.peer_loss_time.one_case", one_case)
    failed = gpu_paths.check_nccl_peer_loss(args, tmp_path, 2)
    assert failed.verdict == FAIL
    assert failed.detail.startswith("sigkill: rank 0 killed by SIGABRT after 31.0 s (exit 76 within 15 s, naming "
                                    "backend nccl, expected)")
    assert "sigstop: rank 0 still running after 150.0 s (an end within 90 s expected)" in failed.detail
    assert gpu_paths.check_nccl_peer_loss(args, tmp_path, 1).verdict == gpu_paths.NOT_RUN


ADVICE = ("use optimizer.impl=torch (torch's fused AdamW), or give the node a CUDA toolkit for torch's CUDA 13.0 "
          "(nvcc, CUDA_HOME)")  # what optim.py advises after the reason: it names CUDA_HOME whatever the reason


@pytest.mark.parametrize("stderr, code, said", [
    ("error: optimizer.impl=deepspeed on a GPU needs DeepSpeed's FusedAdam op, which did not build here (OSError: "
     f"CUDA_HOME environment variable is not set. Please set it to your CUDA install root.): {ADVICE}", 2,
     "the node has no toolkit to build the op: error: optimizer.impl=deepspeed"),
    ("error: optimizer.impl=deepspeed on a GPU needs DeepSpeed's FusedAdam op, which did not build here (Error "
     f"building extension 'fused_adam': /bin/sh: 1: /usr/local/cuda/bin/nvcc: not found): {ADVICE}", 2, "no toolkit"),
    # A compile that fails is the stack's fault, not a missing toolkit: the check fails.
    ("error: optimizer.impl=deepspeed on a GPU needs DeepSpeed's FusedAdam op, which did not build here "
     f"(multi_tensor_adam.cu(3): error: identifier \"__nv_bfloat16\" is undefined): {ADVICE}", 2, ""),
    ("error: optimizer.impl=deepspeed on a GPU needs DeepSpeed's FusedAdam op, which did not build here "
     f"(ImportError: fused_adam.so: undefined symbol: _ZN3c104cuda9SetDeviceEi): {ADVICE}", 2, ""),
    ("Traceback (most recent call last):\nOSError: CUDA_HOME environment variable is not set", 1, "")])
def test_only_a_missing_toolkit_is_a_check_not_run(stderr, code, said):
    found = gpu_paths.not_built(gpu_paths.Run(code, 10.0, stderr, [], ""))
    assert (said in found and found) if said else found == "", found


def test_every_run_a_check_starts_is_a_config_the_trainer_loads(monkeypatch, tmp_path):
    """Each check's runs, caught before they start (the GPU runs them): their overrides, over the demo config, load
    as a RunConfig, so a key's typo is found here and not on a GPU node."""
    from core.config_io import load_config
    from pretrain.config import RunConfig

    started = []

    def train(out, args, *overrides, backbone="bert", env=None, fresh=True):
        started.append(gpu_paths.run_overrides(out, args, *overrides, backbone=backbone))
        return gpu_paths.Run(0, 1.0, "", [], "")

    one_case, calls = _one_case_results({"sigkill": (76, 1.0), "sigstop": (76, 31.0)})
    monkeypatch.setattr(gpu_paths, "train", train)
    monkeypatch.setattr("benchmarks.peer_loss_time.one_case", one_case)
    args = gpu_paths.build_parser().parse_args(["--data", str(tmp_path / "data"), "--work", str(tmp_path)])
    for name, check in gpu_paths.CHECKS.items():
        if name != "fused-lamb":  # its formula check puts tensors on the GPU first; its run is below
            check(args, tmp_path, 2)
    started.append(gpu_paths.run_overrides(tmp_path / "lamb", args, *gpu_paths.LAMB_RUN))
    # rank-gpu 1, fp16 3, fused-adam 2, flash-attention 1 (no flash-attn here), workers 1; NCCL's two cases; lamb 1.
    assert len(started) == 9 and len(calls) == 2
    for overrides in [*started, *([f"data.path={tmp_path}", *extra] for extra in calls)]:
        load_config(RunConfig, str(gpu_paths.REPO / gpu_paths.CONFIG), list(overrides))


def test_a_sigterm_ends_the_checks_with_the_earlier_ones_written(monkeypatch, tmp_path, capsys):
    """The GPU queue ends an entry by SIGTERM: the check running is not turned into a failure and the next is not
    started; the results file holds the checks before it."""
    import os
    import signal

    (tmp_path / "data" / "train").mkdir(parents=True)
    out = tmp_path / "results.json"

    def terminated(args, work, gpus):
        os.kill(os.getpid(), signal.SIGTERM)  # the handler main installed raises at once
        raise AssertionError("not reached")

    monkeypatch.setattr(gpu_paths, "visible_gpus", lambda: (1, "NVIDIA H200"))
    monkeypatch.setattr(gpu_paths, "CHECKS", {"rank-gpu": lambda *a: gpu_paths.Outcome("rank-gpu", PASS, "ok"),
                                              "fp16": terminated, "workers": terminated})
    previous = signal.getsignal(signal.SIGTERM)
    try:
        with pytest.raises(SystemExit) as stopped:
            gpu_paths.main(["--data", str(tmp_path / "data"), "--out", str(out), "--work", str(tmp_path / "work")])
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert stopped.value.code == 128 + signal.SIGTERM
    assert "stopped by SIGTERM during fp16" in capsys.readouterr().err
    written = json.loads(out.read_text())
    assert [o["check"] for o in written["outcomes"]] == ["rank-gpu"] and written["not_yet_run"] == ["fp16", "workers"]
