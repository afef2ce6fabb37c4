"""The exact min-max placement on a linear per-table surrogate, by a MILP (HiGHS via SciPy).

The surrogate cost of a device is the sum of its tables' costs (measured single-table costs,
or a cost model's single-table predictions): the idea SurCo applied to table sharding. The
model, over binary x[t, d] (table t on device d) and the bottleneck z:

    minimise z  s.t.  sum_d x[t, d] = 1,  sum_t c_t x[t, d] <= z,  sum_t size_t x[t, d] <= cap.

The devices are identical, so any placement can be renumbered so that the k-th table in
decreasing cost sits on one of the devices 0..k; fixing that removes most of the D! mirror
images of each solution. LPT's plan bounds z from above (SciPy's `milp` takes no warm start)
and stands in when the solver finds nothing within its time limit. HiGHS runs on one thread
with a fixed seed, so a solve that ends before its time limit is repeatable.
"""

import time
import warnings
from dataclasses import dataclass

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_array, eye_array, hstack, kron

from autoshard.placement.heuristics import Infeasible
from autoshard.placement.lpt import lpt, makespan


@dataclass(frozen=True)
class MilpResult:
    """A placement with its surrogate bottleneck, the proven lower bound on the optimum and the
    relative gap between them (0: proven optimal, up to the solver's `rel_gap`)."""

    placement: np.ndarray
    objective: float
    lower_bound: float
    gap: float
    status: str  # "optimal"; "node_limit" or "time_limit": the solver's best plan when it stopped there;
    # "fallback": LPT's plan (the solver found none, or none as good)
    seconds: float


def stop_status(solver_status: int, seconds: float, time_limit: float) -> str:
    """Why HiGHS stopped: "optimal" (gap closed), else "time_limit" when the clock ran out and
    "node_limit" otherwise (SciPy reports both limits as status 1)."""
    if solver_status == 0:
        return "optimal"
    return "time_limit" if seconds >= 0.95 * time_limit else "node_limit"


def solve(costs: np.ndarray, sizes: np.ndarray, devices: int, capacity: int,
          time_limit: float = 60.0, rel_gap: float = 1e-3, seed: int = 0,
          node_limit: int | None = None) -> MilpResult:
    """Minimise the largest per-device sum of `costs` under the memory cap `capacity`, within
    `time_limit` seconds. A solve stopped by the clock depends on the machine's speed; one
    stopped by `node_limit` (branch-and-bound nodes) does not. The default `rel_gap` (0.1%)
    is far below the measurement noise (2-3%). Raises `Infeasible` when no placement exists, or none is found in
    time and LPT finds none either."""
    start = time.perf_counter()
    costs = np.asarray(costs, dtype=float)
    sizes = np.asarray(sizes, dtype=np.int64)
    n, d = len(costs), devices
    if costs.shape != sizes.shape or costs.ndim != 1 or n == 0:
        raise ValueError(f"costs {costs.shape} and sizes {sizes.shape} must be non-empty vectors of one length")
    if d < 1:
        raise ValueError(f"devices: {devices} (need at least one)")
    try:
        fallback = lpt(costs, sizes, d, capacity)
    except Infeasible:
        fallback = None
    scale = float(costs.mean()) or 1.0  # keeps the load rows' coefficients near 1
    bound = max(float(costs.max()), float(costs.sum()) / d)  # holds with or without the cap
    upper = makespan(costs, fallback, d) if fallback is not None else np.inf

    constraints, bounds = _model(costs / scale, sizes / capacity, d, bound / scale, upper / scale)
    objective = np.zeros(n * d + 1)
    objective[-1] = 1.0
    integrality = np.append(np.ones(n * d), 0)

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Unrecognized options", RuntimeWarning)
        res = milp(objective, integrality=integrality, bounds=bounds, constraints=constraints,
                   options={"time_limit": float(time_limit), "mip_rel_gap": float(rel_gap),
                            "threads": 1, "random_seed": int(seed)}
                   | ({"node_limit": int(node_limit)} if node_limit is not None else {}))

    dual = getattr(res, "mip_dual_bound", None)
    proven = max(bound, dual * scale) if dual is not None and np.isfinite(dual) else bound
    placement, status = None, "fallback"
    if res.x is not None:
        candidate = np.argmax(res.x[:-1].reshape(n, d), axis=1).astype(np.int64)
        # The solver's tolerances allow a hair over the cap; the cap is checked in whole bytes.
        if np.bincount(candidate, weights=sizes, minlength=d).max() <= capacity:
            placement, status = candidate, stop_status(res.status, time.perf_counter() - start, time_limit)
    if placement is None or (fallback is not None and makespan(costs, fallback, d) < makespan(costs, placement, d)):
        if fallback is None:
            why = "no placement exists" if res.status == 2 else f"none found in {time_limit:g} s"
            raise Infeasible(f"MILP: {n} tables on {d} devices of {capacity} bytes: {why}")
        placement, status = fallback, "fallback"
    value = makespan(costs, placement, d)
    lower = min(proven, value)
    gap = (value - lower) / value if value > 0 else 0.0
    return MilpResult(placement=placement, objective=value, lower_bound=lower, gap=gap, status=status,
                      seconds=time.perf_counter() - start)


def _model(costs: np.ndarray, fill: np.ndarray, d: int, lower: float, upper: float
           ) -> tuple[list[LinearConstraint], Bounds]:
    """The constraints and bounds over the columns x[t, dev] (at t * d + dev), then z; `fill`
    is each table's share of a device's memory, `lower` and `upper` bound z."""
    n = len(costs)
    one_each = hstack([kron(eye_array(n), np.ones((1, d))), coo_array((n, 1))])
    load = hstack([kron(costs[None, :], eye_array(d)), -np.ones((d, 1))])
    memory = hstack([kron(fill[None, :], eye_array(d)), coo_array((d, 1))])
    constraints = [LinearConstraint(one_each, 1, 1), LinearConstraint(load, -np.inf, 0),
                   LinearConstraint(memory, -np.inf, 1)]
    ub = np.ones((n, d))
    for rank, t in enumerate(np.argsort(-costs, kind="stable")):
        ub[t, rank + 1:] = 0  # the mirror images: see the module's docstring
    lb = np.append(np.zeros(n * d), lower)
    ub = np.append(ub.ravel(), upper * (1 + 1e-9) if np.isfinite(upper) else np.inf)
    return constraints, Bounds(lb, ub)
