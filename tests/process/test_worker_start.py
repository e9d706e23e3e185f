"""A loader worker whose fork deadlocks before it runs (CPython gh-112275 on Python < 3.12) ends the attempt with one
line and exit 76 after data.worker_start_timeout_s, instead of holding the rank at its first batch until the job's
time limit."""
from conftest import TINY_MODEL, run_python

from pretrain.lifecycle.exit_status import EXIT_PEER_LOST
from pretrain.run_dir import RunDir

# The training command, in a process whose first forked child (the first loader worker) blocks where the deadlocked
# one does: after the fork, before any of the worker's own code.
STUCK_FIRST_FORK = """
import os, sys, time
forks = []
os.register_at_fork(before=lambda: forks.append(1), after_in_child=lambda: len(forks) == 1 and time.sleep(3600))
from pretrain.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_loader_worker_that_never_starts_ends_the_attempt_with_exit_76(prepared, tmp_path):
    script = tmp_path / "stuck_fork.py"
    script.write_text(STUCK_FIRST_FORK)
    out = tmp_path / "run"
    proc = run_python([str(script), "train", "--config", "pretrain/configs/demo_mlm.yaml", f"data.path={prepared}",
                       f"train.output_dir={out}", *TINY_MODEL, "train.max_steps=3", "train.micro_batch_size=4",
                       "train.global_batch_size=4", "train.eval_every=0", "data.num_workers=1",
                       "data.worker_start_timeout_s=3"], timeout=180)
    assert proc.returncode == EXIT_PEER_LOST, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if line.startswith("attempt lost: ")]
    assert len(lines) == 1, proc.stderr[-3000:]
    assert "rank 0 of 1, step 0: loader worker(s) " in lines[0] and "did not start within 3 s" in lines[0]
    assert "gh-112275" in lines[0] and "exit 76" in lines[0]
    assert not list(RunDir(out).checkpoints.glob("step_*"))  # nothing saved: the resume is from the last checkpoint
