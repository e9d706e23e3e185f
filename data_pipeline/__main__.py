"""`python -m data_pipeline prepare --config FILE [key=value ...]`."""
from core.process_life import exit_on_termination
from data_pipeline.cli import main

if __name__ == "__main__":
    exit_on_termination()  # a stopped or hung-up prepare removes its temporary dataset and ends its workers
    raise SystemExit(main())
