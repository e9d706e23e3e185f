"""Pack tokenized documents into fixed-length `[CLS] ... [SEP]` training sequences."""
from __future__ import annotations

import numpy as np


class FullPacker:
    """RoBERTa FULL-SENTENCES packing: one token stream across documents, [SEP] between documents.

    Every sequence is `[CLS] body [SEP]` with exactly seq_len tokens, except the one `flush`
    returns, which keeps the remainder rather than dropping it. A document boundary that falls
    exactly on a sequence end gets no extra [SEP]: the sequence's closing one already marks it.
    """

    def __init__(self, seq_len: int, cls_id: int, sep_id: int) -> None:
        self.body = seq_len - 2
        self.cls_id = cls_id
        self.sep_id = sep_id
        self._buffer: list[int] = []

    def add(self, ids: list[int]) -> list[np.ndarray]:
        """Add one document's token ids; return the sequences it completed."""
        if self._buffer:
            self._buffer.append(self.sep_id)
        self._buffer.extend(ids)
        out = []
        while len(self._buffer) >= self.body:
            out.append(self._wrap(self._buffer[: self.body]))
            del self._buffer[: self.body]
        return out

    def flush(self) -> list[np.ndarray]:
        """Return the last, shorter sequence (if any tokens remain)."""
        out = [self._wrap(self._buffer)] if self._buffer else []
        self._buffer = []
        return out

    def _wrap(self, body: list[int]) -> np.ndarray:
        return np.asarray([self.cls_id, *body, self.sep_id])
