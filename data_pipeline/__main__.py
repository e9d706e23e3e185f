"""`python -m data_pipeline prepare --config FILE [key=value ...]`."""
from core.process_life import exit_on_sigterm
from data_pipeline.cli import main

if __name__ == "__main__":
    exit_on_sigterm()  # a stopped prepare removes its temporary dataset and ends its workers, as on Ctrl-C
    raise SystemExit(main())
