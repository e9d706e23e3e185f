"""train.compile=layers on a CPU in fp32: the encoder layers and the head-and-loss regions each objective names give the
eager step's losses and gradients, for the objectives whose regions no trainer test runs (MLM's: test_train_resume).
In tests/process: inductor compiles its kernels in worker processes."""
import copy

import pytest
import torch
from test_backbones import _batch, _build

from data_pipeline.shards import read_manifest
from pretrain.engine.deepspeed_engine import compile_objective


@pytest.mark.parametrize("name", ["tacl", "coco_lm"])
def test_compiled_regions_give_the_eager_losses_and_gradients(name, prepared, tmp_path):
    tok = read_manifest(prepared)["tokenizer"]
    eager = _build("bert", name, tok, tmp_path).train()
    compiled = copy.deepcopy(eager)
    assert "and " + ", ".join(compiled.compile_regions) in compile_objective(compiled, "layers")
    for step in range(2):  # the second call runs the compiled graphs without tracing
        batch = _batch(tok, name, seed=step)
        results = []
        for objective in (eager, compiled):
            objective.zero_grad(set_to_none=True)
            torch.manual_seed(step)  # COCO-LM samples its replacements
            loss, metrics = objective(batch)
            loss.backward()
            results.append((metrics, {n: p.grad for n, p in objective.named_parameters() if p.grad is not None}))
        (want, want_grads), (got, got_grads) = results
        for key in want:
            torch.testing.assert_close(got[key], want[key], rtol=1e-5, atol=1e-6, msg=f"{name} {key} at call {step}")
        assert got_grads.keys() == want_grads.keys()
        for key in want_grads:
            torch.testing.assert_close(got_grads[key], want_grads[key], rtol=1e-4, atol=1e-6, msg=f"{name} {key}")
