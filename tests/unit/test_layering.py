"""Imports run one way: core <- data_pipeline <- model <- pretrain and evaluation, side by side (nothing imports
upward; evaluation never imports pretrain, and pretrain reaches evaluation only to put its commands on the CLI)."""
import ast
from pathlib import Path

from conftest import REPO

# package -> packages it must never import (no library package imports the tools: benchmarks/, experiments/)
TOOLS = {"benchmarks", "experiments"}
FORBIDDEN = {"core": {"data_pipeline", "model", "pretrain", "evaluation", *TOOLS},
             "data_pipeline": {"model", "pretrain", "evaluation", *TOOLS}, "model": {"pretrain", "evaluation", *TOOLS},
             "evaluation": {"pretrain", *TOOLS}, "pretrain": TOOLS, "benchmarks": {"experiments"}}


def imported_packages(path: Path) -> set[tuple[str, int]]:
    """(top-level package, line) of every import in the file, lazy imports inside functions included."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found |= {(alias.name.split(".")[0], node.lineno) for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add((node.module.split(".")[0], node.lineno))
    return found


def test_no_import_runs_upward():
    violations = []
    for package, forbidden in FORBIDDEN.items():
        for path in sorted((REPO / package).rglob("*.py")):
            violations += [f"{path.relative_to(REPO)}:{line} imports {name}"
                           for name, line in imported_packages(path) if name in forbidden]
    assert not violations, "\n".join(violations)


def test_pretrain_reaches_evaluation_only_from_its_command_line():
    users = [f"{path.relative_to(REPO)}:{line}" for path in sorted((REPO / "pretrain").rglob("*.py"))
             for name, line in imported_packages(path) if name == "evaluation" and path.name != "cli.py"]
    assert not users, "\n".join(users)


def test_the_checker_sees_lazy_imports(tmp_path):
    path = tmp_path / "m.py"
    path.write_text("import os\n\ndef f():\n    from pretrain.config import RunConfig\n    import model.flops\n")
    assert {name for name, _ in imported_packages(path)} == {"os", "pretrain", "model"}


# The run folder's names; only pretrain/run_dir.py may spell them (issue 16: one object owns every path).
RUN_FOLDER_NAMES = ("config.yaml", "model_config.json", "data_manifest.json", "deepspeed_config.json", "checkpoints",
                    "train.log", "metrics.jsonl", "tensorboard", "PREEMPTED", "FAILED")


def test_run_folder_paths_come_from_run_dir_only():
    """A string constant naming a run-folder file anywhere else in pretrain/ is a second copy of the layout."""
    offenders = []
    for path in sorted((REPO / "pretrain").rglob("*.py")):
        if path.name == "run_dir.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Constant) and node.value in RUN_FOLDER_NAMES:
                offenders.append(f"{path.relative_to(REPO)}:{node.lineno} spells {node.value!r}")
    assert not offenders, "\n".join(offenders)


LIBRARY = ("core", "data_pipeline", "model", "pretrain", "evaluation")


def test_no_library_function_is_longer_than_50_lines():
    """A function that long does several jobs; split it where one job ends (issue 32)."""
    long = []
    for package in LIBRARY:
        for path in sorted((REPO / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 50:
                    long.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name}: {node.end_lineno - node.lineno + 1} lines")
    assert not long, "\n".join(long)


# The names a run folder and a dataset folder are made of: only their folder classes join them into paths.
FOLDER_NAMES = ("metrics.jsonl", "checkpoints", "config.yaml", "manifest.json", "index.json", "tokenizer")
FOLDER_CLASSES = ("pretrain/run_dir.py", "data_pipeline/dataset_dir.py")


def path_literals(path: Path) -> list[tuple[int, str]]:
    """(line, name) of every FOLDER_NAMES string joined into a path with `/`, or starting a `name/...` key."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            found += [(node.lineno, side.value) for side in (node.left, node.right)
                      if isinstance(side, ast.Constant) and side.value in FOLDER_NAMES]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            found += [(node.lineno, name) for name in FOLDER_NAMES if node.value.startswith(name + "/")]
    return found


