"""A run removes the streaming segments a killed run left, and only those (with local data as with remote: a
killed run's leftovers would otherwise pile up in /dev/shm for good): a live run's beside it,
mapped or only held open, keeps its names (streaming's own clean-up unlinked every prefix's, a neighbour's too). The lock
that serialises the runs' registrations is one per machine, for every user."""
import fcntl
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import PROCESS_ENV, REPO, free_port, python_process

from core.shared_memory import machine_lock, remove_unheld_segments
from data_pipeline.loader import LoaderConfig, clean_stale_shared_memory

SHM = Path("/dev/shm")
# A prefix far above any a run picks (streaming takes the first free one from 0), so no run's scan reads it.
STALE = "999992_next_epoch"

HOLD = """
import os, sys, time
from multiprocessing import shared_memory
mapped = shared_memory.SharedMemory(name=sys.argv[1], create=True, size=64)
fd = os.open("/dev/shm/" + sys.argv[2], os.O_CREAT | os.O_RDWR, 0o600)  # held open, never mapped
print("ready", flush=True)
time.sleep(120)
"""

# A live run: a streaming dataset over local data, one batch read, its segments held until the go file appears.
LIVE_RUN = """
import json, sys, time
from pathlib import Path
from data_pipeline.loader import LoaderConfig, build_dataset
dataset = build_dataset(LoaderConfig(path=sys.argv[1]), "train", 4)
samples = iter(dataset)
next(samples)
print(json.dumps({"prefix": dataset._shm_prefix_int}), flush=True)
while not Path(sys.argv[2]).exists():
    time.sleep(0.05)
print(json.dumps({"rest": sum(1 for _ in samples)}), flush=True)
"""


