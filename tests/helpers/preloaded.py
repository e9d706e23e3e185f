"""Test processes forked from a server that has already imported torch, transformers, DeepSpeed and the project.

This is multiprocessing's fork server, for commands: a process the tests start (`python -m pretrain train ...`, a
rank, `tests/helpers/train_and_probe.py`) is forked from the server, so it skips the imports that take most of a
tiny run's start (BENCHMARKS.md, "Process start-up and the test suite"), and then runs its module or script as
`python` would: its own pid, argv, working directory, environment, standard streams, signal dispositions and exit
code, a fresh `__main__` module (multiprocessing's spawn finds it), atexit handlers and non-daemon threads at the end.

What a forked process shares with the server and a fresh interpreter would not:
- the modules already imported, and what they read from the environment when imported: a launch whose environment
  differs from the server's (before or after its imports set some variables) in anything but `RUNTIME_VARIABLES` is
  started as a fresh process instead;
- what those imports printed: they printed it once, in the server;
- the string hash seed (PYTHONHASHSEED): two ranks forked from one server iterate a set of strings in the same
  order, where fresh interpreters would not.
- the garbage collector's view of the imports' objects: the server freezes them (`gc.freeze`), so a forked process's
  full collections skip them (a fresh `python -m pretrain train` freezes its own start-up's objects too, later).
Python's, numpy's and torch's global generators are seeded from the OS in each forked process, as a new interpreter
seeds them; the variables the imports set in `os.environ` are set in each forked process's environment too.

Usage (the server): python tests/helpers/preloaded.py SOCKET_PATH   (the path exists once it serves)
The client side is `Server` (one per pytest worker, see tests/conftest.py) and its `launch`/`run`.
"""
from __future__ import annotations

import gc
import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

# What the server imports before it serves: what `python -m pretrain train|export|evaluate` and the training helpers
# import on their way to the first step (the rest is imported in the forked process, as it would be anyway).
PRELOAD = ("pretrain.cli", "pretrain.run", "pretrain.exporting.export", "data_pipeline.loader", "data_pipeline.prepare",
           "streaming.base.dataset", "torch.utils.tensorboard", "evaluation.cli")

# Variables read at run time (by the launcher contract, boto3 and streaming's S3 client, SLURM's tools, the trackers,
# the project's status files), never at import: a launch may set these to values of its own and still be forked. Any
# other difference from the server's environment, where an imported library may already have read the old value,
# starts a fresh process instead. (Not every `S3_*`: TensorBoard reads S3_ENDPOINT when it is imported.)
RUNTIME_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                     "GROUP_RANK", "ROLE_RANK", "ROLE_WORLD_SIZE", "TORCHELASTIC_RUN_ID", "S3_ENDPOINT_URL",
                     "FAULT", "FAULT_TIME_FILE")  # the last two: tests/helpers/faulty_rank.py's own
RUNTIME_PREFIXES = ("AWS_", "SLURM_", "WANDB_", "MLFLOW_", "PYTEST_", "PRETRAIN_")

_HEADER = struct.Struct("!Q")
ENVIRON = "environ.json"  # beside the socket: the server's environment before its imports, and what they set
REQUEST_SECONDS = 30  # for a request to arrive whole, and for the server to answer one with the child's pid


def forkable(env: dict[str, str], base: dict[str, str], set_by_imports: dict[str, str],
             read_later: tuple[str, ...] = ()) -> list[str]:
    """The variables that keep a process with environment `env` from being forked from a server started with `base`
    whose imports then set `set_by_imports` (none: it may be). A variable may hold the server's value from before its
    imports or from after them (the pytest process may have imported what sets it, too). `read_later`: variables the
    caller knows this process reads only after its start (what it runs, not an import), unless the imports set them."""
    def runtime(key: str) -> bool:
        return key in RUNTIME_VARIABLES or key.startswith(RUNTIME_PREFIXES) or (
            key in read_later and key not in set_by_imports)

    after = {**base, **set_by_imports}
    return sorted(k for k in set(env) | set(after) if env.get(k) not in (base.get(k), after.get(k)) and not runtime(k))


# --- the server -----------------------------------------------------------------------------------------------------

