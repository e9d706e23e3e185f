"""`python -m pretrain ...`."""
import sys

if __name__ == "__main__":
    if "train" in sys.argv[1:]:
        from pretrain import signals

        signals.catch()  # before the slow imports below: a preemption signal may come at any time
    from pretrain.cli import main

    raise SystemExit(main())
