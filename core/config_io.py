"""Typed configs: dataclasses filled from YAML plus `a.b=value` overrides, with errors that name the key."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml

from core.errors import ConfigError  # noqa: F401 (re-exported: the loader's callers import it from here)

T = TypeVar("T")


def _field_types(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Convert a YAML value (or an override string parsed as YAML) to the annotated type."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return _coerce(value, arg, key)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(errors[0])
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
        inner = args[0] if args else Any
        items = [_coerce(v, inner, f"{key}[{i}]") for i, v in enumerate(value)]
        return items if origin is list else tuple(items)
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"config key '{key}': expected a mapping, got {value!r}")
        return dict(value)
    if tp is Any:
        return value
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
        return float(value)
    if tp is str:
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise ConfigError(f"config key '{key}': expected a string, got {value!r}")
        return str(value)
    raise ConfigError(f"config key '{key}': unsupported type {tp!r}")


def _build(cls: type[T], data: dict[str, Any], prefix: str = "") -> T:
    types_ = _field_types(cls)
    unknown = sorted(set(data) - set(types_))
    if unknown:
        raise ConfigError(
            f"unknown config key '{prefix}{unknown[0]}' (valid keys here: {', '.join(sorted(types_))})"
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
        value = yaml.safe_load(raw) if raw.strip() else ""
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


def load_config(cls: type[T], path: str | Path | None, overrides: list[str] | None = None) -> T:
    """Load dataclass `cls` from a YAML file (or defaults) and apply key=value overrides."""
    data: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file not found: {path}")
        try:
            loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {path} is not valid YAML: {exc}") from exc
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"config file {path} must hold a mapping at top level")
        data = loaded or {}
    apply_overrides(data, list(overrides or []))
    return _build(cls, data)



def config_to_dict(cfg: Any) -> dict[str, Any]:
    """Plain-dict view of a config dataclass (tuples become lists)."""
    return json.loads(json.dumps(dataclasses.asdict(cfg)))



def config_hash(cfg: Any) -> str:
    """Stable short hash of a config's contents."""
    blob = json.dumps(config_to_dict(cfg), sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]
