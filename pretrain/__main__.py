"""`python -m pretrain ...`."""
import atexit
import os
import sys
import threading


def _exit_without_teardown(code: int) -> None:
    """Exit once everything is written, skipping the interpreter's teardown of torch, transformers and
    DeepSpeed module state, which every process would pay (every rank, every requeued attempt; BENCHMARKS.md,
    "Process start-up and the test suite")."""
    from pretrain.lifecycle.exit_status import EXIT_INTERRUPTED

    uploads = sys.modules.get("pretrain.checkpointing.remote_checkpoints")
    if uploads is None or not uploads.uploads_running():
        # What a normal exit does first: stop executors, join non-daemon threads. Not while a checkpoint upload still
        # sends a file (one given up, or one in the background when an error ends the run): its transfer's executor
        # would hold the exit for the rest of it (and srun's --wait, a node).
        threading._shutdown()
    atexit._run_exitfuncs()  # logging's flush and close, and the libraries' own exit handlers
    sys.stdout.flush()
    sys.stderr.flush()
    if code == EXIT_INTERRUPTED:  # saved after a Ctrl-C: end as an interrupted program does, so a shell's loop stops
        import signal

        from core.process_life import die_of

        die_of(signal.SIGINT)
    os._exit(code)


def command(argv: list[str]) -> str | None:
    """The subcommand `argv` names: its first word that is not an option (nor --local_rank's value)."""
    words = iter(argv)
    for word in words:
        if word in ("--local_rank", "--local-rank"):
            next(words, None)
        elif not word.startswith("-"):
            return word
    return None


if __name__ == "__main__":
    launcher = os.getppid()  # first: the launcher may die while this process starts
    if command(sys.argv[1:]) == "train":
        from core.host_memory import pause_garbage_collector

        pause_garbage_collector()  # until the trainer is built: full collections over the growing start-up heap
        from pretrain.lifecycle import signals

        # Before the slow imports below: a signal may come at any time.
        signals.catch(command_line=True)
        import signal

        from core.process_life import die_with_parent, started_by_launcher

        if started_by_launcher(os.environ):
            # A torchrun or deepspeed launch.py that is itself killed (kill -9, a crash) forwards nothing: its ranks
            # would train on as orphans to max_steps, holding their ports, memory and the run folder a relaunch
            # resumes in. Its death is a SIGTERM instead: they save, write PREEMPTED and exit 75.
            die_with_parent(launcher, signal.SIGTERM)
    else:
        from core.process_life import exit_on_termination

        exit_on_termination()  # a stopped or hung-up export or evaluation removes its temporary folder
    try:
        from pretrain.cli import main

        code = main()
    except KeyboardInterrupt:  # export, evaluate, finetune (training catches SIGINT): their clean-up ran on the way here
        from core.process_life import end_interrupted

        end_interrupted()
    except Exception:
        # A bug: its traceback as the interpreter prints it, and its exit status, but through the exit below: the
        # interpreter's own would wait for a checkpoint upload's file in flight (given up, or in the background).
        sys.excepthook(*sys.exc_info())
        code = 1
    _exit_without_teardown(code)
