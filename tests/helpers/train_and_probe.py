"""Train through the public API, then save the live training model's outputs on a fixed input.

Usage: [torchrun ...] python tests/helpers/train_and_probe.py --probe-out FILE --config FILE [key=value ...]
For every model the objective exports, the probe holds the last hidden state and, where the model
has a head, its logits; the export tests compare these with the exported folders'.
"""
import argparse
import contextlib
import sys

import torch

from pretrain.config import RunConfig
from pretrain.config_io import load_config
from pretrain.run import build_trainer


def main() -> None:
    """Train, then probe the engine's module in eval mode (every rank joins; rank 0 writes)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--probe-out", required=True)
    parser.add_argument("--config", required=True)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    trainer = build_trainer(load_config(RunConfig, args.config, args.overrides))
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
    if trainer.engine.zero_optimization_stage() == 3:  # partitioned parameters: gather them for plain forwards
        import deepspeed

        gather = deepspeed.zero.GatheredParameters(list(module.parameters()))
    probe = {"input_ids": input_ids, "attention_mask": attention_mask, "hidden": {}, "logits": {}}
    with torch.no_grad(), gather:
        for name, model in module.hf_models().items():
            out = model(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True)
            probe["hidden"][name] = out.hidden_states[-1].clone()
            logits = getattr(out, "logits", None)
            logits = getattr(out, "prediction_logits", None) if logits is None else logits  # BertForPreTraining
            if logits is not None:
                probe["logits"][name] = logits.clone()
    if trainer.rank == 0:
        torch.save(probe, args.probe_out)


if __name__ == "__main__":
    sys.exit(main())
