"""sync_milp: the exact placement on the predicted synchronized-stages objective, by a MILP.

Over binary x[t, d] (table t on device d) and one bound z_s per stage s, the surrogate is the
one `sync_greedy` and `sync_local_search` predict: a device's forward (backward) compute is the
sum of its tables' measured single forward (backward) costs, its all-to-all in each direction a
line in its summed width (`sync_search.comm_lines`, clipped at 0 as the comm model is: z_s >= 0
covers the clip). The model:

    minimise z_0 + z_1 + z_2 + z_3  s.t.  sum_d x[t, d] = 1,
        sum_t f_t x[t, d] <= z_0,  a_f + b_f sum_t w_t x[t, d] <= z_1,
        a_b + b_b sum_t w_t x[t, d] <= z_2,  sum_t g_t x[t, d] <= z_3,  sum_t size_t x[t, d] <= cap.

The devices are identical, so the mirror images are removed as in `placement.milp`; the
starting plan (sync_local_search's, in the evaluate stage) bounds the objective from above and stands in when the solver
finds nothing better within its limits (status "start"). HiGHS on one thread, seeded.
"""

import time
import warnings

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_array, eye_array, hstack, kron

from autoshard.placement.heuristics import Infeasible
from autoshard.placement.milp import MilpResult, stop_status
from autoshard.placement.sync import placement_cost
from autoshard.placement.sync_search import line_comm


def predicted_cost(forward: np.ndarray, backward: np.ndarray, dims: np.ndarray, placement: np.ndarray,
                   devices: int, lines: np.ndarray) -> float:
    """The surrogate synchronized cost of a full placement (`sync.placement_cost` on the comm `lines`)."""
    return placement_cost(forward, backward, dims, placement, devices, line_comm(lines))


def solve_sync(forward: np.ndarray, backward: np.ndarray, dims: np.ndarray, sizes: np.ndarray, devices: int,
               capacity: int, lines: np.ndarray, start: np.ndarray | None = None, time_limit: float = 60.0,
               node_limit: int | None = None, rel_gap: float = 1e-3, seed: int = 0) -> MilpResult:
    """Minimise the predicted synchronized cost under the memory cap (see the module's docstring).
    Raises `Infeasible` when the solver finds no placement and there is no `start`."""
    began = time.perf_counter()
    forward, backward = np.asarray(forward, float), np.asarray(backward, float)
    dims, sizes = np.asarray(dims, float), np.asarray(sizes, np.int64)
    n, d = len(forward), devices
    scale = float(np.mean(forward + backward)) or 1.0  # keeps the coefficients near 1
    upper = predicted_cost(forward, backward, dims, start, d, lines) if start is not None else np.inf

    rows = [forward, dims * lines[0, 1], dims * lines[1, 1], backward]
    offsets = [0.0, lines[0, 0], lines[1, 0], 0.0]
    stage = [hstack([kron(row[None, :] / scale, eye_array(d)), coo_array(-np.eye(4)[[s]].repeat(d, axis=0))])
             for s, row in enumerate(rows)]
    one_each = hstack([kron(eye_array(n), np.ones((1, d))), coo_array((n, 4))])
    memory = hstack([kron(sizes[None, :] / capacity, eye_array(d)), coo_array((d, 4))])
    constraints = [LinearConstraint(one_each, 1, 1), LinearConstraint(memory, -np.inf, 1),
                   *(LinearConstraint(a, -np.inf, -offsets[s] / scale) for s, a in enumerate(stage))]
    ub = np.ones((n, d))
    for rank, t in enumerate(np.argsort(-(forward + backward), kind="stable")):
        ub[t, rank + 1:] = 0  # the mirror images, as in placement.milp
    bounds = Bounds(np.zeros(n * d + 4), np.append(ub.ravel(), np.full(4, np.inf)))
    total = LinearConstraint(np.append(np.zeros(n * d), np.ones(4))[None, :], 0,
                             upper / scale * (1 + 1e-9) if np.isfinite(upper) else np.inf)

    limits = {"time_limit": float(time_limit), "mip_rel_gap": float(rel_gap), "threads": 1, "random_seed": int(seed)}
    if node_limit is not None:
        limits["node_limit"] = int(node_limit)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Unrecognized options", RuntimeWarning)
        res = milp(np.append(np.zeros(n * d), np.ones(4)), integrality=np.append(np.ones(n * d), np.zeros(4)),
                   bounds=bounds, constraints=[*constraints, total], options=limits)

    placement, status, value = None, "start", np.inf
    if res.x is not None:
        candidate = np.argmax(res.x[:n * d].reshape(n, d), axis=1).astype(np.int64)
        if np.bincount(candidate, weights=sizes, minlength=d).max() <= capacity:  # the cap in whole bytes
            placement, status = candidate, stop_status(res.status, time.perf_counter() - began, time_limit)
            value = predicted_cost(forward, backward, dims, placement, d, lines)
    if placement is None or upper < value:
        if start is None:
            raise Infeasible(f"sync MILP: {n} tables on {d} devices of {capacity} bytes: no placement found")
        placement, status, value = np.asarray(start, np.int64), "start", upper
    dual = getattr(res, "mip_dual_bound", None)
    lower = min(value, max(0.0, dual * scale)) if dual is not None and np.isfinite(dual) else 0.0
    gap = (value - lower) / value if value > 0 else 0.0
    return MilpResult(placement=placement, objective=value, lower_bound=lower, gap=gap, status=status,
                      seconds=time.perf_counter() - began)
