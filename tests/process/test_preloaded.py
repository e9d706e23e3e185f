"""The tests start the project's commands forked from a preloaded server (tests/helpers/preloaded.py): a forked process
must look, from inside and from outside, like the fresh interpreter it stands for."""
import json
import os
import signal
import subprocess
import sys
import time

from conftest import PROCESS_ENV, REPO, python_process, run_python
from helpers.preloaded import forkable

DESCRIBE = "tests/helpers/describe_process.py"
SAME = ("argv", "path0", "cwd", "main_file", "name", "marker", "rank", "handlers", "environ", "orig_argv", "dispositions")


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, **PROCESS_ENV, **extra}


def _fresh(argv: list[str], env: dict[str, str], cwd=REPO) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def _described(proc: subprocess.CompletedProcess) -> dict:
    """The process's description (a fresh one prints DeepSpeed's import-time warning before it: the server printed it
    once, at its own start)."""
    return json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("{")))


def test_a_forked_script_and_module_see_what_fresh_ones_see():
    env = _env(RANK="1")  # a launcher variable: forked all the same
    for argv in ([DESCRIBE, "ok"], ["-m", "tests.helpers.describe_process", "ok"]):
        fresh, forked, again = _fresh(argv, env), run_python(argv, env), run_python(argv, env)
        assert fresh.returncode == forked.returncode == 0, fresh.stderr + forked.stderr
        want, got, other = _described(fresh), _described(forked), _described(again)
        assert {k: got[k] for k in SAME} == {k: want[k] for k in SAME}
        assert got["rank"] == "1" and got["name"] == "__main__"
        assert got["handlers"]["SIGTERM"] == got["handlers"]["SIGCHLD"] == str(signal.SIG_DFL)
        # Python installs its KeyboardInterrupt handler unless it starts with SIGINT ignored (a suite run in the
        # background of a shell): then the fresh one, and so the forked one, keeps it ignored.
        started_ignoring = signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        assert ("default_int_handler" in got["handlers"]["SIGINT"]) != started_ignoring, got["handlers"]
        for drawn in ("random", "numpy", "torch_seed", "torch_first"):  # seeded from the OS each time, as when fresh
            assert len({other[drawn], got[drawn], want[drawn]}) == 3, drawn
        assert other["pid"] != got["pid"]
        assert forked.stderr == fresh.stderr == "to stderr\n"


def test_exit_codes_messages_and_tracebacks_are_the_interpreters():
    # One mode also with the libraries a training process holds (their exit handlers run at the end too); the others
    # start bare, which is quick.
    for mode, code in (("code", 3), ("message", 1), ("raise", 1), ("raise preloaded", 1), ("interrupt", -signal.SIGINT)):
        fresh, forked = _fresh([DESCRIBE, *mode.split()], _env()), run_python([DESCRIBE, *mode.split()], _env())
        assert forked.returncode == fresh.returncode == code, (mode, forked.stderr)
        assert forked.stderr.splitlines()[-1] == fresh.stderr.splitlines()[-1], mode  # "a message", "ValueError: ..."
        assert ("Traceback" in forked.stderr) == (mode.split()[0] in ("raise", "interrupt"))


def test_threads_are_joined_and_atexit_handlers_run_at_the_end():
    fresh, forked = _fresh([DESCRIBE, "atexit-thread"], _env()), run_python([DESCRIBE, "atexit-thread"], _env())
    assert forked.stdout.splitlines()[1:] == fresh.stdout.splitlines()[1:] == ["thread finished", "atexit ran"]


def test_a_signal_ends_a_forked_process_as_it_ends_a_fresh_one(tmp_path):
    out = tmp_path / "out.txt"
    with open(out, "w") as fh:
        proc = python_process([DESCRIBE, "term"], _env(), stdout=fh, stderr=subprocess.DEVNULL)
    deadline = time.time() + 60
    while "waiting" not in out.read_text() and time.time() < deadline:
        assert proc.poll() is None
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == -signal.SIGTERM
    assert _described(subprocess.CompletedProcess([], 0, out.read_text()))["pid"] == proc.pid


def test_an_environment_a_library_may_have_read_at_import_starts_a_fresh_process():
    env = _env(PYTHONHASHSEED="7", DESCRIBE_MARKER="x")
    proc = python_process([DESCRIBE, "code"], env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert isinstance(proc, subprocess.Popen)  # not forked: the server's interpreter has another hash seed
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 3 and _described(subprocess.CompletedProcess([], 0, out.decode()))["marker"] == "x"
    forked = python_process([DESCRIBE, "ok"], _env(RANK="0"), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    assert not isinstance(forked, subprocess.Popen) and forked.wait(timeout=120) == 0


def test_a_client_that_fails_mid_request_leaves_the_server_serving(tmp_path):
    """A launch that breaks off (here: a connection that sends half a request, then a PIPE the server cannot take) is
    refused or dropped; the next launch is forked as usual."""
    import socket

    import conftest

    server = conftest._preloaded()
    assert run_python([DESCRIBE, "code"], _env()).returncode == 3  # the server is up
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as half:
        half.connect(str(server.path))
        half.sendall(b"\0\0")
    try:
        python_process([DESCRIBE, "ok"], _env(), stdout=subprocess.PIPE)
    except ValueError as exc:
        assert "not PIPE" in str(exc)
    else:
        raise AssertionError("a forked process took stdout=PIPE")
    again = run_python([DESCRIBE, "code"], _env(), timeout=60)
    assert again.returncode == 3 and server.proc.poll() is None


def test_a_variable_read_only_after_the_start_may_differ_where_the_caller_says_so():
    base, set_by_imports = {"PATH": "/bin", "CXX": "c++"}, {"TORCH_EXTENSIONS_DIR": "/server/ext"}
    env = {"PATH": "/bin", "CXX": "/tmp/fake-cxx", "TORCH_EXTENSIONS_DIR": "/tmp/ext"}
    assert forkable(env, base, set_by_imports) == ["CXX", "TORCH_EXTENSIONS_DIR"]
    # CXX only: what the server's imports set is theirs, whatever the caller says.
    assert forkable(env, base, set_by_imports, read_later=("CXX", "TORCH_EXTENSIONS_DIR")) == ["TORCH_EXTENSIONS_DIR"]
    assert forkable({**env, "PATH": "/usr/bin"}, base, set_by_imports, read_later=("CXX",)) == ["PATH",
                                                                                                  "TORCH_EXTENSIONS_DIR"]


def test_after_collection_a_launch_with_this_workers_environment_is_forked():
    """Collection imported every test module in this worker: none may have left os.environ where the server's
    imports did not (a module-level import of DeepSpeed's op builder set a random telemetry id, and every process of
    the suite then started as a fresh interpreter, the suite minutes slower). Import such a library inside the test."""
    import conftest

    server = conftest._preloaded()
    assert forkable(_env(), server.env, server.set_by_imports) == [], "collection changed os.environ (see docstring)"
