"""What the evaluate stage compares: its parameters, the test tasks, and every method's plans.

Every method is built by the registry (`methods.registry`) as a planner, `Task -> placement` (a
device per `task.tables` entry), so heuristics, TorchRec's planner, the cost-model greedy, the RL
sharder and the exact search are called and timed alike. A method that finds no plan for a task
(TorchRec's planner counts optimizer state and may refuse a tight cap) yields None there, with the
reason recorded.
"""

import math
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NotRequired, TypedDict

import numpy as np
import pandas as pd

from autoshard.core.errors import ConfigError, invalid
from autoshard.core.params import Fields, bounded, read
from autoshard.core.schema import Number, StageTime
from autoshard.core.seeding import one_thread, rng
from autoshard.data.tasks import Task, first_fit_decreasing
from autoshard.measure.backends import BackendConfig
from autoshard.measure.comm_store import CommTiming
from autoshard.measure.timing import TimingConfig
from autoshard.methods.registry import LPT, POLICY, not_run
from autoshard.placement.greedy import Infeasible
from autoshard.placement.shards import memory_ok
from autoshard.placement.surrogate import MilpConfig
from autoshard.placement.types import Planner
from autoshard.studies.endpoints import replica
from autoshard.studies.measured import OBJECTIVES, MeasuredComm
from autoshard.studies.paired import same_split
from autoshard.studies.regimes import FamiliesConfig

PROTOCOLS = ("autoshard", "dreamshard", "tight", "small", "few")  # the evaluated protocols (evaluate.objective's keys)
DRAWN = ("small", "few")  # the protocols whose tasks `drawn_tasks` makes (evaluate.small, evaluate.few)



@dataclass(frozen=True)
class SmallConfig:
    """Test tasks of unseen tables drawn in a range of shapes: `evaluate.small` (tiny, whose optimum
    under the cost model is found by exhaustive search) and `evaluate.few` (few tables per device,
    where one misplaced table moves the bottleneck most: a candidate regime for issue 30's headroom)."""

    tasks: int = bounded(lo=0)
    tables: tuple[int, int]  # drawn uniformly in [low, high]
    devices: tuple[int, int]
    memory_slack: float = bounded(lo=1.0)  # cap = slack x (total size / devices), at least the largest table


@dataclass(frozen=True)
class Targets:
    rl: float = bounded(lo=0, lo_open=True)       # RL greedy's median measured ratio to the best heuristic
    refined: float = bounded(lo=0, lo_open=True)  # the same with local search
    optimum_gap: float = bounded(lo=0)   # RL's median predicted gap to the optimum on small tasks
    device_error: float = bounded(lo=0)  # a cost model's median |error| on evaluated plans' devices (issue 16)


@dataclass(frozen=True)
class NoiseTargets:
    """The measurement quality a run needs before its differences are read as findings."""

    median_cv: float = bounded(lo=0, lo_open=True)  # CV of a shard across interleaved rounds, median over shards
    plan_repeat_change: float = bounded(lo=0, lo_open=True)  # |change| of a plan measured again, median over plans


@dataclass(frozen=True)
class EvaluateConfig:
    """The `evaluate` section, with the profile's backend settings used to measure plans."""

    autoshard_tasks_per_ratio: int = bounded(lo=0)
    dreamshard_tasks: int = bounded(lo=0)
    tight_tasks: int = bounded(lo=0)  # the first tight-memory tasks (tasks.tight) evaluated
    small: SmallConfig
    few: SmallConfig
    families: FamiliesConfig  # candidate regimes, searched for headroom under the cost model (predicted only)
    best_of: int
    backend: BackendConfig
    bootstrap: int = bounded(lo=100)
    noise_tasks: int = bounded(lo=0)
    exploratory_share: float = bounded(lo=0, hi=1, lo_open=True)  # the first of each group: exploratory methods
    speed_tables: tuple[int, ...]
    speed_devices: int
    speed_repeats: int
    speed_budget_s: float = bounded(lo=0, lo_open=True)  # a method slower at one size is not timed at larger ones
    targets: Targets
    milp: MilpConfig
    noise_targets: NoiseTargets
    objective: dict[str, str]  # protocol -> max_device | synchronized_stages: what its headline `measured_ms` is
    comm: MeasuredComm | None  # plans whose all-to-all is measured (`evaluate.comm`); None: the comm model's

    @classmethod
    def from_params(cls, evaluate: dict, profile: dict, rl: dict) -> "EvaluateConfig":
        """From the `evaluate` section (`parse`), the profile's backend settings and `rl.best_of`."""
        f = Fields("evaluate", evaluate)
        p = Fields("profile", profile)
        r = Fields("rl", rl)
        best_of = r.integer("best_of")
        r.done()
        device_counts = _comm_device_counts(p)
        objective = objectives(f)
        cfg = read(cls, f, best_of=best_of, backend=measuring_backend(p, f.sub("timing")), objective=objective,
                   comm=comm_settings(f.sub("comm"), objective, device_counts))
        f.done()
        return cfg


