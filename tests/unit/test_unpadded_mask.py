"""A batch column the loader padded nothing in reaches the encoders without its attention mask: the same losses,
metrics and gradients as with the all-ones mask, and no device value read back to the host anywhere in the step.
transformers drops an all-ones mask itself, but only after reading it back (`padding_mask.all()` in an `if`), which
on a GPU makes the host wait for the device at every encoder call: 8 times a micro-step for COCO-LM on ModernBERT."""
from collections import Counter

import pytest
import torch
from helpers.device_reads import DeviceReads
from test_backbones import MATRIX, _batch, _build
from test_one_graph import traced

from core.config_io import load_config
from core.errors import ConfigError
from data_pipeline.batches import unpadded_key
from data_pipeline.shards import read_manifest
from pretrain.config import RunConfig
from pretrain.engine.setup import drops_unpadded_mask


def _step(objective, batch: dict, drop: bool) -> tuple[torch.Tensor, dict, dict, Counter]:
    """One forward and backward from a fixed seed: loss, metrics, gradients by name, and the reads it made."""
    objective.drop_unpadded_mask = drop
    objective.zero_grad(set_to_none=True)
    torch.manual_seed(0)  # the generators' sampling and TACO's negatives draw from it
    reads = DeviceReads()
    with reads:
        loss, metrics = objective(batch)
        loss.backward()
    grads = {n: p.grad.clone() for n, p in objective.named_parameters() if p.grad is not None}
    return loss.detach(), metrics, grads, reads.ops


@pytest.mark.parametrize("backbone,name", MATRIX, ids=[f"{o}-{b}" for b, o in MATRIX])
def test_an_unpadded_batch_trains_the_same_without_its_mask_and_reads_nothing_back(backbone, name, prepared, tmp_path):
    tok = read_manifest(prepared)["tokenizer"]
    objective = _build(backbone, name, tok, tmp_path).train()
    batch = _batch(tok, name, padded=False)
    loss, metrics, grads, reads = _step(objective, batch, drop=True)
    kept_loss, kept_metrics, kept_grads, kept_reads = _step(objective, batch, drop=False)
    assert torch.equal(loss, kept_loss)
    assert metrics.keys() == kept_metrics.keys() and all(torch.equal(metrics[k], kept_metrics[k]) for k in metrics)
    assert grads.keys() == kept_grads.keys() and all(torch.equal(grads[k], kept_grads[k]) for k in grads), \
        [k for k in grads if not torch.equal(grads[k], kept_grads[k])]
    padded = [k for k, v in batch.items() if k.endswith("_unpadded") and v is False]
    if name == "declutr":  # its anchor and positives are spans sampled at different lengths: every view is padded
        assert padded and reads == kept_reads
    else:
        assert batch[unpadded_key("attention_mask")] is True and not padded, padded
        assert not reads, reads
    if backbone != "xlnet":  # XLNet's own attention builds its masks without reading them
        assert kept_reads["_local_scalar_dense"] > 0  # what the mask costs: the counter sees transformers' read


def test_a_padded_column_keeps_its_mask(prepared, tmp_path):
    tok = read_manifest(prepared)["tokenizer"]
    objective = _build("bert", "coco_lm", tok, tmp_path)
    batch = _batch(tok, "coco_lm")  # row 2 padded: the input and its crop
    assert batch[unpadded_key("attention_mask")] is False and batch[unpadded_key("crop_attention_mask")] is False
    assert objective.encoder_mask(batch) is batch["attention_mask"]
    unpadded = _batch(tok, "coco_lm", padded=False)
    assert unpadded[unpadded_key("crop_attention_mask")] is True  # equal rows give equal crops
    assert objective.encoder_mask(unpadded, "crop_attention_mask") is None
    objective.drop_unpadded_mask = False
    assert objective.encoder_mask(unpadded) is unpadded["attention_mask"]
    # A batch built by hand, without the loader's flags, hands its mask over.
    objective.drop_unpadded_mask = True
    plain = {k: v for k, v in unpadded.items() if not k.endswith("_unpadded")}
    assert objective.encoder_mask(plain) is plain["attention_mask"]


@pytest.mark.parametrize("backbone,name", [("bert", "mlm"), ("modernbert", "coco_lm")])
def test_the_step_without_a_mask_is_one_graph(backbone, name, prepared, tmp_path):
    """`train.unpadded_mask=drop` under `train.compile: true`: the step still traces whole."""
    tok = read_manifest(prepared)["tokenizer"]
    objective = _build(backbone, name, tok, tmp_path).train()
    graphs, breaks, reasons = traced(objective, _batch(tok, name, padded=False))
    assert (graphs, breaks) == (1, 0), reasons


def test_auto_drops_the_mask_unless_the_step_is_compiled_whole():
    assert [drops_unpadded_mask("auto", c) for c in (False, "layers", True, "step")] == [True, True, False, False]
    assert [drops_unpadded_mask("drop", c) for c in (False, True)] == [True, True]
    assert [drops_unpadded_mask("keep", c) for c in (False, "layers")] == [False, False]


def test_an_unknown_setting_is_a_config_error(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("train:\n  unpadded_mask: never\n")
    with pytest.raises(ConfigError, match="unpadded_mask"):
        load_config(RunConfig, str(config), [])
