"""Typed configs: dataclasses filled from YAML plus `a.b=value` overrides, with errors that name the key."""
from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import math
import re
import types
import typing
from pathlib import Path
from typing import Any, Optional, TypeVar

import yaml

from core.errors import ConfigError

T = TypeVar("T")

# YAML 1.1 reads 1:2:3:4 as a base-60 number (223384), so a duration of the wrong form loads as some other number of
# seconds; YAML 1.2 dropped the form. Such a scalar stays text here, for the key's own check to read as written.
_SEXAGESIMAL = re.compile(r"[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+(?:\.[0-9_]*)?")


_TEXT, _INT, _TIMESTAMP = "tag:yaml.org,2002:str", "tag:yaml.org,2002:int", "tag:yaml.org,2002:timestamp"


class ConfigLoader(yaml.SafeLoader):
    """PyYAML's safe loader, without YAML 1.1's base-60, octal, hexadecimal and binary integers or its dates."""

    def resolve(self, kind: type, value: Any, implicit: tuple[bool, bool]) -> str:
        """The tag of a node: text for an unquoted base-60 scalar, an integer written with a leading 0 (YAML 1.1
        reads `train.resume_from=00000750` as octal, step 488, and `0x10` as 16), or a date (`output_dir=2024-06-01`);
        PyYAML's choice for anything else. A number key reads such text in decimal; a text key keeps it as written."""
        if kind is yaml.ScalarNode and implicit[0] and _SEXAGESIMAL.fullmatch(value):
            return _TEXT
        tag = super().resolve(kind, value, implicit)
        if tag == _TIMESTAMP or (tag == _INT and len(digits := value.lstrip("+-").replace("_", "")) > 1
                                 and digits[0] == "0"):
            return _TEXT
        return tag


def read_config_yaml(text: str) -> Any:
    """YAML text as configs read it (ConfigLoader)."""
    return yaml.load(text, Loader=ConfigLoader)


def field_types(cls: type) -> dict[str, Any]:
    """A config dataclass's fields and their resolved annotated types, in order."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _describe(tp: Any) -> str:
    """A type as a config message names it: a Literal's values, else the type's name."""
    if typing.get_origin(tp) is typing.Literal:
        return " or ".join(repr(a) for a in typing.get_args(tp))
    name = str(getattr(tp, "__name__", tp))
    return f"{'an' if name[:1] in 'aeiou' else 'a'} {name}"


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Convert a YAML value (or an override string parsed as YAML) to the annotated type."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        members = [a for a in args if a is not type(None)]
        errors = []
        for arg in members:
            try:
                return _coerce(value, arg, key)
            except ConfigError as exc:
                errors.append(str(exc))
        if len(errors) == 1:
            raise ConfigError(errors[0])
        # Each member's own message would name only one of the forms the key accepts.
        raise ConfigError(f"config key '{key}': expected {' or '.join(_describe(a) for a in members)}, got {value!r}")
    if origin is typing.Literal:
        if value not in args:
            raise ConfigError(f"config key '{key}': {value!r} is not one of {list(args)}")
        return value
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"config key '{key}': expected a mapping, got {value!r}")
        return _build(tp, value, prefix=key + ".")
    if origin in (list, tuple):
        if isinstance(value, str):
            value = [v for v in (s.strip() for s in value.split(",")) if v]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"config key '{key}': expected a list, got {value!r}")
        if origin is tuple and args and Ellipsis not in args:  # tuple[float, float]: exactly that many
            if len(value) != len(args):
                raise ConfigError(f"config key '{key}': expected {len(args)} values, got {len(value)}: {list(value)!r}")
            return tuple(_coerce(v, inner, f"{key}[{i}]") for i, (v, inner) in enumerate(zip(value, args)))
        inner = args[0] if args else Any
        items = [_coerce(v, inner, f"{key}[{i}]") for i, v in enumerate(value)]
        return items if origin is list else tuple(items)
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"config key '{key}': expected a mapping, got {value!r}")
        return dict(value)
    if tp is Any:
        return value
    if tp in (bool, int, float, str):
        return _coerce_scalar(value, tp, key)
    raise ConfigError(f"config key '{key}': unsupported type {tp!r}")


def _coerce_scalar(value: Any, tp: type, key: str) -> Any:
    """A YAML scalar as bool, int, float or str; a number written as a string is read as one."""
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"config key '{key}': expected true/false, got {value!r}")
    if tp in (int, float) and isinstance(value, str):
        # YAML 1.1 reads "3e-4" (no dot) as a string; accept any numeric literal.
        try:
            value = float(value) if tp is float else int(value)
        except ValueError:
            raise ConfigError(f"config key '{key}': expected a number, got {value!r}") from None
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                return int(value)
            raise ConfigError(f"config key '{key}': expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"config key '{key}': expected a number, got {value!r}")
        # No key means anything by nan or inf, and nan passes every range check written as a comparison.
        if not math.isfinite(value):
            raise ConfigError(f"config key '{key}': expected a finite number, got {value!r}")
        return float(value)
    if not isinstance(value, (str, int, float)) or isinstance(value, bool):
        raise ConfigError(f"config key '{key}': expected a string, got {value!r}")
    return str(value)


def check_range(prefix: str, obj: Any, keys: tuple[str, ...], above: Optional[float] = None,
                at_least: Optional[float] = None, at_most: Optional[float] = None) -> None:
    """ConfigError naming the first of `keys` (fields of `obj`, unset ones skipped; `prefix` the section, "" for the
    top level) outside > above, >= at_least and <= at_most."""
    rule = " and ".join(f"{op} {bound if isinstance(bound, int) else format(bound, 'g')}"
                        for op, bound in ((">", above), (">=", at_least), ("<=", at_most)) if bound is not None)
    for key in keys:
        value = getattr(obj, key)
        if value is None:
            continue
        if ((above is not None and not value > above) or (at_least is not None and not value >= at_least)
                or (at_most is not None and not value <= at_most)):
            raise ConfigError(f"config key '{prefix + '.' if prefix else ''}{key}' must be {rule}, got {value}")


def coerce_value(value: Any, tp: Any, key: str) -> Any:
    """`value` as the annotated type `tp`, as a config key's value is read; ConfigError names `key` when it is not one."""
    return _coerce(value, tp, key)


