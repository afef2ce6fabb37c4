"""How many interleaved rounds each measurement gets on this machine: the study's measuring
effort, set from the profile's calibration so that a stage keeps its share of `budget_minutes`.

The rounds in params.yaml (`profile.rounds`, `evaluate.timing.rounds`) are sized for the
machine named by `effort.reference_ms` (FBGEMM's harness backward, row-wise Adagrad, default
heap: `measure.harness`). A machine 2**level times slower measures with 2**level times fewer
rounds, a faster one with more (at most `effort.most` times the written rounds), never fewer
than `effort.least` (two rounds still give a noise estimate and a drift check). The level is
the speed ratio's log2 rounded to a whole number, so a machine's own run-to-run noise (a few
percent) does not move it and a rerun on the same machine measures as much again. Only
repetitions change: tasks, seeds, methods and endpoints are the same on every machine, and a
slow machine gets wider intervals, never a smaller study.

The profile stage measures the calibration, decides the effort, uses it and writes it beside its
data (`Paths.effort`, in `data/profile`); every later stage that measures reads it from there, a
file it already depends on.
"""

from __future__ import annotations

import json
import math
from copy import deepcopy
from dataclasses import asdict, dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

from autoshard.core.atomic import atomic_file
from autoshard.core.errors import ConfigError
from autoshard.core.params import Section, bounded

SPEED = "backward_rowwise_adagrad_ms"  # the harness figure the effort scales by


@dataclass(frozen=True)
class EffortConfig(Section):
    """`effort`: the reference machine's harness backward and the limits of the scaling."""

    section: ClassVar[str] = "effort"
    scale: bool                                     # false: the rounds as written, on every machine
    reference_ms: float = bounded(lo=0, lo_open=True)
    least: int = bounded(lo=2)                      # fewest rounds a scaled measurement gets
    most: float = bounded(lo=1)                     # at most this many times the written rounds


@dataclass(frozen=True)
class Effort:
    """This machine's effort: its harness backward (`speed_ms`) against the reference's, the
    level (rounds are divided by 2**level), and the limits it was decided under."""

    speed_ms: float
    reference_ms: float
    level: int
    least: int
    most: float

    def rounds(self, written: int) -> int:
        """The rounds a measurement written with `written` rounds gets on this machine."""
        if self.level == 0:
            return written
        scaled = round(written / 2 ** self.level)
        return min(max(scaled, min(written, self.least)), math.floor(written * self.most))

    def summary(self) -> dict[str, Any]:
        """What the metrics record: the effort and the rounds it gave each measurement."""
        return asdict(self) | {"factor": round(self.speed_ms / self.reference_ms, 4)}


def decide(calibration: dict[str, Any], cfg: EffortConfig) -> Effort:
    """The effort for a machine whose default-heap harness figures are `calibration`."""
    speed = float(calibration[SPEED])
    level = round(math.log2(speed / cfg.reference_ms)) if cfg.scale else 0
    return Effort(speed_ms=speed, reference_ms=cfg.reference_ms, level=int(level), least=cfg.least, most=cfg.most)


def save(effort: Effort, path: Path) -> Path:
    """Write `effort` to `path` (`Paths.effort`, in the profile's data), atomically."""
    with atomic_file(path) as tmp:
        tmp.write_text(json.dumps(asdict(effort), indent=1, sort_keys=True) + "\n")
    return path


def load(path: Path) -> Effort:
    """The effort the profile stage decided (`path`: `Paths.effort`)."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"{path}: missing (the profile stage writes it; run `dvc repro profile`)")
    return Effort(**json.loads(path.read_text()))


ROUNDS = (("profile", "rounds"), ("evaluate", "timing", "rounds"))  # every measurement's rounds in params.yaml


def scaled(params: SimpleNamespace, effort: Effort) -> SimpleNamespace:
    """`params` (a stage's) with every measurement's rounds set by `effort`; the sections a stage
    does not read are left as they are."""
    out = SimpleNamespace(**{k: deepcopy(v) for k, v in vars(params).items()})
    for path in ROUNDS:
        node = getattr(out, path[0], None)
        for key in path[1:-1]:
            node = node.get(key) if isinstance(node, dict) else None
        if isinstance(node, dict) and path[-1] in node:
            node[path[-1]] = effort.rounds(int(node[path[-1]]))
    return out
