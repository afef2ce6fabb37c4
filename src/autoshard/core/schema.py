"""The stage contracts: the keys and types of each stage's metrics file.

Every stage's metrics dict is built by one function in its layer (see each schema's `Built by`)
and read back by the report through `check`, so a renamed or retyped key fails the stage's unit
test or the report with the file and the key named, not as a KeyError deep in a table. A float
may be `None` where the metrics file holds `null` for a value that was not finite (a median over
no tasks). Extra keys are allowed: a schema lists what readers rely on.
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


class WidePool(TypedDict):
    """The synthesize stage's wide pool: tables whose dims, hash sizes and pooling span real models'."""

    tables: int
    train_tables: int
    dims: list[int]
    rows: list[int]              # the smallest and largest hash size
    lookups_per_bag: list[float]  # the lowest and highest mean lookups per bag of a table
    largest_table_bytes: int


class SynthesisMetrics(StageTime):
    """reports/metrics/synthesize.json. Built by `data.calibration.synthesis_metrics`."""

    source: str
    tables: int
    batch_size: int
    indices: int
    distinct: int
    lookups_per_bag: float
    reuse_share: dict[str, float]
    reuse_l1_to_published: float
    pool_bytes: int
    largest_table_bytes: int
    tasks: dict[str, int]
    wide: NotRequired[WidePool]  # the wide pool (data.wide)


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
    what a planner could gain over cost_greedy there, as context beside the verdicts. Predicted, under the cost model: the
    median over tasks of cost_greedy's bottleneck over the best placement known, less 1
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


class CommMetrics(TypedDict):
    """The comm model fitted on measured all-to-alls (`measure.commmodel.profile_comm`): the
    placements measured per device count, the held-out MAPE (a share) pooled, per count and over
    the honest counts (one rank per core or GPU, at most `honest_limit`), on which the target is
    judged (`mape_target_note` says why not when no count is honest), and beside it the measurement
    floor: a re-measurement's MAPE on the same held-out rows (one round against the median of the
    others; None with one round), pooled and honest. Metrics written before the honest counts lack
    those keys; there `mape_target_met` was judged pooled; before the interleaved rounds, `rounds`
    and the floor."""

    placements: int
    device_counts: list[int]
    batch_size: int
    heldout_share: float
    mape_heldout: Number
    mape_heldout_by_world: dict[str, Number]
    mape_train: Number
    mape_heldout_across: Number  # the across-device-count fit alone (what extrapolation uses)
    median_ms_by_world: dict[str, Number]
    mape_target: float
    mape_target_met: bool
    honest_limit: NotRequired[int]
    honest_device_counts: NotRequired[list[int]]
    mape_heldout_honest: NotRequired[Number]
    mape_target_note: NotRequired[str | None]
    rounds: NotRequired[int]  # interleaved rounds per placement (`profile.comm.rounds`)
    mape_floor: NotRequired[Number]
    mape_floor_honest: NotRequired[Number]
    mape_noise_free_honest: NotRequired[Number | None]  # what a noise-free model would score (`noise_free_comm_mape`)


class ProtocolScores(TypedDict):
    """One timing protocol in the profile's protocol check (`measure.protocols.protocol_scores`):
    the median |pass-to-pass change| of a shard's cost and the median CV within a pass (shares)."""

    shards: int
    pass_change_median: Number
    within_pass_cv_median: Number
    seconds: float


class FeedScores(ProtocolScores):
    """One variant of the profile's feeds check (`measure.protocols.feed_scores`): the scores
    above and its cost over the former protocol's (first bags, warm cache), median."""

    cost_ratio_to_former: Number


