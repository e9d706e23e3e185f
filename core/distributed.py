"""Process-group set-up for one process, torchrun, or the deepspeed launcher; CPU uses gloo."""
from __future__ import annotations

import contextlib
import datetime
import os
import pickle
import re
import socket
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, TypeVar

import torch

from core.errors import SetupError, one_line, user_error

T = TypeVar("T")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tasks_per_node(spec: str) -> int:
    """First node's task count from SLURM_TASKS_PER_NODE ("2(x3),1" -> 2)."""
    first = spec.split(",")[0].split("(")[0]
    if not first.isdigit():
        raise SetupError(f"SLURM_TASKS_PER_NODE={spec!r} is not SLURM's form (e.g. '4' or '2(x3),1')")
    return int(first)


def _job_number(job_id: str) -> int:
    """SLURM_JOB_ID as the number every task derives the rendezvous port from."""
    if not job_id.isdigit():
        raise SetupError(f"SLURM_JOB_ID={job_id!r} is not a job number: set MASTER_PORT to choose the rendezvous port")
    return int(job_id)


def first_host(nodelist: str) -> str:
    """The first host name of a SLURM node list ("gpu[003-005,7]" -> "gpu003"), with scontrol when present."""
    import shutil
    import subprocess

    if shutil.which("scontrol"):
        out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, timeout=30)
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.split()[0]
    if "[" not in nodelist:
        return nodelist.split(",")[0]
    prefix, rest = nodelist.split("[", 1)
    first = rest.split(",")[0].split("-")[0].rstrip("]")
    return prefix + first


def slurm_env(environ: dict[str, str]) -> dict[str, str]:
    """RANK/WORLD_SIZE/LOCAL_RANK/LOCAL_WORLD_SIZE/MASTER_* for a task started by srun (one task per GPU).

    MASTER_ADDR is the first node of the job (unless set); MASTER_PORT is derived from the job id
    (unless set), so every task of the job agrees without talking first.
    """
    out = {
        "RANK": environ["SLURM_PROCID"],
        # The step's own counts first: `srun --preserve-env` leaves the allocation's SLURM_NTASKS in place.
        "WORLD_SIZE": (environ.get("SLURM_STEP_NUM_TASKS") or environ.get("SLURM_NTASKS")
                       or environ["SLURM_NPROCS"]),
        "LOCAL_RANK": environ.get("SLURM_LOCALID", "0"),
        "LOCAL_WORLD_SIZE": str(_tasks_per_node(environ.get("SLURM_STEP_TASKS_PER_NODE") or environ.get(
            "SLURM_TASKS_PER_NODE", environ.get("SLURM_NTASKS", "1")))),
        "MASTER_ADDR": environ.get("MASTER_ADDR") or first_host(environ.get("SLURM_JOB_NODELIST", "127.0.0.1")),
        "MASTER_PORT": environ.get("MASTER_PORT") or str(15000 + _job_number(environ.get("SLURM_JOB_ID", "0")) % 20000),
    }
    return out


def rank_is_slurm_task(environ: Mapping[str, str]) -> bool:
    """Whether this rank is a SLURM task of its own (srun started one task per rank), not one of the ranks torchrun
    or the deepspeed launcher started inside one task."""
    ntasks = environ.get("SLURM_STEP_NUM_TASKS") or environ.get("SLURM_NTASKS") or environ.get("SLURM_NPROCS")
    return "SLURM_PROCID" in environ and environ.get("RANK") == environ["SLURM_PROCID"] and environ.get("WORLD_SIZE") == ntasks


# SLURM's own steps, numbered from the top of 32 bits: salloc's interactive step (a shell, its environment the
# allocation's under --preserve-env), the batch script's and the external one. A process they start directly is one
# process, not task 0 of the allocation's N.
_SHELL_STEPS = 0xFFFFFFF0


def started_by_srun(environ: Mapping[str, str]) -> bool:
    """Whether this process is a task of an srun step.

    A batch script's shell has SLURM_PROCID=0 and the allocation's SLURM_NTASKS but no step id; salloc's interactive
    step has a step id of SLURM's own (`_SHELL_STEPS`)."""
    step = environ.get("SLURM_STEP_ID", environ.get("SLURM_STEPID", ""))
    return step.isdigit() and int(step) < _SHELL_STEPS and "SLURM_PROCID" in environ and (
        "SLURM_NTASKS" in environ or "SLURM_NPROCS" in environ or "SLURM_STEP_NUM_TASKS" in environ)


