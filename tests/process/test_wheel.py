"""The project as a cluster installs it: a built wheel in a folder of its own, run from anywhere but the checkout."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, TINY_MODEL

PACKAGES = ("core", "data_pipeline", "model", "pretrain", "deepspeed_configs")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel built from a copy of the sources."""
    root = tmp_path_factory.mktemp("wheel")
    src = root / "src"
    src.mkdir()
    for name in PACKAGES:
        shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", str(src),
                            "-w", str(root / "dist")], capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr[-3000:]
    ours = [line for line in build.stderr.splitlines() if "pyproject.toml" in line and "arning" in line]
    assert not ours, ours  # a clean build: no deprecation warnings about our own pyproject.toml
    (built,) = (root / "dist").glob("contrastive_pretrain-*.whl")
    return built


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> Path:
    """The wheel installed (without dependencies) into an empty target folder."""
    target = tmp_path_factory.mktemp("site")
    install = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--target", str(target),
                              str(wheel)], capture_output=True, text=True, timeout=300)
    assert install.returncode == 0, install.stderr[-3000:]
    return target


def test_installing_the_wheel_beside_transformers_5_changes_nothing_else(wheel):
    """This environment has transformers 5 and numpy >= 2.2 (the GPU image's stack too). pip's own resolver, with no
    index to fetch from, plans the wheel's install from what is installed: the project alone, nothing downgraded
    (a requirement that needed another version, e.g. transformers<5, would find no candidate and fail)."""
    import numpy
    import transformers

    assert int(transformers.__version__.split(".")[0]) >= 5 and tuple(map(int, numpy.__version__.split(".")[:2])) >= (2, 2)
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--no-index", "--quiet", "--report", "-",
                           str(wheel)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    planned = [(item["metadata"]["name"], item["metadata"]["version"]) for item in json.loads(proc.stdout)["install"]]
    assert planned == [("contrastive-pretrain", "0.1.0")], planned
    requires = json.loads(proc.stdout)["install"][0]["metadata"]["requires_dist"]
    assert not any(r.lower().startswith("mosaicml-streaming") for r in requires)  # installed apart, without its caps


def _env(target: Path) -> dict[str, str]:
    # The dependencies come from this interpreter's environment; the project only from the target folder
    # (PYTHONPATH comes before the checkout's editable finder).
    return {**os.environ, "PYTHONPATH": str(target), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}


def test_the_installed_wheel_prepares_trains_and_exports_from_another_folder(installed, corpus_file, tmp_path):
    work = tmp_path / "elsewhere"
    work.mkdir()
    env = _env(installed)

    def run(*args: str) -> subprocess.CompletedProcess:
        proc = subprocess.run([sys.executable, *args], cwd=work, env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
        return proc

    where = run("-c", "import pretrain, deepspeed_configs; print(pretrain.__file__); print(deepspeed_configs.__file__)")
    assert all(line.startswith(str(installed)) for line in where.stdout.split()), where.stdout
    run("-m", "data_pipeline", "prepare", "--config", "data_pipeline/configs/demo.yaml", "output_dir=data",
        f"sources=[{{kind: text, path: '{corpus_file}'}}]", "tokenizer.vocab_size=400", "tokenizer.character_coverage=1.0",
        "seq_len=64", "val_fraction=0.1")
    # The example config, its groups and the DeepSpeed template all come from the installed package.
    train = run("-m", "pretrain", "train", "--config", "pretrain/configs/demo_mlm.yaml", "data.path=data",
                "train.output_dir=run", *TINY_MODEL, "train.micro_batch_size=4", "train.global_batch_size=8",
                "train.max_steps=2", "train.eval_every=0")
    assert "finished at step 2" in train.stdout
    run("-m", "pretrain", "export", "--checkpoint", "run", "--out", "export")
    from transformers import AutoModelForMaskedLM  # the export is files: loaded here, without another process

    assert type(AutoModelForMaskedLM.from_pretrained(work / "export")).__name__ == "BertForMaskedLM"
    assert not (REPO / "run").exists() and sorted(p.name for p in work.iterdir()) == ["data", "export", "run"]


@pytest.mark.parametrize("module", ["pretrain", "data_pipeline"])
def test_help_imports_none_of_the_heavy_libraries(installed, module, tmp_path):
    """--help must not wait for torch, transformers, DeepSpeed or streaming (5.6 s before; the time is in BENCHMARKS.md)."""
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", module, "--help"], cwd=tmp_path,
                          env=_env(installed), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "usage:" in proc.stdout
    imported = {line.split("|")[-1].strip().split(".")[0] for line in proc.stderr.splitlines() if "|" in line}
    assert module in imported  # the log is what was imported (so an empty one cannot pass)
    assert not imported & {"torch", "transformers", "deepspeed", "streaming", "numpy", "datasets"}, sorted(imported)
