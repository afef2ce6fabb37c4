"""Every path of the study, relative to the repository root: the one place that names them."""

from dataclasses import dataclass
from pathlib import Path

WORK_FOLDERS = {"profile": "profile-work", "train_rl": "rl-work", "evaluate": "evaluate-work",
                "transfer": "transfer-work", "ablation": "ablation-work", "columns": "columns-work"}


@dataclass(frozen=True)
class Paths:
    """The study's files under a data folder (DVC-cached) and a reports folder (committed)."""

    data: Path = Path("data")
    reports: Path = Path("reports")

    @property
    def pool(self) -> Path:
        return self.data / "pool"

    @property
    def wide(self) -> Path:
        """The wide pool and its split (`data.wide`), from the synthesize stage."""
        return self.data / "wide"

    @property
    def wide_profile(self) -> Path:
        """The wide pool's measured shards (profile stage)."""
        return self.data / "profile" / "wide"

    @property
    def tasks(self) -> Path:
        return self.data / "tasks.json"

    @property
    def profile(self) -> Path:
        return self.data / "profile"

    @property
    def effort(self) -> Path:
        """The measuring effort the profile decided for this machine (`pipeline.effort`)."""
        return self.data / "profile" / "effort.json"

    @property
    def comm_rows(self) -> Path:
        """The measured all-to-alls the comm model is fitted on (profile stage)."""
        return self.data / "profile" / "comm.parquet"

    @property
    def comm_model(self) -> Path:
        """The fitted comm model (`measure.commmodel.CommModel`)."""
        return self.data / "profile" / "comm_model.json"

    @property
    def cost_model(self) -> Path:
        """The cost model fitted by the cost_model stage."""
        return self.data / "cost_model" / "model.pt"

    @property
    def hybrid_cost_model(self) -> Path:
        """The hybrid cost model (measured single costs x learnt fusion) of the cost_model stage."""
        return self.data / "cost_model" / "hybrid.pt"

    @property
    def stages_cost_model(self) -> Path:
        """The cost model with forward and backward heads (`heads: stages`) of the cost_model stage:
        the main model when that is the stage-head one, else the comparison fit."""
        return self.data / "cost_model" / "stages.pt"

    def cost_model_replicate(self, replicate: int) -> Path:
        """A replicate's cost model (replicate 0 is `cost_model`): the same data, another seed."""
        return self.cost_model if replicate == 0 else self.data / "cost_model" / f"replicate_{replicate}.pt"

    def rl_replicate(self, replicate: int) -> Path:
        """A replicate's policy.pt and cost_model.pt (replicate 0 is `rl`)."""
        return self.rl if replicate == 0 else self.rl / f"replicate_{replicate}"

    @property
    def rl(self) -> Path:
        """The train_rl stage's outputs: policy.pt, cost_model.pt (the simulator), planner.npz."""
        return self.data / "rl"

    @property
    def policy(self) -> Path:
        """The trained policy (train_rl)."""
        return self.rl / "policy.pt"

    @property
    def simulator(self) -> Path:
        """The cost model the policy was trained on (train_rl's copy of the cost_model stage's)."""
        return self.rl / "cost_model.pt"

    @property
    def sync_policy(self) -> Path:
        """The policy trained on the synchronized-stages reward (train_rl's `rl.sync_policy`)."""
        return self.rl / "policy_sync.pt"

    @property
    def fair_policy(self) -> Path:
        """The fair learned sharder (train_rl's `rl.fair_policy`), trained on `simulator`."""
        return self.rl / "policy_fair.pt"

    @property
    def sync_simulator(self) -> Path:
        """The stage-head cost model the synchronized policy was trained on."""
        return self.rl / "stages_model.pt"

    def results(self, stage: str) -> Path:
        """A study stage's data outputs (plans, devices, tables): data/<stage>."""
        return self.data / stage

    def work(self, stage: str) -> Path:
        """A stage's resume folder (kept between runs, outside DVC's outputs)."""
        return self.data / WORK_FOLDERS[stage]

    @property
    def measurements(self) -> Path:
        """The measurement store every measuring stage shares (`measure.store`; kept between
        runs, outside DVC's outputs)."""
        return self.data / "measurements"

    def metrics(self, stage: str) -> Path:
        return self.reports / "metrics" / f"{stage}.json"

    def figures(self, stage: str) -> Path:
        return self.reports / "figures" / stage
