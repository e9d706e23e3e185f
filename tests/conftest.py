"""Shared fixtures: a small real-text corpus, a prepared dataset, and a torchrun launcher."""
from __future__ import annotations

import gzip
import json
import multiprocessing.process
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO, TYPE_CHECKING

import pytest
from core.distributed import restored_environ  # noqa: F401 (the tests import it from here)
from pretrain.run_dir import RunDir

if TYPE_CHECKING:  # annotations only: the server's module is imported where it starts
    from helpers.preloaded import ForkedProcess

REPO = Path(__file__).resolve().parents[1]
TINY_MODEL = [
    "model.architecture=bert",  # the demo config is ModernBERT; these tests name BERT classes (ModernBERT: test_backbones)
    "model.hidden_size=32",
    "model.num_layers=2",
    "model.num_heads=2",
    "model.intermediate_size=64",
    "model.max_position_embeddings=64",
    # `auto` would train in bf16 on a CPU with AMX and fp32 on one without: tests pin what they check.
    "train.precision=fp32",
]


def write_hub_download(folder: Path, configs: dict[str, dict[str, dict[str, list]]]) -> Path:
    """A folder laid out as `hf download ID --repo-type dataset --local-dir` leaves a hub dataset: a README whose YAML
    names each config's splits and their parquet files ({config: {split: {column: values}}})."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    lines = ["---", "configs:"]
    for name, splits in configs.items():
        lines += [f"- config_name: {name}", "  data_files:"]
        (folder / name).mkdir(parents=True, exist_ok=True)
        for split, columns in splits.items():
            pq.write_table(pa.table(columns), folder / name / f"{split}-00000-of-00001.parquet")
            lines += [f"  - split: {split}", f"    path: {name}/{split}-*"]
    (folder / "README.md").write_text("\n".join(lines + ["---", "# a hub dataset, downloaded"]) + "\n")
    return folder


def write_token_dataset(root: Path, sequences: list, size_limit: int = 1000) -> Path:
    """`sequences` (token id arrays) as a train split of MDS shards of about `size_limit` bytes, written with
    streaming's own writer, and a manifest naming the pad id (0): a dataset the loader opens. Returns `root`."""
    import numpy as np
    from streaming import MDSWriter

    from data_pipeline.dataset_dir import DatasetDir
    from data_pipeline.loader import shared_memory_registration

    with shared_memory_registration(), MDSWriter(out=str(Path(root) / "train"), columns={"input_ids": "ndarray:uint16"},
                                                 size_limit=size_limit) as writer:
        for ids in sequences:
            writer.write({"input_ids": np.asarray(ids).astype(np.uint16)})
    DatasetDir(root).manifest.write_text(json.dumps({"tokenizer": {"pad_id": 0}}))
    return Path(root)


def descendants(pid: int) -> list[int]:
    """Every living process below `pid` (loader or prepare workers, their resource tracker), from /proc."""
    found = []
    for children in Path(f"/proc/{pid}/task").glob("*/children"):
        try:
            kids = [int(c) for c in children.read_text().split()]
        except OSError:  # the thread ended
            continue
        for kid in kids:
            found += [kid, *descendants(kid)]
    return found


