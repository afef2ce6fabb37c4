"""Read and check parameters: every bad value is reported with its full name and the value.

A config is a dataclass read by `parse`: each field is the parameter of its name, its type says
how the value is checked, and `bounded`, `choice` and `inline` add what the type cannot say.
"""

import dataclasses
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import UnionType
from typing import Any, ClassVar, Self, TypeVar, get_args, get_origin, get_type_hints

from autoshard.core.errors import ConfigError, invalid

_MISSING = object()
_CHECKS = "autoshard.params"  # the key of a field's checks in its dataclass metadata
C = TypeVar("C")


def load_params(path: str | Path = "params.yaml") -> dict[str, Any]:
    """Load a YAML parameter file as a dict (an empty file is an error, not an empty study)."""
    import yaml  # here, not at the top: the portable worker parses its job with `Fields` and has no PyYAML

    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: parameter file not found")
    try:
        values = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML ({exc.__class__.__name__})") from None
    if not isinstance(values, dict):
        raise ConfigError(f"{path}: expected a mapping of parameters, got {type(values).__name__}")
    return values


def merge(base: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """Deep-merge `overrides` into a copy of `base` (mappings merge, everything else replaces)."""
    out = dict(base)
    for key, value in overrides.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


class Fields:
    """Typed, checked access to one section of the parameters; unknown keys are errors.

    >>> f = Fields("pool", {"num_tables": 8}); f.integer("num_tables"); f.done()
    8
    """

    def __init__(self, section: str, values: Any):
        if not isinstance(values, Mapping):
            raise invalid(section, values, "expected a mapping")
        self.section = section
        self.values = dict(values)
        self.used: set[str] = set()

    def _raw(self, key: str, default: Any) -> Any:
        self.used.add(key)
        if key in self.values:
            return self.values[key]
        if default is _MISSING:
            raise ConfigError(f"{self.name(key)}: missing")
        return default

    def name(self, key: str) -> str:
        return f"{self.section}.{key}" if self.section else key  # "": the file's top level

    def sub(self, key: str) -> "Fields":
        return Fields(self.name(key), self._raw(key, _MISSING))

    def config(self, key: str, cls: type[C], **given: Any) -> C:
        """The config `cls` from the sub-section `key` (see `parse`)."""
        return parse(cls, self.name(key), self._raw(key, _MISSING), **given)

    def integer(self, key: str, lo: int | None = 1, hi: int | None = None,
                default: Any = _MISSING) -> int:
        value = self._raw(key, default)
        return _check_int(self.name(key), value, lo, hi)

    def number(self, key: str, lo: float | None = None, hi: float | None = None,
               lo_open: bool = False, default: Any = _MISSING) -> float:
        value = self._raw(key, default)
        return _check_number(self.name(key), value, lo, hi, lo_open)

    def text(self, key: str, choices: Sequence[str] | None = None, default: Any = _MISSING) -> str:
        value = self._raw(key, default)
        if not isinstance(value, str):
            raise invalid(self.name(key), value, "expected a string")
        if choices is not None and value not in choices:
            raise invalid(self.name(key), value, f"expected one of {', '.join(choices)}")
        return value

    def optional_text(self, key: str) -> str | None:
        """A string, or None when the key is null or absent."""
        value = self._raw(key, None)
        if value is not None and (not isinstance(value, str) or not value):
            raise invalid(self.name(key), value, "expected a non-empty string or null")
        return value

    def boolean(self, key: str, default: Any = _MISSING) -> bool:
        value = self._raw(key, default)
        if not isinstance(value, bool):
            raise invalid(self.name(key), value, "expected true or false")
        return value

    def integers(self, key: str, lo: int | None = 1, hi: int | None = None,
                 default: Any = _MISSING) -> list[int]:
        values = self._list(key, default)
        return [_check_int(f"{self.name(key)}[{i}]", v, lo, hi) for i, v in enumerate(values)]

    def numbers(self, key: str, lo: float | None = None, hi: float | None = None,
                lo_open: bool = False, default: Any = _MISSING) -> list[float]:
        values = self._list(key, default)
        return [_check_number(f"{self.name(key)}[{i}]", v, lo, hi, lo_open)
                for i, v in enumerate(values)]

    def names(self, key: str, choices: Sequence[str], default: Any = _MISSING) -> list[str]:
        """A non-empty list of distinct names, each one of `choices`."""
        values = self._list(key, default)
        for i, v in enumerate(values):
            if v not in choices:
                raise invalid(f"{self.name(key)}[{i}]", v, f"expected one of {', '.join(choices)}")
        if len(set(values)) != len(values):
            raise invalid(self.name(key), values, "names a value twice")
        return list(values)

    def entries(self, key: str) -> list:
        """A non-empty list whose entries the caller checks."""
        return self._list(key, _MISSING)

    def _list(self, key: str, default: Any) -> list:
        values = self._raw(key, default)
        if not isinstance(values, list) or not values:
            raise invalid(self.name(key), values, "expected a non-empty list")
        return values

    def done(self) -> None:
        """Refuse keys nobody asked for: a typo must not silently fall back to a default."""
        unknown = sorted(set(self.values) - self.used)
        if unknown:
            raise invalid(self.name(unknown[0]), self.values[unknown[0]], "unknown parameter")


def _check_int(name: str, value: Any, lo: int | None, hi: int | None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise invalid(name, value, "expected an integer")
    if lo is not None and value < lo:
        raise invalid(name, value, f"must be at least {lo}")
    if hi is not None and value > hi:
        raise invalid(name, value, f"must be at most {hi}")
    return value


def _check_number(name: str, value: Any, lo: float | None, hi: float | None,
                  lo_open: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
        raise invalid(name, value, "expected a number")
    if lo is not None and (value <= lo if lo_open else value < lo):
        raise invalid(name, value, f"must be {'above' if lo_open else 'at least'} {lo}")
    if hi is not None and value > hi:
        raise invalid(name, value, f"must be at most {hi}")
    return float(value)


def bounded(lo: float | None = None, hi: float | None = None, lo_open: bool = False) -> Any:
    """A config field whose number (or each number of its tuple) lies in [lo, hi], (lo, hi] with
    `lo_open`. An integer without a `lo` must be at least 1."""
    limits = {"lo": lo, "hi": hi, "lo_open": lo_open}
    return dataclasses.field(metadata={_CHECKS: {k: v for k, v in limits.items() if v is not None}})


def choice(options: Sequence[str]) -> Any:
    """A config field whose string (or each string of its tuple, named once) is one of `options`."""
    return dataclasses.field(metadata={_CHECKS: {"choices": tuple(options)}})


def inline() -> Any:
    """A config field of a nested config read from its parent's own section, not a sub-section."""
    return dataclasses.field(metadata={_CHECKS: {"inline": True}})


class Section:
    """A config that is a whole section of the parameters, named by its `section`."""

    section: ClassVar[str]

    @classmethod
    def from_params(cls, values: Any) -> Self:
        """The config from its section's values (see `parse`)."""
        return parse(cls, cls.section, values)


def parse(cls: type[C], section: str, values: Any, **given: Any) -> C:
    """The config `cls` from the parameter section named `section`; unknown keys are errors.

    Every field is the parameter of its name, except those `given` (the caller's, from other
    sections or derived) and those with a default (not parameters). By type: bool, int (at least
    1 unless `bounded`), float, str, `tuple[T, ...]` (a non-empty list), `tuple[T, T]` (a [low,
    high] range), `T | None` (null or absent: None) and a nested config (the sub-section of its
    name, or this section with `inline`).

    >>> @dataclasses.dataclass
    ... class Pool:
    ...     num_tables: int
    ...     share: float = bounded(lo=0, hi=1)
    >>> parse(Pool, "pool", {"num_tables": 8, "share": 0.5})
    Pool(num_tables=8, share=0.5)
    """
    f = Fields(section, values)
    cfg = read(cls, f, **given)
    f.done()
    return cfg


def read(cls: type[C], f: Fields, **given: Any) -> C:
    """`parse` from the section `f`, leaving its other keys to the caller (no `f.done()`)."""
    types = get_type_hints(cls)
    values = dict(given)
    for field in dataclasses.fields(cls):
        has_default = field.default is not dataclasses.MISSING or field.default_factory is not dataclasses.MISSING
        if field.init and field.name not in given and not has_default:
            values[field.name] = _value(f, field.name, types[field.name], field.metadata.get(_CHECKS, {}))
    return cls(**values)


def _value(f: Fields, key: str, kind: Any, checks: dict) -> Any:
    """The value of `key` in `f` as a field of type `kind` with `checks` reads it."""
    lo, hi, lo_open, choices = checks.get("lo"), checks.get("hi"), checks.get("lo_open", False), checks.get("choices")
    args = get_args(kind)
    if dataclasses.is_dataclass(kind):
        return read(kind, f) if checks.get("inline") else f.config(key, kind)
    if isinstance(kind, UnionType) and type(None) in args:
        (inner,) = (a for a in args if a is not type(None))
        if inner is str:
            return f.optional_text(key)
        return None if f._raw(key, None) is None else _value(f, key, inner, checks)
    if kind is bool:
        return f.boolean(key)
    if kind is int:
        return f.integer(key, lo=checks.get("lo", 1), hi=hi)
    if kind is float:
        return f.number(key, lo=lo, hi=hi, lo_open=lo_open)
    if kind is str:
        return f.text(key, choices)
    if get_origin(kind) is tuple and (args[0] in (int, float) or args[0] is str and choices):
        if args[0] is str:
            items = f.names(key, choices)
        elif args[0] is int:
            items = f.integers(key, lo=checks.get("lo", 1), hi=hi)
        else:
            items = f.numbers(key, lo=lo, hi=hi, lo_open=lo_open)
        if args[1:] != (Ellipsis,) and (len(items) != 2 or items[0] > items[1]):
            low = f"{lo:g} <= low" if lo is not None else "low"
            raise invalid(f.name(key), items, f"expected [low, high] with {low} <= high")
        return tuple(items)
    raise TypeError(f"{f.name(key)}: `parse` reads no {kind}")


def flatten(values: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Dotted names of every leaf: {"pool": {"dims": [16]}} -> {"pool.dims": [16]}."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out |= flatten(value, f"{name}.")
        else:
            out[name] = value
    return out


def _flag_value(value: Any) -> str:
    """A value as one shell word that DVC parses back as YAML (lists without spaces)."""
    if isinstance(value, list | dict):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


def main(argv: list[str] | None = None) -> int:
    """`autoshard-params overrides FILE`: print FILE as `-S name=value` flags for `dvc exp run`."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(prog="autoshard-params", description=main.__doc__)
    parser.add_argument("command", choices=["overrides"])
    parser.add_argument("file", type=Path)
    args = parser.parse_args(argv)
    try:
        values = load_params(args.file)
    except ConfigError as exc:
        print(f"autoshard-params: error: {exc}", file=sys.stderr)
        return 2
    print(" ".join(f"-S {name}={_flag_value(value)}" for name, value in flatten(values).items()))
    return 0
