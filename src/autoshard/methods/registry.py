"""Every placement method of the study: one entry each, and the one place that builds them.

An entry names the method (`id`, the same everywhere), what it is compared as (`kind`), the
objective it optimises, its tags (which studies and views use it), what it needs from the
`Artifacts`, and a `build` function that makes its planner. Every caller (the stages, the command,
the findings and the report) ask `build` for planners and `ids` for lists of ids, so a
new method is one entry in `METHODS_LIST` and one build function (the README's "Adding a method"
shows one).

A build may start from another method's placement (`ctx.plan(id, task)`) or share an input with
it (`ctx.once`): each is made once per task and timed once (`chain.Steps`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from autoshard.core.errors import ConfigError
from autoshard.data.tasks import Task
from autoshard.methods.artifacts import NEEDS, Artifacts, Settings
from autoshard.methods.chain import Steps
from autoshard.placement.greedy import Infeasible
from autoshard.placement.heuristics import HEURISTICS, heuristic_plan
from autoshard.placement.types import Planner, SplitPlanner

MAX_DEVICE, SYNCHRONIZED = "max_device", "synchronized_stages"  # the objectives a method may optimise

# Roles the study's comparisons are written in.
POLICY = "rl_greedy"            # the trained policy, greedy: the learned sharder the study is about
GREEDY = "cost_greedy"          # greedy placement on the policy's own cost model: its twin
REFINED = "rl_local_search"     # the policy's placement refined by local search
SAMPLED = "rl_best_of_n"        # the best of N placements sampled from the policy
FAIR = "rl_fair_greedy"         # the fair learned sharder, greedy: sees what cost_greedy sees, starts from it
LPT = "lpt_measured"            # LPT on the profile's measured single costs: an engineer's profiler baseline
TORCHREC = "torchrec"           # TorchRec's own planner: the one our users would otherwise run
MILP = "milp"                   # the off-the-shelf solver (HiGHS) on the same measured costs
OPTIMUM = "exact"               # exhaustive search under the cost model (small tasks)
BEST_HEURISTIC = "best_heuristic"  # not a method: per task, the heuristic whose plan measured fastest


class Context:
    """What a build may use besides the artifacts: other methods' placements of a task and
    shared inputs (each made once), and a record of its solves."""

    def __init__(self, built: Built, method: str):
        self._built, self.method = built, method

    def plan(self, method: str, task: Task) -> np.ndarray:
        """`method`'s placement of `task` in this build (made once, shared)."""
        return self._built.planner(method)(task)

    def once(self, task: Task, step: str, make: Callable[[], object]) -> object:
        """An input shared by several methods of this build, made on its first call for `task`."""
        return self._built.steps.once(task, step, make)

    def record(self, task: Task, result: object) -> None:
        """Keep `result` (a MILP solve) under this method and the task's name: `Built.solves`."""
        self._built.solves.setdefault(self.method, {})[task.name] = result


Build = Callable[[Artifacts, Settings, Context], Planner | SplitPlanner]


@dataclass(frozen=True)
class Method:
    """A placement method: `kind` heuristic | baseline | rl | optimum | column (a column-wise
    method: its build makes a `SplitPlanner`, with `Settings.ways`); `needs`, alternatives of
    `Artifacts` fields (any one set suffices); `objective`, the one it optimises (planned only for
    protocols ranked by it when that is not `MAX_DEVICE`); `only`, the one protocol it runs on."""

    id: str
    kind: str
    build: Build
    needs: tuple[tuple[str, ...], ...] = ((),)
    tags: frozenset[str] = frozenset()
    objective: str = MAX_DEVICE
    only: str | None = None
    summary: str = ""

    def __post_init__(self) -> None:
        unknown = {n for group in self.needs for n in group} - set(NEEDS)
        if unknown:
            raise ValueError(f"method {self.id}: needs unknown artifacts {sorted(unknown)}")

    def missing(self, artifacts: Artifacts) -> tuple[str, ...] | None:
        """None when one set of its needs is met, else the first set's missing fields."""
        gaps = [artifacts.missing(group) for group in self.needs]
        return None if any(not g for g in gaps) else gaps[0]


