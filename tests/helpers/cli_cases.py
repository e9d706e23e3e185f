"""Run several `python -m pretrain` command lines in one process and report each one's exit code and stderr.

Usage: python tests/helpers/cli_cases.py CASES.json OUT.json, where CASES.json is {name: [arg, ...]}.
Errors that need the process group (checked after it starts) are tested this way: one interpreter
start-up (~8 s of imports) instead of one per case. Every case exits before training, so the only
state they share is the process group of one rank, which is what each would have created anyway.
"""
import contextlib
import io
import json
import sys

from pretrain.cli import main


def run() -> None:
    """Run every case; write {name: {"code": int, "stderr": str}}."""
    cases = json.loads(open(sys.argv[1]).read())
    results = {}
    for name, args in cases.items():
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            try:
                code = main(args)
            except SystemExit as exc:  # argparse
                code = exc.code
            except Exception as exc:  # a case that escapes the CLI's error handling: report it as the CLI would not
                code, err = -1, io.StringIO(f"uncaught {type(exc).__name__}: {exc}")
        results[name] = {"code": code, "stderr": err.getvalue()}
    with open(sys.argv[2], "w") as fh:
        json.dump(results, fh)


if __name__ == "__main__":
    run()
