"""The sync methods as planners of a task: `sync_greedy` (`sync`), `sync_local_search` from its
plan (`sync_search`) and `sync_milp` from that one's (`sync_milp`); given the policy trained on
the synchronized reward, `rl_sync_greedy` and `rl_sync_local_search` (the same search from it).

Each step of a task's chain runs once: the planners share a per-task record of the inputs and
the plans made so far (or why there is none), so the local search starts from the greedy plan
already made and the MILP from the local search's, whatever order the planners are called in.
Each step is timed once, so a planner's `seconds(task)` is its whole chain's time, reused steps
included: what making its plan from scratch costs.
"""

import time
from collections.abc import Callable

import numpy as np
import pandas as pd

from autoshard.core.errors import ConfigError
from autoshard.data.tasks import Task
from autoshard.measure.commmodel import CommModel
from autoshard.placement.heuristics import Infeasible
from autoshard.placement.milp import MilpResult
from autoshard.placement.surrogate import MilpConfig
from autoshard.placement.sync import sync_greedy
from autoshard.placement.sync_milp import solve_sync
from autoshard.placement.sync_search import comm_lines, sync_local_search

Inputs = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def planners(forward: np.ndarray, backward: np.ndarray, pool_features: pd.DataFrame, comm_model: CommModel,
             batch_size: int, milp: MilpConfig | None = None, seed: int = 0,
             solves: dict[str, MilpResult] | None = None,
             learned: Callable[[Task], np.ndarray] | None = None) -> dict[str, Callable[[Task], np.ndarray]]:
    """`sync_greedy`, `sync_local_search` (from its plan) and, with `milp` (its limits), `sync_milp`
    (bounded by, and never worse than, sync_local_search's plan) over per-pool-table measured single
    forward and backward costs, with the comm model at `batch_size`; a task with a table not
    measured alone gets no plan (a `ConfigError` naming the tables). Each MILP solve is kept in
    `solves` by task name when given. With `learned` (the policy trained on the synchronized
    reward), also `rl_sync_greedy` (its plan) and `rl_sync_local_search` (the same moves and swaps
    from it), the RL counterparts of sync_greedy and sync_local_search."""
    dims = pool_features["dim"].to_numpy(float)
    sizes = pool_features["size_bytes"].to_numpy(np.int64)
    done: dict[Task, dict[str, object]] = {}  # per task: step -> its result, or the error it raised
    elapsed: dict[Task, dict[str, float]] = {}  # per task: step -> seconds it took (its own part)

    def comm(widths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return comm_model.predict_arrays(widths, batch_size)

    def once(t: Task, step: str, make: Callable[[Task], object]) -> object:
        """The result of `step` for `t`, made (and timed) on the first call; its error raised again
        on later calls. Callers make the steps a step needs first, so each time is the step's own."""
        steps = done.setdefault(t, {})
        if step not in steps:
            start = time.perf_counter()
            try:
                steps[step] = make(t)
            except ConfigError as exc:  # Infeasible too (a subclass)
                steps[step] = exc
            elapsed.setdefault(t, {})[step] = time.perf_counter() - start
        if isinstance(steps[step], Exception):
            raise steps[step]
        return steps[step]

    def chained(plan: Callable[[Task], np.ndarray], chain: tuple[str, ...]) -> Callable[[Task], np.ndarray]:
        """`plan` with `plan.seconds(task)`: the time of every step of its chain, made now or reused."""
        plan.seconds = lambda t: sum(elapsed.get(t, {}).get(step, 0.0) for step in chain)
        return plan

    def make_inputs(t: Task) -> Inputs:
        ids = list(t.tables)
        missing = [t.tables[k] for k in np.flatnonzero(np.isnan(forward[ids]) | np.isnan(backward[ids]))]
        if missing:
            raise ConfigError(f"task {t.name}: no single-table measurement of tables {missing}")
        lines = comm_lines(comm_model, t.devices, batch_size, float(dims[ids].sum()))
        return forward[ids], backward[ids], dims[ids], sizes[ids], lines

    def inputs(t: Task) -> Inputs:
        return once(t, "inputs", make_inputs)

    def greedy(t: Task) -> np.ndarray:
        f, b, w, s, _ = inputs(t)
        return once(t, "greedy", lambda t: sync_greedy(f, b, w, s, t.devices, t.memory_bytes, comm)).copy()

    def refined(t: Task) -> np.ndarray:
        begin = greedy(t)
        f, b, w, s, lines = inputs(t)
        return once(t, "refined", lambda t: sync_local_search(f, b, w, s, t.devices, t.memory_bytes, lines,
                                                              begin)).copy()

    def exact(t: Task) -> np.ndarray:
        try:
            begin = refined(t)  # the MILP's plan may be its start
        except Infeasible:
            begin = None
        f, b, w, s, lines = inputs(t)

        def solve(t: Task) -> np.ndarray:
            result = solve_sync(f, b, w, s, t.devices, t.memory_bytes, lines, begin,
                                time_limit=milp.time_limit_s, node_limit=milp.node_limit, seed=seed)
            if solves is not None:
                solves[t.name] = result
            return result.placement

        return once(t, "exact", solve)

    def policy(t: Task) -> np.ndarray:
        return once(t, "policy", learned).copy()

    def policy_refined(t: Task) -> np.ndarray:
        begin = policy(t)
        f, b, w, s, lines = inputs(t)
        return once(t, "policy_refined", lambda t: sync_local_search(f, b, w, s, t.devices, t.memory_bytes, lines,
                                                                     begin)).copy()

    rl = {"rl_sync_greedy": chained(policy, ("policy",)),
          "rl_sync_local_search": chained(policy_refined, ("policy", "inputs", "policy_refined"))} if learned else {}
    return {"sync_greedy": chained(greedy, ("inputs", "greedy")),
            "sync_local_search": chained(refined, ("inputs", "greedy", "refined")),
            **({"sync_milp": chained(exact, ("inputs", "greedy", "refined", "exact"))} if milp else {}), **rl}
