"""Pack tokenized documents into training sequences: `full`, `document` or `pairs` (NSP/SOP).

Each packer's `add` takes one document and returns the samples it completed; `flush` returns
what remains at the end. A sample is a dict of MDS columns.
"""
from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np

Sample = dict[str, Any]


def _wrap(cls_id: int, body: list[int], sep_id: int) -> np.ndarray:
    out = np.empty(len(body) + 2, dtype=np.int64)
    out[0], out[1:-1], out[-1] = cls_id, body, sep_id
    return out


class FullPacker:
    """RoBERTa FULL-SENTENCES packing: one token stream across documents, [SEP] between documents.

    Every sequence is `[CLS] body [SEP]` with exactly seq_len tokens, except the one `flush`
    returns, which keeps the remainder rather than dropping it. A document boundary that falls
    exactly on a sequence end gets no extra [SEP]: the sequence's closing one already marks it.
    """

    columns = {"input_ids": "ndarray"}

    def __init__(self, seq_len: int, cls_id: int, sep_id: int) -> None:
        self.body = seq_len - 2
        self.cls_id = cls_id
        self.sep_id = sep_id
        self._buffer: list[int] = []

    def add(self, doc_id: int, ids: list[int]) -> list[Sample]:
        """Add one document's token ids; return the sequences it completed."""
        if not ids:
            return []  # a document that encodes to nothing (e.g. only zero-width characters)
        if self._buffer:
            self._buffer.append(self.sep_id)
        self._buffer.extend(ids)
        n = len(self._buffer) // self.body
        out = [{"input_ids": _wrap(self.cls_id, self._buffer[i * self.body:(i + 1) * self.body], self.sep_id)} for i in range(n)]
        del self._buffer[: n * self.body]
        return out

    def add_many(self, docs: list[list[int]]) -> np.ndarray:
        """`add` for many documents at once: the completed sequences as rows of one array (same tokens, same order)."""
        pieces: list = [self._buffer] if self._buffer else []
        length = len(self._buffer)
        sep = [self.sep_id]
        for ids in docs:
            if not len(ids):
                continue
            if length % self.body:  # tokens wait in the buffer: this document needs its separator
                pieces.append(sep)
                length += 1
            pieces.append(ids)
            length += len(ids)
        stream = np.concatenate([np.asarray(piece, dtype=np.int64) for piece in pieces]) if pieces else np.empty(0, np.int64)
        n = length // self.body
        self._buffer = stream[n * self.body:].tolist()
        out = np.empty((n, self.body + 2), dtype=np.int64)
        out[:, 0], out[:, -1] = self.cls_id, self.sep_id
        out[:, 1:-1] = stream[:n * self.body].reshape(n, self.body)
        return out

    def flush(self) -> list[Sample]:
        """Return the last, shorter sequence (if any tokens remain)."""
        out = [{"input_ids": _wrap(self.cls_id, self._buffer, self.sep_id)}] if self._buffer else []
        self._buffer = []
        return out


class DocumentPacker:
    """Never crosses a document boundary: each document is cut into `[CLS] chunk [SEP]` pieces.

    A document's last piece is shorter (padded in the batch); short documents are not merged.
    """

    columns = {"input_ids": "ndarray", "doc_id": "int64"}

    def __init__(self, seq_len: int, cls_id: int, sep_id: int) -> None:
        self.body = seq_len - 2
        self.cls_id = cls_id
        self.sep_id = sep_id

    def add(self, doc_id: int, ids: list[int]) -> list[Sample]:
        """Cut one document into sequences."""
        return [
            {"input_ids": _wrap(self.cls_id, ids[i:i + self.body], self.sep_id), "doc_id": doc_id}
            for i in range(0, len(ids), self.body)
        ]

    def flush(self) -> list[Sample]:
        """Nothing is held between documents."""
        return []


