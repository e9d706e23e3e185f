"""train.compile=layers on a CPU in fp32: the encoder layers and the head-and-loss regions each objective names give the
eager step's losses and gradients, for the objectives whose regions no trainer test runs (TaCL's: test_compile_check).
In tests/process: inductor compiles its kernels in worker processes."""
import copy

import pytest
import torch
from test_backbones import _batch, _build

from data_pipeline.shards import read_manifest
from model.rotary_tables import tabulate_rotary
from pretrain.engine.deepspeed_engine import compile_objective


LOSSES = {"mlm": {"mlm_loss"},
          "coco_lm": {"generator_mlm_loss", "copy_loss", "copy_prior_loss", "clm_loss", "scl_loss"}}


@pytest.mark.parametrize("name", list(LOSSES))
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
        terms = [key for key in want if key.endswith("_loss")]
        assert set(terms) == LOSSES[name]
        for key in terms:
            torch.testing.assert_close(got[key], want[key], rtol=1e-5, atol=1e-6, msg=f"{name} {key} at call {step}")
        # The accuracies computed inside the regions: at most one prediction flipped by a near-tie of a random model.
        one = 1.0 / int((batch["labels"] != -100).sum())
        region_accuracies = [k for k in ("mlm_accuracy", "generator_accuracy", "clm_accuracy") if k in want]
        assert region_accuracies
        for key in region_accuracies:
            assert abs(float(got[key]) - float(want[key])) <= one + 1e-6, (name, key, float(got[key]), float(want[key]))
        assert got_grads.keys() == want_grads.keys()
        # Fused kernels sum in another order: each gradient within 1e-4 of its own size, plus a floor of 1e-6 of the
        # whole gradient's (a key bias, whose true gradient is 0 under softmax, holds rounding noise only).
        scale = torch.cat([g.flatten() for g in want_grads.values()]).norm()
        for key, w in want_grads.items():
            error = float((got_grads[key] - w).norm())
            assert error <= 1e-4 * float(w.norm()) + 1e-6 * float(scale), (name, step, key, error, float(w.norm()))


def test_modernbert_compiled_whole_with_rotary_tables_gives_the_eager_step(prepared, tmp_path):
    """train.compile=true on ModernBERT with train.rotary_tables (the trainer's default): the compiled step, which
    loads cos and sin from the tables, gives the eager step of the untouched model, to 1e-5."""
    tok = read_manifest(prepared)["tokenizer"]
    eager = _build("modernbert", "mlm", tok, tmp_path).train()
    compiled = copy.deepcopy(eager)
    assert tabulate_rotary(compiled) == 1
    assert compile_objective(compiled, True) == "the objective's step (encoders, heads and losses)"
    for step in range(2):
        batch = _batch(tok, "mlm", seed=step)
        results = []
        for objective in (eager, compiled):
            objective.zero_grad(set_to_none=True)
            loss, metrics = objective(batch)
            loss.backward()
            results.append((loss.detach(), {n: p.grad for n, p in objective.named_parameters() if p.grad is not None}))
        (want, want_grads), (got, got_grads) = results
        torch.testing.assert_close(got, want, rtol=1e-5, atol=0, msg=f"loss at call {step}")
        assert got_grads.keys() == want_grads.keys()
        for key, grad in want_grads.items():
            torch.testing.assert_close(got_grads[key], grad, rtol=1e-4, atol=1e-6, msg=f"{key} at call {step}")