def serve(path: str) -> None:
    """Import PRELOAD, then fork one child per request on the Unix socket at `path` and report each child's end."""
    import importlib

    # What a fresh interpreter started by the pytest worker begins with: this process was one a moment ago.
    dispositions = {sig: signal.getsignal(sig) for sig in signal.valid_signals() - {signal.SIGKILL, signal.SIGSTOP}
                    if signal.getsignal(sig) is not None}
    # Except SIGHUP, which starts at its default as in a terminal's process: a suite run under nohup (or a CI runner that
    # ignores it) would otherwise start every command with it ignored, and the hang-up tests would test nothing.
    dispositions[signal.SIGHUP] = signal.SIG_DFL
    started_with = dict(os.environ)
    _end_with_parent()
    sys.path[0] = os.getcwd()  # as `python -m` from the repository root: the repository's packages come first
    for name in PRELOAD:
        importlib.import_module(name)
    from core.distributed import import_deepspeed

    import_deepspeed()
    from pretrain.engine.optim import ask_cpuinfo_once

    ask_cpuinfo_once()
    # Asked here, once per server: the children that build DeepSpeed's CPU ops have the answer (each asking costs a
    # second, pretrain/engine/optim.py).
    import cpuinfo

    cpuinfo.get_cpu_info()
    # The imports' objects (about 780,000) out of every child's full collections: DeepSpeed's ZeRO-3 set-up and
    # train_and_probe.py each run gc.collect(), which would otherwise traverse them all (BENCHMARKS.md).
    gc.freeze()
    set_by_imports = {k: v for k, v in os.environ.items() if started_with.get(k) != v}
    # Forking a process with other threads copies their locks in whatever state they are: none may exist (native
    # ones included: an OpenMP pool started by an import).
    threads = os.listdir("/proc/self/task")
    if len(threads) != 1:
        raise SystemExit(f"preloaded server: importing {PRELOAD} left {len(threads)} threads; it cannot fork safely")
    sys.stdout.flush()
    sys.stderr.flush()
    Path(path).with_name(ENVIRON).write_text(json.dumps({"started_with": started_with, "set_by_imports": set_by_imports}))
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path + ".binding")
    listener.listen(64)
    # A child's end wakes the select below through this pipe (a signal handler alone would not: Python retries select).
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    children: dict[int, socket.socket] = {}
    os.rename(path + ".binding", path)  # the client waits for this name: it is there once the server listens
    while True:
        readable, _, _ = select.select([listener, wake_read], [], [])
        if wake_read in readable:
            os.read(wake_read, 4096)
        _reap(children)
        if listener not in readable:
            continue
        conn, _ = listener.accept()
        try:
            conn.settimeout(REQUEST_SECONDS)
            request, fds = _receive(conn)
        except (OSError, ValueError, struct.error) as exc:  # a client that failed mid-request: drop it, serve on
            print(f"preloaded server: dropped a request ({type(exc).__name__}: {exc})", file=sys.stderr, flush=True)
            conn.close()
            continue
        pid = os.fork()
        if pid == 0:
            listener.close()
            for fd in (wake_read, wake_write):
                os.close(fd)
            for other in children.values():
                other.close()
            _child(request, fds, conn, dispositions, set_by_imports)  # never returns
        for fd in fds:
            os.close(fd)
        try:
            conn.sendall(f"{pid}\n".encode())
        except OSError:
            pass  # the client has gone; the child is reaped all the same
        children[pid] = conn


def _end_with_parent() -> None:
    """SIGTERM this server when the pytest worker that started it dies (a crashed worker leaves no server behind)."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG


def _reap(children: dict[int, socket.socket]) -> None:
    """Send every ended child's wait status to its client, and close that connection."""
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = children.pop(pid, None)
        if conn is not None:
            try:
                conn.sendall(f"{os.waitstatus_to_exitcode(status)}\n".encode())
            except OSError:
                pass  # the client has gone: nobody waits for this child
            conn.close()


def _receive(conn: socket.socket) -> tuple[dict, list[int]]:
    """One request: its JSON and the three descriptors (stdin, stdout, stderr) sent with it."""
    data, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
    if len(fds) != 3 or len(data) < _HEADER.size:
        for fd in fds:
            os.close(fd)
        raise ValueError(f"{len(fds)} descriptors and {len(data)} bytes, not 3 and a header")
    size = _HEADER.unpack(data[:_HEADER.size])[0]
    body = data[_HEADER.size:]
    while len(body) < size:
        more = conn.recv(size - len(body))
        if not more:
            for fd in fds:
                os.close(fd)
            raise ValueError("the request was cut short")
        body += more
    return json.loads(body), fds