class PairPacker:
    """BERT's sentence-pair instances: `[CLS] A [SEP] B [SEP]` with token_type_ids 0 for A, 1 for B.

    Follows google-research/bert create_pretraining_data.py (create_instances_from_document):
    sentences are gathered until a target length (seq_len - 3, or a random shorter one with
    probability short_seq_prob), A is a random prefix of them.
    - NSP: with probability 0.5 (or when there is only one sentence), B comes from another
      document (label 1, "not next"); otherwise B is the rest of the gathered sentences (label 0).
      The other document is drawn from the last `pool_size` documents this packer saw.
    - SOP (ALBERT): B is always the rest; with probability 0.5 A and B are swapped (label 1).
      A single long sentence is split in two at a random token.
    The pair is truncated to fit by trimming the longer segment at a random end.
    """

    columns = {"input_ids": "ndarray", "token_type_ids": "ndarray", "pair_label": "int32", "doc_a": "int64", "doc_b": "int64"}

    def __init__(
        self, seq_len: int, cls_id: int, sep_id: int, task: str, short_seq_prob: float, pool_size: int, seed: int
    ) -> None:
        self.max_tokens = seq_len - 3
        self.cls_id = cls_id
        self.sep_id = sep_id
        self.task = task
        self.short_seq_prob = short_seq_prob
        self.rng = np.random.default_rng(seed)
        self.pool: deque[tuple[int, list[list[int]]]] = deque(maxlen=pool_size)

    def _random_segment(self, doc_id: int, target: int) -> tuple[int, list[int]] | None:
        others = [entry for entry in self.pool if entry[0] != doc_id]
        if not others:
            return None
        other_id, sentences = others[self.rng.integers(len(others))]
        start = self.rng.integers(len(sentences))
        tokens: list[int] = []
        for sent in sentences[start:]:
            tokens.extend(sent)
            if len(tokens) >= target:
                break
        return other_id, tokens

    def _truncate(self, a: list[int], b: list[int]) -> None:
        while len(a) + len(b) > self.max_tokens:
            longer = a if len(a) > len(b) else b
            if self.rng.random() < 0.5:
                del longer[0]
            else:
                longer.pop()

    def _sample(self, a: list[int], b: list[int], label: int, doc_a: int, doc_b: int) -> Sample:
        self._truncate(a, b)
        ids = np.asarray([self.cls_id, *a, self.sep_id, *b, self.sep_id], dtype=np.int64)
        types = np.zeros(len(ids), dtype=np.uint8)
        types[len(a) + 2:] = 1
        return {"input_ids": ids, "token_type_ids": types, "pair_label": label, "doc_a": doc_a, "doc_b": doc_b}

    def _instance(self, doc_id: int, chunk: list[list[int]], target: int) -> tuple[Sample | None, int]:
        """One instance from the gathered sentences, and how many of them to put back (NSP random B)."""
        if self.task == "sop" and len(chunk) == 1:
            sent = chunk[0]
            if len(sent) < 2:
                return None, 0
            cut = int(self.rng.integers(1, len(sent)))
            chunk = [sent[:cut], sent[cut:]]
        a_end = int(self.rng.integers(1, len(chunk))) if len(chunk) >= 2 else 1
        a = [t for s in chunk[:a_end] for t in s]
        rest = [t for s in chunk[a_end:] for t in s]
        if self.task == "sop":
            if self.rng.random() < 0.5:
                return self._sample(rest, a, 1, doc_id, doc_id), 0
            return self._sample(a, rest, 0, doc_id, doc_id), 0
        if not rest or self.rng.random() < 0.5:
            drawn = self._random_segment(doc_id, max(1, target - len(a)))
            if drawn is not None:
                # As BERT does, the unused sentences go back to start the next instance.
                return self._sample(a, drawn[1], 1, doc_id, drawn[0]), len(chunk) - a_end
            if not rest:
                return None, 0  # nothing to pair with yet (the first document seen)
        return self._sample(a, rest, 0, doc_id, doc_id), 0

    def add(self, doc_id: int, sentences: list[list[int]]) -> list[Sample]:
        """Cut one document (as tokenized sentences) into pair instances."""
        sentences = [s for s in sentences if s]
        out: list[Sample] = []
        target = self._target()
        chunk: list[list[int]] = []
        length = 0
        i = 0
        while i < len(sentences):
            chunk.append(sentences[i])
            length += len(sentences[i])
            if i == len(sentences) - 1 or length >= target:
                sample, put_back = self._instance(doc_id, chunk, target)
                if sample is not None:
                    out.append(sample)
                i -= put_back
                chunk, length, target = [], 0, self._target()
            i += 1
        if sentences:  # an empty document cannot give NSP's random B segment
            self.pool.append((doc_id, sentences))
        return out

    def _target(self) -> int:
        if self.rng.random() < self.short_seq_prob:
            return int(self.rng.integers(2, self.max_tokens + 1))
        return self.max_tokens

    def flush(self) -> list[Sample]:
        """Nothing is held between documents."""
        return []
