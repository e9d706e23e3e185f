"""Heads that transformers has no class for, saved beside an export as plain safetensors + JSON.

SpanBERT's span boundary objective head (Joshi et al. 2020, eq. 1): a masked token x_i of the span
(x_s .. x_e) is predicted from the encodings of the boundary tokens x_{s-1}, x_{e+1} and a relative
position embedding p_{i-s+1}:
    h0 = [x_{s-1}; x_{e+1}; p_{i-s+1}]
    h1 = LayerNorm(GeLU(W1 h0 + b1))
    y_i = LayerNorm(GeLU(W2 h1 + b2))
and y_i goes through the MLM's own output projection (tied to the token embeddings).
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from core.errors import CheckpointError


@dataclass
class SpanBoundaryShape:
    """What a saved span boundary head needs to be rebuilt."""

    hidden_size: int
    max_span_tokens: int
    layer_norm_eps: float = 1e-12


class SpanBoundaryHead(nn.Module):
    """Boundary encodings + relative position → a hidden vector for the MLM output projection."""

    def __init__(self, shape: SpanBoundaryShape) -> None:
        super().__init__()
        self.shape = shape
        h = shape.hidden_size
        self.position = nn.Embedding(shape.max_span_tokens, h)
        self.layer1, self.norm1 = nn.Linear(3 * h, h), nn.LayerNorm(h, eps=shape.layer_norm_eps)
        self.layer2, self.norm2 = nn.Linear(h, h), nn.LayerNorm(h, eps=shape.layer_norm_eps)
        nn.init.normal_(self.position.weight, std=0.02)

    def forward(self, left: torch.Tensor, right: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
        """left, right: [N, H] boundary encodings; offset: [N] 1-based place in the span → [N, H]."""
        # Spans longer than the table (rare: max_span words of many pieces) share its last position.
        place = (offset - 1).clamp(0, self.shape.max_span_tokens - 1)
        h0 = torch.cat([left, right, self.position(place).to(left.dtype)], dim=-1)
        h1 = self.norm1(F.gelu(self.layer1(h0)))
        return self.norm2(F.gelu(self.layer2(h1)))

    def save(self, folder: str | Path, name: str) -> None:
        """Write `<name>.safetensors` and `<name>.json` (its shape) into folder."""
        from safetensors.torch import save_file

        folder = Path(folder)
        save_file({k: v.detach().contiguous().cpu() for k, v in self.state_dict().items()},
                  str(folder / f"{name}.safetensors"))
        (folder / f"{name}.json").write_text(json.dumps({"class": "SpanBoundaryHead", **asdict(self.shape)}, indent=2) + "\n")

    @classmethod
    def load(cls, folder: str | Path, name: str = "span_boundary_head") -> "SpanBoundaryHead":
        """The head saved beside an export (CheckpointError when it is missing or does not fit its shape)."""
        from safetensors.torch import load_file

        folder = Path(folder)
        meta, weights = folder / f"{name}.json", folder / f"{name}.safetensors"
        if not meta.is_file() or not weights.is_file():
            raise CheckpointError(f"'{folder}' has no span boundary head ({meta.name} and {weights.name})")
        fields = json.loads(meta.read_text())
        fields.pop("class", None)
        head = cls(SpanBoundaryShape(**fields))
        try:
            head.load_state_dict(load_file(str(weights)))
        except RuntimeError as exc:
            raise CheckpointError(f"'{weights}' does not fit the shape in {meta.name}: {exc}") from None
        return head
