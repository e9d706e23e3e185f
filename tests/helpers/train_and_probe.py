"""Train through the public API, then save the live training model's outputs on a fixed input.

Usage: [torchrun ...] python tests/helpers/train_and_probe.py --probe-out FILE --config FILE [key=value ...]
   or: [torchrun ...] python tests/helpers/train_and_probe.py --runs RUNS.json
where RUNS.json is a list of {"probe_out": FILE, "args": ["--config", FILE, "key=value", ...]}, trained one
after the other in this process (one interpreter and process-group start-up for many short runs).
For every model the objective exports, the probe holds the last hidden state and, where the model
has a head, its logits (and BERT's NSP logits, which read the pooler); the export tests compare these with the
exported folders'.
"""
import argparse
import contextlib
import gc
import json
import sys
from typing import Optional

import torch

from core.config_io import load_config
from pretrain.config import RunConfig
from pretrain.run import build_trainer


def train_and_probe(config: str, overrides: list[str], probe_out: Optional[str]) -> None:
    """Train one run, then probe the engine's module in eval mode (every rank joins; rank 0 writes); no probe_out:
    train only."""
    trainer = build_trainer(load_config(RunConfig, config, overrides))
    if probe_out is None:  # no probe to hold the comparisons: the step as it is
        trainer.fit()
        trainer.engine.ds.destroy()
        del trainer
        gc.collect()
        return
    norms = _compare_grad_norms(trainer.engine.ds.optimizer)
    clips = _compare_clips(trainer.engine.ds.optimizer)
    trainer.fit()
    module = trainer.engine.module
    module.eval()
    g = torch.Generator().manual_seed(0)
    vocab = module.hf_models()[""].config.vocab_size
    input_ids = torch.randint(5, vocab, (3, 40), generator=g)
    input_ids[:, 0], input_ids[:, -1] = 2, 3
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 30:] = 0
    gather = contextlib.nullcontext()
    if trainer.engine.ds.zero_optimization_stage() == 3:  # partitioned parameters: gather them for plain forwards
        import deepspeed

        gather = deepspeed.zero.GatheredParameters(list(module.parameters()))
    probe = {"input_ids": input_ids, "attention_mask": attention_mask, "hidden": {}, "logits": {}, "pair_logits": {},
             "grad_norms": norms, "clips": clips}
    with torch.no_grad(), gather:
        for name, model in module.hf_models().items():
            out = model(input_ids=input_ids, attention_mask=attention_mask)
            # The encoder's own output (after ModernBERT's final norm), what AutoModel returns for the folder.
            base = getattr(model, model.base_model_prefix, model)
            probe["hidden"][name] = base(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state.clone()
            logits = getattr(out, "logits", None)
            logits = getattr(out, "prediction_logits", None) if logits is None else logits  # BertForPreTraining
            if logits is not None:
                probe["logits"][name] = logits.clone()
            if getattr(out, "seq_relationship_logits", None) is not None:  # BERT's pooler and NSP head (frozen without a pair task)
                probe["pair_logits"][name] = out.seq_relationship_logits.clone()
    if torch.distributed.get_rank() == 0:
        torch.save(probe, probe_out)
    trainer.engine.ds.destroy()
    del trainer, module
    gc.collect()


def _compare_grad_norms(optimizer) -> list[tuple[float, float]]:
    """At ZeRO 1-2 the engine computes DeepSpeed's gradient norm with a foreach kernel (pretrain/engine/deepspeed_engine.py): record
    (that norm, DeepSpeed's own on the same gradients) at every call."""
    pairs: list[tuple[float, float]] = []
    ours = optimizer.__dict__.get("get_grad_norm_direct")  # set on the instance only where the engine replaced it
    if ours is None:
        return pairs
    from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer

    def both(gradients, params, norm_type=2):
        norm = ours(gradients, params, norm_type)
        pairs.append((norm.item(), DeepSpeedZeroOptimizer.get_grad_norm_direct(optimizer, gradients, params, norm_type).item()))
        return norm

    optimizer.get_grad_norm_direct = both
    return pairs


def _compare_clips(optimizer) -> list[tuple[str, bool]]:
    """At ZeRO 1-2 the engine clips with the invalid norm replaced on the device: at every call, apply it and
    DeepSpeed's own to copies of the gradients, with the step's norm and (at the first call) with a norm four times
    the clipping threshold (the tiny runs' own norms may never clip) and each invalid norm DeepSpeed replaces, and
    record (which norm, whether the two gave the same gradients bit for bit)."""
    pairs: list[tuple[str, bool]] = []
    ours = optimizer.__dict__.get("unscale_and_clip_grads")  # set on the instance only where the engine replaced it
    if ours is None:
        return pairs
    from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer

    def both(grad_groups_flat, total_norm):
        trials = {"step": total_norm}
        if not pairs and torch.is_tensor(total_norm):
            above = 4 * optimizer.clip_grad * optimizer.loss_scale
            trials.update({name: torch.full_like(total_norm, v) for name, v in
                           (("clipping", above), ("-1.0", -1.0), ("inf", float("inf")), ("nan", float("nan")))})
        flat = [g for grad in grad_groups_flat for g in (grad if isinstance(grad, list) else [grad])]
        for name, norm in trials.items():
            a, b = [g.clone() for g in flat], [g.clone() for g in flat]
            ours(a, norm)
            DeepSpeedZeroOptimizer.unscale_and_clip_grads(optimizer, b, norm)
            pairs.append((name, all(torch.equal(x, y) for x, y in zip(a, b))))
        return ours(grad_groups_flat, total_norm)

    optimizer.unscale_and_clip_grads = both
    return pairs


def main() -> None:
    """One run from the command line, or several from a JSON list."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--probe-out")
    parser.add_argument("--config")
    parser.add_argument("--runs")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    if args.runs:
        for run in json.loads(open(args.runs).read()):
            config, overrides = run["args"][1], run["args"][2:]
            train_and_probe(config, overrides, run.get("probe_out"))
    else:
        train_and_probe(args.config, args.overrides, args.probe_out)


if __name__ == "__main__":
    sys.exit(main())
