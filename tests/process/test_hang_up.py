"""A hang-up (SIGHUP) is caught where the process was started to receive it, and stays ignored under nohup: the
trainer's signals (save and stop) and the commands' `exit_on_termination` (clean up, exit 129)."""
import shutil
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


@pytest.mark.parametrize("nohup", [False, True], ids=["plain", "nohup"])
@pytest.mark.parametrize("setup", list(SETUPS))
def test_a_hang_up_is_caught_unless_the_process_was_started_to_ignore_it(setup, nohup):
    prefix = [shutil.which("nohup")] if nohup else []
    proc = subprocess.run([*prefix, sys.executable, "-c", SETUPS[setup] + HANG_UP_AND_SAY], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
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
