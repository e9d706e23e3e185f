"""A hang-up (SIGHUP) is caught where the process was started to receive it, and stays ignored under nohup: the
trainer's signals (save and stop) and the commands' `exit_on_termination` (clean up, exit 129)."""
import shutil
import signal
import subprocess
import sys

import pytest
from conftest import REPO

SETUPS = {
    # Twice, as `python -m pretrain train` and then the trainer's PreemptionGuard do.
    "trainer": "from pretrain.lifecycle import signals\nsignals.catch()\nsignals.catch()\n",
    "command": "from core.process_life import exit_on_termination\nexit_on_termination()\n",
}
HANG_UP_AND_SAY = ("import os, signal\nos.kill(os.getpid(), signal.SIGHUP)\n"
                   "print('alive', signal.getsignal(signal.SIGHUP) == signal.SIG_IGN,"
                   " signals.first_received() if 'signals' in dir() else None)\n")


# A process started from a terminal (the suite itself may run under nohup, or a CI runner that ignores SIGHUP).
AS_FROM_A_TERMINAL = "import signal\nsignal.signal(signal.SIGHUP, signal.SIG_DFL)\n"


@pytest.mark.parametrize("nohup", [False, True], ids=["plain", "nohup"])
@pytest.mark.parametrize("setup", list(SETUPS))
def test_a_hang_up_is_caught_unless_the_process_was_started_to_ignore_it(setup, nohup):
    prefix = [shutil.which("nohup")] if nohup else []
    proc = subprocess.run([*prefix, sys.executable, "-c", ("" if nohup else AS_FROM_A_TERMINAL) + SETUPS[setup]
                           + HANG_UP_AND_SAY], cwd=REPO, capture_output=True, text=True, timeout=60)
    if nohup:  # ignored, as nohup asked: nothing recorded, nothing stopped
        assert (proc.returncode, proc.stdout.split()) == (0, ["alive", "True", "None"]), proc.stderr[-2000:]
    elif setup == "trainer":  # recorded for the trainer's next step boundary, which saves and stops
        assert (proc.returncode, proc.stdout.split()) == (0, ["alive", "False", "SIGHUP"]), proc.stderr[-2000:]
    else:  # the command's clean-up runs, then exit 128 + 1
        assert (proc.returncode, proc.stdout) == (129, ""), proc.stderr[-2000:]


@pytest.mark.parametrize("shared", [True, False], ids=["2>&1", "apart"])
def test_a_dead_stdout_takes_stderr_with_it_only_where_both_write_to_one_pipe(shared):
    """`... 2>&1 | tee log`: once tee is gone, stderr fails as stdout does, so both go to /dev/null; a stderr of its
    own (a terminal, a file) keeps its lines."""
    code = ("import os\nfrom core.process_life import drop_output\n"
            "drop_output(1)\nos.write(1, b'out\\n')\nos.write(2, b'err\\n')\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT if shared else subprocess.PIPE, timeout=60)
    assert proc.returncode == 0
    assert (proc.stdout, proc.stderr) == ((b"", None) if shared else (b"", b"err\n"))


# A trainer's process whose stdout and stderr are a terminal: it says when its handlers are in, waits for the terminal
# to hang up, takes the SIGHUP, and writes to both streams as its save would.
HUNG_UP_TRAINER = AS_FROM_A_TERMINAL + """import os, sys
from pretrain.lifecycle import signals
signals.catch()
said, go = (int(fd) for fd in sys.argv[1:])
os.write(said, b"ready\\n")
os.read(go, 1)  # the terminal has hung up
os.kill(os.getpid(), signal.SIGHUP)
print("after the hang-up", flush=True)
print("after the hang-up", file=sys.stderr, flush=True)
os.write(said, signals.first_received().encode() + b"\\n")
"""


def test_a_hung_up_terminal_is_left_for_dev_null_when_the_sighup_comes():
    """Every write to a terminal that hung up fails with EIO: the save's first line would end the run."""
    import os

    terminal, child_side = os.openpty()
    said_r, said_w = os.pipe()
    go_r, go_w = os.pipe()
    proc = subprocess.Popen([sys.executable, "-c", HUNG_UP_TRAINER, str(said_w), str(go_r)], cwd=REPO,
                            stdout=child_side, stderr=child_side, pass_fds=(said_w, go_r))
    for fd in (child_side, said_w, go_r):
        os.close(fd)
    with os.fdopen(said_r) as said:
        assert said.readline() == "ready\n"
        os.close(terminal)  # the hang-up
        os.write(go_w, b"!")
        reply = said.readline()
        code = proc.wait(timeout=60)
    os.close(go_w)
    assert (code, reply) == (0, "SIGHUP\n")


# A command (prepare, export, evaluate) with a line still in stdout's buffer, on a pipe whose reader (the `tee` of
# `... | tee log`) ended with the terminal.
HUNG_UP_COMMAND = AS_FROM_A_TERMINAL + """import sys, time
from core.process_life import exit_on_termination
exit_on_termination()
print("a result, not yet flushed")
print("ready", file=sys.stderr, flush=True)
time.sleep(60)
"""


def test_a_hung_up_command_exits_129_though_its_stdout_pipe_is_gone():
    import os

    buffered = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # stdout on a pipe holds the line
    proc = subprocess.Popen([sys.executable, "-c", HUNG_UP_COMMAND], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=buffered)
    assert proc.stderr.readline() == "ready\n"
    proc.stdout.close()  # tee is gone
    proc.send_signal(signal.SIGHUP)
    assert proc.wait(timeout=60) == 128 + signal.SIGHUP, proc.stderr.read()[-2000:]
