"""The folder says what a test starts: under tests/unit/, starting a process fails the test (tests/conftest.py)."""
import subprocess
import sys

import pytest


def test_a_unit_test_that_starts_a_process_fails_with_where_it_belongs():
    with pytest.raises(AssertionError, match="move it to tests/process/"):
        subprocess.run([sys.executable, "-c", "pass"])


def test_a_process_forked_for_a_unit_test_fails_the_same_way():
    from conftest import run_cli

    with pytest.raises(AssertionError, match="move it to tests/process/"):
        run_cli("pretrain", ["--help"])
