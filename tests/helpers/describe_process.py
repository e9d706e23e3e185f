"""Print what a started Python process looks like from inside, as JSON (tests/process/test_preloaded.py compares a
process forked from the preloaded server with a fresh one). argv[1]: an exit mode, `ok` (with what the preloaded server
imports imported, as a training process has it, and what its random generators draw), `code`, `message`, `raise`,
`interrupt`, `term` (wait for SIGTERM) or `atexit-thread`; `preloaded` after the mode imports the same for any mode."""
import atexit
import json
import os
import random
import signal
import sys
import threading
import time

mode = sys.argv[1]
path0 = sys.path[0]
drawn = {}
if mode == "ok" or "preloaded" in sys.argv[2:]:  # what the server imports, as a training process imports it
    import importlib

    import numpy
    import torch

    from core.distributed import import_deepspeed
    sys.path.append(os.path.dirname(os.path.abspath(__file__)))
    from preloaded import PRELOAD

    for name in PRELOAD:
        importlib.import_module(name)
    import_deepspeed()
    # Each generator seeded from the OS, as in a fresh interpreter (the other modes need no imports: they start fast).
    drawn = {"random": random.random(), "numpy": float(numpy.random.random()), "torch_seed": torch.initial_seed(),
             "torch_first": torch.rand(1).item()}
print(json.dumps({
    "argv": sys.argv, "path0": path0, "cwd": os.getcwd(), "main_file": sys.modules["__main__"].__file__,
    "name": __name__, "marker": os.environ.get("DESCRIBE_MARKER"), "rank": os.environ.get("RANK"), **drawn,
    "handlers": {name: str(signal.getsignal(getattr(signal, name))) for name in ("SIGTERM", "SIGUSR1", "SIGCHLD", "SIGINT")},
    "pid": os.getpid(), "ppid": os.getppid(), "environ": dict(os.environ), "orig_argv": sys.orig_argv[1:],
    "dispositions": {int(s): str(signal.getsignal(s)) for s in signal.valid_signals() if signal.getsignal(s) is not None},
}), flush=True)
print("to stderr", file=sys.stderr, flush=True)
if mode == "code":
    sys.exit(3)
if mode == "message":
    sys.exit("a message")
if mode == "raise":
    raise ValueError("uncaught")
if mode == "interrupt":
    raise KeyboardInterrupt
if mode == "term":
    print("waiting", flush=True)
    time.sleep(60)
if mode == "atexit-thread":
    atexit.register(lambda: print("atexit ran", flush=True))
    threading.Thread(target=lambda: (time.sleep(0.5), print("thread finished", flush=True))).start()