def running(pid: int) -> bool:
    """Whether `pid` runs: not gone, and not a zombie waiting for its parent."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return False


def kjv_chapters(n: int) -> list[str]:
    """The first n chapters of the bundled corpus (real English text)."""
    with gzip.open(REPO / "data" / "kjv.txt.gz", "rt", encoding="utf-8") as fh:
        return fh.read().split("\n\n")[:n]


@pytest.fixture(scope="session")
def corpus_file(tmp_path_factory) -> Path:
    """A plain-text corpus of 60 documents separated by blank lines."""
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_text("\n\n".join(kjv_chapters(60)) + "\n", encoding="utf-8")
    return path


def prepare_corpus(out: Path, corpus_file: Path, *extra: str) -> Path:
    """The corpus prepared with a 400-token unigram tokenizer into 64-token sequences (extra: e.g. packing=pairs), in
    zstd shards: what a bucket holds, and streaming's unpacking path under every training test (a local folder's
    default is none)."""
    from core.config_io import load_config
    from data_pipeline.config import PrepareConfig
    from data_pipeline.prepare import prepare

    return prepare(load_config(PrepareConfig, None, [
        f"output_dir={out}", "sources=[{kind: text, path: '" + str(corpus_file) + "'}]", "tokenizer.vocab_size=400",
        "tokenizer.character_coverage=1.0", "seq_len=64", "val_fraction=0.1", "compression=zstd", *extra]))


@pytest.fixture(scope="session")
def prepared(tmp_path_factory, corpus_file) -> Path:
    """The corpus prepared with a 400-token unigram tokenizer into 64-token sequences."""
    return prepare_corpus(tmp_path_factory.mktemp("prepared") / "data", corpus_file)


@pytest.fixture(scope="session")
def document_data(tmp_path_factory, corpus_file) -> Path:
    """The same, packed one document per row (DeCLUTR's data): the same tokenizer."""
    return prepare_corpus(tmp_path_factory.mktemp("documents") / "data", corpus_file, "packing=document")


PROCESS_ENV = {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}


def _preloaded():
    """This pytest process's preloaded server (tests/helpers/preloaded.py), started on first use."""
    global _SERVER
    if _UNIT_GUARD["on"]:  # a forked process is a process: the unit guard refuses it as it refuses a Popen
        raise AssertionError("a test under tests/unit/ started a process: move it to tests/process/")
    if _SERVER is None:
        from helpers.preloaded import Server

        _SERVER = Server(REPO, {**_STARTED_WITH, **PROCESS_ENV})
    return _SERVER


_SERVER = None
# The environment before any test ran (a test may set a variable while the server starts; it then differs for later
# launches, which would all get fresh interpreters).
_STARTED_WITH = dict(os.environ)


_SESSION_TMPDIR: list[str] = []


def pytest_configure(config) -> None:
    """One temporary folder (TMPDIR) for this run, its workers and every process they start, removed at its end.

    streaming writes two lock files per dataset opened into the temporary folder and never removes them; they mark
    prefixes it must not reuse, so every later run's scan for a free prefix steps over all of them (BENCHMARKS.md,
    "Process start-up and the test suite": thousands of earlier sessions' files in /tmp made the suite minutes slower).
    The workers share the controller's folder, so within a run no finished run's prefix is reused."""
    if hasattr(config, "workerinput") or os.environ.get("PYTEST_XDIST_WORKER"):
        return  # an xdist worker: it inherited the controller's
    folder = tempfile.mkdtemp(prefix="contrastive-pretrain-tests-")
    _SESSION_TMPDIR.append(folder)
    os.environ["TMPDIR"] = folder
    _STARTED_WITH["TMPDIR"] = folder  # the preloaded server's too: a launch differing from it would start fresh
    # Inductor's cache in the same folder, as torch would put it from TMPDIR, but named now: torch sets the variable
    # itself when torch._dynamo is first imported (a test module's import, after the server's environment was
    # taken), and launches differing from the server in it would all start fresh interpreters. Each run compiles
    # afresh, as CI's clean machine does; a cache the caller names is kept.
    if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
        cache = os.path.join(folder, "torchinductor")
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = _STARTED_WITH["TORCHINDUCTOR_CACHE_DIR"] = cache


def pytest_unconfigure(config) -> None:
    """Remove the run's temporary folder (the controller's, once every worker has ended)."""
    for folder in _SESSION_TMPDIR:
        shutil.rmtree(folder, ignore_errors=True)


def pytest_collection_finish(session) -> None:
    """Freeze what collection imported (torch, transformers, DeepSpeed, every test module): this process's full
    garbage collections then skip those objects, as the preloaded server's children and a training process do."""
    import gc

    gc.freeze()


def pytest_sessionfinish(session, exitstatus) -> None:
    """Stop the preloaded server of this pytest process, if one was started."""
    if _SERVER is not None:
        _SERVER.stop()


def python_process(argv: list[str], env: dict[str, str] | None = None, cwd: Path = REPO, stdout=None, stderr=None,
                   new_session: bool = False):
    """`python *argv` started as a process (forked from the preloaded server where its environment allows): the
    subprocess.Popen calls of the tests that start the project's commands and helpers (`new_session`: Popen's
    `start_new_session`)."""
    return _preloaded().launch(argv, {**os.environ, **PROCESS_ENV} if env is None else env, cwd, stdout, stderr,
                               new_session=new_session)


def run_python(argv: list[str], env: dict[str, str] | None = None, cwd: Path = REPO, timeout: float = 300,
               read_later: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """`subprocess.run([python, *argv], capture_output=True, text=True)` through `python_process`'s server (forked
    also where `read_later`'s variables differ: the caller knows they are read after the start, see `forkable`)."""
    return _preloaded().run(argv, {**os.environ, **PROCESS_ENV} if env is None else env, cwd, timeout, read_later)


class ForkedModuleRuns:
    """Stands in for the `subprocess` module of a benchmark whose `main` a test calls in its own process: a captured run
    of `python -m MODULE` (what the benchmark measures or checks) is forked from the preloaded server, as `run_cli`
    forks a test's own commands; anything else, torchrun's agent among them, goes to `subprocess` itself."""

    def __getattr__(self, name: str):
        return getattr(subprocess, name)

    def run(self, cmd: list, *, cwd=None, env=None, capture_output: bool = False, text: bool = False, **kwargs):
        """`subprocess.run`, forked where it can be."""
        if (list(cmd[:2]) != [sys.executable, "-m"] or cmd[2] == "torch.distributed.run" or kwargs
                or not (capture_output and text)):
            return subprocess.run(cmd, cwd=cwd, env=env, capture_output=capture_output, text=text, **kwargs)
        return run_python(*self._forked(cmd, env, cwd), timeout=900)

    def Popen(self, cmd: list, *, cwd: str | Path | None = None, env: dict[str, str] | None = None, stdout=None,
              stderr=None, text: bool = False, **kwargs) -> "subprocess.Popen | _PipedStderr":
        """`subprocess.Popen` of `python -m MODULE` with its stderr piped as text (benchmarks/gpu_paths.py's runs),
        forked where it can be, the stderr read through a file, in a session of its own if asked. A fork does not
        reach CUDA (the server's imports touched the driver before it): a test that reads a CUDA error keeps a fresh
        interpreter. Anything else goes to `subprocess.Popen`."""
        if (list(cmd[:2]) != [sys.executable, "-m"] or set(kwargs) - {"start_new_session"} or stderr != subprocess.PIPE
                or not text or stdout not in (None, subprocess.DEVNULL)):
            return subprocess.Popen(cmd, cwd=cwd, env=env, stdout=stdout, stderr=stderr, text=text, **kwargs)
        err = tempfile.TemporaryFile("w+")
        proc = python_process(*self._forked(cmd, env, cwd), stdout=stdout, stderr=err,
                              new_session=kwargs.get("start_new_session", False))
        return _PipedStderr(proc, err)

    @staticmethod
    def _forked(cmd: list, env: dict | None, cwd: str | Path | None) -> tuple[list[str], dict, Path]:
        """A fork's arguments after the interpreter, environment and folder. The benchmark's PYTHONPATH of the
        checkout first becomes this process's own (a forked `-m` from REPO has the checkout first too)."""
        from benchmarks.arguments import repo_pythonpath

        env = dict(os.environ if env is None else env)
        if env.get("PYTHONPATH") == repo_pythonpath():
            env.pop("PYTHONPATH")
            env.update({"PYTHONPATH": os.environ["PYTHONPATH"]} if "PYTHONPATH" in os.environ else {})
        return [os.fspath(c) for c in cmd[1:]], {**env, **PROCESS_ENV}, Path(cwd or os.getcwd())


class _PipedStderr:
    """A forked process whose stderr a caller reads as Popen's `communicate()` gives a PIPE's (here through a file)."""

    def __init__(self, proc: "subprocess.Popen | ForkedProcess", err: IO[str]) -> None:
        self.proc, self.err = proc, err
        self.pid, self.args = proc.pid, proc.args

    @property
    def returncode(self) -> int | None:
        """The exit status once it has ended (negative: the signal that ended it), else None."""
        return self.proc.returncode

    def communicate(self, timeout: float | None = None) -> tuple[None, str]:
        """Wait for the end (subprocess.TimeoutExpired past `timeout`), then (None, everything it wrote on stderr)."""
        self.proc.wait(timeout)
        self.err.seek(0)
        text = self.err.read()
        self.err.close()
        return None, text

    def wait(self, timeout: float | None = None) -> int:
        """Its exit status, once it has ended (subprocess.TimeoutExpired past `timeout`)."""
        return self.proc.wait(timeout)


def run_cli(module: str, args: list[str], nproc: int = 1, timeout: int = 300, check: bool = True,
            launcher: str = "direct") -> subprocess.CompletedProcess:
    """Run `python -m module args` (`module` a .py path: that script) from the repo root; nproc > 1 starts the ranks
    directly with the environment srun gives them (launcher="torchrun": under torchrun, a new interpreter for the
    agent and each rank).

    With direct ranks, stdout is rank 0's log (the rank that logs) and stderr every rank's log."""
    if nproc > 1 and launcher == "direct":
        return _run_ranks(module, args, nproc, timeout, check)
    command = [module] if module.endswith(".py") else ["-m", module]
    if nproc > 1:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", *command, *args]
        proc = subprocess.run(cmd, cwd=REPO, env={**os.environ, **PROCESS_ENV}, capture_output=True, text=True,
                              timeout=timeout)
    else:
        proc = run_python([*command, *args], timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(proc.args)} exited {proc.returncode}\n--- stdout\n{proc.stdout[-4000:]}\n"
                             f"--- stderr\n{proc.stderr[-6000:]}")
    return proc


def _run_ranks(module: str, args: list[str], n: int, timeout: int, check: bool) -> subprocess.CompletedProcess:
    """launch_ranks, waited for: the first non-zero exit code, rank 0's log and all ranks' logs."""
    import tempfile

    with tempfile.TemporaryDirectory() as logs:
        procs = launch_ranks(args, n, Path(logs), module)
        deadline = time.time() + timeout
        try:
            codes = [p.wait(timeout=max(1.0, deadline - time.time())) for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        texts = [(Path(logs) / f"rank{rank}.log").read_text() for rank in range(n)]
    code = next((c for c in codes if c != 0), 0)
    proc = subprocess.CompletedProcess(procs[0].args, code, texts[0], "".join(f"--- rank {r}\n{t}" for r, t in enumerate(texts)))
    if check and code != 0:
        raise AssertionError(f"{n} ranks of {module} {' '.join(args)} exited {codes}\n{proc.stderr[-8000:]}")
    return proc


def train_runs_in_one_process(runs: list[dict], spec: Path, timeout: int = 900) -> None:
    """Train (and probe) several runs one after the other in one pair of ranks (tests/helpers/train_and_probe.py
    --runs): a process group start-up and a DeepSpeed set-up per run, not a launch.
    `runs`: [{"probe_out": FILE, "args": [...]}, ...] (no probe_out: train only)."""
    spec.write_text(json.dumps(runs))
    proc = _run_ranks("tests/helpers/train_and_probe.py", ["--runs", str(spec)], 2, timeout, check=False)
    assert proc.returncode == 0, proc.stderr[-8000:]


class RunsCode:
    """What a hostile checkpoint file can hold: unpickling it calls `open(path, "w")`, creating `path`."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return open, (str(self.path), "w")


def plant_payload(tag: Path, ran: Path) -> Path:
    """Rewrite a checkpoint tag's model file to carry a pickled call that creates `ran`, and its completion record to
    match (intact by its own record, as whoever can write the folder or the bucket can make it); returns the file."""
    import torch
    from pretrain.checkpointing.checkpoint_dir import COMPLETE, file_manifest

    model_file = tag / "mp_rank_00_model_states.pt"
    torch.save({**torch.load(model_file, weights_only=False), "note": RunsCode(ran)}, model_file)
    marker = json.loads((tag / COMPLETE).read_text())
    (tag / COMPLETE).write_text(json.dumps({**marker, "files": file_manifest(tag)}))
    return model_file


LAUNCHER_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@pytest.fixture(autouse=True)
def no_launcher_variables_leak():
    """A test that leaves RANK or MASTER_PORT in this worker's environment hands a port chosen once to every later
    launch of the worker, which then collide with whatever took that port since: such a leak fails the test that
    made it (library code must undo what it sets; in-process training wraps itself in restored_environ)."""
    saved = dict(os.environ)
    yield
    leaked = {k: os.environ[k] for k in LAUNCHER_VARIABLES if os.environ.get(k) != saved.get(k) and k in os.environ}
    os.environ.clear()
    os.environ.update(saved)
    assert not leaked, f"the test left launcher variables in os.environ: {leaked}"


_PORTS_RNG = random.SystemRandom()  # not the global generator, which a test may seed alike in both workers


def _ports_the_kernel_never_picks() -> range:
    """Ports outside the range the kernel hands out for outgoing connections and bind(0) (ip_local_port_range)."""
    try:
        low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        low, high = 32768, 60999
    return range(10000, low) if low - 10000 >= 2000 else range(high + 1, 65536)


def free_port() -> int:
    """A TCP port nobody listens on right now (for MASTER_PORT), from outside the ephemeral range: a port bind(0)
    gave could be handed to another process's connection (a gloo pair, an S3 client) before the rank binds it."""
    ports = _ports_the_kernel_never_picks()
    if not ports:  # the ephemeral range covers nearly all ports here: bind(0) it is
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]
    for _ in range(100):
        port = _PORTS_RNG.choice(ports)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError(f"no free port in {ports}")


def launch_ranks(args: list[str], n: int, log_dir: Path, module: str = "pretrain", env: dict[str, str] | None = None) -> list:
    """Start n ranks of `python -m module args` (`module` a .py path: that script) as separate processes with the
    environment srun or torchrun would give them (and `env`'s variables); each rank's stdout and stderr go to
    log_dir/rank{r}.log."""
    port = free_port()
    log_dir.mkdir(parents=True, exist_ok=True)
    command = [module] if module.endswith(".py") else ["-m", module]
    procs = []
    for rank in range(n):
        rank_env = {**os.environ, **PROCESS_ENV, **(env or {}), "RANK": str(rank), "WORLD_SIZE": str(n),
                    "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(n), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        with open(log_dir / f"rank{rank}.log", "w") as out:  # the child keeps its own copy of the descriptor
            procs.append(python_process([*command, *args], rank_env, stdout=out, stderr=subprocess.STDOUT))
    return procs


def wait_for_step(run: Path, step: int, procs, timeout: float = 120) -> None:
    """Block until the run's metrics.jsonl reaches `step` (failing if a rank exits first)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if any(row["step"] >= step for row in RunDir(run).metric_rows()):  # complete rows: the run is writing them
            return
        assert all(p.poll() is None for p in procs), "a rank exited early"
        time.sleep(0.05)
    raise AssertionError(f"step {step} not reached")


# Longest modules first, so that `pytest -n 2 --dist loadfile` (the Makefile's test command) starts the long, mostly
# waiting SLURM module at once and packs the short ones around the long ones (measured durations on the 2-core machine;
# a module not listed runs after these, in collection order, and the SPREAD modules' tests come last).
LONGEST_FIRST = ["test_slurm", "test_transformers_versions", "test_train_resume", "test_gpu_throughput_cpu",
                 "test_engine_configs", "test_family_objectives", "test_compile_regions", "test_objective_training",
                 "test_compile_check", "test_object_storage", "test_preloaded", "test_evaluation",
                 "test_rotary_tables_benchmark", "test_rotary_tables", "test_export_stages", "test_tracking",
                 "test_gpu_queue_run", "test_elastic", "test_launch", "test_launch_checks", "test_hot_loop",
                 "test_parallel_and_integrity", "test_peer_loss", "test_wheel", "test_diagnostics", "test_errors",
                 "test_preemption", "test_interrupt", "test_objective_behaviour", "test_config_errors", "test_layering_at_run_time",
                 "test_linear_probe", "test_sentence_embeddings", "test_host_memory", "test_export"]
# Modules whose tests share no fixture of their own that costs anything to build: under `--dist loadfile` their tests go
# to whichever worker is free, one by one. Every other module runs whole on one worker (its module fixtures, such as a
# module's 2-rank training runs, built once).
SPREAD = {"test_one_graph"}


@pytest.hookimpl(optionalhook=True)  # a hook of xdist's: pytest -p no:xdist must not refuse it
def pytest_xdist_make_scheduler(config, log):
    """`--dist loadfile` in the collection's order (LONGEST_FIRST; xdist would put the modules with the most tests
    first), except that the tests of a SPREAD module are scheduled one by one."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    config.option.loadscopereorder = False

    class ModulesUnlessSpread(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return nodeid if Path(module).stem in SPREAD else module

    return ModulesUnlessSpread(config, log)


def pytest_collection_modifyitems(config, items) -> None:
    """Mark every test under tests/process/ slow (the folder says what a test starts), and order the collected tests
    by module, longest module first (stable within a module)."""
    for item in items:
        if _folder(item) == "process":
            item.add_marker(pytest.mark.slow)
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    rank.update({name: len(rank) + 1 for name in SPREAD})  # last: their tests, one by one, fill the end evenly
    items.sort(key=lambda item: rank.get(Path(str(item.fspath)).stem, len(LONGEST_FIRST)))


def _folder(item) -> str:
    """"unit" or "process": the folder under tests/ that holds the item's module."""
    return Path(str(item.fspath)).parent.name


# tests/unit/ runs in this process only: a test there that starts a process (a subprocess, a loader worker, a rank)
# fails with the line below, through the guard these hooks switch on around its set-up and call.
_UNIT_GUARD = {"on": False}
_popen_init = subprocess.Popen.__init__
_process_start = multiprocessing.process.BaseProcess.start


def _refuse_in_unit_tests(original):
    def guarded(self, *args, **kwargs):
        if _UNIT_GUARD["on"]:
            raise AssertionError("a test under tests/unit/ started a process: move it to tests/process/")
        return original(self, *args, **kwargs)
    return guarded


subprocess.Popen.__init__ = _refuse_in_unit_tests(_popen_init)
multiprocessing.process.BaseProcess.start = _refuse_in_unit_tests(_process_start)


def _guarded_phase(item):
    """A hook wrapper body: the guard is on for a unit test's phase, off after it."""
    _UNIT_GUARD["on"] = _folder(item) == "unit"
    try:
        yield
    finally:
        _UNIT_GUARD["on"] = False


# Set-up (the fixtures a unit test makes, module and session ones included) and the test itself.
pytest_runtest_setup = pytest.hookimpl(hookwrapper=True)(_guarded_phase)
pytest_runtest_call = pytest.hookimpl(hookwrapper=True)(_guarded_phase)
