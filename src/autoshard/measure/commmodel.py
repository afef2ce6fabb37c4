"""A communication cost model fitted on measured all-to-alls, as NeuroShard models comm.

Per device and direction, the all-to-all time is linear in what the device sends and what it
receives: ms = a + b * sent_mb + c * received_mb, fitted by least squares per device count D.
With table-wise sharding and a data-parallel batch B, device d of summed embedding width w_d
sends (D - 1) * B/D * w_d * 4 bytes forward (its pooled rows to each peer) and receives
B/D * (W - w_d) * 4 bytes (W: the placement's total width); backward the two swap.
A second fit across all measured device counts adds a term in D; it is what the model uses
for a device count it was not measured at (an extrapolation, labelled so).
The held-out target is judged on the honest device counts only (`comm.honest_limit`: one rank
per core or GPU); oversubscribed counts are fitted and reported, but their times mostly measure
scheduling (a prediction at one is labelled so, `CommModel.source`).

Each device count's placements are measured in one launch of interleaved rounds (each round times
every placement once, in a seeded shuffled order, `comm_store.measure_rounds`), so a machine that
drifts spreads over all of them; a row's `ms` is the median over rounds. The measurement floor
(`mape_floor_honest`, `mape_floor`) is how well a re-measurement scores against those values: each
held-out row's first round against the median of its other rounds. A model cannot be expected to
beat the measurement's own repeatability, so the floor is reported beside the held-out MAPE; the
target is still judged on the honest held-out MAPE alone (at most `mape_target`). One round is
noisier than a median over rounds, so the floor overstates a full re-measurement's error somewhat.

A device count this machine cannot launch (on CUDA, more ranks than GPUs: `comm.can_measure`) is
not measured: its rows hold TorchRec's analytic estimate (column `source`: "analytic", else
"measured"), are left out of the fit and the MAPEs, and the model predicts that count by the fit
across the measured ones. With no count measurable at all (a one-GPU machine) the model is fitted
on the analytic rows instead, and says so: its predictions are labelled "analytic-model".
"""

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NotRequired, TypedDict

import numpy as np
import pandas as pd

from autoshard.core.errors import ConfigError
from autoshard.core.schema import Number
from autoshard.core.seeding import rng
from autoshard.measure.comm import analytic_comm, can_measure, honest_limit
from autoshard.measure.comm_store import CommTiming, measure_rounds, placement_key, ranks
from autoshard.measure.timing import TimingConfig


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


DIRECTIONS = ("forward", "backward")
BYTES_PER_VALUE = 4
MB = 1e6


def traffic(widths: Sequence[int], batch_size: int) -> list[dict[str, tuple[float, float]]]:
    """Per device: {direction: (sent_mb, received_mb)} of one all-to-all step."""
    world = len(widths)
    rows = batch_size // world
    total = sum(widths)
    out = []
    for w in widths:
        sent = (world - 1) * rows * w * BYTES_PER_VALUE / MB
        received = rows * (total - w) * BYTES_PER_VALUE / MB
        out.append({"forward": (sent, received), "backward": (received, sent)})
    return out