# ---- the builds ----------------------------------------------------------------------------

def _heuristic(name: str) -> Build:
    return lambda a, s, ctx: lambda t: heuristic_plan(name, a.pool_features, t, s.seed)


def _torchrec(a: Artifacts, s: Settings, ctx: Context) -> Planner:
    from autoshard.placement.torchrec import torchrec_plan

    return lambda t: torchrec_plan(a.pool_features, t, s.batch_size, compute_device=s.device)


def _cost_greedy(a: Artifacts, s: Settings, ctx: Context) -> Planner:
    if a.numpy is not None:
        return lambda t: _numpy_place(a, t, policy=False)
    from autoshard.rl.infer import cost_greedy

    return lambda t: cost_greedy(a.cost_model, a.features, [t])[0]


def _policy_greedy(a: Artifacts, s: Settings, ctx: Context) -> Planner:
    if a.numpy is not None:
        return lambda t: _numpy_place(a, t, policy=True)
    from autoshard.rl.infer import policy_plans

    return lambda t: policy_plans(a.policy, a.cost_model, a.features, [t])[0]


def _numpy_place(a: Artifacts, t: Task, policy: bool) -> np.ndarray:
    ids = list(t.tables)
    return a.numpy.place(a.features[ids], a.sizes[ids], t.devices, t.memory_bytes, t.name, policy=policy)


def _fair_greedy(a: Artifacts, s: Settings, ctx: Context) -> Planner:
    from autoshard.rl.infer import policy_plans

    return lambda t: policy_plans(a.fair_policy, a.cost_model, a.features, [t])[0]


def _best_of_n(a: Artifacts, s: Settings, ctx: Context) -> Planner:
    from autoshard.rl.infer import policy_plans

    return lambda t: policy_plans(a.policy, a.cost_model, a.features, [t], s.best_of, seed=s.seed_for(t))[0]


def _local_search_from(start: str) -> Build:
    def build(a: Artifacts, s: Settings, ctx: Context) -> Planner:
        from autoshard.placement.search import model_search

        model = a.numpy if a.numpy is not None else a.cost_model
        return lambda t: model_search(model, a.features, t, ctx.plan(start, t))
    return build


def _hybrid_greedy(a: Artifacts, s: Settings, ctx: Context) -> Planner:
    from autoshard.rl.infer import cost_greedy

    return lambda t: cost_greedy(a.hybrid, a.hybrid_features, [t])[0]


def _measured_costs(costs: np.ndarray, t: Task, *others: np.ndarray) -> np.ndarray:
    """The per-table costs of a task's tables; a table never measured alone (NaN in `costs` or in
    any of `others`) is an error naming it."""
    ids = list(t.tables)
    unknown = np.isnan(costs[ids])
    for other in others:
        unknown |= np.isnan(other[ids])
    if unknown.any():
        missing = [t.tables[i] for i in np.flatnonzero(unknown)]
        raise ConfigError(f"task {t.name}: no single-table measurement of tables {missing}")
    return costs[ids]


def _lpt(a: Artifacts, s: Settings, ctx: Context) -> Planner:
    from autoshard.placement.lpt import lpt

    return lambda t: lpt(_measured_costs(a.single_costs, t), a.sizes[list(t.tables)], t.devices, t.memory_bytes)


def _milp(a: Artifacts, s: Settings, ctx: Context) -> Planner:
    from autoshard.placement.milp import solve_costs

    def plan(t: Task) -> np.ndarray:
        result = solve_costs(_measured_costs(a.single_costs, t), a.sizes[list(t.tables)], t.devices, t.memory_bytes,
                             time_limit=s.milp.time_limit_s, seed=s.seed, node_limit=s.milp.node_limit)
        ctx.record(t, result)
        return result.placement
    return plan


