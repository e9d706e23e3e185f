"""The ranks of tests/process/test_from_rank0.py (`python rank0_ranks.py OUT`; RANK, WORLD_SIZE, MASTER_ADDR and
MASTER_PORT from the launch): each calls `core.distributed.from_rank0` in turn with a result, a user error, a user
error defined outside core, a message of several lines, a bug, a result and an error class that cannot be sent, and
writes what it saw to OUT/rank<rank>.json. A full disk is the user's error on every rank, as on rank 0."""
import json
import os
import sys
import traceback
from pathlib import Path

import torch.distributed

from core import distributed as dist
from core.errors import ConfigError
from data_pipeline.shards import CorruptShardError

CALLS = {"value": 0}


def _result() -> dict:
    CALLS["value"] += 1
    return {"tag": "step_00000010", "damaged": ["step_00000020"]}


def _config_error() -> None:
    raise ConfigError("train.zero_stage=4 is not a ZeRO stage")


def _corrupt_shard() -> None:
    raise CorruptShardError("shard 'train/shard.00001.mds' does not match its hash")


def _several_lines() -> None:
    raise ConfigError("checkpoint step_00000010 holds other parameters:\n  generator.weight missing\n  resume with it")


def _bug() -> None:
    return {}["missing"]


def _unpicklable() -> object:
    return lambda: None  # no other rank could receive it


def _local_error_class() -> None:
    class LocalError(ConfigError):  # defined where the other ranks cannot import it
        pass

    raise LocalError("a key only this function knows")


def _disk_full() -> None:
    import errno

    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/runs/a/checkpoints/latest")  # as open() raises it


def _outcome(compute) -> dict:
    """What from_rank0 gave this rank: its result, or the exception's type, message and whether the traceback
    reaches into `compute` (rank 0's own exception) or not."""
    try:
        return {"result": repr(dist.from_rank0(compute, "doing the test's work"))}
    except Exception as exc:
        frames = [frame.name for frame in traceback.extract_tb(exc.__traceback__)]
        return {"type": f"{type(exc).__module__}.{type(exc).__qualname__}", "message": str(exc),
                "raised_in_compute": compute.__name__ in frames}


def main(out: Path) -> None:
    torch.distributed.init_process_group("gloo", rank=int(os.environ["RANK"]), world_size=2)
    seen = {name: _outcome(fn) for name, fn in [("result", _result), ("config_error", _config_error),
                                                 ("corrupt_shard", _corrupt_shard), ("several_lines", _several_lines),
                                                 ("bug", _bug), ("unpicklable", _unpicklable),
                                                 ("local_error_class", _local_error_class),
                                                 ("disk_full", _disk_full)]}
    seen["calls"] = CALLS["value"]
    # The ranks are still in step after every failure: one more collective meets its partner.
    seen["after"] = dist.broadcast_object(f"from rank {dist.rank()}")[0]
    (out / f"rank{dist.rank()}.json").write_text(json.dumps(seen))
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
    os._exit(0)