def _child(request: dict, fds: list[int], conn: socket.socket, dispositions: dict, set_by_imports: dict) -> None:
    """In the forked process: become the requested command, run it, exit with its code."""
    code = 1
    try:
        if request["new_session"]:
            os.setsid()
        conn.close()
        signal.set_wakeup_fd(-1)
        for sig, handler in dispositions.items():
            signal.signal(sig, handler)
        for target, fd in zip((0, 1, 2), fds):
            os.dup2(fd, target)
        for fd in fds:
            if fd > 2:
                os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update({**request["env"], **set_by_imports})
        unbuffered = bool(os.environ.get("PYTHONUNBUFFERED"))
        sys.stdout.reconfigure(line_buffering=True, write_through=unbuffered)
        sys.stderr.reconfigure(line_buffering=True, write_through=True)
        sys.orig_argv = [sys.executable, *request["argv"]]
        _reseed()
        code = _run(request["argv"], request["cwd"])
    except SystemExit as exc:
        code = _exit_code(exc)
    except KeyboardInterrupt:  # as the interpreter ends on one: the traceback, then death by SIGINT
        sys.excepthook(*sys.exc_info())
        _exit(-signal.SIGINT)
    except BaseException:  # what the interpreter does with an uncaught exception
        sys.excepthook(*sys.exc_info())
        code = 1
    _exit(code)


def _reseed() -> None:
    """Seed Python's, numpy's and torch's global generators from the OS, as a new interpreter does (each forked
    process would otherwise draw the server's numbers)."""
    import random

    import numpy
    import torch

    random.seed()
    numpy.random.seed()
    torch.seed()


def _run(argv: list[str], cwd: str) -> int:
    """`python -m MODULE ARGS` or `python SCRIPT ARGS`, as the interpreter runs them: sys.argv, sys.path[0], and the
    code run in a fresh `__main__` module that stays `__main__` until the process ends."""
    import importlib.machinery
    import runpy
    import types

    main = types.ModuleType("__main__")
    sys.modules["__main__"] = main
    if "__mp_main__" in sys.modules:
        sys.modules["__mp_main__"] = main
    if argv[0] == "-m":
        sys.path[0] = cwd
        sys.argv = [argv[1], *argv[2:]]  # runpy puts the module's file in argv[0], as `python -m` does
        runpy._run_module_as_main(argv[1], alter_argv=True)
        return 0
    path = os.path.abspath(argv[0])  # argv[0] stays as given; __file__ is absolute
    sys.argv = list(argv)
    sys.path[0] = os.path.dirname(path)
    main.__file__, main.__cached__, main.__spec__ = path, None, None
    main.__loader__ = importlib.machinery.SourceFileLoader("__main__", path)
    main.__builtins__ = __builtins__
    with open(path, "rb") as fh:
        code = compile(fh.read(), path, "exec")
    exec(code, main.__dict__)
    return 0


def _exit_code(exc: SystemExit) -> int:
    """The exit status `raise SystemExit(x)` gives: 0 for None, x for an int, else x printed to stderr and 1."""
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr)
    return 1


def _exit(code: int) -> None:
    """What the interpreter does at exit (join non-daemon threads, atexit handlers, flush), then leave at once; a
    negative code: die of that signal."""
    import atexit
    import threading

    try:
        threading._shutdown()
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        if code < 0:
            signal.signal(-code, signal.SIG_DFL)
            os.kill(os.getpid(), -code)
        os._exit(code & 0xFF)


# --- the client -----------------------------------------------------------------------------------------------------