def _comm_device_counts(profile: Fields) -> tuple[int, ...]:
    """`profile.comm.device_counts`, the device counts the profile measured all-to-alls at;
    none for a stage whose params do not give them (it scores with the comm model)."""
    if "comm" not in profile.values:
        return ()
    c = profile.sub("comm")
    counts = tuple(c.integers("device_counts", lo=2))
    c.done()
    return counts


def comm_settings(c: Fields, objective: Mapping[str, str], device_counts: tuple[int, ...]) -> MeasuredComm | None:
    """`evaluate.comm`: with `measure`, the plans of the protocols ranked by synchronized_stages
    on a device count of `profile.comm.device_counts` get their all-to-all measured; None when
    no plan would be."""
    measure = c.boolean("measure")
    timing = read(CommTiming, c)
    c.done()
    protocols = tuple(p for p in PROTOCOLS if objective[p] == "synchronized_stages")
    if not (measure and protocols and device_counts):
        return None
    return MeasuredComm(timing=timing, device_counts=device_counts, protocols=protocols)


def objectives(f: Fields) -> dict[str, str]:
    """`evaluate.objective`: one of OBJECTIVES for every protocol, or a mapping protocol ->
    objective naming each of PROTOCOLS (the issue: each protocol ranked by its paper's objective)."""
    if not isinstance(f.values.get("objective"), dict):
        return dict.fromkeys(PROTOCOLS, f.text("objective", OBJECTIVES))
    o = f.sub("objective")
    out = {p: o.text(p, OBJECTIVES) for p in PROTOCOLS}
    o.done()
    return out


def measuring_backend(profile: Fields, timing: Fields) -> BackendConfig:
    """The profile's backend settings (backend, device, optimizer, batch size, threads, memory
    limit) with the protocol of `timing` (`evaluate.timing`): how plans are measured. Checks both."""
    backend = BackendConfig.from_fields(profile, read(TimingConfig, timing))
    profile.optional_text("measurements_space")  # where plans' measurements are read from: `measured.measurement_store`
    profile.done()
    timing.done()
    return backend


def held_out_tasks(tasks: list[Task], cfg: EvaluateConfig) -> list[Task]:
    """The first test tasks of each group: per unseen ratio for AutoShard's protocol, and
    DreamShard's; every group must hold as many as asked."""
    out = []
    groups: dict[tuple[str, float], list[Task]] = {}
    for t in tasks:
        if t.split == "test":
            groups.setdefault((t.protocol, t.unseen_ratio), []).append(t)
    for (protocol, ratio), group in groups.items():
        n = cfg.autoshard_tasks_per_ratio if protocol == "autoshard" else cfg.dreamshard_tasks
        field = "autoshard_tasks_per_ratio" if protocol == "autoshard" else "dreamshard_tasks"
        if n > len(group):
            raise invalid(f"evaluate.{field}", n, f"only {len(group)} {protocol} test tasks "
                          f"(unseen ratio {ratio:g}) exist; see tasks.{protocol}.test_tasks")
        out += group[:n]
    return out


