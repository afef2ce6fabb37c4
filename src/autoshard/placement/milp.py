"""The exact placement under a linear objective, by a MILP (HiGHS via SciPy).

A linear objective (`placement.objective.Linear`) has S stages, each a device's summed per-table
values v[t, s] plus an offset a_s, never below 0, and costs the sum over stages of the slowest
device: one stage of per-table costs (measured single costs, or a cost model's single-table
predictions: the idea SurCo applied to table sharding) or DreamShard's four synchronized stages.
Over binary x[t, d] (table t on device d) and one bound z_s per stage:

    minimise sum_s z_s  s.t.  sum_d x[t, d] = 1,  z_s >= 0,  sum_t size_t x[t, d] <= cap_d,
        (a_s + sum_t v[t, s] x[t, d]) / speed_d + sum_t c[t, s] x[t, d] <= z_s.

Devices may differ in speed and memory (a mixed cluster, `placement.topology`; by default every
speed is 1, every cap the same and no table has a comm c). Devices alike in both can be
renumbered among themselves, so the k-th table in decreasing total value sits, if on such a
device, on one of the first k + 1 of them; fixing that removes most of the mirror images of each
solution. A starting placement bounds the objective from above (SciPy's `milp` takes no warm
start) and stands in when the solver finds nothing better within its limits (status "start").
HiGHS runs on one thread with a fixed seed, so a solve that ends before its time limit is
repeatable.
"""

import time
import warnings
from dataclasses import dataclass

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_array, eye_array, hstack, kron

from autoshard.placement.greedy import Infeasible
from autoshard.placement.lpt import lpt
from autoshard.placement.objective import Linear, Speeds


@dataclass(frozen=True)
class MilpResult:
    """A placement with its objective, the proven lower bound on the optimum and the relative
    gap between them (0: proven optimal, up to the solver's `rel_gap`)."""

    placement: np.ndarray
    objective: float
    lower_bound: float
    gap: float
    status: str  # "optimal"; "node_limit" or "time_limit": the solver's best plan when it stopped there;
    # "start": the starting placement (the solver found none, or none as good)
    seconds: float


def stop_status(solver_status: int, seconds: float, time_limit: float) -> str:
    """Why HiGHS stopped: "optimal" (gap closed), else "time_limit" when the clock ran out and
    "node_limit" otherwise (SciPy reports both limits as status 1)."""
    if solver_status == 0:
        return "optimal"
    return "time_limit" if seconds >= 0.95 * time_limit else "node_limit"


