"""Command-line flags generated from a config dataclass: one flag per key, so no flag mirrors a key by hand.

A field `max_length: int` becomes `--max-length N`; a nested section's fields become flags of their own
(`data.text_column` is `--text-column`); `bool` is a switch, `list[T]` takes one or more values, a `Literal`
its choices. Every flag defaults to unset (argparse.SUPPRESS), so the parsed namespace holds only the flags
given, keyed by their config key: `flag_overrides` turns them into `key=value` overrides.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import typing
from typing import Any, Optional

from core.config_io import field_types


def _flag_kwargs(tp: Any) -> dict[str, Any]:
    """argparse settings for a field of this annotated type."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Union:  # Optional[X]
        inner = [a for a in args if a is not type(None)]
        return _flag_kwargs(inner[0]) if len(inner) == 1 else {}
    if tp is bool:
        return {"action": "store_true"}
    if origin is typing.Literal:
        return {"choices": args, "type": type(args[0])}
    if origin in (list, tuple):
        return {"nargs": "+", "type": args[0] if args and args[0] in (int, float, str) else str}
    return {"type": tp} if tp in (int, float, str) else {}


def add_config_flags(parser: argparse.ArgumentParser, cls: type, help: Optional[dict[str, str]] = None,
                     prefix: str = "") -> None:
    """A flag for every key of `cls` (nested sections flattened), with `help[key]` as its help text."""
    help = help or {}
    for name, tp in field_types(cls).items():
        if dataclasses.is_dataclass(tp):
            add_config_flags(parser, tp, help, prefix=f"{prefix}{name}.")
            continue
        kwargs = _flag_kwargs(tp)
        if kwargs.get("action") != "store_true":
            kwargs["metavar"] = name.upper()
        parser.add_argument(f"--{name.replace('_', '-')}", dest=f"{prefix}{name}", default=argparse.SUPPRESS,
                            help=help.get(name), **kwargs)


def flag_overrides(args: argparse.Namespace, cls: type) -> list[str]:
    """The flags given, as `key=value` overrides of `cls` (arguments that are not keys of it are left out).

    A list flag takes every word up to the next flag, so `--model a/ layer=0` gave it `layer=0` as a model: a word
    `KEY=VALUE` in a list whose KEY is a key of `cls` is the override it reads as, wherever it stands (as elsewhere
    on the command line)."""
    keys = set(_keys(cls))

    def override(word: Any) -> bool:
        return isinstance(word, str) and "=" in word and word.partition("=")[0] in keys

    out, moved = [], []
    for key, value in vars(args).items():
        if key not in keys:
            continue
        if isinstance(value, list):
            moved += [word for word in value if override(word)]
            value = [word for word in value if not override(word)]
        out.append(f"{key}={json.dumps(value, ensure_ascii=False)}")
    return moved + out  # as overrides: a flag, given after them, wins


def _keys(cls: type, prefix: str = "") -> list[str]:
    out = []
    for name, tp in field_types(cls).items():
        out += _keys(tp, f"{prefix}{name}.") if dataclasses.is_dataclass(tp) else [f"{prefix}{name}"]
    return out


class CommandLineParser(argparse.ArgumentParser):
    """argparse whose refusal of a flag or of its value is one `error:` line and exit 2, as a bad `key=value`'s is:
    the usage it printed first, dozens of generated flags long, buried the line. `--help` still prints it whole."""

    def error(self, message: str) -> typing.NoReturn:
        """Print `error: PROG: MESSAGE` on one line and exit 2."""
        self.exit(2, f"error: {self.prog}: {message} (--help lists the flags)\n")


def parse_with_overrides(parser: argparse.ArgumentParser, argv: Optional[list[str]] = None) -> argparse.Namespace:
    """`parser.parse_args(argv)`, where a command's `key=value` words are its overrides wherever they stand.

    argparse gives a positional list only the words up to the next flag (`--config c a=1 --overwrite b=2` leaves
    `b=2` unrecognized); those after it are appended here, in order. Any other stray word is still an error."""
    args, extra = parser.parse_known_args(argv)
    if extra:
        takes = isinstance(getattr(args, "overrides", None), list)
        stray = [w for w in extra if not takes or w.startswith("-") or "=" not in w]
        if stray:
            parser.error(f"unrecognized arguments: {' '.join(stray)}")
        args.overrides = [*args.overrides, *extra]
    return args