def _build(cls: type[T], data: dict[str, Any], prefix: str = "") -> T:
    types_ = field_types(cls)
    unknown = sorted(set(data) - set(types_))
    if unknown:
        close = difflib.get_close_matches(unknown[0], list(types_), n=2, cutoff=0.75)
        hint = f": did you mean {' or '.join(repr(prefix + c) for c in close)}?" if close else ""
        raise ConfigError(
            f"unknown config key '{prefix}{unknown[0]}'{hint} (valid keys here: {', '.join(sorted(types_))})"
        )
    kwargs = {name: _coerce(value, types_[name], prefix + name) for name, value in data.items()}
    try:
        obj = cls(**kwargs)
    except TypeError as exc:  # a required field without a default was not given
        raise ConfigError(f"config section '{prefix.rstrip('.') or cls.__name__}': {exc}") from exc
    validate = getattr(obj, "validate", None)
    if callable(validate):
        validate()
    return obj


def _parse_override(item: str) -> tuple[list[str], Any]:
    if "=" not in item:
        raise ConfigError(f"override {item!r} is not of the form key=value")
    key, raw = item.split("=", 1)
    key = key.strip()
    if not key:
        raise ConfigError(f"override {item!r} has an empty key")
    try:
        value = read_config_yaml(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return key.split("."), value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Set dotted `a.b=value` overrides into a nested dict (values parsed as YAML scalars)."""
    for item in overrides:
        path, value = _parse_override(item)
        node = data
        for part in path[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"override {item!r}: '{part}' is not a section")
            node = child
        node[path[-1]] = value
    return data


GLOBAL_PACKAGE = "# @package _global_"


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """A YAML error in one line: what is wrong and where (PyYAML's own text spans lines and ends with a caret)."""
    mark = getattr(exc, "problem_mark", None)
    what = " ".join(str(part) for part in (getattr(exc, "context", None), getattr(exc, "problem", None)) if part)
    if mark is None:
        return what or " ".join(str(exc).split())
    return f"{what or 'error'} at line {mark.line + 1}, column {mark.column + 1}"


def _read_yaml(path: Path) -> dict[str, Any]:
    if path.is_dir():
        raise ConfigError(f"config file {path} is a folder; give a YAML file in it")
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        loaded = read_config_yaml(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigError(f"config file {path} is not UTF-8 text (byte {exc.start}: {exc.reason})") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path} is not valid YAML: {_yaml_problem(exc)}") from exc
    if loaded is not None and not isinstance(loaded, dict):
        raise ConfigError(f"config file {path} must hold a mapping at top level")
    return loaded or {}


def _merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    """Deep merge: sections merge key by key, anything else in `top` replaces what `base` has."""
    out = dict(base)
    for key, value in top.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def _group_file(root: Path, group: str, option: str, where: str) -> tuple[dict[str, Any], list[str]]:
    """A config group option's content, placed under its group's section (or at top level with `# @package _global_`),
    and the `defaults` it lists in turn (a recipe names its objective option)."""
    path = root / group / f"{option}.yaml"
    if not path.is_file():
        options = sorted(p.stem for p in (root / group).glob("*.yaml")) if (root / group).is_dir() else []
        raise ConfigError(f"{where}: no config group option '{group}/{option}' ({path} does not exist; "
                          f"options in {root / group}: {', '.join(options) or 'none'})")
    content = _read_yaml(path)
    nested = _defaults(content, path)
    first_line = path.read_text(encoding="utf-8").split("\n", 1)[0].strip()
    return (content if first_line == GLOBAL_PACKAGE else {group: content}), nested


def _defaults(data: dict[str, Any], path: Path) -> list[str]:
    """The `defaults:` list taken out of a config file's data: group/option names."""
    defaults = data.pop("defaults", None) or []  # `defaults:` with every entry commented out: none
    if not isinstance(defaults, list) or not all(isinstance(d, str) and d.count("/") == 1 for d in defaults):
        raise ConfigError(f"config file {path}: 'defaults' must be a list of group/option names, got {defaults!r}")
    return defaults


def compose(path: Path, group_choices: dict[str, str] | None = None) -> dict[str, Any]:
    """A run YAML with its `defaults:` list resolved: each `group/option` (a YAML beside the file, in
    `group/option.yaml`, which may list defaults of its own) is merged in order, then the file's own keys on top.
    `group_choices` replaces the option of a group listed at any depth (the `group=option` override)."""
    data = _read_yaml(path)
    choices = group_choices or {}
    seen: list[str] = []

    def resolve(defaults: list[str], where: str) -> dict[str, Any]:
        merged: dict[str, Any] = {}
        for group, option in (d.split("/") for d in defaults):
            seen.append(group)
            content, nested = _group_file(path.parent, group, choices.get(group, option), where)
            merged = _merge(_merge(merged, resolve(nested, f"config group option {group}/{option}")), content)
        return merged

    merged = resolve(_defaults(data, path), f"config file {path}")
    for group, option in choices.items():
        if group not in seen:
            raise ConfigError(f"override '{group}={option}': {path} has no config group '{group}' in its defaults "
                              f"({', '.join(sorted(set(seen))) or 'none'})")
    return _merge(merged, data)


def load_config(cls: type[T], path: str | Path | None, overrides: list[str] | None = None,
                search: tuple[Path, ...] = ()) -> T:
    """Load dataclass `cls` from a YAML file (with its `defaults:` groups) and apply key=value overrides.

    An override `group=option` (no dot, a plain name) picks another option of a config group the file's
    defaults list; every other override sets a key. A relative `path` missing from the working directory is
    looked up under each folder of `search` (where an installed package keeps its example configs).
    """
    overrides = list(overrides or [])
    if path is not None and not Path(path).is_absolute() and not Path(path).exists():
        path = next((root / path for root in search if (root / path).is_file()), path)
    data: dict[str, Any] = {}
    if path is not None:
        # `group=name` (a section of the config, or a group such as `recipe` that only the defaults name, given a
        # plain name rather than a mapping) picks a group option.
        sections = {name for name, tp in field_types(cls).items() if dataclasses.is_dataclass(tp)}
        listed = _read_yaml(Path(path)).get("defaults")  # none, or a malformed list that compose refuses, below
        groups = sections | {d.split("/")[0] for d in (listed if isinstance(listed, list) else []) if isinstance(d, str)}
        picks = {}
        for item in overrides:
            key, _, value = (part.strip() for part in item.partition("="))
            if key in groups and value and not value.startswith(("{", "[")):
                picks[key] = value
        overrides = [o for o in overrides if o.partition("=")[0].strip() not in picks]
        data = compose(Path(path), picks)
    apply_overrides(data, overrides)
    return _build(cls, data)


def config_to_dict(cfg: Any) -> dict[str, Any]:
    """Plain-dict view of a config dataclass (tuples become lists)."""
    return json.loads(json.dumps(dataclasses.asdict(cfg)))



def config_changes(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> list[str]:
    """'key OLD -> NEW' (values as JSON) for every value that differs between two config dicts, section by section."""
    out = []
    for key in [*new, *(k for k in old if k not in new)]:
        was, now = old.get(key), new.get(key)
        if isinstance(was, dict) and isinstance(now, dict):
            out += config_changes(was, now, f"{prefix}{key}.")
        elif was != now:
            out.append(f"{prefix}{key} {json.dumps(was)} -> {json.dumps(now)}")
    return out


def config_hash(cfg: Any) -> str:
    """Stable short hash of a config's contents."""
    blob = json.dumps(config_to_dict(cfg), sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]
