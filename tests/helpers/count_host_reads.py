"""Train in this process and record every tensor -> Python read that the project's own code makes.

Usage: python tests/helpers/count_host_reads.py OUT.json RUNS.json
where RUNS.json maps a name to the run's arguments (["--config", FILE, "key=value", ...]); the runs
train one after the other in this process. Each record says whether it happened inside a training
step (the hot loop) or outside it (the flushes, evaluation, checkpoints), at which step, and the file
and line that made it, in the project's own code. On a GPU each such read waits for the device; the test
holds the hot loop to none. Beside them, per run, every read any code made in a
step (`dispatched`: a dispatch mode below every library, tests/helpers/device_reads.py), the tensors any code built
in a step from Python data (`made`) or by a factory given no device (`host_built`), and the steps that trained on
a batch with a padded attention-mask column (where transformers must look at the mask), numbered as
the records number the step they are in.
"""
import json
import sys
from pathlib import Path

import torch
from device_reads import DeviceReads, HostFactories

REPO = Path(__file__).resolve().parents[2]
READS = ("item", "tolist", "numpy", "__float__", "__int__", "__bool__", "__index__")
PACKAGES = ("pretrain", "model", "data_pipeline", "core")


def main() -> None:
    """Patch the reads once, train every run, write the records by run."""
    from core.config_io import load_config
    from pretrain.config import RunConfig
    from pretrain.run import build_trainer

    out, runs = sys.argv[1], json.loads(Path(sys.argv[2]).read_text())
    state = {"in_step": False, "trainer": None, "records": None}

    def patch(name: str) -> None:
        original = getattr(torch.Tensor, name)

        def reading(self, *args, **kwargs):
            frame = sys._getframe(1)
            path = Path(frame.f_code.co_filename)
            if state["records"] is not None and path.is_relative_to(REPO) and path.relative_to(REPO).parts[0] in PACKAGES:
                step = state["trainer"].step if state["trainer"] is not None else -1
                state["records"].append({"in_step": state["in_step"], "step": step, "method": name,
                                         "where": f"{path.relative_to(REPO)}:{frame.f_lineno}"})
            return original(self, *args, **kwargs)

        setattr(torch.Tensor, name, reading)

    for name in READS:
        patch(name)
    results = {}
    for name, args in runs.items():
        trainer = build_trainer(load_config(RunConfig, args[1], args[2:]))
        state["trainer"], state["records"] = trainer, []
        train_step = trainer.train_step

        dispatched, made, host_built = [], [], []

        def marked_step(train_step=train_step) -> None:
            state["in_step"], step, reads, factories = True, trainer.step, DeviceReads(), HostFactories()
            try:
                with reads, factories:
                    train_step()
            finally:
                state["in_step"] = False
                dispatched.extend({"step": step, "where": where} for where in reads.where)
                made.extend({"step": step, "where": where} for where in reads.made)
                host_built.extend({"step": step, "where": where} for where in factories.where)

        padded_steps = set()
        next_batch = trainer._next_batch

        def noted_batch(next_batch=next_batch):
            batch = next_batch()
            if not all(v for k, v in batch.items() if k.endswith("_unpadded")):
                padded_steps.add(trainer.step)  # as the records count it: the steps done before this one
            return batch

        trainer.train_step, trainer._next_batch = marked_step, noted_batch
        trainer.fit()
        results[name] = {"records": state["records"], "dispatched": dispatched, "made": made, "host_built": host_built,
                         "padded_steps": sorted(padded_steps)}
        state["trainer"], state["records"] = None, None
        trainer.engine.ds.destroy()
    if torch.distributed.get_rank() == 0:
        Path(out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