def setup_env() -> None:
    """Fill RANK/WORLD_SIZE/LOCAL_RANK/MASTER_* from SLURM (srun) or for a plain single process.

    torchrun and the deepspeed launcher set these themselves; then nothing is changed.
    """
    env = dict(os.environ)  # checked whole before any of it is set
    if "RANK" not in env and started_by_srun(env):
        env.update(slurm_env(env))
    tasks = env.get("SLURM_NTASKS") or env.get("SLURM_NPROCS") or "1"
    if "RANK" not in env and tasks.isdigit() and int(tasks) > 1:
        from core.process_life import to_stderr

        # Else it would wait for N - 1 ranks that nothing starts, then blame a node.
        to_stderr(f"note: this SLURM allocation has {tasks} tasks (SLURM_NTASKS), but this process was not started by "
                  "srun: it runs as one rank; start it with srun for one rank per task (slurm/pretrain.sbatch does)")
    if "RANK" not in env:
        env.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(_free_port()))
    # torchrun sets LOCAL_WORLD_SIZE; the deepspeed launcher sets LOCAL_SIZE. Streaming needs it to
    # know which ranks share a node.
    if "LOCAL_WORLD_SIZE" not in env and ("LOCAL_SIZE" in env or "WORLD_SIZE" in env):
        env["LOCAL_WORLD_SIZE"] = env.get("LOCAL_SIZE", env.get("WORLD_SIZE"))
    check_launcher_env(env)
    os.environ.update({key: value for key, value in env.items() if os.environ.get(key) != value})
    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")


LAUNCHER_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_PORT")


def check_launcher_env(environ: Mapping[str, str]) -> None:
    """The rank layout a launcher (or a user's export) gave is whole numbers that fit together: a SetupError naming
    the variable otherwise, not a ValueError from deep inside DeepSpeed's set-up."""
    values = {}
    launchers = (f"{', '.join(LAUNCHER_VARIABLES)} and MASTER_ADDR come from torchrun, srun or the deepspeed "
                 "launcher (set all of them, or none for one process)")
    for name in LAUNCHER_VARIABLES:
        text = environ.get(name)
        if text is None:
            raise SetupError(f"{'RANK is set but ' if name != 'RANK' else ''}{name} is not: {launchers}")
        if not re.fullmatch(r"[0-9]+", text.strip()):
            raise SetupError(f"{name}={text!r} is not a whole number: {launchers}")
        values[name] = int(text)
    if not environ.get("MASTER_ADDR", "").strip():
        raise SetupError(f"RANK is set but MASTER_ADDR is not: {launchers}")
    for rank, size in (("RANK", "WORLD_SIZE"), ("LOCAL_RANK", "LOCAL_WORLD_SIZE")):
        if not values[rank] < values[size]:
            uneven = ""
            if rank == "LOCAL_RANK" and "SLURM_TASKS_PER_NODE" in environ:
                uneven = (f" (SLURM_TASKS_PER_NODE={environ['SLURM_TASKS_PER_NODE']}: give every machine the same "
                          "number of tasks, with --ntasks-per-node)")
            raise SetupError(f"{rank}={values[rank]} with {size}={values[size]}: a rank counts from 0 to {size} - 1"
                             + uneven)
    if not 0 < values["MASTER_PORT"] < 65536:
        raise SetupError(f"MASTER_PORT={values['MASTER_PORT']} is not a TCP port (1-65535)")


@contextlib.contextmanager
def restored_environ() -> Iterator[None]:
    """os.environ as it was before the block, whatever the block (or DeepSpeed's set-up in it) wrote there."""
    saved = dict(os.environ)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


@contextlib.contextmanager
def set_up_for_this_call() -> Iterator[None]:
    """`setup_env` for one library call in a process that goes on (export from a notebook or a test): what it set
    is undone after, so a launch from the same process later does not inherit a port that is no longer free."""
    with restored_environ():
        setup_env()
        yield


