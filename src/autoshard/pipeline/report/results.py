"""Every stage's metrics file read back as its typed result, the one input of the page writers: a
renamed or retyped key fails here with the file and the key named, not deep in a table."""

from dataclasses import dataclass
from pathlib import Path

from autoshard.core.schema import read_checked
from autoshard.costmodel.accuracy import CostModelScores
from autoshard.data.calibration import Synthesis
from autoshard.measure.analysis import Profile
from autoshard.rl.validation import RLTraining
from autoshard.studies.ablation import Ablation
from autoshard.studies.columns import Columns
from autoshard.studies.evaluate import Evaluation
from autoshard.studies.transfer import Transfer


@dataclass(frozen=True)
class Results:
    """The stages' typed results (None: that stage's metrics file is absent) and where the
    figures lie; `stages` is dvc.yaml's notebook stages in order, (stage, notebook stem)."""

    reports: Path
    stages: tuple[tuple[str, str], ...]
    synthesize: Synthesis | None = None
    profile: Profile | None = None
    cost_model: CostModelScores | None = None
    train_rl: RLTraining | None = None
    evaluate: Evaluation | None = None
    transfer: Transfer | None = None
    ablation: Ablation | None = None
    columns: Columns | None = None
    budget_minutes: float | None = None
    budget_shares: dict[str, float] | None = None  # each stage's share of budget_minutes


CONTRACTS: dict[str, type] = {"synthesize": Synthesis, "profile": Profile, "cost_model": CostModelScores,
                              "train_rl": RLTraining, "evaluate": Evaluation, "transfer": Transfer,
                              "ablation": Ablation, "columns": Columns}


def read_results(reports: Path, stages: tuple[tuple[str, str], ...], budget_minutes: float | None = None,
                 budget_shares: dict[str, float] | None = None) -> Results:
    """Each stage's `reports/metrics/<stage>.json` that exists, checked against its contract."""
    found = {}
    for stage, contract in CONTRACTS.items():
        path = reports / "metrics" / f"{stage}.json"
        if path.exists():
            found[stage] = read_checked(path, contract)
    return Results(reports=reports, stages=stages, budget_minutes=budget_minutes, budget_shares=budget_shares,
                   **found)