def test_only_the_segments_no_process_holds_are_removed(tmp_path):
    """Names of this test's own (no run's clean-up, in another test worker, touches them): the one a process maps
    and the one it only holds open stay; the one nothing holds goes, and so does the other once its holder is gone."""
    tag = f"cp_test_{os.getpid()}"
    mapped, open_only, stale = f"{tag}_mapped", f"{tag}_open_only", f"{tag}_stale"
    mine = lambda name: name.startswith(tag)  # noqa: E731
    holder = subprocess.Popen([sys.executable, "-c", HOLD, mapped, open_only], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        (SHM / stale).write_bytes(b"\0" * 64)  # written and closed: nothing holds it, as after a kill
        assert remove_unheld_segments(mine) == [stale]
        assert (SHM / mapped).exists() and (SHM / open_only).exists() and not (SHM / stale).exists()
    finally:
        holder.kill()
        holder.wait()
    # Their holder gone, its segments are a killed process's leftovers like any other (the mapped one may have gone
    # already: the killed process's resource tracker unlinks what it created).
    assert open_only in remove_unheld_segments(mine)
    assert not (SHM / open_only).exists() and not (SHM / mapped).exists()


def _line(out: Path, n: int, proc, timeout: float = 120) -> dict:
    """The `n`th line the process printed to `out` (1-based), once there."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        lines = out.read_text().splitlines(keepends=True) if out.exists() else []
        if len(lines) >= n and lines[n - 1].endswith("\n"):
            return json.loads(lines[n - 1])
        assert proc.poll() is None, f"the live run ended ({proc.returncode}) before its line {n}"
        time.sleep(0.05)
    raise AssertionError(f"no line {n} from the live run in {timeout} s")


HOLD_PREFIX = """
import fcntl, sys, time
from core.shared_memory import hold_while_alive, machine_lock
# As build_dataset does: under the registration lock, which a clean-up takes before it looks at a prefix's lock.
registration = machine_lock("contrastive_pretrain_streaming.lock")
fcntl.flock(registration, fcntl.LOCK_EX)
hold_while_alive(sys.argv[1])
fcntl.flock(registration, fcntl.LOCK_UN)
print("ready", flush=True)
time.sleep(120)
"""


def test_a_segment_whose_run_holds_its_prefix_lock_stays_though_no_process_here_holds_it(prepared):
    """A live run in another container that shares this machine's /dev/shm: /proc here shows none of its processes,
    so its segments look unheld, but the lock it holds on its prefix is seen. Once its holder is gone, they go, and
    its lock file with them; the lock file a run that ended well left (its segments gone with it) goes at once."""
    from data_pipeline.loader import _prefix_lock

    prefix = 999994  # far above any prefix a run picks: no run's own
    segment = f"{prefix}_next_epoch"
    ended = _prefix_lock(prefix - 1)
    os.close(machine_lock(ended))
    holder = subprocess.Popen([sys.executable, "-c", HOLD_PREFIX, _prefix_lock(prefix)], stdout=subprocess.PIPE,
                              text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert holder.stdout.readline().strip() == "ready"
        (SHM / segment).write_bytes(b"\0" * 64)  # written and closed, once its prefix is held: no process holds it
        assert segment not in clean_stale_shared_memory(LoaderConfig(path=str(prepared)))
        assert (SHM / segment).exists() and (SHM / _prefix_lock(prefix)).exists()
        assert not (SHM / ended).exists()  # (by this clean-up, or by another test worker's run's)
    finally:
        holder.kill()
        holder.wait()
    removed = clean_stale_shared_memory(LoaderConfig(path=str(prepared)))
    assert not (SHM / segment).exists() and not (SHM / _prefix_lock(prefix)).exists(), removed


MANY_LOCKS = """
import os, resource, sys
from core.shared_memory import machine_lock
from data_pipeline.loader import LoaderConfig, _prefix_lock, clean_stale_shared_memory
# A node where thousands of runs ended, under a limit of open files below their number.
resource.setrlimit(resource.RLIMIT_NOFILE, (256, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
names = [_prefix_lock(p) for p in range(998000, 998600)]
for name in names:
    os.close(machine_lock(name))
clean_stale_shared_memory(LoaderConfig(path=sys.argv[1]))
print(sum(os.path.exists(os.path.join("/dev/shm", name)) for name in names), "left")
"""


def test_the_lock_files_of_ended_runs_go_though_they_outnumber_the_open_files_allowed(prepared):
    """600 lock files of ended runs and a limit of 256 open files: the clean-up takes them one at a time."""
    done = subprocess.run([sys.executable, "-c", MANY_LOCKS, str(prepared)], capture_output=True, text=True,
                          timeout=120, env={**os.environ, **PROCESS_ENV, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0 and done.stdout.strip() == "0 left", (done.stdout, done.stderr[-3000:])


def test_a_live_runs_segments_survive_another_runs_clean_up_and_it_reads_on(prepared, tmp_path):
    go, out, err = tmp_path / "go", tmp_path / "live.out", tmp_path / "live.err"
    script = tmp_path / "live_run.py"
    script.write_text(LIVE_RUN)
    # Its own temporary folder, as a SLURM job's: streaming's scan then sees no other run's lock files and takes the
    # first prefix without segments, one streaming's clean-up reaches.
    (tmp_path / "tmp").mkdir()
    env = {**os.environ, **PROCESS_ENV, "TMPDIR": str(tmp_path / "tmp")}
    with open(out, "w") as stdout, open(err, "w") as stderr:
        live = python_process([str(script), str(prepared), str(go)], env=env, stdout=stdout, stderr=stderr)
    try:
        prefix = _line(out, 1, live)["prefix"]
        names = sorted(p.name for p in SHM.glob(f"{prefix:06}_*"))
        assert f"{prefix:06}_locals" in names, names
        (SHM / STALE).write_bytes(b"\0" * 64)  # a killed run's, at a prefix far above this one
        removed = clean_stale_shared_memory(LoaderConfig(path=str(prepared)))  # local data
        assert not set(names) & set(removed)
        assert sorted(p.name for p in SHM.glob(f"{prefix:06}_*")) == names
        assert not (SHM / STALE).exists()  # (by this clean-up, or by another test worker's run's)
        (SHM / STALE).write_bytes(b"\0" * 64)
        try:
            assert clean_stale_shared_memory(LoaderConfig(path=str(tmp_path / "cache"), remote="s3://bucket/data",
                                                          clean_stale_shared_memory=False)) == []
        finally:
            (SHM / STALE).unlink(missing_ok=True)
        go.touch()
        assert _line(out, 2, live)["rest"] > 0
        assert live.wait(timeout=60) == 0, err.read_text()[-2000:]
    finally:
        if live.poll() is None:
            live.kill()
            live.wait()


def test_the_registration_lock_is_one_for_the_machine_and_opens_for_every_user(tmp_path):
    """Created readable by all whatever the creator's umask, opened read-only (what another user's file allows),
    and exclusive across processes."""
    name = f"contrastive_pretrain_test_{os.getpid()}.lock"
    old = os.umask(0o077)
    try:
        first = machine_lock(name)
    finally:
        os.umask(old)
    try:
        assert (SHM / name).stat().st_mode & 0o777 == 0o644
        assert fcntl.fcntl(first, fcntl.F_GETFL) & os.O_ACCMODE == os.O_RDONLY
        fcntl.flock(first, fcntl.LOCK_EX)
        other = subprocess.run([sys.executable, "-c", TRY_LOCK, name], capture_output=True, text=True, timeout=60,
                               env={**os.environ, "PYTHONPATH": str(REPO)})
        assert other.stdout.strip() == "held elsewhere", other.stderr[-2000:]
        fcntl.flock(first, fcntl.LOCK_UN)
        other = subprocess.run([sys.executable, "-c", TRY_LOCK, name], capture_output=True, text=True, timeout=60,
                               env={**os.environ, "PYTHONPATH": str(REPO)})
        assert other.stdout.strip() == "taken", other.stderr[-2000:]
    finally:
        os.close(first)
        (SHM / name).unlink(missing_ok=True)


TRY_LOCK = """
import fcntl, sys
from core.shared_memory import machine_lock, remove_unheld_segments
fd = machine_lock(sys.argv[1])
try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    print("taken")
except BlockingIOError:
    print("held elsewhere")
"""


TWO_MACHINES = """
import fcntl, os, sys, time
import torch.distributed as td
from core.shared_memory import machine_lock
from data_pipeline.loader import _lock_every_machine
rank, lock_name = int(os.environ["RANK"]), sys.argv[1]
td.init_process_group("gloo")
lock = machine_lock(lock_name)
if rank == 1:
    time.sleep(1.0)  # both runs' rank 0 try first: each takes one of the two locks
_lock_every_machine(lock)
print("locked", time.time(), flush=True)
time.sleep(0.2)
fcntl.flock(lock, fcntl.LOCK_UN)
td.destroy_process_group()
"""


def test_two_runs_that_share_two_machines_do_not_deadlock_on_their_locks(tmp_path):
    """Run A's leaders take machine 1's lock then machine 2's, run B's the other way round (two lock files stand
    for the two machines' locks). A leader that blocked while holding the other lock would wait for ever."""
    locks = [f"cp_test_{os.getpid()}_machine{m}.lock" for m in (1, 2)]
    script = tmp_path / "two_machines.py"
    script.write_text(TWO_MACHINES)
    procs, logs = [], []
    try:
        for run, order in (("A", locks), ("B", locks[::-1])):
            port = str(free_port())
            for rank, lock in enumerate(order):
                env = {**os.environ, **PROCESS_ENV, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "WORLD_SIZE": "2",
                       "RANK": str(rank)}
                logs.append(tmp_path / f"{run}{rank}.log")
                with open(logs[-1], "w") as out:  # the ranks forked from the preloaded server
                    procs.append(python_process([str(script), lock], env, stdout=out, stderr=subprocess.STDOUT))
        codes = [p.wait(timeout=90) for p in procs]
        texts = [log.read_text() for log in logs]
        assert codes == [0] * 4 and all("\nlocked " in "\n" + text for text in texts), [t[-1500:] for t in texts]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for lock in locks:
            (SHM / lock).unlink(missing_ok=True)


# A rank that dies of a signal, or leaves after a lost peer: it unlinks its datasets' segments itself (or another rank
# of the node was first: argv[2]), then ends with no exit handler run.
RELEASE_AND_DIE = """
import gc, os, sys
from pathlib import Path
from data_pipeline.loader import LoaderConfig, build_dataset, release_shared_memory
dataset = build_dataset(LoaderConfig(path=sys.argv[1]), "train", 4)
next(iter(dataset))
gc.freeze()  # as a training process does with what its start-up built (core.host_memory)
if sys.argv[2] == "another rank first":
    for path in Path("/dev/shm").glob(f"{dataset._shm_prefix_int:06}_*"):
        path.unlink()
print(len(release_shared_memory()), flush=True)
os._exit(0)
"""


@pytest.mark.parametrize("first", ["itself", "another rank first"])
def test_a_process_that_released_its_segments_leaves_its_resource_tracker_nothing_to_report(prepared, first):
    """The segments it created are told gone to its resource tracker, which otherwise, once the process has ended,
    warns about each as leaked and fails to unlink it again (a screenful after a Ctrl-C before the first step); also
    where another rank of the node unlinked them first."""
    proc = subprocess.run([sys.executable, "-c", RELEASE_AND_DIE, str(prepared), first], cwd=REPO,
                          env={**os.environ, **PROCESS_ENV}, capture_output=True, text=True, timeout=120)
    # The tracker holds the same stderr: the run returns once it has ended, and said whatever it had to.
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (int(proc.stdout) >= 4) == (first == "itself"), proc.stdout
    assert "resource_tracker" not in proc.stderr and "leaked" not in proc.stderr, proc.stderr[-2000:]
