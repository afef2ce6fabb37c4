"""Metrics files under reports/metrics: strict JSON that DVC reads as metrics (a value that is
not a finite number, such as a median over no tasks, is written as null, never NaN)."""

import json
from pathlib import Path
from typing import Any

import numpy as np

from autoshard.core.atomic import atomic_file


def finite(value: float) -> float | None:
    """`value` as a float, or None where it is not a finite number (strict JSON's null)."""
    return float(value) if np.isfinite(value) else None


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float):
        return None if finite(value) is None else round(value, 6)
    return value


def write_metrics(path: str | Path, metrics: dict[str, Any]) -> None:
    """Write `metrics` as pretty JSON (numpy scalars made plain, floats rounded, non-finite as
    null), atomically."""
    with atomic_file(path) as tmp:
        tmp.write_text(json.dumps(_plain(metrics), indent=2, sort_keys=True, allow_nan=False) + "\n")


def read_metrics(path: str | Path) -> dict[str, Any]:
    return json.loads(Path(path).read_text())
