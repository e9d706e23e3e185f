"""Weighted source mixtures, and hub sources failing fast offline."""
import time
from collections import Counter

import pytest

from core.config_io import load_config
from core.errors import InputDataError, SetupError
from data_pipeline.config import PrepareConfig
from data_pipeline.mixture import mix
from data_pipeline.prepare import prepare


def _counting_sources(sizes):
    opened = Counter()

    def open_source(i):
        opened[i] += 1
        return iter(f"s{i}d{j}" for j in range(sizes[i]))

    return open_source, opened


@pytest.mark.parametrize("weights", [[3.0, 1.0], [1.0, 1.0, 2.0]])
def test_first_exhausted_follows_weights(weights):
    open_source, _ = _counting_sources([100_000] * len(weights))
    stream = mix(open_source, weights, 0, "first_exhausted", ["a", "b", "c"])
    drawn = Counter(source for _, (source, _) in zip(range(40_000), stream))
    for i, w in enumerate(weights):
        assert abs(drawn[i] / 40_000 - w / sum(weights)) < 0.02


def test_all_exhausted_repeats_small_sources():
    open_source, opened = _counting_sources([50, 5000])
    out = list(mix(open_source, [1.0, 1.0], 1, "all_exhausted", ["small", "big"]))
    counts = Counter(i for i, _ in out)
    assert counts[1] == 5000 and abs(counts[0] / len(out) - 0.5) < 0.02
    assert opened[0] > 50  # the small source was reopened many times
    # first_exhausted stops when the small source ends.
    out = list(mix(open_source, [1.0, 1.0], 1, "first_exhausted", ["small", "big"]))
    assert Counter(i for i, _ in out)[0] == 50


def test_empty_source_is_named():
    with pytest.raises(InputDataError, match="'empty'"):
        list(mix(lambda i: iter([] if i == 0 else ["x"] * 10), [1.0, 1.0], 0, "first_exhausted", ["empty", "full"]))


def test_hub_source_fails_fast_offline(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    cfg = load_config(PrepareConfig, None, [f"output_dir={tmp_path / 'out'}",
                                             "sources=[{kind: hub, path: wikimedia/wikipedia, name: 20231101.en}]"])
    import datasets  # noqa: F401  (a cold import is not what is timed: datasets' own retries would take 20 s)

    start = time.time()
    with pytest.raises(SetupError, match="local files"):
        prepare(cfg)
    assert time.time() - start < 10
    assert not (tmp_path / "out").exists()