class Server:
    """One preloaded server (started on first use) and the processes forked from it."""

    def __init__(self, repo: Path, env: dict[str, str]) -> None:
        self.repo, self.env = repo, dict(env)
        self.proc: subprocess.Popen | None = None
        self.folder: Path | None = None
        self.set_by_imports: dict[str, str] = {}

    @property
    def path(self) -> Path:
        """The server's socket, in a folder of its own (made at the start)."""
        return self.folder / "server.sock"

    def _start(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                return
            raise RuntimeError(f"the preloaded server exited {self.proc.returncode}; its output is in the test log")
        import tempfile

        self.folder = Path(tempfile.mkdtemp(prefix="preloaded-"))
        # Its own output (library warnings at import) goes to the pytest process's stderr.
        self.proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), str(self.path)], cwd=self.repo,
                                     env=self.env, stdout=sys.stderr.fileno() if _has_fileno(sys.stderr) else None)
        while not self.path.exists():
            if self.proc.poll() is not None:
                raise RuntimeError(f"the preloaded server exited {self.proc.returncode} before it served")
            time.sleep(0.05)
        self.set_by_imports = json.loads((self.folder / ENVIRON).read_text())["set_by_imports"]

    def stop(self) -> None:
        """End the server (its forked processes are left to run out, as a Popen's would be) and remove its socket."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)
        if self.folder is not None:
            import shutil

            shutil.rmtree(self.folder, ignore_errors=True)

    def launch(self, argv: list, env: dict[str, str], cwd: Path, stdout=None, stderr=None,
               stdin=subprocess.DEVNULL, read_later: tuple[str, ...] = (),
               new_session: bool = False) -> "subprocess.Popen | ForkedProcess":
        """`python *argv` with `env` in `cwd`: forked when the environment allows (`forkable`, with `read_later`),
        else a new process (said on stderr, with the variables that decided it). stdout/stderr: an open file or
        descriptor, subprocess.DEVNULL, subprocess.STDOUT (stderr only), or None (inherit); not PIPE. `new_session`:
        Popen's `start_new_session` (its process group then ends with `os.killpg(pid, ...)`)."""
        argv = [os.fspath(a) for a in argv]
        body = json.dumps({"argv": argv, "env": env, "cwd": os.fspath(cwd), "new_session": new_session}).encode()
        self._start()
        differ = forkable(env, self.env, self.set_by_imports, read_later)
        if differ:
            print(f"preloaded server: a fresh interpreter for {' '.join(argv[:3])} ...: {', '.join(differ)} differ "
                  "from the server's environment", file=sys.stderr)
            return subprocess.Popen([sys.executable, *argv], cwd=cwd, env=env, stdout=stdout, stderr=stderr, stdin=stdin,
                                    start_new_session=new_session)
        if subprocess.PIPE in (stdin, stdout, stderr):
            raise ValueError("a forked process takes files, descriptors, DEVNULL or STDOUT, not PIPE")
        with _Streams(stdin, stdout, stderr) as fds, socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(REQUEST_SECONDS)
            conn.connect(str(self.path))
            socket.send_fds(conn, [_HEADER.pack(len(body)) + body], fds)
            return ForkedProcess(conn.detach(), [sys.executable, *argv])

    def run(self, argv: list, env: dict[str, str], cwd: Path, timeout: float,
            read_later: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
        """`subprocess.run(..., capture_output=True, text=True, timeout=timeout)` through `launch`."""
        import tempfile

        with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
            proc = self.launch(argv, env, cwd, stdout=out, stderr=err, read_later=read_later)
            try:
                code = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                raise
            out.seek(0)
            err.seek(0)
            return subprocess.CompletedProcess([sys.executable, *argv], code, out.read(), err.read())


def _has_fileno(stream) -> bool:
    try:
        stream.fileno()
    except (AttributeError, OSError, ValueError):
        return False
    return True


class _Streams:
    """The three descriptors a forked process gets, opened for the call and closed after it (the child has copies)."""

    def __init__(self, stdin, stdout, stderr) -> None:
        self.spec = (stdin, stdout, stderr)
        self.opened: list[int] = []

    def __enter__(self) -> list[int]:
        fds = []
        for i, spec in enumerate(self.spec):
            if spec is None:
                fds.append(i)
            elif spec == subprocess.DEVNULL:
                fd = os.open(os.devnull, os.O_RDWR)
                self.opened.append(fd)
                fds.append(fd)
            elif spec == subprocess.STDOUT:
                fds.append(fds[1])
            elif isinstance(spec, int):
                fds.append(spec)
            else:
                spec.flush()
                fds.append(spec.fileno())
        return fds

    def __exit__(self, *exc) -> None:
        for fd in self.opened:
            os.close(fd)


class ForkedProcess:
    """The part of subprocess.Popen's interface the tests use, for a process the server forked."""

    def __init__(self, fd: int, args: list[str]) -> None:
        self.args = args
        self.returncode: int | None = None
        self._conn = socket.socket(fileno=fd)
        self._buffer = b""
        try:
            line = self._line(REQUEST_SECONDS)
        except BaseException:
            self._conn.close()
            raise
        if line is None:
            self._conn.close()
            raise RuntimeError(f"the preloaded server did not answer within {REQUEST_SECONDS} s")
        self.pid = int(line)

    def _line(self, timeout: float | None) -> str | None:
        """The server's next line on this connection, or None if none came within `timeout` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self._buffer:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            self._conn.settimeout(left)
            try:
                chunk = self._conn.recv(64)
            except (socket.timeout, BlockingIOError):
                return None
            if not chunk:
                raise ConnectionError(f"the preloaded server closed the connection of pid {getattr(self, 'pid', '?')}"
                                      " (it has ended: see the test log)")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line.decode()

    def _ended(self, line: str) -> int:
        self.returncode = int(line)
        self._conn.close()
        return self.returncode

    def poll(self) -> int | None:
        if self.returncode is None:
            line = self._line(0)
            if line is not None:
                self._ended(line)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            line = self._line(timeout)
            if line is None:
                raise subprocess.TimeoutExpired(self.args, timeout)
            self._ended(line)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:  # as Popen: never a pid whose end has been reported (it may be another's by now)
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


if __name__ == "__main__":
    serve(sys.argv[1])
