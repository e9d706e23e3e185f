"""The training process keeps the memory a step frees (glibc): a block freed and asked for again costs no new pages."""
import json
import os
import platform
import subprocess
import sys

import pytest
from conftest import REPO, TINY_MODEL, run_cli
from pretrain.run_dir import RunDir

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the setting exists in glibc only")

# A fresh process: 4 MiB asked for, written and freed three times; the page faults of each round, and the line the
# setting logged. Plain malloc, so that only the allocator's policy decides whether the pages are new.
PROBE = """
import ctypes, json, resource, sys
from core.host_memory import keep_freed_memory
line = keep_freed_memory() if sys.argv[1] == "keep" else None
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype, libc.free.argtypes = ctypes.c_void_p, [ctypes.c_void_p]
faults = []
for _ in range(3):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    block = libc.malloc(4 << 20)
    ctypes.memset(block, 1, 4 << 20)
    libc.free(block)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps({"line": line, "faults": faults}))
"""


def _probe(mode: str, **env: str) -> dict:
    proc = subprocess.run([sys.executable, "-c", PROBE, mode], cwd=REPO, capture_output=True, text=True, check=True,
                          env={**{k: v for k, v in os.environ.items()
                                  if not k.startswith("MALLOC_") and k not in ("GLIBC_TUNABLES", "LD_PRELOAD")},
                               "PYTHONPATH": str(REPO), **env})
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_freed_block_comes_back_without_new_pages():
    pages = (4 << 20) // 4096
    kept = _probe("keep")
    assert kept["line"].startswith("host allocator: glibc keeps freed memory")
    assert kept["faults"][1] < pages // 16 and kept["faults"][2] < pages // 16, kept
    # glibc's default gives the first block back to the kernel and takes the second from it anew.
    assert _probe("default")["faults"][1] > pages // 2


def test_a_users_own_malloc_settings_stand():
    probe = _probe("keep", MALLOC_TRIM_THRESHOLD_="131072")
    assert probe["line"] == "host allocator: left as the environment sets it (MALLOC_TRIM_THRESHOLD_)"
    assert probe["faults"][1] > (4 << 20) // 4096 // 2  # no reuse: the user's threshold, not ours
    assert "MALLOC_ARENA_MAX" in _probe("keep", MALLOC_ARENA_MAX="2")["line"]  # any MALLOC_* is a choice


def test_a_run_says_what_it_did_with_the_allocator_and_can_leave_glibcs_defaults(prepared, tmp_path, monkeypatch):
    args = ["train", "--config", "pretrain/configs/demo_mlm.yaml", f"data.path={prepared}", *TINY_MODEL,
            "train.micro_batch_size=4", "train.global_batch_size=4", "train.max_steps=1", "train.eval_every=0",
            "train.save_every=1", "train.report_to=[]"]
    for name in [k for k in os.environ if k.startswith("MALLOC_")] + ["GLIBC_TUNABLES", "LD_PRELOAD"]:
        monkeypatch.delenv(name, raising=False)  # the suite's environment may carry allocator settings of its own
    kept, default = RunDir(tmp_path / "kept"), RunDir(tmp_path / "default")
    run_cli("pretrain", [*args, f"train.output_dir={kept.root}"])
    run_cli("pretrain", [*args, f"train.output_dir={default.root}", "train.keep_freed_host_memory=false"])
    assert "host allocator: glibc keeps freed memory for reuse" in kept.text_log.read_text()
    assert "host allocator" not in default.text_log.read_text()


GC_PROBE = r"""
import gc, json, runpy, sys
import core.host_memory as host_memory  # light: the heavy imports below must happen in the paused window

young, full, seen = [], [], {}
# Explicit gc.collect() calls (libraries make a few) are full ones and run even while paused: count the automatic,
# young-generation collections that the pause stops, and how many objects were frozen at each full one.
gc.callbacks.append(lambda phase, info: phase == "start" and info["generation"] < 2 and young.append(1))
gc.callbacks.append(lambda phase, info: phase == "start" and info["generation"] == 2 and full.append(gc.get_freeze_count()))
resume = host_memory.resume_garbage_collector

def counted_resume():
    from pretrain.trainer import Trainer  # imported by now

    def fit(self):
        seen.update(enabled=gc.isenabled(), frozen=gc.get_freeze_count())
        print("GC " + json.dumps(seen), flush=True)
        return "finished"

    Trainer.fit = fit
    seen["start-up collections"] = len(young)
    seen["frozen at full collections"] = list(full)
    return resume()

host_memory.resume_garbage_collector = counted_resume
young.clear()
sys.argv = ["pretrain", *sys.argv[1:]]
runpy.run_module("pretrain", run_name="__main__")
"""


def test_a_training_process_starts_without_collections_and_trains_with_its_start_up_frozen(prepared, tmp_path):
    """`python -m pretrain train`: no automatic garbage collection runs from the entry to the built trainer (about 1 s
    of full collections otherwise); the one DeepSpeed's ZeRO-3 set-up asks for finds the imports' objects frozen; and
    the steps run with the collector on and the start-up's objects frozen."""
    args = ["train", "--config", "pretrain/configs/demo_mlm.yaml", f"data.path={prepared}", *TINY_MODEL,
            "train.micro_batch_size=4", "train.global_batch_size=4", "train.max_steps=1", "train.eval_every=0",
            f"train.output_dir={tmp_path / 'run'}", "train.report_to=[]", "train.zero_stage=3"]
    proc = subprocess.run([sys.executable, "-c", GC_PROBE, *args], cwd=REPO, capture_output=True, text=True, timeout=300)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("GC ")), None)
    assert line is not None, proc.stderr[-3000:]
    seen = json.loads(line[3:])
    assert seen["start-up collections"] == 0 and seen["enabled"] is True and seen["frozen"] > 100_000, seen
    assert len(seen["frozen at full collections"]) >= 1 and min(seen["frozen at full collections"]) > 100_000, seen


def test_an_in_process_caller_keeps_its_own_collector():
    """Without the pause (a caller that trains from Python), the resume neither freezes nor switches anything."""
    import gc

    from core.host_memory import resume_garbage_collector

    frozen, enabled = gc.get_freeze_count(), gc.isenabled()
    assert resume_garbage_collector() is False
    assert gc.get_freeze_count() == frozen and gc.isenabled() == enabled


def test_only_the_train_command_pauses_the_collector():
    """The subcommand is the first word that is not an option: an export or evaluation whose path is `train` is not a
    training process (it would run with the collector paused to its end), and the deepspeed launcher's rank comes
    first."""
    from pretrain.__main__ import command

    assert command(["train", "--config", "c.yaml"]) == "train"
    assert command(["--local_rank=1", "train", "--config", "c.yaml"]) == "train"
    assert command(["--local_rank", "1", "train", "--config", "c.yaml"]) == "train"
    assert command(["export", "--checkpoint", "runs/x", "--out", "train"]) == "export"
    assert command(["evaluate", "self-similarity", "--out", "train"]) == "evaluate"
    assert command([]) is None
