"""The generic contract checker, and the evaluate stage's contract until it moves to studies/.

Each stage's metrics file has one typed result (a TypedDict) in the module of the builder that
returns it (`data.calibration.Synthesis`, `studies.transfer.Transfer`, ...); `check` and
`read_checked` hold a metrics dict to one, so a renamed or retyped key fails the stage's unit test
or the report with the file and the key named, not as a KeyError deep in a table. A float may be
`None` where the metrics file holds `null` for a value that was not finite (a median over no
tasks). Extra keys are allowed: a contract lists what readers rely on.
"""

import types
import typing
from pathlib import Path
from typing import Any, NotRequired, TypedDict, TypeVar, Union

from autoshard.core.errors import ConfigError
from autoshard.core.metrics import read_metrics

Number = float | None


class StageTime(TypedDict):
    """What every stage's metrics file holds: the stage's wall time (read by the report)."""

    seconds: float


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


class EvaluateMetrics(StageTime, HeadlineObjective, ComputeOnlyPairs):
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


T = TypeVar("T")


def check(metrics: Any, schema: type[T], source: str) -> T:
    """`metrics` if it holds every key of `schema` with a value of its type; otherwise a
    `ConfigError` naming `source` (the file) and the first missing or mistyped key."""
    _check(metrics, schema, source, "")
    return metrics


def read_checked(path: str | Path, schema: type[T]) -> T:
    """The metrics file at `path`, checked against `schema` (see `check`)."""
    return check(read_metrics(path), schema, str(path))


def _check(value: Any, kind: Any, source: str, where: str) -> None:
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if kind is Any:
        return
    if typing.is_typeddict(kind):
        _expect(isinstance(value, dict), value, "a mapping", source, where)
        for key, hint in typing.get_type_hints(kind).items():
            path = f"{where}.{key}" if where else key
            if key not in value:
                if key in kind.__required_keys__:
                    raise ConfigError(f"{source}: key {path!r} is missing")
                continue
            _check(value[key], hint, source, path)
    elif origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return
        options = [a for a in args if a is not type(None)]
        for option in options[:-1]:  # the first that fits (`primary`'s entries: an endpoint or its record)
            try:
                return _check(value, option, source, where)
            except ConfigError:
                continue
        _check(value, options[-1], source, where)
    elif origin is list:
        _expect(isinstance(value, list), value, "a list", source, where)
        for i, item in enumerate(value):
            _check(item, args[0], source, f"{where}[{i}]")
    elif origin is dict:
        _expect(isinstance(value, dict), value, "a mapping", source, where)
        for key, item in value.items():
            _check(item, args[1], source, f"{where}.{key}" if where else str(key))
    elif kind is type(None):
        _expect(value is None, value, "null", source, where)
    elif kind is float:
        _expect(isinstance(value, int | float) and not isinstance(value, bool), value, "a number", source, where)
    elif kind is int:
        _expect(isinstance(value, int) and not isinstance(value, bool), value, "an integer", source, where)
    else:
        _expect(isinstance(value, kind), value, _name(kind), source, where)


def _name(kind: Any) -> str:
    return getattr(kind, "__name__", str(kind))


def _mistyped(value: Any, expected: str, source: str, where: str) -> ConfigError:
    return ConfigError(f"{source}: key {where!r} holds {value!r} ({type(value).__name__}), expected {expected}")


def _expect(ok: bool, value: Any, expected: str, source: str, where: str) -> None:
    if not ok:
        raise _mistyped(value, expected, source, where)
