"""The per-step metric sums: averaged over micro-batches, exact in float64, whatever the dtypes and names."""
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
