"""Weighted mixture of document sources, drawn with a seeded RNG."""
from __future__ import annotations

from typing import Callable, Iterator

import numpy as np

from core.errors import InputDataError

DRAW_BLOCK = 4096


def mix(
    open_source: Callable[[int], Iterator[str]],
    weights: list[float],
    seed: int,
    stopping: str,
    names: list[str],
) -> Iterator[tuple[int, str]]:
    """Yield (source index, document), picking each next source with probability weight / sum.

    `first_exhausted` stops when any source runs out; `all_exhausted` reopens a finished source
    (so it is repeated) until every source has been read to its end at least once. Either way the
    share of documents from each source follows the weights.
    """
    n = len(weights)
    if n == 1:
        yield from ((0, doc) for doc in open_source(0))
        return
    cumulative = np.cumsum(np.asarray(weights, dtype=np.float64) / sum(weights))
    rng = np.random.default_rng(seed)
    iterators = [open_source(i) for i in range(n)]
    yielded = [0] * n
    finished: set[int] = set()
    while True:
        for i in np.searchsorted(cumulative, rng.random(DRAW_BLOCK), side="right").clip(max=n - 1):
            doc = next(iterators[i], None)
            if doc is None:
                if yielded[i] == 0:
                    raise InputDataError(f"source '{names[i]}' yielded no text")
                finished.add(int(i))
                if stopping == "first_exhausted" or len(finished) == n:
                    return
                iterators[i] = open_source(int(i))
                doc = next(iterators[i])
            yielded[i] += 1
            yield int(i), doc


def plan_takes(counts: list[int], weights: list[float], seed: int, stopping: str, names: list[str],
               max_documents: int = 0) -> list[int]:
    """How many documents the mixture draws from each source (more than its count when repeated).

    Replays `mix` over placeholders, so a dataset prepared in parts takes from each source exactly
    what reading the sources one document at a time would have taken.
    """
    taken = [0] * len(counts)
    stream = mix(lambda i: iter(range(counts[i])), weights, seed, stopping, names)
    for n, (source, _) in enumerate(stream):
        if max_documents and n >= max_documents:
            break
        taken[source] += 1
    return taken