def solve(objective: Linear, sizes: np.ndarray, devices: int, capacity: int | np.ndarray,
          start: np.ndarray | None = None, time_limit: float = 60.0, rel_gap: float = 1e-3, seed: int = 0,
          node_limit: int | None = None, speeds: np.ndarray | None = None,
          comm: np.ndarray | None = None) -> MilpResult:
    """Minimise `objective` under the memory cap `capacity` (bytes, one for every device or one per
    device), on devices of `speeds` (None: all 1), each table adding its `comm` (T, S; None: none)
    to its device's stages whatever the speed (`objective.Speeds`), from the placement `start` (or none), within
    `time_limit` seconds. A solve stopped by the clock depends on the machine's speed; one stopped
    by `node_limit` (branch-and-bound nodes) does not. The default `rel_gap` (0.1%) is far below the
    measurement noise (2-3%). Raises `Infeasible` when the solver finds no placement and there is
    no `start`."""
    began = time.perf_counter()
    values, offsets = objective.share, objective.base
    sizes = np.asarray(sizes, dtype=np.int64)
    (n, stages), d = values.shape, devices
    if sizes.shape != (n,) or n == 0:
        raise ValueError(f"objective of {n} tables and sizes {sizes.shape} must be non-empty and of one length")
    if d < 1:
        raise ValueError(f"devices: {devices} (need at least one)")
    caps = np.broadcast_to(np.asarray(capacity, dtype=np.int64), (d,))
    speeds = np.ones(d) if speeds is None else np.asarray(speeds, dtype=np.float64)
    if speeds.shape != (d,) or not (speeds > 0).all():
        raise ValueError(f"speeds {speeds}: need a positive speed per device")
    timed = Speeds(objective, speeds, comm)  # the objective as these devices run it
    extra = np.zeros_like(values) if comm is None else np.asarray(comm, dtype=np.float64)
    scale = float(np.abs(values).sum(axis=1).mean()) or 1.0  # keeps the coefficients near 1
    lower = _lower_bound(objective, speeds)  # comm, never negative, only adds to it
    upper = timed.cost(start, d) if start is not None else np.inf

    tables, device = (a.ravel() for a in np.meshgrid(np.arange(n), np.arange(d), indexing="ij"))
    column = tables * d + device  # x[t, k] is variable t * D + k

    def per_device(coefficients: np.ndarray, then: coo_array) -> coo_array:
        return hstack([coo_array((coefficients, (device, column)), shape=(d, n * d)), then])

    load = [per_device(values[tables, s] / scale / speeds[device] + extra[tables, s] / scale,
                       coo_array(-np.eye(stages)[[s]].repeat(d, axis=0))) for s in range(stages)]
    one_each = hstack([kron(eye_array(n), np.ones((1, d))), coo_array((n, stages))])
    memory = per_device(sizes[tables] / caps[device], coo_array((d, stages)))
    total = np.append(np.zeros(n * d), np.ones(stages))[None, :]
    constraints = [LinearConstraint(one_each, 1, 1), LinearConstraint(memory, -np.inf, 1),
                   *(LinearConstraint(a, -np.inf, -offsets[s] / scale / speeds) for s, a in enumerate(load)),
                   LinearConstraint(total, 0, upper / scale * (1 + 1e-9) if np.isfinite(upper) else np.inf)]
    ub = np.ones((n, d))
    alike = [np.flatnonzero((speeds == v) & (caps == c)) for v, c in dict.fromkeys(zip(speeds, caps, strict=True))]
    for rank, t in enumerate(np.argsort(-values.sum(axis=1), kind="stable")):
        for group in alike:
            ub[t, group[rank + 1:]] = 0  # the mirror images: see the module's docstring
    bounds = Bounds(np.append(np.zeros(n * d), lower / scale), np.append(ub.ravel(), np.full(stages, np.inf)))

    limits = {"time_limit": float(time_limit), "mip_rel_gap": float(rel_gap), "threads": 1, "random_seed": int(seed)}
    if node_limit is not None:
        limits["node_limit"] = int(node_limit)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Unrecognized options", RuntimeWarning)
        res = milp(total[0], integrality=np.append(np.ones(n * d), np.zeros(stages)), bounds=bounds,
                   constraints=constraints, options=limits)

    placement, status, value = None, "start", np.inf
    if res.x is not None:
        candidate = np.argmax(res.x[:n * d].reshape(n, d), axis=1).astype(np.int64)
        # The solver's tolerances allow a hair over the cap; the cap is checked in whole bytes.
        if (np.bincount(candidate, weights=sizes, minlength=d) <= caps).all():
            placement, status = candidate, stop_status(res.status, time.perf_counter() - began, time_limit)
            value = timed.cost(placement, d)
    if placement is None or upper < value:
        if start is None:
            why = "no placement exists" if res.status == 2 else f"none found in {time_limit:g} s"
            held = f"{caps[0]} bytes" if (caps == caps[0]).all() else f"{caps.min()} to {caps.max()} bytes"
            raise Infeasible(f"MILP: {n} tables on {d} devices of {held}: {why}")
        placement, status, value = np.asarray(start, np.int64), "start", upper
    dual = getattr(res, "mip_dual_bound", None)
    proven = max(float(lower.sum()), dual * scale) if dual is not None and np.isfinite(dual) else float(lower.sum())
    bound = min(value, proven)
    gap = (value - bound) / value if value > 0 else 0.0
    return MilpResult(placement=placement, objective=value, lower_bound=bound, gap=gap, status=status,
                      seconds=time.perf_counter() - began)


def solve_costs(costs: np.ndarray, sizes: np.ndarray, devices: int, capacity: int, **limits) -> MilpResult:
    """The min-max placement of per-table `costs` (`solve` on `Linear.max_device`), from LPT's
    placement where LPT finds one."""
    costs = np.asarray(costs, dtype=float)
    try:
        start = lpt(costs, np.asarray(sizes, dtype=np.int64), devices, capacity)
    except Infeasible:
        start = None
    return solve(Linear.max_device(costs), sizes, devices, capacity, start, **limits)


def _lower_bound(objective: Linear, speeds: np.ndarray) -> np.ndarray:
    """(S,): per stage, a bound its slowest device cannot go below: every device's work over their
    summed speed (with speeds of 1: the average device, offset + total / D), and, where no table's
    value is negative, the offset plus the largest one on the fastest device."""
    values, offsets = objective.share, objective.base
    spread = offsets * (len(speeds) / speeds.sum()) + values.sum(axis=0) / speeds.sum()
    largest = np.where(values.min(axis=0) >= 0, (offsets + values.max(axis=0)) / speeds.max(), -np.inf)
    return np.maximum(np.maximum(spread, largest), 0.0)
