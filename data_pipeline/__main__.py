"""`python -m data_pipeline prepare --config FILE [key=value ...]`."""
from core.process_life import end_interrupted, exit_on_termination

if __name__ == "__main__":
    exit_on_termination()  # a stopped or hung-up prepare removes its temporary dataset and ends its workers
    try:
        from data_pipeline.cli import main

        code = main()
    except KeyboardInterrupt:  # a Ctrl-C: the same clean-up ran on the way here
        end_interrupted()
    raise SystemExit(code)
