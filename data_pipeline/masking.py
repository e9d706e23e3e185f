"""Dynamic masking, applied per micro-batch with a generator seeded from the step (so resume repeats it)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

IGNORE_INDEX = -100


@dataclass
class MaskingConfig:
    """Which tokens are picked and what they become."""

    strategy: Literal["bert"] = "bert"
    mask_prob: float = 0.15
    # Of the picked tokens: this fraction becomes [MASK], this fraction a random token, the rest stay.
    mask_token_fraction: float = 0.8
    random_token_fraction: float = 0.1

    def validate(self) -> None:
        """Probabilities must be probabilities."""
        from pretrain.config_io import ConfigError

        if not 0.0 < self.mask_prob < 1.0:
            raise ConfigError(f"config key 'masking.mask_prob' must be in (0, 1), got {self.mask_prob}")
        if self.mask_token_fraction < 0 or self.random_token_fraction < 0 or (
            self.mask_token_fraction + self.random_token_fraction > 1.0
        ):
            raise ConfigError("config keys 'masking.mask_token_fraction' + 'masking.random_token_fraction' must be in [0, 1]")


class BertMasking:
    """BERT masking: pick `mask_prob` of the non-special tokens; 80% → [MASK], 10% → random, 10% kept.

    Adds `labels` (original id at picked positions, IGNORE_INDEX elsewhere) and keeps the clean
    ids as `original_input_ids` for objectives that need them.
    """

    def __init__(self, cfg: MaskingConfig, vocab_size: int, mask_id: int, special_ids: list[int]) -> None:
        self.cfg = cfg
        self.mask_id = mask_id
        self.special_ids = torch.tensor(sorted(special_ids), dtype=torch.long)
        keep = torch.ones(vocab_size, dtype=torch.bool)
        keep[self.special_ids[self.special_ids < vocab_size]] = False
        # Random replacements are drawn from ordinary tokens only.
        self.replacement_ids = keep.nonzero().squeeze(1)

    def pickable(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Positions that may be masked: not special, not padding."""
        return ~torch.isin(input_ids, self.special_ids)

    def __call__(self, batch: dict[str, torch.Tensor], generator: torch.Generator) -> dict[str, torch.Tensor]:
        """Return a new batch with masked `input_ids` and `labels`."""
        ids = batch["input_ids"]
        probs = torch.full(ids.shape, self.cfg.mask_prob)
        picked = torch.bernoulli(probs, generator=generator).bool() & self.pickable(ids)
        action = torch.rand(ids.shape, generator=generator)
        to_mask = picked & (action < self.cfg.mask_token_fraction)
        to_random = picked & (action >= self.cfg.mask_token_fraction) & (
            action < self.cfg.mask_token_fraction + self.cfg.random_token_fraction
        )
        draws = torch.randint(len(self.replacement_ids), ids.shape, generator=generator)
        masked = torch.where(to_mask, torch.full_like(ids, self.mask_id), ids)
        masked = torch.where(to_random, self.replacement_ids[draws], masked)
        labels = torch.where(picked, ids, torch.full_like(ids, IGNORE_INDEX))
        return {**batch, "input_ids": masked, "labels": labels, "original_input_ids": ids}


def build_masking(cfg: MaskingConfig, vocab_size: int, mask_id: int, special_ids: list[int]) -> BertMasking:
    """The masking transform named by the config."""
    if cfg.strategy == "bert":
        return BertMasking(cfg, vocab_size, mask_id, special_ids)
    raise ValueError(f"unknown masking strategy {cfg.strategy!r}")