def leading_tasks(tasks: list[Task], share: float) -> list[Task]:
    """The first `share` (rounded up) of each group of `tasks` (protocol and unseen ratio), in
    order: stratified like the headline's, the same on every machine."""
    groups: dict[tuple[str, float], list[Task]] = {}
    for t in tasks:
        groups.setdefault((t.protocol, t.unseen_ratio), []).append(t)
    keep = {t.name for g in groups.values() for t in g[:math.ceil(share * len(g))]}
    return [t for t in tasks if t.name in keep]


Skip = Callable[[str, Task], str | None]  # why a method is not planned (and measured) for a task, or None


def exploratory_rule(tasks: list[Task], kept: Collection[str], share: float,
                     everywhere: Collection[str] = ("small",)) -> Skip:
    """Where exploratory methods are planned and measured: every method of `kept` (the primary
    endpoints' arms) on every task; the others on the first `share` of each group (`leading_tasks`)
    and on every task of the protocols in `everywhere` (small tasks, cheap, whose optimum is searched)."""
    measured = {t.name for t in leading_tasks([t for t in tasks if t.protocol not in everywhere], share)}
    why = f"exploratory: measured on the first {share:.0%} of each group of tasks"

    def skip(method: str, task: Task) -> str | None:
        exempt = method in kept or task.protocol in everywhere or task.name in measured
        return None if exempt else why
    return skip


def replicate_plans(builds: Sequence[Mapping[str, Planner]], tasks: list[Task], wanted: Mapping[str, Collection[str]],
                    sizes: np.ndarray, objective: Mapping[str, str] | None = None
                    ) -> tuple[dict[str, list[np.ndarray | None]], pd.DataFrame]:
    """Replicate r's (from 1, `builds[r - 1]`: method -> planner) plans, named
    `endpoints.replica(method, r)` and aligned with `tasks`, of each method on the tasks of the
    protocols `wanted` names for it (the primary endpoints it is an arm of; not run elsewhere),
    with their status frame as `plan_all`'s: to be measured in the same pass as replicate 0's."""
    plans: dict[str, list[np.ndarray | None]] = {}
    frames = []

    def skip(method: str, task: Task) -> str | None:
        return None if task.protocol in wanted.get(method, ()) else "replicates: where a primary endpoint needs it"
    for r, planners in enumerate(builds, start=1):
        mine, status = plan_all(planners, tasks, sizes, progress=False, objective=objective, skip=skip)
        plans |= {replica(m, r): p for m, p in mine.items() if any(x is not None for x in p)}
        frames.append(status.assign(method=status["method"].map(lambda m, r=r: replica(m, r))))
    status = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=["task", "method", "seconds",
                                                                                          "status"])
    return plans, status[status["method"].isin(plans)]


def arms_by_protocol(endpoints: Sequence, methods: Collection[str]) -> dict[str, set[str]]:
    """Method of `methods` -> the protocols of the primary endpoints it is an arm of (`endpoints`:
    `studies.endpoints.Endpoint`s): where its replicates must plan."""
    return {m: {e.protocol for e in endpoints if m in (e.method, e.reference)} for m in methods}


def drawn_tasks(features: pd.DataFrame, test_tables: np.ndarray, cfg: SmallConfig, seed: int,
                protocol: str = "small") -> list[Task]:
    """Seeded test tasks of unseen (test-pool) tables of `protocol` (one of DRAWN, its section
    `cfg`), each placeable under its cap."""
    if protocol not in DRAWN:
        raise ValueError(f"drawn_tasks: {protocol!r} is none of {DRAWN}")
    sizes = features["size_bytes"].to_numpy()
    out = []
    for k in range(cfg.tasks):
        g = rng(seed, "evaluate", protocol, k)
        n = int(g.integers(cfg.tables[0], cfg.tables[1] + 1))
        devices = int(g.integers(cfg.devices[0], cfg.devices[1] + 1))
        if n > len(test_tables):
            raise invalid(f"evaluate.{protocol}.tables", list(cfg.tables),
                          f"the test pool has {len(test_tables)} tables")
        tables = np.sort(g.choice(test_tables, n, replace=False))
        cap = int(max(sizes[tables].max(), cfg.memory_slack * sizes[tables].sum() / devices))
        while first_fit_decreasing(sizes[tables], devices, cap) is None:
            cap = int(cap * 1.1) + 1
        out.append(Task(name=f"{protocol}/{k:03d}", protocol=protocol, split="test",
                        tables=tuple(int(t) for t in tables), devices=devices, memory_bytes=cap, unseen_ratio=1.0))
    return out


