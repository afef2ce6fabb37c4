"""Read and check parameters: every bad value is reported with its full name and the value."""

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from autoshard.core.errors import ConfigError, invalid

_MISSING = object()


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

    def integers(self, key: str, lo: int | None = 1, default: Any = _MISSING) -> list[int]:
        values = self._list(key, default)
        return [_check_int(f"{self.name(key)}[{i}]", v, lo, None) for i, v in enumerate(values)]

    def numbers(self, key: str, lo: float | None = None, hi: float | None = None,
                default: Any = _MISSING) -> list[float]:
        values = self._list(key, default)
        return [_check_number(f"{self.name(key)}[{i}]", v, lo, hi, False)
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
