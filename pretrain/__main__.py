"""`python -m pretrain ...`."""
import atexit
import os
import sys
import threading


def _exit_without_teardown(code: int) -> None:
    """Exit once everything is written, skipping the interpreter's teardown of torch, transformers and
    DeepSpeed module state: about 2 s of every process (every rank, every requeued attempt)."""
    threading._shutdown()  # what a normal exit does first: stop executors, join non-daemon threads
    atexit._run_exitfuncs()  # logging's flush and close, and the libraries' own exit handlers
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    if "train" in sys.argv[1:]:
        from core.host_memory import pause_garbage_collector
        from pretrain import signals

        signals.catch()  # before the slow imports below: a preemption signal may come at any time
        pause_garbage_collector()  # until the trainer is built: the imports' full collections cost about 1 s
    from pretrain.cli import main

    _exit_without_teardown(main())