def init_distributed(timeout_s: float = 600.0) -> None:
    """Start the process group through DeepSpeed (NCCL on GPU, gloo on CPU), its collectives bounded by `timeout_s`.

    The bound at start covers ZeRO's set-up, the data's and the first step; `set_timeout` tightens it after that.
    """
    setup_env()
    if torch.cuda.is_available():
        # Explicitly what torch defaults to (3: tear down on a failed collective), and the flight recorder's
        # buffer, so a timeout dumps what each rank was doing (TORCH_FR_DUMP_TEMP_FILE: set by the trainer).
        os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "3")
        os.environ.setdefault("TORCH_NCCL_DUMP_ON_TIMEOUT", "1")
        os.environ.setdefault("TORCH_FR_BUFFER_SIZE", "20000")
    import_deepspeed()
    import deepspeed

    if not torch.cuda.is_available():
        # On CPU every init JIT-compiles DeepSpeed's shared-memory all-reduce (tens of seconds, and it needs g++);
        # gloo does the collectives anyway, so skip it.
        sys.modules["deepspeed.comm.torch"].build_shm_op = lambda: None
    else:
        torch.cuda.set_device(gpu_of_rank(int(os.environ["LOCAL_RANK"]), torch.cuda.device_count(), os.environ))
    _import_muon_uncompiled()
    deepspeed.init_distributed(auto_mpi_discovery=False, timeout=datetime.timedelta(seconds=timeout_s))
    _local_world_is_this_host()


def gpu_of_rank(local_rank: int, visible: int, environ: Mapping[str, str]) -> int:
    """The GPU a rank uses: the one its LOCAL_RANK numbers, as DeepSpeed assumes too.

    Where the process sees fewer (srun --gpus-per-task=1 or --gpu-bind give each task its own), a SetupError that says
    how to launch, instead of CUDA's "invalid device ordinal" traceback."""
    if local_rank < visible:
        return local_rank
    shown = environ.get("CUDA_VISIBLE_DEVICES")
    raise SetupError(f"LOCAL_RANK={local_rank}, but this process sees {visible} GPU(s)"
                     f"{f' (CUDA_VISIBLE_DEVICES={shown})' if shown is not None else ''}: each rank takes the GPU its "
                     "LOCAL_RANK numbers, as DeepSpeed does, so every rank of a node must see all of the node's GPUs; "
                     "under SLURM ask for them per node (--gpus-per-node=N, as slurm/pretrain.sbatch does) without "
                     "--gpus-per-task or --gpu-bind, or start no more ranks per node than it has GPUs")


def set_timeout(seconds: float) -> None:
    """Bound every later collective of the default group and the control group by `seconds`."""
    if world_size() == 1 or not torch.distributed.is_initialized():
        return
    from torch.distributed import distributed_c10d as c10d

    timeout = datetime.timedelta(seconds=seconds)
    # Every group: the default one, the control group, and those DeepSpeed made for ZeRO (private API in torch
    # 2.x, the only way to change a live group's bound).
    for group in list(c10d._world.pg_map.keys()):  # the default group is among them
        c10d._set_pg_timeout(timeout, group)


@contextlib.contextmanager
def long_wait(seconds: float, after: float) -> Iterator[None]:
    """Collectives inside may wait `seconds` (a save, an evaluation, an upload); `after` applies again afterwards."""
    set_timeout(seconds)
    try:
        yield
    finally:
        set_timeout(after)


# What gloo, NCCL and c10d say when a peer process died or stopped answering.
_PEER_FAILURE_TEXT = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "Timed out waiting",
                      "Socket Timeout", "NCCL communicator was aborted", "Watchdog caught collective operation timeout")


def is_peer_failure(exc: BaseException) -> bool:
    """True when `exc` is a collective that failed because another rank died or hung (not a bug of this rank)."""
    if launched_world_size() == 1:
        return False
    # DistStoreError: the rendezvous timed out before every rank joined (a rank or node that never started).
    kinds = tuple(k for k in (getattr(torch.distributed, "DistBackendError", None),
                              getattr(torch.distributed, "DistNetworkError", None),
                              getattr(torch.distributed, "DistStoreError", None)) if k is not None)
    seen = set()
    while exc is not None and id(exc) not in seen:  # DeepSpeed and the loader may wrap it
        seen.add(id(exc))
        if (kinds and isinstance(exc, kinds)) or (
                isinstance(exc, RuntimeError) and any(t in str(exc) for t in _PEER_FAILURE_TEXT)):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def import_deepspeed() -> None:
    """Import DeepSpeed without the MLflow its autotuner loads at import (a part of every rank's start-up:
    BENCHMARKS.md, "Process start-up and the test suite").

    The autotuner, which this project never runs, logs to MLflow when `import mlflow` succeeds; a None in
    sys.modules makes that import fail for the duration, and `train.report_to: mlflow` imports it as usual after.
    """
    if "deepspeed" in sys.modules:
        return
    blocked = "mlflow" not in sys.modules
    if blocked:
        sys.modules["mlflow"] = None
    try:
        import deepspeed  # noqa: F401
    finally:
        if blocked and sys.modules.get("mlflow", 0) is None:
            del sys.modules["mlflow"]