def evaluated_tasks(tasks: list[Task], tight: list[Task], features: pd.DataFrame, test_tables: np.ndarray,
                    cfg: EvaluateConfig, seed: int) -> list[Task]:
    """Every task the evaluate stage plans and measures, in protocol order: the held-out test
    tasks of both papers' protocols, the first `cfg.tight_tasks` of `tight` (`data.tasks.tight_tasks`)
    and the drawn protocols' (DRAWN)."""
    out = held_out_tasks(tasks, cfg) + tight[:cfg.tight_tasks]
    for protocol in DRAWN:
        out += drawn_tasks(features, test_tables, getattr(cfg, protocol), seed, protocol)
    return out


def same_plans(reference: list[np.ndarray | None], planner: Planner, tasks: list[Task]) -> dict[str, float]:
    """Share of `tasks` on which `planner` makes the same placement as `reference` (or, like it,
    none): with the very same device numbers, and as the same split of the tables whatever the
    devices are called (the devices are identical, so the two plans then cost the same)."""
    labels, splits = [], []
    for ref, task in zip(reference, tasks, strict=True):
        try:
            mine = planner(task)
        except Infeasible:
            mine = None
        both = mine is not None and ref is not None
        labels.append(mine is ref is None or (both and np.array_equal(mine, ref)))
        splits.append(same_split(mine, ref))
    return {"same devices": float(np.mean(labels)), "same split": float(np.mean(splits))}


def plan_all(methods: Mapping[str, Planner], tasks: list[Task], sizes: np.ndarray, progress: bool = True,
             objective: Mapping[str, str] | None = None,
             skip: Skip | None = None) -> tuple[dict[str, list[np.ndarray | None]], pd.DataFrame]:
    """Each method's plan of each task (None: no plan), and a frame of (task, method, seconds,
    status); timed on one thread (a planner with `seconds`, as every registry build, says how long
    its whole chain took, steps it reused from another method included). A method is not run where
    `not_run` says so (given `objective`, the protocols' objectives; without it, every method runs
    off the small tasks), nor where `skip` gives a reason (`exploratory_rule`). A plan that
    breaks the memory cap is no plan (status says so): under the tight-memory protocol a failure to
    count (`studies.memory.failed_counts`), not a crash of the stage."""
    from tqdm.auto import tqdm

    plans: dict[str, list[np.ndarray | None]] = {m: [] for m in methods}
    rows = []
    with one_thread():
        for task in tqdm(tasks, desc="planning", disable=not progress):
            for name, planner in methods.items():
                plan, status, seconds = None, "ok", float("nan")
                why = not_run(name, task, objective) or (skip(name, task) if skip is not None else None)
                if why:
                    status = f"not run ({why})"
                else:
                    start = time.perf_counter()
                    try:
                        plan = np.asarray(planner(task), dtype=np.int64)
                    except ConfigError as exc:
                        status = f"no plan: {exc}"
                    seconds = time.perf_counter() - start
                    if hasattr(planner, "seconds"):  # a chained planner: its whole chain, reused steps included
                        seconds = planner.seconds(task)
                if plan is not None and not memory_ok(task, plan, sizes):
                    plan, status = None, "no plan: its placement broke the memory cap"
                plans[name].append(plan)
                rows.append({"task": task.name, "method": name, "seconds": seconds, "status": status})
    return plans, pd.DataFrame(rows)


