"""The sharding MDP, batched: many tasks of T tables on D devices step at once as tensors.

Tables are placed one per step, largest predicted single-table cost first. A device that
cannot hold the current table is masked out, so a placement never exceeds the memory cap;
so is a device after which the remaining tables could not be placed (`PackingGuard`: a task
that first-fit-decreasing can place never dead-ends). Where the guard can vouch for no device
any device with room is allowed and the step is counted in `fallbacks`; if no device can hold
a table the task is infeasible and `step`'s caller gets `Infeasible`, never a silent overflow.
Device costs come from the cost model: the head applied to the sum of the encodings of the
device's tables (the cost model is the simulator).

The `synchronized` reward scores DreamShard's synchronized stages instead (`placement.sync`):
each device's forward and backward compute are a stage-head cost model's two heads
(`heads: stages`) on its summed encodings, its all-to-all times the comm model's lines
(`placement.objective.comm_lines`) in its summed embedding width; the cost is the sum over the
four stages of the slowest device. The device costs the policy sees stay the totals (the two
heads summed), as with the other rewards.
"""

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from autoshard.core.errors import ConfigError
from autoshard.costmodel.model import CostModel, check_features
from autoshard.data.features import FEATURE_COLUMNS
from autoshard.data.packing import PackingGuard
from autoshard.data.tasks import Task
from autoshard.measure.commmodel import CommModel
from autoshard.placement.greedy import Infeasible
from autoshard.placement.objective import comm_lines

REWARDS = ("bottleneck", "balance", "synchronized")


@dataclass(frozen=True)
class StageComm:
    """What the `synchronized` reward needs beyond the cost model: the comm model and the batch
    size its all-to-all traffic is predicted at (the profile's)."""

    model: CommModel
    batch_size: int

    def lines(self, devices: int, total_width: float) -> np.ndarray:
        """(2, 2) forward and backward (intercept, slope) of a device's all-to-all ms in its width."""
        return comm_lines(self.model, devices, self.batch_size, total_width)


@dataclass
class Lookahead:
    """What the cost-model greedy sees at a step, for a `lookahead` policy: (B, D) each device's
    predicted cost after placing the current table, and (B, 2) the tables still to place after it:
    their predicted single costs / all the task's, and their bytes / the memory still free."""

    after: torch.Tensor
    remaining: torch.Tensor


@dataclass
class Batch:
    """Static description of a batch of tasks with the same T and D, in placement order."""

    tasks: list[Task]
    tables: torch.Tensor      # (B, T) pool ids, in placement order
    features: torch.Tensor    # (B, T, 21) raw features
    encodings: torch.Tensor   # (B, T, E) cost-model encodings (no gradient)
    sizes: torch.Tensor       # (B, T) bytes
    capacity: torch.Tensor    # (B,) bytes per device
    single_cost: torch.Tensor  # (B, T) predicted cost of each table alone (ms)
    devices: int

    @property
    def size(self) -> int:
        return self.tables.shape[0]

    @property
    def steps(self) -> int:
        return self.tables.shape[1]

    def reference(self) -> torch.Tensor:
        """A per-task cost scale: the ideal balanced load, sum of single costs / D."""
        return self.single_cost.sum(1) / self.devices


@torch.no_grad()
def make_batch(model: CostModel, features: np.ndarray, tasks: Sequence[Task]) -> Batch:
    """Encode the tasks' tables and order each task's tables by predicted single cost, largest first."""
    if not tasks:
        raise ValueError("make_batch needs at least one task")
    shapes = {(len(t.tables), t.devices) for t in tasks}
    if len(shapes) != 1:
        raise ValueError(f"a batch needs tasks of one shape (tables, devices), got {sorted(shapes)}")
    ids = torch.tensor([list(t.tables) for t in tasks], dtype=torch.long)
    used, inverse = torch.unique(ids, return_inverse=True)  # encode only the tasks' tables
    x = check_features(np.asarray(features)[used.numpy()])
    enc = model.encode(x)
    single = model.cost_ms(enc)
    order = torch.argsort(single[inverse], dim=1, descending=True, stable=True)
    ids, inverse = torch.gather(ids, 1, order), torch.gather(inverse, 1, order)
    sizes = torch.as_tensor(np.asarray(features)[:, FEATURE_COLUMNS.index("size_bytes")], dtype=torch.float64)[ids]
    return Batch(tasks=list(tasks), tables=ids, features=x[inverse], encodings=enc[inverse],
                 sizes=sizes, capacity=torch.tensor([float(t.memory_bytes) for t in tasks],
                                                    dtype=torch.float64),
                 single_cost=single[inverse], devices=tasks[0].devices)


def synchronized_stages(model: CostModel, comm: StageComm | None, batch: Batch,
                        placement: torch.Tensor) -> torch.Tensor:
    """(B, D, 4) predicted forward compute, forward all-to-all, backward all-to-all and backward
    compute of every device (see the module note) for placements (B, T) in the batch's table order
    (-1: not placed yet); a device without tables computes nothing."""
    if comm is None:
        raise ConfigError("rl.reward: synchronized needs the comm model (none was given)")
    if model.cfg.heads != "stages":
        raise ConfigError(f"rl.reward: synchronized needs a cost model with heads: stages, "
                          f"got heads: {model.cfg.heads}")
    placed = torch.nn.functional.one_hot(placement.clamp_min(0), batch.devices)
    placed = (placed * (placement >= 0)[..., None]).to(batch.encodings.dtype)        # (B, T, D)
    compute = model.head_ms(torch.einsum("btd,bte->bde", placed, batch.encodings))   # (B, D, 2)
    compute = compute.double() * (placed.sum(1) > 0)[..., None]
    dims = batch.features[..., FEATURE_COLUMNS.index("dim")].double()               # (B, T)
    width = torch.einsum("btd,bt->bd", placed.double(), dims)
    lines = torch.from_numpy(np.stack([comm.lines(batch.devices, w) for w in dims.sum(1).tolist()]))  # (B, 2, 2)
    link = (lines[:, None, :, 0] + lines[:, None, :, 1] * width[..., None]).clamp_min(0.0)  # (B, D, 2)
    return torch.stack([compute[..., 0], link[..., 0], link[..., 1], compute[..., 1]], -1)


