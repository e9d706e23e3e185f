"""A batch over its prediction budget in a compiled step: run eagerly, with the eager loss, compiling nothing (inductor
compiles in worker processes, so this lives with the process tests)."""
import torch
from test_backbones import _batch, _build

from data_pipeline.shards import read_manifest


def test_a_batch_over_its_budget_runs_eagerly_in_a_compiled_step(prepared, tmp_path):
    """Compiling the wider shape of a batch over its budget would take one rank minutes while the others wait in the
    gradient all-reduce: the step runs it eagerly instead, with the loss of the eager objective, and compiles nothing."""
    from torch._dynamo.utils import counters

    from data_pipeline.batches import OVER_BUDGET
    from pretrain.engine.deepspeed_engine import compile_step

    tok = read_manifest(prepared)["tokenizer"]
    objective = _build("bert", "mlm", tok, tmp_path, num_layers=1).train()
    batch, wide = _batch(tok, "mlm"), _batch(tok, "mlm", budget=lambda rows, length: 1)
    assert not batch[OVER_BUDGET] and wide[OVER_BUDGET]
    assert len(wide["prediction_index"]) == wide["masked_positions"].numel() > len(batch["prediction_index"])
    eager, _ = objective(wide)
    torch._dynamo.reset()
    counters.clear()
    compile_step(objective)
    objective(batch)
    graphs = counters["stats"]["unique_graphs"]
    assert graphs >= 1
    loss, _ = objective(wide)
    loss.backward()  # an eager graph: its backward compiles nothing either
    assert counters["stats"]["unique_graphs"] == graphs
    assert torch.allclose(loss, eager, rtol=1e-5)
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in objective.parameters())
    objective(dict(wide, **{OVER_BUDGET: False}))  # the same batch unflagged: a graph of its own
    assert counters["stats"]["unique_graphs"] > graphs
    torch._dynamo.reset()