class ProfileMetrics(StageTime):
    """reports/metrics/profile.json. Built by `measure.analysis.profile_metrics`."""

    shards_measured: int
    shards_unmeasurable: int
    shards_by_kind: dict[str, int]
    backend: str
    device: str
    threads: int
    batch_size: int
    median_cv: Number
    cv_target: float
    cv_target_met: bool
    rounds_for_cv_target: int
    noise: dict[str, Number]   # median_cv, round_drift(_max), remeasured_share of the interleaved rounds
    fused_over_sum_median: Number
    fused_over_sum_p10_p90: list[Number]
    torch_over_fbgemm_median_ratio: Number
    torch_fbgemm_kendall_tau: Number
    torch_fused_over_fbgemm_median_ratio: Number  # the fused pure-torch backend on the same shards
    torch_fused_fbgemm_kendall_tau: Number
    harness_check: dict[str, dict[str, Any]]
    comm_measured_processes: int
    comm: NotRequired[CommMetrics]
    protocol_check: NotRequired[dict[str, ProtocolScores]]  # sequential and interleaved, measured side by side
    feeds_check: NotRequired[dict[str, FeedScores]]  # fixed or rotated bags, warm or evicted cache (protocols.FEEDS)
    torch_threads: int
    peak_rss_gib: float


class EstimatorScores(TypedDict):
    mape: Number
    r2: Number
    tau_similar_size: Number


class HybridMetrics(TypedDict):
    """The hybrid cost model against the feature-only model and the rescaled sum of single
    costs, on multi-table shards of seen and of unseen tables (MAPE, a share)."""

    mape_seen: Number
    mape_unseen: Number
    rescaled_sum_mape_seen: Number
    rescaled_sum_mape_unseen: Number
    feature_only_mape_seen: Number
    feature_only_mape_unseen: Number
    mape_target: float
    targets_met: dict[str, bool]
    beats_rescaled_sum: dict[str, bool]
    mape: dict[str, Number]
    best_epoch: int


class PairedDifference(TypedDict):
    """A paired difference of absolute percentage error, test shard by test shard: its mean,
    95% bootstrap interval and Wilcoxon signed-rank p-value."""

    difference: Number
    ci_low: Number
    ci_high: Number
    p_value: Number
    shards: int


class ActiveMetrics(TypedDict):
    """The hybrid's active selection (`costmodel.active`): what was measured, each arm's MAPE
    (mean and sd over `seeds` fits; arm -> seen | unseen) and the paired differences
    ("active - uniform | unseen", ...)."""

    rounds: int
    shards_per_round: int
    ensemble: int
    seeds: int
    candidates: int
    shards_measured: int
    mape: dict[str, dict[str, Number]]
    mape_sd: dict[str, dict[str, Number]]
    paired: dict[str, PairedDifference]


class MeasurementFloor(TypedDict):
    """Seen-table test shards measured in both profile passes: the pass-to-pass MAPE (the
    second pass as the prediction of the main one) and each model's MAPE on exactly those
    shards against the main pass and against the mean of the two passes (shares)."""

    shards: int
    pass_to_pass_mape: Number
    pass_to_pass_mape_rescaled: Number  # the second pass times one factor fitted on train shards measured twice
    mape_vs_main: dict[str, Number]
    mape_vs_mean: dict[str, Number]


class DimError(TypedDict):
    """The neural cost model's MAPE on the test shards whose tables all have one dim."""

    mape: Number
    shards: int


class WideCostModel(TypedDict):
    """The cost models on the wide pool (`data.wide`: dims to 1024), measured by the profile."""

    shards: dict[str, int]                     # split -> shards
    dims: list[int]                            # the dims its tables have
    mape: dict[str, dict[str, Number]]         # estimator -> test set -> MAPE
    error_by_dim: dict[str, dict[str, dict[str, DimError]]]  # estimator -> test set -> widest dim -> error
    best_epoch: int                            # of the model fitted on it


class CostModelMetrics(StageTime):
    """reports/metrics/cost_model.json. Built by `costmodel.evaluate.cost_model_metrics`."""

    shards: dict[str, int]
    comparison: dict[str, EstimatorScores]
    neural_mape: dict[str, Number]
    mape_targets: dict[str, float]
    targets_met: dict[str, bool]
    noise_floor_cv: Number
    learning_curve: list[dict[str, Any]]
    best_epoch: int
    predict_10k_shards_seconds: float
    hybrid: NotRequired[HybridMetrics]
    measurement_floor: NotRequired[MeasurementFloor]
    active: NotRequired[ActiveMetrics]
    error_by_dim: NotRequired[dict[str, dict[str, DimError]]]  # test set -> dim (or "mixed") -> error
    wide: NotRequired[WideCostModel]           # the wide pool's fitted and transferred models