def repeat_subset(tasks: list[Task], plans: dict[str, list[np.ndarray | None]],
                  per_protocol: int) -> tuple[list[Task], dict[str, list[np.ndarray | None]]]:
    """The first `per_protocol` tasks of each protocol with their RL greedy plan and lpt_measured's,
    for measuring them a second time, together in one pass: both chosen by name, never by a
    measurement (a plan picked as the lowest of several noisy measurements regresses toward the mean)."""
    chosen = [t for p in dict.fromkeys(t.protocol for t in tasks)
              for t in [t for t in tasks if t.protocol == p][:per_protocol]]
    index = {t.name: i for i, t in enumerate(tasks)}
    return chosen, {m: [plans[m][index[t.name]] for t in chosen] for m in (POLICY, LPT) if m in plans}


# The stage's metrics contract: reports/metrics/evaluate.json, read back typed by the report.

class FailedPlacements(TypedDict):
    """The entry `failed` of reports/metrics/evaluate.json: protocol -> method -> number of test
    tasks whose placement failed (no plan, or a device over the memory cap), as
    `failed.<protocol>.<method>: int`. Built by `studies.memory.failed_counts`."""

    failed: dict[str, dict[str, int]]


class HeadlineObjective(TypedDict):
    """The entry `objective` of reports/metrics/evaluate.json: protocol -> what its headline
    `measured_ms` ranks plans by (max_device | synchronized_stages). Built by
    `studies.evaluate.objectives`."""

    objective: dict[str, str]


class PairedComparison(TypedDict):
    """One `<method>__vs__<reference>` entry of a paired block (`studies.paired.compare`)."""

    tasks: int
    median_ratio: Number
    ci_low: Number
    ci_high: Number
    p_value: Number
    identical_share: Number
    mde: Number


class ComputeOnlyPairs(TypedDict):
    """The entry `paired_max_device` of reports/metrics/evaluate.json: protocol ->
    `<method>__vs__<reference>` -> the paired comparison on the slowest device's compute
    (max_device_ms), for every protocol. Built by `studies.findings.paired_max_device`."""

    paired_max_device: dict[str, dict[str, PairedComparison]]


class PrimaryEndpoint(TypedDict):
    """One `primary.<endpoint>` entry of reports/metrics/evaluate.json (`studies.endpoints.primary`):
    a pre-registered comparison's verdict (better | worse | equivalent | inconclusive) over the
    trained chains' replicates, the median over tasks of the mean log ratio over replicates with
    its interval (`interval` names its method, `mc_error` the Monte Carlo error of its ends), the
    Holm-adjusted p of the verdict's claim, each replicate's median ratio, the share of (replicate,
    task) pairs with identical plans, and the one pass every arm was measured in."""

    method: str
    reference: str
    protocol: str
    cost: str
    verdict: str
    median_ratio: Number
    ci_low: Number
    ci_high: Number
    interval: str
    mc_error: Number
    resamples: int
    p_holm: Number
    p_claims: dict[str, Number]
    sesoi: float
    alpha: float
    tasks: int
    failed: int
    replicates: int
    replicate_medians: list[float]
    identical_share: Number
    note: str
    per_task: dict[str, float]
    # `pass` (the one pass both arms came from; null when none) is not a Python name: read as a key


class Amendment(TypedDict):
    """One entry of `primary.amendments`: a change to the pre-registration after it was made."""

    date: str
    commit: str
    change: str
    why: str
    results_seen: bool
    family: str | None


class Registration(TypedDict):
    """`primary.registered`: the commit and date the family was registered at, and its digest then."""

    commit: str
    date: str
    family: str


class MeasurementQuality(TypedDict):
    """The entry `noise` of reports/metrics/evaluate.json (`studies.findings.measurement_quality`)."""

    median_cv: Number
    round_drift: Number
    remeasured_share: float
    plan_repeat_change: Number
    plan_repeat_change_calibrated: Number
    noise_sd: dict[str, Number]
    noise_sd_max_device: NotRequired[dict[str, Number]]  # the compute bottleneck's: the headroom's noise floor
    targets: dict[str, float]
    met: bool


