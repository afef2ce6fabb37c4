"""The generic contract checker, and what every stage's contract holds (`StageTime`).

Each stage's metrics file has one typed result (a TypedDict) in the module of the builder that
returns it (`data.calibration.Synthesis`, `studies.transfer.Transfer`, ...); `check` and
`read_checked` hold a metrics dict to one, so a renamed or retyped key fails the stage's unit test
or the report with the file and the key named, not as a KeyError deep in a table. A float may be
`None` where the metrics file holds `null` for a value that was not finite (a median over no
tasks). Extra keys are allowed: a contract lists what readers rely on.
"""

import types
import typing
from pathlib import Path
from typing import Any, TypedDict, TypeVar, Union

from autoshard.core.errors import ConfigError
from autoshard.core.metrics import read_metrics

Number = float | None


class StageTime(TypedDict):
    """What every stage's metrics file holds: the stage's wall time (read by the report)."""

    seconds: float


T = TypeVar("T")


def check(metrics: Any, schema: type[T], source: str) -> T:
    """`metrics` if it holds every key of `schema` with a value of its type; otherwise a
    `ConfigError` naming `source` (the file) and the first missing or mistyped key."""
    _check(metrics, schema, source, "")
    return metrics


def read_checked(path: str | Path, schema: type[T]) -> T:
    """The metrics file at `path`, checked against `schema` (see `check`)."""
    return check(read_metrics(path), schema, str(path))


def _check(value: Any, kind: Any, source: str, where: str) -> None:
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if kind is Any:
        return
    if typing.is_typeddict(kind):
        _expect(isinstance(value, dict), value, "a mapping", source, where)
        for key, hint in typing.get_type_hints(kind).items():
            path = f"{where}.{key}" if where else key
            if key not in value:
                if key in kind.__required_keys__:
                    raise ConfigError(f"{source}: key {path!r} is missing")
                continue
            _check(value[key], hint, source, path)
    elif origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return
        options = [a for a in args if a is not type(None)]
        for option in options[:-1]:  # the first that fits (`primary`'s entries: an endpoint or its record)
            try:
                return _check(value, option, source, where)
            except ConfigError:
                continue
        _check(value, options[-1], source, where)
    elif origin is list:
        _expect(isinstance(value, list), value, "a list", source, where)
        for i, item in enumerate(value):
            _check(item, args[0], source, f"{where}[{i}]")
    elif origin is dict:
        _expect(isinstance(value, dict), value, "a mapping", source, where)
        for key, item in value.items():
            _check(item, args[1], source, f"{where}.{key}" if where else str(key))
    elif kind is type(None):
        _expect(value is None, value, "null", source, where)
    elif kind is float:
        _expect(isinstance(value, int | float) and not isinstance(value, bool), value, "a number", source, where)
    elif kind is int:
        _expect(isinstance(value, int) and not isinstance(value, bool), value, "an integer", source, where)
    else:
        _expect(isinstance(value, kind), value, _name(kind), source, where)


def _name(kind: Any) -> str:
    return getattr(kind, "__name__", str(kind))


def _mistyped(value: Any, expected: str, source: str, where: str) -> ConfigError:
    return ConfigError(f"{source}: key {where!r} holds {value!r} ({type(value).__name__}), expected {expected}")


def _expect(ok: bool, value: Any, expected: str, source: str, where: str) -> None:
    if not ok:
        raise _mistyped(value, expected, source, where)
