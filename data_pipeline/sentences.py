"""Sentence splitting for `pairs` packing (NSP/SOP segments).

The rule, kept deliberately simple and language-agnostic for English-like text:
- a line break always ends a sentence;
- within a line, a sentence ends after `.`, `!` or `?` (and any closing quotes or brackets)
  when whitespace follows and the next character is an uppercase letter, a digit, or an
  opening quote or bracket.
Abbreviations ("Mr. Smith") are split wrongly; NSP and SOP only need plausible segment
boundaries, and BERT's own data was split with a similarly simple tool.
"""
from __future__ import annotations

import re

_BOUNDARY = re.compile(r"(?<=[.!?])([\"'\u201d\u2019)\]]*)\s+(?=[\"'\u201c\u2018(\[]?[A-Z0-9])")


def split_sentences(document: str) -> list[str]:
    """The sentences of a document, in order, without empty ones."""
    out: list[str] = []
    for line in document.splitlines():
        line = line.strip()
        if not line:
            continue
        start = 0
        for match in _BOUNDARY.finditer(line):
            end = match.end(1)
            out.append(line[start:end].strip())
            start = match.end()
        out.append(line[start:].strip())
    return [s for s in out if s]