def comm_rows(placements: Sequence[Sequence[int]], measured: Sequence[Sequence[tuple[float, float]]],
              batch_size: int, placement_ids: Sequence[int] | None = None,
              rounds: Sequence[Sequence[Sequence[Sequence[float]]]] | None = None) -> pd.DataFrame:
    """One row per (placement, device, direction): world, width, sent_mb, received_mb, ms.
    With `rounds` (per placement, per round, per device its (forward, backward) ms, as a comm
    store record's `rounds`) also `first_round_ms` and `others_ms`, the median of the later rounds
    (NaN with one round): what the measurement floor compares (`remeasure_ape`)."""
    ids = list(placement_ids) if placement_ids is not None else list(range(len(placements)))
    per_round = list(rounds) if rounds is not None else [None] * len(placements)
    rows = []
    for pid, widths, times_by_rank, repeats in zip(ids, placements, measured, per_round, strict=True):
        for d, (moved, times) in enumerate(zip(traffic(widths, batch_size), times_by_rank, strict=True)):
            for k, (direction, ms) in enumerate(zip(DIRECTIONS, times, strict=True)):
                sent, received = moved[direction]
                row = {"placement": int(pid), "world": len(widths), "device": d, "direction": direction,
                       "width": int(widths[d]), "batch_size": batch_size,
                       "sent_mb": sent, "received_mb": received, "ms": float(ms)}
                if repeats is not None:
                    values = [float(r[d][k]) for r in repeats]
                    row["first_round_ms"] = values[0]
                    row["others_ms"] = float(np.median(values[1:])) if len(values) > 1 else float("nan")
                rows.append(row)
    return pd.DataFrame(rows)


def remeasure_ape(rows: pd.DataFrame) -> np.ndarray:
    """Per row, the absolute percentage difference of its first round from the median of its other
    rounds (`comm_rows` with rounds): a re-measurement's error against the target values. Empty
    when the rows carry no per-round values or have one round."""
    if "others_ms" not in rows:
        return np.empty(0)
    rows = rows[rows["others_ms"].notna()]
    others = rows["others_ms"].to_numpy(float)
    return np.abs(rows["first_round_ms"].to_numpy(float) - others) / others


def _design(rows: pd.DataFrame, with_world: bool) -> np.ndarray:
    cols = [np.ones(len(rows)), rows["sent_mb"].to_numpy(float), rows["received_mb"].to_numpy(float)]
    if with_world:
        cols.append(rows["world"].to_numpy(float))
    return np.column_stack(cols)


@dataclass
class CommModel:
    """Least-squares coefficients: `per_world[D][direction]` = [a, b, c] (intercept, per sent
    MB, per received MB); `across[direction]` = [a, b, c, e] with e per device of world size.
    `analytic`: fitted on TorchRec's analytic estimate, no count having been measurable here."""

    per_world: dict[int, dict[str, list[float]]] = field(default_factory=dict)
    across: dict[str, list[float]] = field(default_factory=dict)
    analytic: bool = False

    def source(self, world: int, limit: int) -> str:
        """'measured-model' when fitted at this device count, 'oversubscribed-model' when fitted at
        it but it is above the honest limit `limit` (`comm.honest_limit`: the fit's times there
        mostly measure scheduling), 'extrapolated-model' when only the across-world fit covers it;
        'analytic-model' at every count for a model fitted on the analytic estimate."""
        if self.analytic:
            return "analytic-model"
        if world not in self.per_world:
            return "extrapolated-model"
        return "measured-model" if world <= limit else "oversubscribed-model"

    def predict_rows(self, rows: pd.DataFrame) -> np.ndarray:
        """Predicted ms for rows with world, direction, sent_mb, received_mb (never below 0)."""
        out = np.zeros(len(rows))
        for i, (world, direction, sent, received) in enumerate(
                rows[["world", "direction", "sent_mb", "received_mb"]].itertuples(index=False)):
            if int(world) in self.per_world:
                a, b, c = self.per_world[int(world)][direction]
                out[i] = a + b * sent + c * received
            else:
                a, b, c, e = self.across[direction]
                out[i] = a + b * sent + c * received + e * world
        return np.maximum(out, 0.0)

    def predict(self, widths: Sequence[int], batch_size: int) -> list[tuple[float, float]]:
        """(forward, backward) ms per device of a placement given as each device's summed width."""
        fwd, bwd = self.predict_arrays(np.asarray(widths, float), batch_size)
        return [(float(f), float(b)) for f, b in zip(fwd, bwd, strict=True)]

    def predict_arrays(self, widths: np.ndarray, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
        """Forward and backward ms per device as arrays: `predict` without pandas, for planners
        that call it once per candidate device."""
        world = len(widths)
        scale = (batch_size // world) * BYTES_PER_VALUE / MB
        sent = (world - 1) * widths * scale
        received = (widths.sum() - widths) * scale
        out = []
        for direction, (s, r) in zip(DIRECTIONS, [(sent, received), (received, sent)], strict=True):
            a, b, c = self.coefficients(world, direction)
            out.append(np.maximum(a + b * s + c * r, 0.0))
        return out[0], out[1]

    def coefficients(self, world: int, direction: str) -> tuple[float, float, float]:
        """(a, b, c) of ms = a + b * sent_mb + c * received_mb at `world` devices: the fit at that
        device count, else the fit across counts with its device-count term folded into a."""
        if world in self.per_world:
            a, b, c = self.per_world[world][direction]
            return float(a), float(b), float(c)
        a, b, c, e = self.across[direction]
        return float(a + e * world), float(b), float(c)

    def to_json(self) -> dict:
        """A JSON-ready document (device counts as string keys)."""
        return {"per_world": {str(w): v for w, v in self.per_world.items()}, "across": self.across,
                "analytic": self.analytic,
                "units": "ms = a + b*sent_mb + c*received_mb (+ e*world across device counts)"}

    @classmethod
    def from_json(cls, doc: dict) -> "CommModel":
        """A model from `to_json`'s document (one written before `analytic` was: measured)."""
        return cls({int(w): v for w, v in doc["per_world"].items()}, doc["across"], bool(doc.get("analytic", False)))

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=1))

    @classmethod
    def load(cls, path: str | Path) -> "CommModel":
        return cls.from_json(json.loads(Path(path).read_text()))


