"""Before `make repro`: this machine's speed, and each stage's estimated time against its share
of the budget.

The estimate scales each stage's wall time in the committed run (its metrics file's `seconds`)
by this machine's FBGEMM harness backward (row-wise Adagrad, `measure.harness`, in a fresh
process with the default heap: the figure every machine can give) over the committed run's
(`profile.json`: `calibration.default`). Measuring dominates the profile, evaluate, transfer
and columns stages; training dominates train_rl and ablation, which scale less: the estimate is
a guide, printed before the run starts, not a promise. Each stage's share of `budget_minutes`
is `budget_shares` in params.yaml; the report sets the measured times beside the same shares.

    python -m autoshard.pipeline.budget        (make repro runs it first)
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import ClassVar

from autoshard.core.errors import ConfigError
from autoshard.core.params import Section, bounded, load_params
from autoshard.core.paths import Paths
from autoshard.measure import harness

STAGES = ("synthesize", "profile", "cost_model", "train_rl", "evaluate", "transfer", "ablation", "columns")
SPEED = "backward_rowwise_adagrad_ms"  # the harness figure the estimate scales by


@dataclass(frozen=True)
class Shares(Section):
    """`budget_shares`: every notebook stage's share of `budget_minutes`, together 1."""

    section: ClassVar[str] = "budget_shares"
    synthesize: float = bounded(lo=0, lo_open=True, hi=1)
    profile: float = bounded(lo=0, lo_open=True, hi=1)
    cost_model: float = bounded(lo=0, lo_open=True, hi=1)
    train_rl: float = bounded(lo=0, lo_open=True, hi=1)
    evaluate: float = bounded(lo=0, lo_open=True, hi=1)
    transfer: float = bounded(lo=0, lo_open=True, hi=1)
    ablation: float = bounded(lo=0, lo_open=True, hi=1)
    columns: float = bounded(lo=0, lo_open=True, hi=1)

    def __post_init__(self) -> None:
        total = sum(asdict(self).values())
        if abs(total - 1) > 1e-6:
            raise ConfigError(f"params.yaml: budget_shares: {total:g} in all (expected 1)")


def shares(params: dict) -> dict[str, float]:
    """The stages' shares of `budget_minutes` (`Shares`), by stage."""
    return asdict(Shares.from_params(params.get("budget_shares")))


def committed(paths: Paths) -> tuple[dict[str, float], float | None]:
    """Each stage's wall time in the committed run and that run's harness backward (None where
    its profile has no calibration)."""
    seconds, speed = {}, None
    for stage in STAGES:
        path = paths.metrics(stage)
        if path.exists():
            metrics = json.loads(path.read_text())
            seconds[stage] = float(metrics.get("seconds", 0.0))
            if stage == "profile":
                speed = (metrics.get("calibration") or {}).get("default", {}).get(SPEED)
    return seconds, speed


def here() -> float:
    """This machine's harness backward (ms), in a fresh process with the default heap."""
    return float(harness.fresh()["harness"][SPEED])


def estimate(seconds: dict[str, float], speed_there: float | None, speed_here: float) -> dict[str, float]:
    """Each stage's committed seconds scaled by the speed ratio (1 where the committed run has none)."""
    factor = speed_here / speed_there if speed_there else 1.0
    return {stage: s * factor for stage, s in seconds.items()}


def table(estimates: dict[str, float], stage_shares: dict[str, float], budget_minutes: float) -> list[str]:
    """The printed lines: per stage, the estimate against its share, then the total."""
    lines = [f"{'stage':<12}{'estimate':>10}{'share':>10}"]
    for stage in STAGES:
        est = estimates.get(stage)
        lines.append(f"{stage:<12}{'?' if est is None else f'{est / 60:.1f} min':>10}"
                     f"{stage_shares[stage] * budget_minutes:>6.1f} min")
    total = sum(estimates.values()) / 60
    verdict = "within" if total <= budget_minutes else "OVER"
    lines.append(f"{'all':<12}{total:>6.1f} min{budget_minutes:>6.1f} min  ({verdict} budget_minutes)")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--params", type=Path, default=Path("params.yaml"))
    args = parser.parse_args(argv)
    params = load_params(args.params)
    seconds, there = committed(Paths())
    speed = here()
    print(f"this machine: harness backward {speed:.1f} ms (row-wise Adagrad, default heap); the committed run's: "
          f"{'not recorded' if there is None else f'{there:.1f} ms'}")
    print("\n".join(table(estimate(seconds, there, speed), shares(params), float(params["budget_minutes"]))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
