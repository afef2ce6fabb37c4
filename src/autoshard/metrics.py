"""Metrics files under reports/metrics: plain JSON that DVC reads as metrics."""

import json
from pathlib import Path
from typing import Any

import numpy as np

from autoshard.atomic import atomic_file


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float):
        return round(value, 6)
    return value


def write_metrics(path: str | Path, metrics: dict[str, Any]) -> None:
    """Write `metrics` as pretty JSON (numpy scalars made plain, floats rounded), atomically."""
    with atomic_file(path) as tmp:
        tmp.write_text(json.dumps(_plain(metrics), indent=2, sort_keys=True) + "\n")


def read_metrics(path: str | Path) -> dict[str, Any]:
    return json.loads(Path(path).read_text())