def _sync_inputs(a: Artifacts, s: Settings, ctx: Context, t: Task) -> tuple:
    """(forward, backward, dims, sizes, comm lines) of a task's tables for the sync planners."""
    def make() -> tuple:
        from autoshard.placement.objective import comm_lines

        forward, backward = a.stage_singles
        ids = list(t.tables)
        dims = a.pool_features["dim"].to_numpy(float)[ids]
        lines = comm_lines(a.comm_model, t.devices, s.batch_size, float(dims.sum()))
        return _measured_costs(forward, t, backward), backward[ids], dims, a.sizes[ids], lines
    return ctx.once(t, "sync inputs", make)


def _sync_objective(a: Artifacts, s: Settings, ctx: Context, t: Task) -> tuple:
    """(the synchronized objective, sizes) of a task's tables."""
    from autoshard.placement.objective import Linear

    f, b, w, z, lines = _sync_inputs(a, s, ctx, t)
    return Linear.synchronized(f, b, w, lines), z


def _sync_greedy(a: Artifacts, s: Settings, ctx: Context) -> Planner:
    from autoshard.placement.sync import sync_greedy

    def plan(t: Task) -> np.ndarray:
        f, b, w, z, lines = _sync_inputs(a, s, ctx, t)
        return sync_greedy(f, b, w, z, t.devices, t.memory_bytes, lines)
    return plan


def _sync_search_from(start: str) -> Build:
    def build(a: Artifacts, s: Settings, ctx: Context) -> Planner:
        from autoshard.placement.search import local_search

        def plan(t: Task) -> np.ndarray:
            begin = ctx.plan(start, t)
            objective, sizes = _sync_objective(a, s, ctx, t)
            return local_search(objective, sizes, t.devices, t.memory_bytes, begin)
        return plan
    return build


def _sync_milp(a: Artifacts, s: Settings, ctx: Context) -> Planner:
    from autoshard.placement.milp import solve

    def plan(t: Task) -> np.ndarray:
        try:
            begin = ctx.plan("sync_local_search", t)  # bounded by, and never worse than, its plan
        except Infeasible:
            begin = None
        objective, sizes = _sync_objective(a, s, ctx, t)
        result = solve(objective, sizes, t.devices, t.memory_bytes, begin,
                       time_limit=s.milp.time_limit_s, node_limit=s.milp.node_limit, seed=s.seed)
        ctx.record(t, result)
        return result.placement
    return plan


def _sync_policy(a: Artifacts, s: Settings, ctx: Context) -> Planner:
    from autoshard.rl.infer import policy_plans

    return lambda t: policy_plans(a.sync_policy, a.stages_model, a.features, [t])[0]


def _exact(a: Artifacts, s: Settings, ctx: Context) -> Planner:
    from autoshard.placement.exact import exact_plan

    return lambda t: exact_plan(a.cost_model, a.features, t)


# ---- the entries ---------------------------------------------------------------------------

def _column_greedy(a: Artifacts, s: Settings, ctx: Context) -> SplitPlanner:
    from autoshard.placement.column_split import split_then_place

    def plan(t: Task) -> tuple[list, np.ndarray]:
        result = split_then_place(a.cost_model, a.pool_features, t, s.ways, s.candidates)
        return result.shards, result.placement
    return plan


def _table_costs(a: Artifacts) -> dict[int, float]:
    """The measured single costs by pool table id, as the column splits read them."""
    return dict(enumerate(np.asarray(a.single_costs, dtype=float)))


def _column_lpt(a: Artifacts, s: Settings, ctx: Context) -> SplitPlanner:
    from autoshard.placement.column_split import lpt_split

    costs = _table_costs(a)
    return lambda t: lpt_split(costs, a.pool_features, t, s.ways)