def _import_muon_uncompiled() -> None:
    """Import DeepSpeed's Muon module with its torch.compile decorators turned into no-ops.

    ZeRO imports it for isinstance checks, and its module-level decorators import all of inductor, at every
    rank's (re)start (BENCHMARKS.md, "Process start-up and the test suite"). The optimizers built here are never Muon,
    so its functions never run and need no compiling.
    """
    if "deepspeed.runtime.zero.muon.muon_optimizer" in sys.modules:
        return
    real = torch.compile

    def uncompiled(model=None, **_options):
        return model if model is not None else (lambda fn: fn)

    torch.compile = uncompiled
    try:
        import deepspeed.runtime.zero.muon.muon_optimizer  # noqa: F401
    except ImportError:  # a DeepSpeed without Muon
        pass
    finally:
        torch.compile = real


def _host_id() -> str:
    """What identifies one machine's /dev/shm: host name and kernel boot id."""
    boot = Path("/proc/sys/kernel/random/boot_id")
    return f"{socket.gethostname()}/{boot.read_text().strip() if boot.is_file() else ''}"


# Every rank's machine, pid and addresses, gathered once at start: a lost peer is named from them.
_PEERS: list[dict[str, Any]] = []


def _addresses() -> list[str]:
    """The IP addresses this machine's name resolves to (what a peer's connection error shows of it)."""
    try:
        return sorted({info[4][0] for info in socket.getaddrinfo(socket.gethostname(), None)})
    except OSError:
        return []


def pid_gone(pid: int) -> bool:
    """True when no process has this pid on this machine, or only its unreaped remains (a zombie)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        # ProcessLookupError: the process was reaped between the open and the read of its /proc entry.
        return True
    return state in ("Z", "X")


def lost_peers(error: str) -> str:
    """Which ranks the failure of a collective lost, as far as this rank can tell: the ranks on this machine whose
    process is gone, else those of the machine whose address the error names; empty when it cannot tell."""
    if not _PEERS:
        return ""
    me = _PEERS[rank()]
    local = [r for r, peer in enumerate(_PEERS) if peer["host"] == me["host"] and r != rank()]
    # A killed process closes its sockets a moment before it turns into a zombie: the error can arrive first. (A
    # timed-out collective lost a live peer, hung or far away: no wait.)
    deadline = time.monotonic() + (0.0 if "timed out" in error.lower() else 2.0)
    while not (gone := [r for r in local if pid_gone(_PEERS[r]["pid"])]) and local and time.monotonic() < deadline:
        time.sleep(0.05)
    if gone:
        return f"rank {', '.join(map(str, gone))} on this machine (its process is gone)" if len(gone) == 1 else \
            f"ranks {', '.join(map(str, gone))} on this machine (their processes are gone)"
    named = {address for address in re.findall(r"\[([0-9a-fA-F.:]+)\]", error)}
    remote = [r for r, peer in enumerate(_PEERS) if peer["host"] != me["host"] and named & set(peer["addresses"])]
    if remote:
        hosts = sorted({_PEERS[r]["host"].split("/")[0] for r in remote})
        return f"rank{'s' if len(remote) > 1 else ''} {', '.join(map(str, remote))} on {', '.join(hosts)}"
    return ""


def _local_world_is_this_host() -> None:
    """Make LOCAL_RANK/LOCAL_WORLD_SIZE count the ranks on this machine, not on this SLURM node.

    Streaming's loader coordinates through /dev/shm and assumes one node is one machine. Several
    SLURM nodes emulated on one machine (slurm/local_cluster.sh) break that: each node's rank
    would be a "local leader" and they would fight over the same shared memory. The GPU device
    is already chosen, so only the data loader's view changes.
    """
    if world_size() == 1:
        return
    global _PEERS
    _PEERS = all_gather_object({"host": _host_id(), "pid": os.getpid(), "addresses": _addresses()})
    hosts = [peer["host"] for peer in _PEERS]
    mine = [r for r, h in enumerate(hosts) if h == hosts[rank()]]
    if len(mine) == int(os.environ["LOCAL_WORLD_SIZE"]):
        return
    sizes = {hosts.count(h) for h in hosts}
    if mine != list(range(mine[0], mine[0] + len(mine))) or len(sizes) != 1:
        raise SetupError(f"ranks {mine} share this machine but are not a contiguous block of equal size; "
                           "use srun's block distribution (the default) with the same number of tasks per machine")
    os.environ.update(LOCAL_RANK=str(rank() - mine[0]), LOCAL_WORLD_SIZE=str(len(mine)))


def rank() -> int:
    """This process's global rank."""
    return torch.distributed.get_rank() if torch.distributed.is_initialized() else 0


