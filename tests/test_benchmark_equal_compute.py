"""The equal-compute report's 'fraction of MLM's compute to reach MLM's final accuracy', on curves made up here."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import equal_compute  # noqa: E402

FRACTIONS = (0.25, 0.5, 0.75, 1.0)


def _runs(*curves: list[float]) -> list[dict]:
    """One record per seed; every probe task gets the same curve (accuracy at 1/4, 1/2, 3/4, 1 of the budget)."""
    return [{"checkpoints": [{"fraction_of_budget": f, "probes": {t: {"accuracy": {feat: a}} for t, feat in equal_compute.PROBES}}
                             for f, a in zip(FRACTIONS, curve)]} for curve in curves]


def test_fraction_to_reach_interpolates_the_seed_mean_from_the_random_init_point():
    base = {"probes": {"1": {t: {"accuracy": {feat: 0.2}} for t, feat in equal_compute.PROBES}}}
    records = {
        "MLM": _runs([0.3, 0.4, 0.5, 0.6], [0.3, 0.4, 0.5, 0.8]),  # final mean 0.7
        "FAST": _runs([0.5, 0.9, 0.9, 0.9], [0.5, 0.5, 0.9, 0.9]),  # mean 0.5, 0.7 (hit at 1/2 exactly), ...
        "STEEP": _runs([0.95, 1.0, 1.0, 1.0]),  # crosses 0.7 between 0 (0.2) and 1/4 (0.95): 0.25 * 0.5 / 0.75
        "SLOW": _runs([0.3, 0.4, 0.5, 0.6]),  # never reaches 0.7
    }
    reach = equal_compute.fractions_to_reach_mlm(records, base)
    assert set(reach) == set(equal_compute.PROBES)
    per = reach[equal_compute.PROBES[0]]
    assert abs(per["FAST"] - 0.5) < 1e-12
    assert abs(per["STEEP"] - 0.25 * (0.7 - 0.2) / (0.95 - 0.2)) < 1e-12
    assert per["SLOW"] is None
    assert abs(per["MLM"] - 1.0) < 1e-12  # MLM reaches its own final value at its end
