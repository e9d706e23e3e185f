"""The prepare and train command lines on a dataset whose manifest names climb out of it."""
import json
import re
from pathlib import Path

import pytest
from core.errors import InputDataError
from data_pipeline.dataset_dir import DatasetDir


@pytest.mark.parametrize("where,name", [("tokenizer", "../../outside.json"), ("tokenizer", ".."), ("split", "../escape")])
def test_a_manifest_name_that_climbs_out_of_the_dataset_is_refused(prepared, tmp_path, where, name):
    """Manifest names become local paths (a remote dataset's cache too): a separator or '..' is bad input, exit 2."""
    from conftest import run_cli

    from data_pipeline.shards import read_manifest

    m = json.loads((DatasetDir(prepared).manifest).read_text())
    if where == "tokenizer":
        m["tokenizer"]["files"].append(name)
    else:
        m["splits"][name] = m["splits"]["train"]
    (DatasetDir(tmp_path).manifest).write_text(json.dumps(m))
    with pytest.raises(InputDataError, match=re.escape(repr(name))):
        read_manifest(tmp_path)
    if name == "..":  # once through the command line: one line, exit 2
        proc = run_cli("pretrain", ["train", "--config", "pretrain/configs/demo_mlm.yaml", f"data.path={tmp_path}",
                                    f"train.output_dir={tmp_path}-run"], check=False)
        assert proc.returncode == 2 and "not a plain file name" in proc.stderr and "Traceback" not in proc.stderr
        assert not Path(f"{tmp_path}-run").exists()


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGHUP", "SIGINT", "SIGKILL"])
def test_a_prepare_stopped_midway_leaves_no_worker_and_on_sigterm_no_temporary_folder(prepared, tmp_path, sig):
    """SLURM's time limit and scancel send SIGTERM (then SIGKILL): the temporary dataset goes, and the spawned
    workers, which would wait for work forever, end with their parent either way. A closed terminal's shell sends
    SIGHUP to the whole process group, the workers too: the same clean-up; and a Ctrl-C (SIGINT, to the group too),
    which then ends the command by SIGINT with one line."""
    import gzip
    import os
    import signal
    import subprocess
    import time

    import sys

    from conftest import PROCESS_ENV, REPO, descendants, python_process, running

    corpus = tmp_path / "kjv.txt"
    kjv = gzip.open(REPO / "data" / "kjv.txt.gz", "rt", encoding="utf-8").read().rstrip() + "\n\n"
    corpus.write_text(kjv * 6, encoding="utf-8")  # long enough to stop midway (the bible alone takes about 1 s)
    out = tmp_path / "out"
    log = tmp_path / "prepare.log"
    argv = ["-m", "data_pipeline", "prepare", "--config", "data_pipeline/configs/demo.yaml", f"output_dir={out}",
            f"sources=[{{kind: text, path: '{corpus}'}}]", f"tokenizer.pretrained={DatasetDir(prepared).tokenizer}",
            "num_workers=2", "part_bytes=20000", "seq_len=64"]
    with open(log, "w") as fh:
        if sig == "SIGINT":  # as from a terminal: with Python's KeyboardInterrupt handler, which a suite run in the
            # background (SIGINT ignored) would not pass on
            proc = subprocess.Popen([sys.executable, *argv], cwd=REPO, env={**os.environ, **PROCESS_ENV}, stdout=fh,
                                    stderr=subprocess.STDOUT,
                                    preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        else:
            proc = python_process(argv, stdout=fh, stderr=subprocess.STDOUT)
    def spawned() -> list[int]:
        found = []
        for pid in descendants(proc.pid):
            try:
                if "spawn_main" in Path(f"/proc/{pid}/cmdline").read_text():
                    found.append(pid)
            except OSError:  # gone between the listing and the read
                pass
        return found

    deadline = time.time() + 120
    if sig in ("SIGHUP", "SIGINT"):  # the workers' share of the group's signal first, while they still import: the
        # parent decides
        while len(spawned()) < 2 and proc.poll() is None and time.time() < deadline:
            time.sleep(0.01)
        early = spawned()
        for pid in early:
            os.kill(pid, getattr(signal, sig))
        time.sleep(0.5)
        assert len(early) == 2 and all(running(pid) for pid in early), log.read_text()[-3000:]
    while not list(tmp_path.glob(".out.tmp-*/*/part-*")) and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)  # until the workers write parts
    workers = spawned()
    assert proc.poll() is None and len(workers) == 2, log.read_text()[-3000:]
    if sig in ("SIGHUP", "SIGINT"):  # and once they work
        for pid in workers:
            os.kill(pid, getattr(signal, sig))
        time.sleep(0.5)
        assert all(running(pid) for pid in workers) and proc.poll() is None, log.read_text()[-3000:]
    proc.send_signal(getattr(signal, sig))
    code = proc.wait(timeout=60)
    deadline = time.time() + 10  # the kernel's parent-death signal, or the pool's own stop
    while [pid for pid in workers if running(pid)] and time.time() < deadline:
        time.sleep(0.05)
    assert not [pid for pid in workers if running(pid)], (workers, log.read_text()[-2000:])
    assert not out.exists()
    if sig == "SIGINT":
        assert code == -signal.SIGINT, (code, log.read_text()[-3000:])
        assert log.read_text().splitlines()[-1] == ("interrupted (Ctrl-C): stopped; what it had not finished writing "
                                                    "is removed"), log.read_text()[-3000:]
    elif sig != "SIGKILL":
        assert code == 128 + getattr(signal, sig), log.read_text()[-3000:]
    if sig != "SIGKILL":
        assert "Traceback" not in log.read_text()
        assert not list(tmp_path.glob(".out.tmp-*"))  # the temporary dataset went with it


def test_a_worker_s_write_the_disk_refuses_is_one_line(prepared, tmp_path):
    """A full disk, a quota or a file size limit (RLIMIT_FSIZE here) met by a prepare worker writing its shards:
    the worker's error reaches the command as the user's, not as a bug's traceback."""
    import gzip

    from conftest import REPO, run_python

    corpus = tmp_path / "kjv.txt"
    corpus.write_text(gzip.open(REPO / "data" / "kjv.txt.gz", "rt", encoding="utf-8").read(), encoding="utf-8")
    proc = run_python(["tests/helpers/file_size_limit.py", "500000", "data_pipeline", "prepare", "--config",
                       "data_pipeline/configs/demo.yaml", f"output_dir={tmp_path / 'out'}",
                       f"sources=[{{kind: text, path: '{corpus}'}}]",
                       f"tokenizer.pretrained={DatasetDir(prepared).tokenizer}",
                       "num_workers=2", "part_bytes=2000000", "compression=null", "seq_len=64"])
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    (line,) = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert "a write was refused: File too large" in line, line
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.tmp-*"))