def test_folder_layouts_are_spelled_by_their_folder_classes_only():
    """RunDir and DatasetDir own their file names, in the library, the benchmarks and the tests alike (issue 32)."""
    offenders = []
    for package in (*LIBRARY, "benchmarks", "tests"):
        for path in sorted((REPO / package).rglob("*.py")):
            if str(path.relative_to(REPO)) in FOLDER_CLASSES:
                continue
            offenders += [f"{path.relative_to(REPO)}:{line} joins {name!r}" for line, name in path_literals(path)]
    assert not offenders, "\n".join(offenders)


def test_the_folder_guard_sees_joins_and_keys(tmp_path):
    path = tmp_path / "m.py"
    path.write_text('a = run / "checkpoints" / tag\nb = f"tokenizer/{name}"\nc = {"checkpoints": 1}\nd = "tokenizer"\n')
    assert path_literals(path) == [(1, "checkpoints"), (2, "tokenizer")]


def test_streaming_is_reached_through_its_modules_only():
    """mosaicml-streaming (installed without its metadata, README "Installing") is imported by the loader and the
    object store only (tests/process/test_errors.py: without it, a run says how to install it)."""
    allowed = {"core/streaming_import.py", "core/object_store.py", "data_pipeline/loader.py"}
    users = {str(path.relative_to(REPO)) for package in ("core", "data_pipeline", "model", "pretrain", "evaluation")
             for path in sorted((REPO / package).rglob("*.py")) for name, _ in imported_packages(path) if name == "streaming"}
    assert users == allowed, users


def _method(path: str, cls: str, name: str) -> ast.FunctionDef:
    tree = ast.parse((REPO / path).read_text(encoding="utf-8"))
    (klass,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls]
    (method,) = [n for n in klass.body if isinstance(n, ast.FunctionDef) and n.name == name]
    return method


def test_the_trainer_is_handed_its_parts_and_builds_none():
    """pretrain/run.py is the one composition root: Trainer.__init__ only keeps what it is given (no call at all)."""
    init = _method("pretrain/trainer.py", "Trainer", "__init__")
    calls = [ast.unparse(n.func) for n in ast.walk(init) if isinstance(n, ast.Call)]
    assert not calls, calls


def test_checkpoint_save_and_restore_take_no_parts():
    """The checkpoint manager is handed the stateful parts once; a save names its step (and whether the attempt ends
    on it), a restore nothing."""
    save = _method("pretrain/checkpointing/checkpoint_manager.py", "CheckpointManager", "save")
    restore = _method("pretrain/checkpointing/checkpoint_manager.py", "CheckpointManager", "restore")
    assert [a.arg for a in save.args.args] == ["self", "step", "last", "hurry"]
    assert [a.arg for a in restore.args.args] == ["self"]


def test_nothing_outside_the_engine_reaches_into_deepspeed():
    """`Engine.ds` is the DeepSpeed engine: the library speaks to the Engine, only pretrain/engine/deepspeed_engine.py to `ds`."""
    offenders = []
    for package in LIBRARY:
        for path in sorted((REPO / package).rglob("*.py")):
            if path.relative_to(REPO).as_posix() == "pretrain/engine/deepspeed_engine.py":
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
                if isinstance(node, ast.Attribute) and node.attr == "ds":
                    offenders.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert not offenders, offenders


def test_the_batch_script_reads_the_one_table_of_exit_codes():
    """slurm/pretrain.sbatch decides requeues on 75, 76 and 130 (through slurm/attempt_outcome.sh, which it sources):
    their copies are the table's values."""
    from pretrain.lifecycle.exit_status import EXIT_CODES, EXIT_INTERRUPTED, EXIT_PEER_LOST, EXIT_PREEMPTED

    assert 'source "$REPO_DIR/slurm/attempt_outcome.sh"' in (REPO / "slurm" / "pretrain.sbatch").read_text()
    script = (REPO / "slurm" / "attempt_outcome.sh").read_text(encoding="utf-8")
    assert f"EXIT_PREEMPTED={EXIT_PREEMPTED} " in script and f"EXIT_PEER_LOST={EXIT_PEER_LOST} " in script
    assert f"EXIT_INTERRUPTED={EXIT_INTERRUPTED} " in script
    assert (EXIT_PREEMPTED, EXIT_PEER_LOST, EXIT_INTERRUPTED) == (75, 76, 130)
    assert sorted(EXIT_CODES) == [0, 1, 2, 4, 75, 76, 130]
