"""Validation during training: the objective's loss and metrics over the same batches and masks every time."""
from __future__ import annotations

from typing import Optional

import torch

from model.diagnostics import headline, validation_unigram_entropy
from pretrain.engine.deepspeed_engine import Engine, to_device
from pretrain.observe.metrics import MetricWindow


class Validator:
    """Mean metrics over `batches` validation batches, with the headline figures against the unigram entropy.

    What an objective samples while it evaluates (ELECTRA's and COCO-LM's replacements, TACO's negatives) is drawn
    from `seed` afresh at each evaluation, on generators forked from the training's: the figures are a function of
    the weights alone, and training draws the same numbers whether or how often it is evaluated."""

    def __init__(self, engine: Engine, loader, batches: int, world: int, tokenizer: dict, seed: int = 0) -> None:
        self.engine, self.loader, self.batches, self.world, self.seed = engine, loader, batches, world, seed
        # What the validation loss is read against, from the same batches; it refuses data the model cannot read.
        self.unigram_entropy: Optional[float] = validation_unigram_entropy(loader, batches, tokenizer)

    @torch.no_grad()
    def __call__(self) -> dict[str, float]:
        """Evaluate the model now (dropout off), then put it back in training mode."""
        self.engine.eval()
        window = MetricWindow()
        device = self.engine.device
        gpu = []  # the GPU this rank draws on (the CPU's generator is always forked)
        if device.type == "cuda":
            gpu = [device.index if device.index is not None else torch.cuda.current_device()]
        with torch.random.fork_rng(devices=gpu, device_type="cuda"):
            torch.random.default_generator.manual_seed(self.seed)
            for index in gpu:
                torch.cuda.default_generators[index].manual_seed(self.seed)
            for _, batch in zip(range(self.batches), self.loader):
                loss, metrics = self.engine.eval_step(to_device(batch, device))
                window.add({"loss": loss, **metrics})
        self.engine.train()
        out = window.take_means(self.world)
        return {**out, **headline(out, self.unigram_entropy)} if out else {}