class Headroom(TypedDict):
    """One `headroom.<protocol>` entry of reports/metrics/evaluate.json (`studies.headroom.headroom`):
    what a planner could gain over cost_greedy there, as context beside the verdicts. Predicted, under
    the cost model: the median over tasks of cost_greedy's bottleneck over the best placement known, less 1
    (`greedy_gap`; its max and the share of tasks above 0.5%), that ratio the other way (`bound`),
    how the best was found (`how`: "exhaustive search" or local search from `starts` starts and every
    method's plan, `search_seconds` its time) and each method's median share of the gap closed
    (`captured`, over `captured_tasks` tasks with a gap). On the measured single costs: LPT over the
    MILP's proven lower bound, less 1 (`lpt_gap`, `how_lpt`; `lpt_gap_optimal_share`: tasks the MILP
    solved to optimality). Measured, one pass: cost_greedy's `measured_cost` over that of the measured
    plan predicted lowest, less 1 (`measured_gap`), whose plan that was (`measured_of`, tasks per
    method) and how often it was the best known (`measured_at_best_share`). The bounds: `lower`
    (at least this much is available under the cost model), `upper` (null where no bound exists,
    `upper_why` says how it was found or why not) and `better_reachable` (False where the upper
    bound lies below the smallest effect of interest). The noise floor (`noise_key` names its
    entry in `noise`)."""

    tasks: int
    tasks_without_greedy: int
    greedy_gap: Number
    greedy_gap_max: Number
    greedy_gap_above_share: Number
    bound: Number
    how: str
    starts: int
    search_seconds: float
    captured: dict[str, Number]
    captured_tasks: int
    lpt_gap: Number
    how_lpt: str
    lpt_gap_optimal_share: Number
    measured_gap: Number
    measured_cost: str
    measured_tasks: int
    measured_of: dict[str, int]
    measured_at_best_share: Number
    lower: Number
    upper: Number
    upper_why: str
    better_reachable: bool
    noise_floor: Number
    noise_key: str


class Family(TypedDict):
    """One candidate regime of `families.families` (`studies.regimes.families`): `per_device` tables
    on each of `devices` devices, `memory` ample or tight, `speeds` equal or a profile; over its
    `tasks`, predicted, greedy's gap to the best placement known (median, p90, max) and the
    speed-blind greedy's median gap; whether the median exceeds the smallest effect of interest."""

    family: str
    per_device: int
    devices: int
    memory: str
    speeds: str
    tasks: int
    greedy_gap: Number
    greedy_gap_p90: Number
    greedy_gap_max: Number
    blind_gap: Number
    exceeds_sesoi: bool


class Families(TypedDict):
    """`families` of reports/metrics/evaluate.json: the candidate regimes searched for headroom
    before any is measured, the smallest effect of interest they are held to (`primary.sesoi`: a
    median gap above it leaves room for a "better" verdict) and the search's seconds."""

    sesoi: float
    seconds: float
    families: list[Family]


class ReferenceChoice(TypedDict):
    """How the best heuristic of a task was chosen (`studies.paired.selection_bias`): on `chosen_by`
    (a prediction), scored on the pass; what choosing on the pass's own measurement would have
    flattered it by (the median of lowest measured / chosen - 1), on how many tasks they differ."""

    chosen_by: str
    oracle_over_chosen_median: Number
    tasks_differing: int
    tasks: int


class Evaluation(StageTime, HeadlineObjective, ComputeOnlyPairs):
    """reports/metrics/evaluate.json. Built by `studies.stats.evaluate_metrics`: the primary
    endpoints first, the headroom per protocol, the measurement quality, the exploratory paired
    blocks (headline objective, synchronized stages, compute only), the exploratory summary lines,
    the replicates' spread, the per-method results and targets."""

    primary: dict[str, PrimaryEndpoint | Registration | list[Amendment]]  # endpoints, `registered`, `amendments`
    headroom: dict[str, Headroom]  # per protocol
    families: Families
    noise: MeasurementQuality
    reference: dict[str, ReferenceChoice]  # per protocol
    paired: dict[str, dict[str, PairedComparison]]
    paired_synchronized: dict[str, dict[str, PairedComparison]]
    answer: list[str]
    replicates: dict[str, dict[str, dict[str, Any]]]
    results: dict[str, dict[str, dict[str, Any]]]
    targets: list[dict[str, Any]]
    failed: dict[str, Any]
