"""`python -m pretrain` with a fault injected into one rank at one step (FAULT=rank:step:kind), for the peer-loss tests.

kind: sigkill (os.kill SIGKILL), exit (sys.exit(1)), abort (os.abort()), stop (SIGSTOP: the process hangs and
sends nothing, as a lost host), full (its disk full from then on: no file it writes may grow past 40 kB, by
RLIMIT_FSIZE, so a write beyond fails with EFBIG, as on a full file system). Just before the fault the rank writes the
time to FAULT_TIME_FILE.
"""
import os
import resource
import signal
import sys
import time
from pathlib import Path

from core import distributed as dist
from pretrain import cli
from pretrain.trainer import Trainer

rank, step, kind = os.environ["FAULT"].split(":")
original = Trainer.train_step


def train_step(self) -> None:
    """The real step, then the fault on the chosen rank once the chosen step is done."""
    original(self)
    if dist.rank() == int(rank) and self.step == int(step):
        Path(os.environ["FAULT_TIME_FILE"]).write_text(repr(time.time()))
        if kind == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif kind == "exit":
            sys.exit(1)
        elif kind == "abort":
            # No core file: where a runner allows them, the dying rank would hold its sockets open while it writes one.
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
            os.abort()
        elif kind == "stop":
            os.kill(os.getpid(), signal.SIGSTOP)
        elif kind == "full":
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails instead of killing the process
            resource.setrlimit(resource.RLIMIT_FSIZE, (40_000, 40_000))


Trainer.train_step = train_step
if __name__ == "__main__":
    sys.exit(cli.main(sys.argv[1:]))
