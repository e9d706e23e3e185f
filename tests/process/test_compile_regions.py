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
        # The loss terms; the discrete metrics (retrieval, accuracy) may flip on a near-tie of a random model.
        terms = [key for key in want if key.endswith("_loss")]
        assert len(terms) >= 2
        for key in terms:
            torch.testing.assert_close(got[key], want[key], rtol=1e-5, atol=1e-6, msg=f"{name} {key} at call {step}")
        assert got_grads.keys() == want_grads.keys()
        # Fused kernels sum in another order: each gradient within 1e-5 of the whole gradient's size (a key bias,
        # whose true gradient is 0 under softmax, holds rounding noise only; relative to itself it moves by 100%).
        scale = torch.cat([g.flatten() for g in want_grads.values()]).norm()
        worst = max((float((got_grads[k] - want_grads[k]).norm() / scale), k) for k in want_grads)
        assert worst[0] < 1e-5, (name, step, worst)
