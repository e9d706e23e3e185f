"""The per-step metric sums: averaged over micro-batches, exact in float64, whatever the dtypes and names."""
import pytest
import torch

from pretrain.observe.metrics import MetricWindow


def test_a_window_averages_each_step_over_its_micro_batches():
    window = MetricWindow()
    # Step 1: two micro-batches with the same names (the usual case), in the dtypes objectives return.
    window.add({"loss": torch.tensor(2.5), "acc": torch.tensor(0.25, dtype=torch.bfloat16)})
    window.add({"loss": torch.tensor(1.5), "acc": torch.tensor(0.75, dtype=torch.bfloat16)})
    window.end_step(1, {"lr": 0.1, "tokens": 10.0, "samples": 2.0, "data_wait_s": 0.5})
    # Step 2: a micro-batch whose names differ (a staged objective adds one): summed by name.
    window.add({"b": torch.tensor(1.0), "a": torch.tensor(3.0)})
    window.add({"a": torch.tensor(5.0), "b": torch.tensor(2.0), "c": torch.tensor(4.0)})
    window.end_step(2, {"lr": 0.2, "tokens": 7.0, "samples": 1.0, "data_wait_s": 0.0})
    rows = window.flush(world=1)
    assert [step for step, _ in rows] == [1, 2]
    assert rows[0][1] == {"acc": 0.5, "loss": 2.0, "lr": 0.1, "tokens": 10.0, "samples": 2.0, "data_wait_s": 0.5}
    assert rows[1][1] == {"a": 4.0, "b": 1.5, "c": 2.0, "lr": 0.2, "tokens": 7.0, "samples": 1.0, "data_wait_s": 0.0}
    assert len(window) == 0


def test_sums_are_float64_and_the_values_are_not_rounded():
    window = MetricWindow()
    x = torch.tensor(1 / 3, dtype=torch.float32)
    for _ in range(3):
        window.add({"loss": x})
    means = window.take_means(world=1)
    assert means == {"loss": float(x) * 3 / 3}  # float64 arithmetic on the fp32 value, as Python floats would do


class _Log:
    """What the reporter writes to, kept (the run's logger writes TensorBoard and metrics.jsonl rows)."""

    def __init__(self):
        self.rows = []

    def scalars(self, step, values, group):
        self.rows.append((step, group, dict(values)))

    def progress(self, step, metrics, sec_per_step):
        pass


@pytest.mark.parametrize("precision,stops", [("fp16", False), ("bf16", True), ("fp32", True)])
def test_an_overflowing_gradient_stops_bf16_and_fp32_but_not_fp16_which_skips_the_step(precision, stops):
    """fp16 skips an overflowing step and lowers its loss scale (the norm is inf by design); bf16 and fp32 would apply
    it, so an infinite norm stops them. A NaN loss stops every precision; either way the step is logged first."""
    from core.errors import DivergedError
    from pretrain.observe.metrics import MetricsReporter

    def step(loss, grad_norm):
        log = _Log()
        reporter = MetricsReporter(log, world=1, flops_per_token=None, peak_tflops=1.0, precision=precision)
        reporter.window.add({"loss": torch.tensor(loss)})
        reporter.window.end_step(7, {"lr": 1e-3, "grad_norm": grad_norm, "tokens": 64.0, "samples": 2.0,
                                     "data_wait_s": 0.0})
        try:
            reporter.drain(7, seq_len=32, sec_per_step=None)
        except DivergedError as exc:
            return log.rows, str(exc)
        return log.rows, None

    rows, error = step(2.0, float("inf"))
    assert rows[0][0] == 7 and rows[0][2]["grad_norm"] == float("inf")
    assert (error is not None) == stops and (not stops or "training diverged at step 7: grad_norm inf" in error)
    rows, error = step(float("nan"), 1.0)
    assert error is not None and "loss nan" in error and rows[0][0] == 7


def test_a_validation_or_a_save_is_left_out_of_the_throughput_window(monkeypatch):
    """tokens/s, samples/s, MFU and the data-wait share are training's pace: the window that held a validation or a
    checkpoint save (the trainer runs both `paused`) counted its seconds, and every such window read slower."""
    from pretrain.observe import metrics as metrics_module
    from pretrain.observe.metrics import Rates

    clock = [100.0]
    monkeypatch.setattr(metrics_module.time, "perf_counter", lambda: clock[0])
    rates = Rates()
    clock[0] += 10.0  # 10 s of training: 100 steps of 1,000 tokens, 4 samples and 1/64 s of data wait each
    rates.add([(step, {"tokens": 1000.0, "samples": 4.0, "data_wait_s": 1 / 64}) for step in range(100)])
    with rates.paused():
        clock[0] += 30.0  # a validation, then a save
    assert rates.take() == {"tokens_per_s": 10_000.0, "samples_per_s": 40.0, "data_wait_fraction": 100 / 64 / 10}
    clock[0] += 5.0  # the next window: its own time only
    rates.add([(0, {"tokens": 1000.0, "samples": 4.0, "data_wait_s": 0.0})])
    assert rates.take()["tokens_per_s"] == 200.0