def _column_milp(a: Artifacts, s: Settings, ctx: Context) -> SplitPlanner:
    from autoshard.placement.column_split import milp_split

    costs = _table_costs(a)
    return lambda t: milp_split(costs, a.pool_features, t, s.ways, s.milp.node_limit, s.milp.time_limit_s, s.seed)


def _torchrec_column(a: Artifacts, s: Settings, ctx: Context) -> SplitPlanner:
    from autoshard.placement.column_split import ColumnShard
    from autoshard.placement.torchrec import torchrec_column_plan

    dims = a.pool_features["dim"].to_numpy(dtype=np.int64)

    def plan(t: Task) -> tuple[list, np.ndarray]:
        planned = torchrec_column_plan(a.pool_features, t, s.batch_size, max(s.ways))
        return ([ColumnShard(table, start, width, int(dims[table])) for table, start, width, _ in planned],
                np.array([rank for *_, rank in planned], dtype=np.int64))
    return plan


def _tags(*names: str) -> frozenset[str]:
    return frozenset(names)


SIMULATOR = (("cost_model",), ("numpy",))         # the policy's cost model, torch or exported
POLICY_AND_SIMULATOR = (("cost_model", "policy"), ("numpy",))
SYNC = (("stage_singles", "comm_model"),)
_TIMED_HEURISTICS = ("lookup_greedy", "size_lookup_greedy")  # the heuristics the speed table times

