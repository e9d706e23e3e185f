"""benchmarks/gpu_paths.py's verdicts, on rows written here: the fp16 check fails a resume that lost the loss scale,
a run that skipped no step, a non-finite loss; a comparison fails on a step missing; the float64 reference of
DeepSpeed's FusedLamb is its formula, worked by hand. Without a GPU the check stops in one line; a check that raises
fails and the next one runs, the results written after each."""
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
