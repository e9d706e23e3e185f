"""An export read back as a user reads it: the installed transformers' own classes load the written folder, and
its outputs must be the live model's. What the installed transformers cannot load the same is never shipped."""
from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import torch
from transformers import AutoModel, AutoTokenizer, PreTrainedModel
from transformers.utils import ModelOutput

from core.errors import SetupError
from model.backbones.base import LOAD_DTYPE, Backbone, forward_input_names

# Real text through the export's own tokenizer, one sentence a forward: outputs at padded positions mean nothing.
PROBE = ["In the beginning God created the heaven and the earth.", "And God said, Let there be light: and there was light."]
TOLERANCE = 1e-5


def output_tensors(out: ModelOutput | tuple[Any, ...] | list[Any]) -> list[torch.Tensor]:
    """Every tensor of a model output, in order (XLNet's memories are a tuple of them)."""
    items = out.to_tuple() if hasattr(out, "to_tuple") else tuple(out)
    flat: list[torch.Tensor] = []
    for item in items:
        flat += output_tensors(item) if isinstance(item, (tuple, list)) else [item] if torch.is_tensor(item) else []
    return flat


def _gap(got: list[torch.Tensor], want: list[torch.Tensor]) -> float | None:
    """The largest |difference| when some output is not within the tolerance (inf: not even the same shapes)."""
    if len(got) != len(want) or any(g.shape != w.shape for g, w in zip(got, want)):
        return float("inf")
    if all(torch.allclose(g, w, rtol=TOLERANCE, atol=TOLERANCE) for g, w in zip(got, want)):
        return None
    return max((g - w).abs().max().item() for g, w in zip(got, want))


@contextmanager
def _quiet_loads() -> Iterator[None]:
    """Without transformers' load report and progress bars: AutoModel on a head model's folder lists the head's
    weights as unexpected, which is what it should do here, and the export's log is not the place for it."""
    from transformers.utils import logging as hf_logging

    verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()


@torch.no_grad()
def check_loads_the_same(folder: Path, live: PreTrainedModel, name: str) -> None:
    """Load `folder` with AutoModel and with the live model's class; refuse (SetupError) when either's outputs on
    the probe differ from the live model's by more than the tolerance."""
    import transformers

    live.eval()
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    positions = getattr(live.config, "max_position_embeddings", None)  # XLNet's is -1: relative positions only
    length = min(32, positions) if positions and positions > 0 else 32
    probes = [{k: v for k, v in tokenizer(text, truncation=True, max_length=length, return_tensors="pt").items()
               if k in forward_input_names(live)} for text in PROBE]
    for cls, reference in ((AutoModel, Backbone.base(live)), (type(live), live)):
        with _quiet_loads():
            loaded = cls.from_pretrained(str(folder), dtype=LOAD_DTYPE).eval()
        got = [t for inputs in probes for t in output_tensors(loaded(**inputs))]
        gap = _gap(got, [t for inputs in probes for t in output_tensors(reference(**inputs))])
        if gap is not None:
            raise SetupError(f"export refused: {name} loads in transformers {transformers.__version__}'s "
                             f"{type(loaded).__name__} with other outputs than the trained model (largest difference "
                             f"{gap:.3g}, tolerance {TOLERANCE:g}); nothing was written")