def fit_comm_model(rows: pd.DataFrame) -> CommModel:
    """Least squares per device count and direction, and across device counts per direction."""
    if rows.empty:
        raise ConfigError("comm rows: none (the comm model needs measured all-to-alls)")
    model = CommModel()
    for world, part in rows.groupby("world"):
        model.per_world[int(world)] = {
            d: np.linalg.lstsq(_design(g, False), g["ms"].to_numpy(float), rcond=None)[0].tolist()
            for d, g in part.groupby("direction")}
    for direction, g in rows.groupby("direction"):
        coef = np.linalg.lstsq(_design(g, True), g["ms"].to_numpy(float), rcond=None)[0].tolist()
        if g["world"].nunique() < 2:  # the world term is not identified from one device count
            coef = [*np.linalg.lstsq(_design(g, False), g["ms"].to_numpy(float), rcond=None)[0].tolist(), 0.0]
        model.across[str(direction)] = coef
    return model


def heldout_split(placements: int, share: float, seed: int, world: int) -> np.ndarray:
    """A seeded boolean mask of the held-out placements (at least one, at least one left to fit)."""
    if placements < 2:
        raise ConfigError(f"profile.comm.placements: {placements} (fitting and holding out needs at least 2)")
    held = min(placements - 1, max(1, round(share * placements)))
    mask = np.zeros(placements, bool)
    mask[rng(seed, "profile", "comm", "heldout", world).choice(placements, held, replace=False)] = True
    return mask


def mape(model: CommModel, rows: pd.DataFrame) -> float:
    """Mean absolute percentage error of the model on measured rows (a share)."""
    truth = rows["ms"].to_numpy(float)
    return float(np.mean(np.abs(model.predict_rows(rows) - truth) / truth))