def launched_rank() -> int:
    """This process's rank: the group's, or before the group exists the one its launcher gave (RANK)."""
    return rank() if torch.distributed.is_initialized() else int(os.environ.get("RANK", "0"))


def launched_world_size() -> int:
    """The number of ranks: the group's, or before the group exists the one its launcher gave (WORLD_SIZE)."""
    return world_size() if torch.distributed.is_initialized() else int(os.environ.get("WORLD_SIZE", "1"))


def local_device() -> torch.device:
    """The device this rank trains on: the GPU init_distributed selected, or the CPU."""
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def world_size() -> int:
    """Number of ranks."""
    return torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1


def local_world_size() -> int:
    """Ranks on this machine (set by the launcher, or by setup_env)."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", "1"))


def barrier() -> None:
    """Wait for every rank."""
    if torch.distributed.is_initialized():
        torch.distributed.barrier()


def all_gather_object(obj: Any) -> list[Any]:
    """Every rank's object, in rank order."""
    if world_size() == 1:
        return [obj]
    out: list[Any] = [None] * world_size()
    torch.distributed.all_gather_object(out, obj)
    return out


def broadcast_object(*objs: Any) -> list[Any]:
    """Rank 0's objects on every rank."""
    items = list(objs)
    if torch.distributed.is_initialized():
        torch.distributed.broadcast_object_list(items, src=0)
    return items


def from_rank0(compute: Callable[[], T], doing: str) -> T:
    """`compute()` run on rank 0 alone, its result on every rank; if it raises, every rank raises.

    Rank 0 re-raises its own exception (a bug keeps its traceback); the others raise the same user-error class with
    its message, or a RuntimeError naming a bug's type and message. Without this, a rank-0 failure leaves the other
    ranks waiting in a collective that rank 0 never joins. `doing` completes "rank 0 failed ..." in that message.
    """
    result, failure, kind, message = None, None, None, ""
    if rank() == 0:
        try:
            result = compute()
            if world_size() > 1:
                pickle.dumps(result)  # what broadcast_object would fail on outside this guard, the others waiting
        except Exception as exc:  # every rank must learn of it, or the others would wait in the broadcast
            failure, result = exc, None
            shown = user_error(exc)
            kind = type(shown) if shown is not None else RuntimeError
            message = one_line(shown) if shown is not None else f"rank 0 failed {doing}: {type(exc).__name__}: {exc}"
            try:
                pickle.dumps(kind)
            except Exception:  # a class defined where the others cannot import it
                kind, message = RuntimeError, f"rank 0 failed {doing}: {type(exc).__name__}: {message}"
    result, kind, message = broadcast_object(result, kind, message)
    if failure is not None:
        raise failure
    if kind is not None:
        raise kind(message)
    return result


_CONTROL_GROUP = None


def control_all_reduce_sum(values: torch.Tensor) -> torch.Tensor:
    """Sum of small host-side values (flags, counts) over ranks, on the CPU.

    On a GPU the default group is NCCL, whose result waits for every kernel queued before it; a
    per-step flag exchanged there would stop the host from running ahead of the device. A gloo group
    made for these exchanges does not touch the device. Every rank must call it at the same points.
    """
    global _CONTROL_GROUP
    if world_size() == 1:  # nothing to exchange: no collective call at every step
        return values
    group = None
    if torch.distributed.get_backend() != "gloo":
        if _CONTROL_GROUP is None:
            _CONTROL_GROUP = torch.distributed.new_group(backend="gloo")
        group = _CONTROL_GROUP
    torch.distributed.all_reduce(values, group=group)
    return values


def all_reduce_sum(values: torch.Tensor) -> torch.Tensor:
    """Element-wise sum over ranks (float64 on CPU, so reductions are exact enough to compare runs)."""
    if world_size() > 1:
        device = "cuda" if torch.cuda.is_available() else "cpu"
        values = values.to(device)
        torch.distributed.all_reduce(values)
    return values.cpu()
