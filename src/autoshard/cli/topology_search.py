"""`autoshard plan --topology FILE --method milp | cost_greedy_local_search`: the exact solver and
the local search on devices that differ in speed and memory, every table whole.

Each starts from the placement every sharded plan makes on the same costs (`placement.sharding.place`
on each table's cost alone, measured here or TorchRec's estimate with `--backend analytic`, for
milp, as lpt_measured places them; predicted by the cost model for the search, as cost_greedy
places them) and improves it under that placement's own objective: the busiest device's costs
over its speed plus its modelled comm, each device within its own memory
(`placement.objective.Speeds`). The MILP (`placement.milp`) solves it until the study's node and
time limits stop it, never worse than its start, its status, proven lower bound and gap in the
plan file; local search (`placement.search`) moves and swaps tables while that objective falls.
On a cluster of like devices, milp solves the tables' single costs and cost_greedy_local_search
searches the cost model's prediction of each device (`cli.service`); on a topology both work on
the per-table sums the plan file reports.
"""

from __future__ import annotations

import time

import numpy as np

from autoshard.cli.defaults import study_defaults
from autoshard.cli.service import FIRST_RUN
from autoshard.cli.sharding_plan import Result
from autoshard.methods.registry import GREEDY, MILP
from autoshard.placement.objective import Linear, Speeds
from autoshard.placement.search import local_search
from autoshard.placement.sharding import Placed
from autoshard.placement.topology import Topology

STARTS = {MILP: FIRST_RUN, "cost_greedy_local_search": GREEDY}  # the method whose placement each improves
METHODS = tuple(STARTS)


def plan(method: str, start: Result, topology: Topology) -> Result:
    """`start` (STARTS[method]'s plan on `topology`, every table whole on the fused kernel: the
    command offers the caching kernel, whose DDR these do not count, only to the methods that do)
    improved by `method`."""
    layouts = [p.layout for p in start.placed]
    costs = np.array([layout.pieces[0].cost for layout in layouts])
    comm = np.array([layout.pieces[0].comm for layout in layouts])
    held = np.array([layout.pieces[0].memory for layout in layouts], dtype=np.int64)
    placement = np.array([p.devices[0] for p in start.placed], dtype=np.int64)
    began = time.perf_counter()
    if method == MILP:
        from autoshard.placement import milp  # SciPy's optimize: half a second the other methods need not pay

        study = study_defaults()
        solved = milp.solve(Linear.max_device(costs), held, topology.devices, topology.memories, placement,
                            node_limit=study["evaluate.milp.node_limit"],
                            time_limit=study["evaluate.milp.time_limit_s"], speeds=topology.speeds,
                            comm=comm[:, None])
        placement = solved.placement
        found = {MILP: {"status": solved.status, "lower_bound_ms": solved.lower_bound, "gap": solved.gap,
                          "from": f"{STARTS[method]}'s placement"}}
    else:
        objective = Speeds(Linear.max_device(costs), topology.speeds, comm[:, None])
        placement = local_search(objective, held, topology.devices, topology.memories, placement)
        found = {"search": {"from": f"{STARTS[method]}'s placement", "what": "moves and swaps of whole tables while "
                            "the busiest device's costs over its speed plus its comm fall (placement.search)"}}
    placed = [Placed(layout, (int(d),)) for layout, d in zip(layouts, placement, strict=True)]
    return Result(placed, start.seconds + time.perf_counter() - began, {**start.costs, **found})
