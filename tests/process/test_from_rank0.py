"""`core.distributed.from_rank0` on two real gloo ranks: rank 0 alone computes, every rank gets its result, and a
failure there is raised on every rank (rank 0 its own exception, the others the same user-error class in one line,
or a RuntimeError naming a bug), with the ranks still in step for the next collective."""
import json

import pytest
from conftest import run_cli

from core import distributed as dist
from core.errors import ConfigError

RANKS = "tests/helpers/rank0_ranks.py"


def test_rank0s_result_and_failures_reach_every_rank(tmp_path):
    run_cli(RANKS, [str(tmp_path)], nproc=2)
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    result = {"result": repr({"tag": "step_00000010", "damaged": ["step_00000020"]})}
    assert r0["result"] == r1["result"] == result
    assert (r0["calls"], r1["calls"]) == (1, 0)  # computed once, on rank 0

    config = {"type": "core.errors.ConfigError", "message": "train.zero_stage=4 is not a ZeRO stage"}
    assert r0["config_error"] == {**config, "raised_in_compute": True}  # rank 0's own exception, traceback and all
    assert r1["config_error"] == {**config, "raised_in_compute": False}
    shard = {"type": "data_pipeline.shards.CorruptShardError",
             "message": "shard 'train/shard.00001.mds' does not match its hash"}
    assert r0["corrupt_shard"] == {**shard, "raised_in_compute": True}
    assert r1["corrupt_shard"] == {**shard, "raised_in_compute": False}
    assert r0["several_lines"]["message"].count("\n") == 2
    assert r1["several_lines"] == {"type": "core.errors.ConfigError", "raised_in_compute": False, "message":
                                   "checkpoint step_00000010 holds other parameters: generator.weight missing "
                                   "resume with it"}

    assert r0["bug"] == {"type": "builtins.KeyError", "message": "'missing'", "raised_in_compute": True}
    assert r1["bug"] == {"type": "builtins.RuntimeError", "raised_in_compute": False,
                         "message": "rank 0 failed doing the test's work: KeyError: 'missing'"}
    # What cannot be sent fails on rank 0, inside the guard, rather than in the broadcast with the others waiting.
    assert r0["unpicklable"]["raised_in_compute"] is False and "pickle" in r0["unpicklable"]["message"].lower()
    assert r1["unpicklable"]["type"] == "builtins.RuntimeError"
    assert r1["unpicklable"]["message"].startswith("rank 0 failed doing the test's work: ")
    assert r0["local_error_class"]["type"].endswith("_local_error_class.<locals>.LocalError")
    assert r0["local_error_class"]["raised_in_compute"] is True
    assert r1["local_error_class"] == {"type": "builtins.RuntimeError", "raised_in_compute": False, "message":
                                       "rank 0 failed doing the test's work: LocalError: a key only this function knows"}
    assert r0["disk_full"] == {"type": "builtins.OSError", "raised_in_compute": True,
                               "message": "[Errno 28] No space left on device: '/runs/a/checkpoints/latest'"}
    assert r1["disk_full"] == {"type": "core.errors.NoSpaceError", "raised_in_compute": False, "message":
                               "a write was refused: No space left on device (/runs/a/checkpoints/latest). Free space "
                               "(or raise the quota or file size limit), then run the same command again"}
    assert r0["after"] == r1["after"] == "from rank 0"


def test_without_a_process_group_it_is_the_call_itself():
    assert dist.from_rank0(lambda: 7, "adding") == 7
    error = ConfigError("bad key")

    def fail() -> None:
        raise error

    with pytest.raises(ConfigError) as raised:
        dist.from_rank0(fail, "checking")
    assert raised.value is error
