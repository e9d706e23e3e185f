"""Every `python -m pretrain ...` and `python -m data_pipeline ...` command the docs and the example configs show parses
with the command line it names: a flag that swallows the next argument, a renamed flag or subcommand fails here,
not in a user's shell. Parsing only: placeholders (MODEL, ...) stand where paths go."""
import re
import shlex
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# Where users copy command lines from: the docs' code blocks, the example configs' comments, and the demo script
# (`make demo`, which the suite does not run whole). (The sbatch scripts' own command lines run in
# tests/process/test_slurm.py.)
SOURCES = ["README.md", "docs/*.md", "evaluation/configs/**/*.yaml", "pretrain/configs/**/*.yaml",
           "data_pipeline/configs/*.yaml", "scripts/*.sh"]
COMMAND = re.compile(r"^(?:#\s*)?(?:\S+=\S+ )*(?:python3? -m|(?P<launcher>(?:torchrun|deepspeed) .*?)) "
                     r"(?P<program>pretrain|data_pipeline)\b(?P<rest>.*)")
ELIDED = "ELIDED"


def _command_lines(path: Path) -> list[tuple[int, str]]:
    """(line number, text) of the lines that may hold a command: a Markdown file's code blocks, a YAML's comments."""
    lines, fenced = [], False
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if path.suffix == ".md" and line.lstrip().startswith("```"):
            fenced = not fenced
        elif fenced or (path.suffix == ".yaml" and line.lstrip().startswith("#")) or path.suffix == ".sh":
            lines.append((number, line.strip()))
    joined = []  # a line ending in a backslash goes on on the next
    for number, line in lines:
        if joined and joined[-1][1].endswith("\\"):
            joined[-1] = (joined[-1][0], joined[-1][1][:-1] + " " + line.lstrip("# "))
        else:
            joined.append((number, line))
    return joined


def _documented() -> list[tuple[str, str, list[str]]]:
    """(where, program, argv) of each documented command; argv starts with the launcher's words when one starts it
    (torchrun ... -m, deepspeed ... --module)."""
    found = []
    for pattern in SOURCES:
        for path in sorted(REPO.glob(pattern)):
            for number, line in _command_lines(path):
                match = COMMAND.search(line)
                if not match:
                    continue
                rest = re.split(r"\s#\s|\s{2,}#", match["rest"])[0]  # a comment follows
                rest = re.sub(r"\$\{?(\w+)\}?", r"\1", rest)  # shell variables: their names
                rest = re.sub(r"(?<!\S)\.\.\.(?!\S)", ELIDED, rest)  # "--config ..." elides a value
                # "[key=value ...]" stands for overrides; "a | b" lists alternatives (a diagram), not one command.
                argv = [word for word in shlex.split(rest)
                        if not re.fullmatch(r"\[|\]|\[?(key=value|overrides)|\.\.\.\]", word)]
                if argv and argv[0] in ("train", "export", "evaluate", "finetune", "prepare", "verify") and "|" not in argv:
                    launcher = shlex.split(match["launcher"]) + [match["program"]] if match["launcher"] else []
                    found.append((f"{path.relative_to(REPO)}:{number}", match["program"], launcher + argv))
    return found


DOCUMENTED = _documented()


def test_the_docs_show_the_commands_users_run():
    programs = {(program, argv[0]) for _, program, argv in DOCUMENTED}
    assert {("pretrain", "train"), ("pretrain", "export"), ("pretrain", "finetune"), ("pretrain", "evaluate"),
            ("data_pipeline", "prepare"), ("data_pipeline", "verify")} <= programs, programs
    assert len(DOCUMENTED) >= 30
    demo = sorted(argv[0] if program == "data_pipeline" else argv[argv.index("pretrain") + 1] if "pretrain" in argv
                  else argv[0] for where, program, argv in DOCUMENTED if where.startswith("scripts/demo.sh:"))
    assert demo == ["export", "prepare", "train"], demo  # make demo's three commands, the torchrun one whole


def _launched(where: str, argv: list[str], capsys) -> list[str]:
    """The arguments the program gets from the launcher's command line, parsed by the launcher's own parser."""
    if argv[0] == "torchrun":
        from torch.distributed.run import parse_args
    elif argv[0] == "deepspeed":
        from deepspeed.launcher.runner import parse_args
    else:
        return argv
    try:
        args = parse_args(argv[1:])
    except SystemExit:
        pytest.fail(f"{where}: {shlex.join(argv)}: {capsys.readouterr().err.strip()}")
    if argv[0] == "torchrun":
        script, rest = args.training_script, args.training_script_args
    else:
        script, rest = args.user_script, args.user_args
    assert args.module and script in ("pretrain", "data_pipeline"), (where, args)  # run as a module, not a file
    return rest


@pytest.mark.parametrize("where,program,argv", DOCUMENTED, ids=[w for w, _, _ in DOCUMENTED])
def test_a_documented_command_parses(where, program, argv, capsys):
    argv = _launched(where, argv, capsys)
    if program == "pretrain":
        from pretrain.cli import build_parser
    else:
        from data_pipeline.cli import build_parser
    from core.config_flags import parse_with_overrides

    try:
        args = parse_with_overrides(build_parser(), argv)
    except SystemExit:
        pytest.fail(f"{where}: python -m {program} {shlex.join(argv)}: {capsys.readouterr().err.strip()}")
    overrides = getattr(args, "overrides", None) or []
    assert all("=" in item for item in overrides if item != ELIDED), (where, overrides)  # a stray word, not a key