METHODS_LIST: tuple[Method, ...] = (
    *(Method(h, "heuristic", _heuristic(h), tags=_tags("command", "transfer", *(("speed",) if h in _TIMED_HEURISTICS
                                                                             else ())),
             summary="the prototypes' heuristic, respecting memory") for h in HEURISTICS),
    Method(GREEDY, "baseline", _cost_greedy, SIMULATOR,
           tags=_tags("command", "learned", "compared", "reference", "replicate", "transfer", "speed", "shown",
                      "predicted"),
           summary="largest predicted table first onto the device with the lowest predicted cost after it"),
    Method("cost_greedy_local_search", "baseline", _local_search_from(GREEDY), SIMULATOR,
           tags=_tags("command", "learned", "compared", "replicate", "speed"),
           summary="cost_greedy refined by local search on the cost model"),
    Method("hybrid_greedy", "baseline", _hybrid_greedy, (("hybrid", "hybrid_features"),),
           tags=_tags("speed", "headline", "shown"),
           summary="cost_greedy on the hybrid cost model (measured single costs x a learnt fusion factor)"),
    Method(LPT, "baseline", _lpt, (("single_costs",),),
           tags=_tags("compared", "reference", "speed", "shown"),
           summary="LPT on the profile's measured single-table costs: largest first onto the least-loaded device"),
    Method(MILP, "baseline", _milp, (("single_costs",),),
           tags=_tags("compared", "reference", "shown", "solver", "limits"),
           summary="exact min-max MILP (HiGHS) on the measured single-table costs, node- and time-limited"),
    Method("torchrec", "baseline", _torchrec, tags=_tags("command", "compared", "reference", "speed"),
           summary="TorchRec's EmbeddingShardingPlanner, table-wise"),
    Method("sync_greedy", "baseline", _sync_greedy, SYNC, tags=_tags("compared", "speed"), objective=SYNCHRONIZED,
           summary="largest measured single cost first onto the device with the lowest predicted synchronized-"
                   "stages cost (measured single forward/backward costs summed, comm model)"),
    Method("sync_local_search", "baseline", _sync_search_from("sync_greedy"), SYNC, tags=_tags("compared", "speed"),
           objective=SYNCHRONIZED,
           summary="sync_greedy refined by moves and swaps on the predicted synchronized-stages cost"),
    Method("sync_milp", "baseline", _sync_milp, SYNC, tags=_tags("compared", "solver", "limits"),
           objective=SYNCHRONIZED,
           summary="exact MILP (HiGHS) on the predicted synchronized-stages cost (per-stage linear surrogate), "
                   "node- and time-limited, from sync_local_search's plan"),
    Method(POLICY, "rl", _policy_greedy, POLICY_AND_SIMULATOR,
           tags=_tags("command", "learned", "compared", "replicate", "transfer", "speed", "headline", "shown",
                      "predicted"),
           summary="the trained policy, greedy"),
    Method(FAIR, "rl", _fair_greedy, (("cost_model", "fair_policy"),),
           tags=_tags("compared", "replicate", "headline", "shown", "predicted", "speed"),
           summary="the fair learned sharder, greedy: the policy with cost_greedy's view (each device's cost after "
                   "placing), per-step rewards, started by cloning cost_greedy (rl.fair_policy)"),
    Method(SAMPLED, "rl", _best_of_n, (("cost_model", "policy"),),
           tags=_tags("command", "learned", "compared", "speed"),
           summary="the best of N sampled placements by predicted bottleneck (torch: sampling)"),
    Method(REFINED, "rl", _local_search_from(POLICY), POLICY_AND_SIMULATOR,
           tags=_tags("command", "learned", "compared", "replicate", "speed", "headline", "shown", "predicted"),
           summary="the greedy policy's placement refined by local search on the cost model"),
    Method("rl_sync_greedy", "rl", _sync_policy, (("sync_policy", "stages_model", *SYNC[0]),),
           tags=_tags("compared"), objective=SYNCHRONIZED,
           summary="the policy trained on the predicted synchronized-stages cost (stage-head cost model, comm "
                   "model), greedy"),
    Method("rl_sync_local_search", "rl", _sync_search_from("rl_sync_greedy"),
           (("sync_policy", "stages_model", *SYNC[0]),), tags=_tags("compared"), objective=SYNCHRONIZED,
           summary="rl_sync_greedy's placement refined by sync_local_search's moves and swaps on the predicted "
                   "synchronized-stages cost"),
    Method(OPTIMUM, "optimum", _exact, (("cost_model",),), only="small",
           summary="exhaustive search under the cost model (small tasks)"),
)
# The column-wise methods (the column study's): each splits tables into `Settings.ways` column
# shards; with ways (1,) it is its own table-wise twin (`studies.columns.TWIN` names the twins).
COLUMN_LIST: tuple[Method, ...] = (
    Method("column_greedy", "column", _column_greedy, (("cost_model",),), tags=_tags("columns"),
           summary="split-then-place on the cost model: a greedy search over which tables to split, each candidate "
                   "set placed greedily on the cost model"),
    Method("column_lpt", "column", _column_lpt, (("single_costs",),), tags=_tags("columns"),
           summary="the tables costlier than a balanced device split just enough (measured single costs scaled "
                   "by width), then LPT"),
    Method("column_milp", "column", _column_milp, (("single_costs",),), tags=_tags("columns", "limits"),
           summary="column_lpt's split, then the MILP on the column shards"),
    Method("torchrec_column", "column", _torchrec_column, tags=_tags("columns"),
           summary="TorchRec's planner with column-wise shards allowed"),
)
REGISTRY: dict[str, Method] = {m.id: m for m in (*METHODS_LIST, *COLUMN_LIST)}
METHODS: tuple[str, ...] = tuple(m.id for m in METHODS_LIST)  # the table-wise methods, what the stages plan
COLUMNS: tuple[str, ...] = tuple(m.id for m in COLUMN_LIST)
KIND: dict[str, str] = {m.id: m.kind for m in REGISTRY.values()}

# The paired figure's comparisons: method against reference.
FIGURE_PAIRS = ((POLICY, GREEDY), (REFINED, GREEDY), (POLICY, LPT), (POLICY, MILP),
                (GREEDY, LPT), (MILP, BEST_HEURISTIC), (POLICY, BEST_HEURISTIC),
                ("torchrec", BEST_HEURISTIC))


