"""`python -m data_pipeline prepare --config FILE [key=value ...]`."""
from data_pipeline.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