class FairSharder(TypedDict):
    """The fair learned sharder on the validation tasks: mean predicted bottleneck over the best
    heuristic's (all under the simulator), beside cost_greedy's and the reproduction's."""

    val_ratio: Number                  # the fair sharder, greedy, after training
    cost_greedy_val_ratio: Number      # its teacher
    reproduction_val_ratio: Number     # rl_greedy: AutoShard's design
    after_imitation_val_ratio: Number  # after cloning cost_greedy, before PPO
    unshaped_val_ratio: Number         # the same training with the terminal reward only (None: not run)
    no_worse_than_greedy: bool         # val_ratio <= cost_greedy_val_ratio (a benchmark, not an assert; with
                                       #   keep_best chosen on these tasks, so evaluate's test tasks are the check)
    kept_iteration: int | None         # the validation point whose weights it ends with (None: the last iterate)
    curves: dict[str, list[list[Number]]]  # run -> [iteration, validation ratio] pairs


class TrainRLMetrics(StageTime):
    """reports/metrics/train_rl.json. Built by `rl.validation.train_rl_metrics`."""

    validation_ratio_to_best_heuristic: dict[str, Number]
    validation_win_rate: dict[str, Number]
    heuristics_ratio_to_best: dict[str, Number]
    speed_seconds: dict[str, Number]
    refresh: list[dict[str, Any]]
    iterations: int
    fair: NotRequired[FairSharder]     # absent where rl.fair_policy is off


class TransferPoint(TypedDict):
    """One method at one point of a transfer axis."""

    tasks: int
    bounded_share: Number  # share of tasks whose best heuristic is slowest on a one-table device
    ratio_median: Number
    ratio_lo: Number
    ratio_hi: Number
    win_rate: Number
    predicted_ratio_median: Number
    mean_ms: Number


class TransferWorst(TypedDict):
    axis: str
    value: float
    ratio_median: Number


class TransferMetrics(StageTime):
    """reports/metrics/transfer.json. Built by `studies.transfer.transfer_metrics`. `axes`:
    axis -> method -> point value (as text, e.g. "40") -> scores."""

    axes: dict[str, dict[str, dict[str, TransferPoint]]]
    rl_greedy_worst: TransferWorst | None
    rl_greedy_points_below_1: int
    points: int
    tasks_measured: int
    shards_measured: int


class AblationVariant(TypedDict):
    """One variant's measured ratios across seeds (also one `seed N` key per seed)."""

    variant: str
    label: str
    mean: Number
    std: Number
    min: Number
    max: Number
    vs_full: NotRequired[Number]


class AblationMetrics(StageTime):
    """reports/metrics/ablation.json. Built by `studies.ablation.ablation_metrics`."""

    variants: list[AblationVariant]
    seeds: list[int]
    iterations: int
    protocols: list[str]
    test_tasks: int
    shards_measured: int


class ColumnsPair(TypedDict):
    """One column-wise method against its table-wise twin (the same planner, every table whole),
    paired over one protocol's tasks where both have a plan. Exploratory: no verdict."""

    tasks: int
    twin: str
    median_ratio: Number
    ci_low: Number
    ci_high: Number
    p_value: Number
    identical_share: Number  # tasks where the two are one plan (no split chosen, the same devices)
    direction: str  # where the 95% interval lies: "below 1", "above 1", "spans 1" (or "no tasks")
    split_share: float  # tasks where the column-wise plan split at least one table
    split_tables_median: float
    bound_share_median: float  # the costliest table alone / the twin's bottleneck


class ColumnsMetrics(StageTime):
    """reports/metrics/columns.json. Built by `studies.columns.columns_metrics`."""

    protocols: dict[str, dict[str, ColumnsPair]]  # protocol -> column-wise method -> against its twin
    pairs: dict[str, str]  # column-wise method -> its table-wise twin
    ways: list[int]
    tasks: dict[str, int]  # per protocol
    measuring_pass: str
    shards_measured: int


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