def ids(tag: str | None = None, kind: str | None = None, objective: str | None = None) -> tuple[str, ...]:
    """The ids of the methods with `tag`, of `kind` and optimising `objective` (each if given), in
    registry order."""
    return tuple(m.id for m in REGISTRY.values() if (tag is None or tag in m.tags) and (kind is None or m.kind == kind)
                 and (objective is None or m.objective == objective))


def needs(methods: tuple[str, ...] | list[str]) -> set[str]:
    """Every artifact any of `methods` may use (each of its alternatives): what to load for them."""
    return {n for m in methods for group in check(m, "methods").needs for n in group}


def check(method: str, option: str = "--method") -> Method:
    """The entry of `method`, or a `ConfigError` naming `option` and the known ids."""
    if method not in REGISTRY:
        raise ConfigError(f"{option}: {method!r} (expected one of {', '.join(REGISTRY)})")
    return REGISTRY[method]


@dataclass
class Built:
    """Planners of the methods asked for, sharing their steps (a start of another's chain is made
    here too, but not listed); `left_out` says why a method asked for is not among them; `solves`
    the MILP solves per method and task."""

    artifacts: Artifacts
    settings: Settings
    planners: dict[str, Planner | SplitPlanner] = field(default_factory=dict)
    left_out: dict[str, str] = field(default_factory=dict)
    solves: dict[str, dict[str, object]] = field(default_factory=dict)
    steps: Steps = field(default_factory=Steps)
    made: dict[str, Planner | SplitPlanner] = field(default_factory=dict)  # starts of chains included

    def planner(self, method: str) -> Planner | SplitPlanner:
        """`method`'s planner in this build, built on first use."""
        if method not in self.made:
            entry = REGISTRY[method]
            gap = entry.missing(self.artifacts)
            if gap is not None:
                raise ConfigError(f"method {method}: needs {', '.join(gap)}, which this run has not got")
            raw = entry.build(self.artifacts, self.settings, Context(self, method))
            self.made[method] = _chained(self.steps, method, raw, entry.kind == "column")
        return self.made[method]


def _chained(steps: Steps, method: str, raw: Planner | SplitPlanner, split: bool = False) -> Planner | SplitPlanner:
    """`raw` made once per task through `steps`, with `seconds(task)`: the time of its whole chain
    (a placement as int64 devices; a `split` planner's shards and devices as it made them)."""
    def plan(t: Task):
        made = steps.once(t, method, lambda: raw(t))
        return made if split else np.array(made, dtype=np.int64)
    plan.seconds = lambda t: steps.seconds(t, method)
    return plan


def build(methods: tuple[str, ...] | list[str], artifacts: Artifacts, settings: Settings) -> Built:
    """Planners of `methods` (registry ids) from `artifacts`; a method whose needs are missing is
    left out, the reason in `Built.left_out`."""
    built = Built(artifacts, settings)
    for m in methods:
        entry = check(m, "methods")
        gap = entry.missing(artifacts)
        if gap is not None:
            built.left_out[m] = f"needs {', '.join(gap)}"
        elif "limits" in entry.tags and settings.milp is None:
            built.left_out[m] = "needs the MILP's limits (Settings.milp)"
        else:
            built.planners[m] = built.planner(m)
    return built


def not_run(method: str, task: Task, objective: dict[str, str] | None = None) -> str | None:
    """Why `method` is not planned for `task`, or None: a method that runs on one protocol only
    (`Method.only`) or optimises the synchronized objective runs where `objective` (protocol ->
    objective) ranks the task's protocol by it."""
    entry = REGISTRY.get(method)
    if entry is None:  # a planner made outside the registry (a test's, a variant's) runs everywhere
        return None
    if entry.only is not None and task.protocol != entry.only:
        return f"{entry.only} tasks only"
    ranked_by = (objective or {}).get(task.protocol)
    if entry.objective != MAX_DEVICE and objective is not None and ranked_by != entry.objective:
        return f"optimises {entry.objective}; {task.protocol} is ranked by {ranked_by}"
    return None
