"""Train through the public API, then save the live training model's MLM logits on a fixed input.

Usage: python tests/helpers/train_and_probe.py --probe-out FILE --config FILE [key=value ...]
The export test compares these logits with the exported folder's.
"""
import argparse
import sys

import torch

from pretrain.config import RunConfig
from pretrain.config_io import load_config
from pretrain.run import build_trainer


def main() -> None:
    """Train, then probe the engine's module in eval mode."""
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
    with torch.no_grad():
        outputs = {name: m(input_ids=input_ids, attention_mask=attention_mask) for name, m in module.hf_models().items()}
    torch.save({"input_ids": input_ids, "attention_mask": attention_mask,
                "logits": {name: o.logits for name, o in outputs.items()}}, args.probe_out)


if __name__ == "__main__":
    sys.exit(main())