def random_placements(table_dims: Sequence[int], world: int, count: int, seed: int) -> list[list[int]]:
    """`count` random placements of tables with `table_dims` onto `world` devices, as each
    device's summed width; the tables are a random subset (a quarter to all) so that the
    totals vary too. Seeded by rng(seed, "profile", "comm", world)."""
    gen = rng(seed, "profile", "comm", world)
    dims = np.asarray(table_dims, int)
    out = []
    for _ in range(count):
        k = int(gen.integers(max(1, len(dims) // 4), len(dims) + 1))
        chosen = gen.choice(len(dims), k, replace=False)
        devices = gen.integers(0, world, k)
        out.append([int(dims[chosen][devices == d].sum()) for d in range(world)])
    return out


def analytic_ranks(widths: Sequence[int], batch_size: int, device: str) -> list[tuple[float, float]]:
    """TorchRec's (forward, backward) all-to-all estimate per device of a placement given as each
    device's summed width (`comm.analytic_comm`: linear in a table's dim, blind to its pooling,
    so a device's tables may be taken as one table of their summed width)."""
    return analytic_comm([[int(w)] for w in widths], [[1.0]] * len(widths), batch_size, device)


def profile_comm(table_dims: Sequence[int], device_counts: Sequence[int], placements: int, batch_size: int,
                 timing: TimingConfig, seed: int, *, heldout_share: float, device: str, mape_target: float,
                 rounds: int) -> tuple[pd.DataFrame, CommModel, dict]:
    """Measure `placements` random placements per device count (those drawn twice, once) (one torchrun launch each, in
    `rounds` interleaved rounds of `timing.warmup` untimed and `timing.runs` timed all-to-alls,
    orders seeded from `seed`), fit the model on the placements not held out, and score it on the
    held-out ones, beside the measurement floor. A count this machine cannot launch
    (`comm.can_measure`) gets TorchRec's analytic estimate instead (see the module's text).
    Returns the rows (columns `heldout` and `source`, and the per-round columns of `comm_rows`),
    the model and the metrics (`device_counts`: those measured; `analytic_device_counts`: the
    others)."""
    frames = []
    comm_timing = CommTiming(rounds=int(rounds), warmup=timing.warmup, runs=timing.runs)
    for world in device_counts:
        # a placement drawn twice is one measurement: kept once, so it cannot be fitted and held out
        drawn = random_placements(table_dims, int(world), placements, seed)
        widths = list({placement_key(w): w for w in drawn}.values())
        held = heldout_split(len(widths), heldout_share, seed, int(world))
        if can_measure(int(world), device):
            records = measure_rounds(widths, batch_size, device, comm_timing,
                                     rng(seed, "profile", "comm", "rounds", int(world)))
            measured = [records[placement_key(w)] for w in widths]
            rows = comm_rows(widths, [ranks(r) for r in measured], batch_size,
                             rounds=[r["rounds"] for r in measured]).assign(source="measured")
        else:
            rows = comm_rows(widths, [analytic_ranks(w, batch_size, device) for w in widths],
                             batch_size).assign(source="analytic")
        frames.append(rows.assign(heldout=held[rows["placement"].to_numpy()]))
    rows = pd.concat(frames, ignore_index=True)
    timed = rows[rows["source"] == "measured"]
    fitted = timed if len(timed) else rows
    model = fit_comm_model(fitted[~fitted["heldout"]])
    model.analytic = timed.empty
    analytic = [int(w) for w in device_counts if not can_measure(int(w), device)]
    metrics = {"placements": int(placements), "device_counts": [int(w) for w in device_counts if w not in analytic],
               "analytic_device_counts": analytic, "batch_size": int(batch_size),
               "heldout_share": float(heldout_share), "rounds": int(rounds),
               **heldout_metrics(model, timed, honest_limit(device), mape_target)}
    if analytic:
        unmeasured = (f"device counts {analytic} were not measured (more ranks than the {honest_limit(device)} GPUs "
                      "here): " + ("the model is fitted on TorchRec's analytic estimate" if timed.empty
                                   else "the model extrapolates to them from the measured counts"))
        metrics["mape_target_note"] = unmeasured if timed.empty else "; ".join(
            filter(None, [metrics["mape_target_note"], unmeasured]))
    floor = metrics["mape_floor_honest"]
    metrics["mape_noise_free_honest"] = None if floor is None or rounds < 2 else noise_free_comm_mape(floor, rounds)
    return rows, model, metrics


def median_variance(rounds: int) -> float:
    """Variance of the median of `rounds` independent standard normal values (1 for one round,
    1/2 for two, about 0.449 for three): a numerical constant, from 200,000 draws of a fixed
    generator."""
    draws = np.random.default_rng(0).standard_normal((200_000, int(rounds)))
    return float(np.median(draws, axis=1).var())


def noise_free_comm_mape(floor: float, rounds: int) -> float:
    """What a noise-free model would score against the median of `rounds` rounds, from the
    floor `floor` (one round against the median of the other rounds), if rounds are independently
    and normally noisy: the floor's error has variance 1 + median_variance(rounds - 1) rounds'
    worth, the target's own median_variance(rounds)."""
    return floor * math.sqrt(median_variance(rounds) / (1 + median_variance(rounds - 1)))


def heldout_metrics(model: CommModel, rows: pd.DataFrame, limit: int, mape_target: float) -> dict:
    """The fit's MAPE on the held-out rows (column `heldout`) of the measured `rows`: pooled, per
    device count, across counts and over the honest counts (at most `limit`, see
    `comm.honest_limit`), the one the target is judged on; without an honest count the target is
    not met and `mape_target_note` says why. Beside them the measurement floor (`remeasure_ape`)
    over the same held-out rows, pooled (`mape_floor`) and honest (`mape_floor_honest`): None
    without two rounds or such rows. With no measured rows every MAPE is None."""
    test = rows[rows["heldout"]]
    worlds = sorted(int(w) for w in rows["world"].unique())
    honest = [w for w in worlds if w <= limit]
    honest_test = test[test["world"].isin(honest)]
    measured = not rows.empty
    metrics = {"mape_heldout": mape(model, test) if measured else None,
               "mape_heldout_by_world": {str(w): mape(model, g) for w, g in test.groupby("world")},
               "mape_train": mape(model, rows[~rows["heldout"]]) if measured else None,
               # the fit across device counts alone, as used where no count was measured (8 devices)
               "mape_heldout_across": mape(CommModel({}, model.across), test) if measured else None,
               "median_ms_by_world": {str(w): float(g["ms"].median()) for w, g in rows.groupby("world")},
               "honest_limit": int(limit), "honest_device_counts": honest,
               "mape_heldout_honest": mape(model, honest_test) if len(honest_test) else None,
               "mape_floor": _floor(test), "mape_floor_honest": _floor(honest_test),
               "mape_target": float(mape_target), "mape_target_note": None}
    if not measured:
        metrics |= {"mape_target_met": False, "mape_target_note": "no device count was measured"}
    elif metrics["mape_heldout_honest"] is None:
        metrics["mape_target_met"] = False
        metrics["mape_target_note"] = (f"no measured device count {worlds} runs one process per core or GPU "
                                       f"(at most {limit} here): every one is oversubscribed")
    else:
        metrics["mape_target_met"] = bool(metrics["mape_heldout_honest"] <= mape_target)
    return metrics


def _floor(rows: pd.DataFrame) -> float | None:
    ape = remeasure_ape(rows)
    return float(np.mean(ape)) if len(ape) else None


def error_table(model: CommModel, rows: pd.DataFrame) -> pd.DataFrame:
    """MAPE and median ms per device count, direction and fitted / held-out set (and, where the
    rows say it, per source: measured or analytic)."""
    rows = rows.assign(predicted_ms=model.predict_rows(rows))
    rows["ape"] = (rows["predicted_ms"] - rows["ms"]).abs() / rows["ms"]
    keys = ["world", "source", "direction", "heldout"] if "source" in rows else ["world", "direction", "heldout"]
    return rows.groupby(keys).agg(
        rows=("ms", "size"), median_ms=("ms", "median"), mape=("ape", "mean")).reset_index()
