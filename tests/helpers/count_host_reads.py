"""Train in this process and record every tensor -> Python read that the project's own code makes.

Usage: python tests/helpers/count_host_reads.py OUT.json --config FILE [key=value ...]
Each record says whether it happened inside a training step (the hot loop) or outside (the flushes,
evaluation, checkpoints), and the file and line that made it. On a GPU each such read waits for the
device; the test holds the hot loop to none.
"""
import json
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
READS = ("item", "tolist", "numpy", "__float__", "__int__", "__bool__", "__index__")


def main() -> None:
    """Patch the reads, train, write the records."""
    from core.config_io import load_config
    from pretrain.config import RunConfig
    from pretrain.run import build_trainer

    out, config, overrides = sys.argv[1], sys.argv[3], sys.argv[4:]
    trainer = build_trainer(load_config(RunConfig, config, overrides))
    records, state = [], {"in_step": False}

    def patch(name: str) -> None:
        original = getattr(torch.Tensor, name)

        def reading(self, *args, **kwargs):
            frame = sys._getframe(1)
            path = Path(frame.f_code.co_filename)
            if path.is_relative_to(REPO) and path.relative_to(REPO).parts[0] in ("pretrain", "model", "data_pipeline", "core"):
                records.append({"in_step": state["in_step"], "step": trainer.step, "method": name,
                                "where": f"{path.relative_to(REPO)}:{frame.f_lineno}"})
            return original(self, *args, **kwargs)

        setattr(torch.Tensor, name, reading)

    train_step = trainer.train_step

    def marked_step() -> None:
        state["in_step"] = True
        try:
            train_step()
        finally:
            state["in_step"] = False

    trainer.train_step = marked_step
    for name in READS:
        patch(name)
    trainer.fit()
    if trainer.rank == 0:
        Path(out).write_text(json.dumps(records, indent=1))


if __name__ == "__main__":
    main()
