"""Stage 0's gradient buckets (pretrain/engine/grad_buckets.py) on two real gloo ranks: each gradient is the mean of
the ranks' own, computed here from the gradients each rank sends back; a parameter only one rank's graph used is
averaged with the other's zeros, and the ranks still agree on the order of their collectives; a backward inside the
accumulation reduces nothing; buckets launch while backward runs, in the order rank 0 saw the gradients arrive once
the first reduced step has shown it; and in the DeepSpeed engine the buckets replace DeepSpeed's own reduction. The
whole trainer with the buckets against DeepSpeed's own reduction: test_engine_configs.py."""
import torch
from conftest import run_cli

RANKS = "tests/helpers/grad_bucket_ranks.py"  # the ranks' code


def _mean_of(r0: dict, r1: dict, mine: torch.Tensor, name: str) -> torch.Tensor:
    other = r1.get(name, torch.zeros_like(mine))
    return (r0[name].double() + other.double()) / 2


def test_buckets_average_every_gradient_over_the_ranks_and_launch_during_backward(tmp_path):
    run_cli(RANKS, ["buckets", str(tmp_path)], nproc=2)
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1))
    assert r0["buckets"] >= 4
    assert "only_rank0.weight" in r0["own"] and "only_rank0.weight" not in r1["own"]
    for name, mine in r0["reduced"].items():
        tolerance = 1e-3 if mine.dtype == torch.float16 else 1e-6
        assert torch.allclose(mine.double(), _mean_of(r0["own"], r1["own"], mine, name), rtol=tolerance, atol=0), name
        assert torch.equal(mine, r1["reduced"][name]), name  # both ranks step from the same gradient
    # Without the ranks' average in between, each rank's first backward kept its own gradient.
    assert not torch.equal(r0["inside"]["first.weight"], r1["inside"]["first.weight"])
    # Rank 0 had every bucket on its way before backward ended; rank 1, which never gets only_rank0's gradient, held
    # them all behind that parameter's bucket (the order both keep).
    assert all(r0["launched"]) and not any(r1["launched"])
    # The reordered net: at most the bucket of first.bias was out when first.weight arrived in the first step; in
    # the second, the four of `last` and `middle` were.
    for r in (r0, r1):
        assert r["launched_when_first_arrived"][0] <= 1 and r["launched_when_first_arrived"][1] >= 4, r
    for key in ("reordered_own", "reordered_own_2"):
        assert r0[key].keys() == r1[key].keys() == r0["reordered"].keys()
    for name, mine in r0["reordered"].items():
        expected = _mean_of(r0["reordered_own_2"], r1["reordered_own_2"], mine, name)
        assert torch.allclose(mine.double(), expected, rtol=1e-6, atol=0), name


def test_in_deepspeeds_engine_the_buckets_replace_its_own_reduction_eager_and_compiled(tmp_path):
    """Also under train.compile=layers: the hooks sit on the parameters, outside the compiled regions."""
    run_cli(RANKS, ["engine", str(tmp_path)], nproc=2)
    results = [torch.load(tmp_path / f"engine{rank}.pt") for rank in (0, 1)]
    for result in results:
        counts = result["counts"]
        assert counts["deepspeed"] == [0, 1, 0, 1]  # one flat all-reduce after each boundary's backward
        n = counts["buckets_per_step"]
        assert n >= 2 and counts["buckets"] == counts["buckets_compiled"] == [0, n, 0, n]  # nothing of DeepSpeed's
        a, b, compiled = (result["weights"][k] for k in ("deepspeed", "buckets", "buckets_compiled"))
        assert all(torch.equal(a[k], b[k]) for k in a)
        assert all(torch.allclose(a[k], compiled[k], rtol=1e-5, atol=1e-7) for k in a)
    # The ranks' batches differ; only the average keeps their weights equal.
    for k, v in results[0]["weights"]["buckets_compiled"].items():
        assert torch.equal(v, results[1]["weights"]["buckets_compiled"][k]), k