class ShardingEnv:
    """Batched environment over one `Batch`; `reset`, then `step` T times. `comm` is needed by
    the `synchronized` reward only."""

    def __init__(self, model: CostModel, batch: Batch, comm: StageComm | None = None):
        self.model, self.batch, self.comm = model, batch, comm
        self.reset()

    def reset(self) -> None:
        b, d, e = self.batch.size, self.batch.devices, self.batch.encodings.shape[2]
        self.t = 0
        self.device_sum = torch.zeros(b, d, e)
        self.device_mem = torch.zeros(b, d, dtype=torch.float64)
        self.device_cost = torch.zeros(b, d)
        self.placement = torch.full((b, self.batch.steps), -1, dtype=torch.long)
        self.guard = PackingGuard(self.batch.sizes.numpy(), self.batch.capacity.numpy(), d)
        self._mask: tuple[int, torch.Tensor] | None = None

    @property
    def done(self) -> bool:
        return self.t >= self.batch.steps

    @property
    def fallbacks(self) -> int:
        """(task, step) pairs where the guard vouched for no device and any with room was allowed."""
        return self.guard.fallbacks

    def mask(self) -> torch.Tensor:
        """(B, D) devices that can hold the current table and leave the rest placeable (see the
        module note); raises if some task has no device with room."""
        if self._mask is not None and self._mask[0] == self.t:
            return self._mask[1]
        fits = torch.from_numpy(self.guard.allowed(self.t, self.device_mem.numpy()))
        self._mask = (self.t, fits)
        stuck = ~fits.any(1)
        if stuck.any():
            i = int(torch.nonzero(stuck)[0])
            task = self.batch.tasks[i]
            raise Infeasible(f"task {task.name}: table {int(self.batch.tables[i, self.t])} "
                             f"fits on no device at step {self.t}")
        return fits

    def allowed(self, t: int) -> torch.Tensor:
        """The environment as `placement.greedy`'s rule: this step's `mask()`."""
        if t != self.t:
            raise ValueError(f"step {t} asked of an environment at step {self.t}")
        return self.mask()

    def placed(self, t: int, actions: torch.Tensor) -> None:
        """The environment as `placement.greedy`'s rule: `step(actions)`."""
        self.step(actions, self.allowed(t))

    @torch.no_grad()
    def step(self, actions: torch.Tensor, mask: torch.Tensor | None = None) -> None:
        """Place the current table of every task on `actions` (B,) — which must be allowed.
        `mask` is this step's `mask()` when the caller already has it."""
        fits = self.mask() if mask is None else mask
        rows = torch.arange(self.batch.size)
        if not fits[rows, actions].all():
            raise ValueError("an action chose a device the mask refuses (no room, or no room left for the rest)")
        self.device_sum[rows, actions] += self.batch.encodings[:, self.t]
        self.device_mem[rows, actions] += self.batch.sizes[:, self.t]
        self.device_cost[rows, actions] = self.model.cost_ms(self.device_sum[rows, actions])
        self.placement[:, self.t] = actions
        self.guard.placed(self.t, actions.numpy())
        self.t += 1

    def after(self) -> torch.Tensor:
        """(B, D) predicted cost of every device if the current table were placed on it."""
        return self.model.cost_ms(self.device_sum + self.batch.encodings[:, self.t, None, :])

    def lookahead(self) -> Lookahead:
        """This step's `Lookahead` (see there)."""
        b, later = self.batch, slice(self.t + 1, None)
        cost = b.single_cost[:, later].sum(1) / b.single_cost.sum(1).clamp_min(1e-9)
        free = (b.capacity * b.devices - self.device_mem.sum(1)).clamp_min(1.0)
        size = b.sizes[:, later].sum(1) / free
        return Lookahead(self.after(), torch.stack([cost, size.to(cost.dtype)], -1))

    def bottleneck(self) -> torch.Tensor:
        """Predicted cost of the slowest device (B,)."""
        return self.device_cost.max(1).values

    def stages(self) -> torch.Tensor:
        """(B, D, 4) predicted stages of every device (`synchronized_stages`)."""
        return synchronized_stages(self.model, self.comm, self.batch, self.placement)

    def synchronized(self) -> torch.Tensor:
        """Predicted synchronized-stages cost (B,): each stage's slowest device, summed (ms)."""
        return self.stages().max(1).values.sum(-1)

    def reward(self, kind: str) -> torch.Tensor:
        """Terminal reward: `bottleneck` (minus bottleneck / reference scale, DreamShard),
        `balance` (min/max of device costs, AutoShard) or `synchronized` (minus the synchronized-
        stages cost / the same reference scale)."""
        if kind == "bottleneck":
            return -self.bottleneck() / self.batch.reference()
        if kind == "balance":
            return self.device_cost.min(1).values / self.bottleneck().clamp_min(1e-9)
        if kind == "synchronized":
            return (-self.synchronized() / self.batch.reference().double()).float()
        raise ValueError(f"rl.reward: {kind!r} (expected one of {', '.join(REWARDS)})")

    def pool_placement(self) -> list[dict[int, int]]:
        """Per task: pool table id -> device."""
        return [dict(zip(self.batch.tables[i].tolist(), self.placement[i].tolist(), strict=True))
                for i in range(self.batch.size)]
