"""Scoring with measured all-to-alls: a real 2-rank launch, the cache and its key, the
synchronized objective on measured comm, which protocols get it, and the settings' checks."""

from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from autoshard.core.errors import ConfigError
from autoshard.data.tasks import Task
from autoshard.measure import comm_store
from autoshard.measure.analytic import AnalyticBackend
from autoshard.measure.backends import BackendConfig
from autoshard.measure.comm import STAGES
from autoshard.measure.comm_store import CommTiming, comm_space, placement_key, placement_records, ranks
from autoshard.measure.commmodel import CommModel
from autoshard.measure.store import MeasurementStore
from autoshard.measure.timing import TimingConfig
from autoshard.pipeline.stage import select, stage_spec
from autoshard.studies import measured
from autoshard.studies.evaluate import EvaluateConfig
from autoshard.studies.measured import MeasuredComm, bottlenecks, device_widths, score

ROOT = Path(__file__).resolve().parents[2]
TIMING = CommTiming(rounds=2, warmup=1, runs=2)
ONE_ROUND = TimingConfig(warmup=1, runs=2, rounds=1, drift_limit=0.25, retries=1)


def placements_comm(*args, **kwargs) -> dict[str, list[tuple[float, float]]]:
    """(forward, backward) ms per device of each placement, as scoring reads them."""
    return {name: ranks(record) for name, record in placement_records(*args, **kwargs).items()}


def config(params: dict, **comm) -> EvaluateConfig:
    """The evaluate config from the params dvc.yaml gives the stage, `evaluate.comm` overridden."""
    chosen = select(params, stage_spec("evaluate", ROOT / "dvc.yaml")[1], "params")
    evaluate = chosen["evaluate"] | {"comm": chosen["evaluate"]["comm"] | comm}
    return EvaluateConfig.from_params(evaluate, chosen["profile"] | {"device": "cpu"}, chosen["rl"])


class Launches:
    """Stands in for the torchrun launch: counts launches; rank d's time is 0.01 x width + d."""

    def __init__(self):
        self.calls: list[int] = []

    def __call__(self, placements, batch_size, device, timing, timeout_s=600):
        self.calls.append(len(placements))
        return [[(0.01 * w + d, 0.02 * w + d) for d, w in enumerate(p)] for p in placements]


@pytest.fixture
def launches(monkeypatch) -> Launches:
    fake = Launches()
    monkeypatch.setattr(comm_store, "measure_comm_many", fake)
    return fake


def test_a_real_launch_measures_placements_in_interleaved_rounds(tmp_path):
    store = MeasurementStore(tmp_path, "space")
    placements = [[16, 48], [32, 32], [64, 0]]
    out = placements_comm(placements + [[16, 48]], store, 64, "cpu", TIMING, seed=0)
    assert sorted(out) == sorted(map(placement_key, placements))
    for per_device in out.values():
        assert len(per_device) == 2 and all(f > 0 and b > 0 for f, b in per_device)
    records = comm_space(store, 64, 2, TIMING, "cpu").read()
    assert all(len(r["rounds"]) == TIMING.rounds for r in records.values())


def test_a_second_score_launches_nothing_and_the_key_covers_the_settings(tmp_path, launches, monkeypatch):
    store = MeasurementStore(tmp_path, "space")
    placements = [[16, 48, 0, 32], [32, 32, 16, 16], [8, 8]]
    first = placements_comm(placements, store, 64, "cpu", TIMING, seed=0)
    assert launches.calls == [1 * TIMING.rounds, 2 * TIMING.rounds], "one launch per device count, all rounds"
    assert np.allclose(first["16,48,0,32"], [(0.16, 0.32), (1.48, 1.96), (2.0, 2.0), (3.32, 3.64)])
    assert placements_comm(placements, store, 64, "cpu", TIMING, seed=1) == first
    assert len(launches.calls) == 2, "a second score of the same plans launched again"
    placements_comm([*placements, [24, 40]], store, 64, "cpu", TIMING, seed=0)
    assert launches.calls[-1] == TIMING.rounds, "only the missing placement is measured"
    folder = comm_space(store, 64, 2, TIMING, "cpu").folder
    assert comm_space(store, 128, 2, TIMING, "cpu").folder != folder
    assert comm_space(store, 64, 4, TIMING, "cpu").folder != folder
    assert comm_space(store, 64, 2, replace(TIMING, runs=3), "cpu").folder != folder
    assert comm_space(store, 64, 2, replace(TIMING, rounds=3), "cpu").folder != folder
    assert comm_space(store.tagged("again"), 64, 2, TIMING, "cpu").folder != folder
    placements_comm(placements, store.tagged("again"), 64, "cpu", TIMING, seed=0)
    assert len(launches.calls) == 5, "a tagged pass is an independent re-measurement"
    monkeypatch.setattr(comm_store, "source_digest", lambda *modules: "other measuring code")
    assert comm_space(store, 64, 2, TIMING, "cpu").folder != folder, "the measuring code is not in the key"


def _plans():
    dreamshard = Task("d/0", "dreamshard", "test", (0, 1, 2, 3), 2, 10**12, 1.0)
    autoshard = Task("a/0", "autoshard", "test", (0, 1, 2, 3), 2, 10**12, 0.0)
    plans = {"one": [np.array([0, 0, 1, 1])] * 2, "other": [np.array([0, 1, 0, 1])] * 2}
    return [dreamshard, autoshard], plans


def test_score_uses_measured_comm_for_the_protocols_asked_and_sums_stage_maxima(tmp_path, pool, launches,
                                                                                  monkeypatch):
    monkeypatch.setattr(measured, "honest_limit", lambda device: 2)  # 2 ranks, one per core
    tasks, plans = _plans()
    backend = AnalyticBackend(pool)
    cfg = BackendConfig(backend="analytic", device="cpu", optimizer="EXACT_SGD", batch_size=64, threads=1,
                        timing=ONE_ROUND, memory_limit_bytes=2**30)
    store = MeasurementStore(tmp_path, "space")
    asked = MeasuredComm(timing=TIMING, device_counts=(2,), protocols=("dreamshard",))
    devices = score(backend, pool.features, tasks, plans, cfg, store, 0, progress=False, measured_comm=asked)
    sources = devices.groupby("protocol")["comm_source"].unique()
    assert list(sources["dreamshard"]) == ["measured"] and list(sources["autoshard"]) == ["analytic"]
    launched = len(launches.calls)
    again = score(backend, pool.features, tasks, plans, cfg, store, 0, progress=False, measured_comm=asked)
    assert len(launches.calls) == launched and again.equals(devices)
    one = devices[(devices["task"] == "d/0") & (devices["method"] == "one")]
    widths = device_widths(pool.features, [[0, 1], [2, 3]])
    assert one["forward_comm_ms"].tolist() == [0.01 * w + d for d, w in enumerate(widths)]
    by_hand = sum(one[s].max() for s in STAGES)
    plan = bottlenecks(devices, {"dreamshard": "synchronized_stages", "autoshard": "max_device"}).set_index(
        ["task", "method"])
    assert plan.loc[("d/0", "one"), "synchronized_ms"] == pytest.approx(by_hand)
    assert plan.loc[("d/0", "one"), "measured_ms"] == pytest.approx(by_hand)
    off = score(backend, pool.features, tasks, plans, cfg, store, 0, progress=False)
    assert set(off["comm_source"]) == {"analytic"}, "default off: every other caller unchanged"
    foreign = MeasurementStore(tmp_path, "space", foreign=True)
    read_only = score(backend, pool.features, tasks, plans, cfg, foreign, 0, progress=False, measured_comm=asked)
    assert set(read_only["comm_source"]) == {"analytic"} and len(launches.calls) == launched


ANALYTIC = BackendConfig(backend="analytic", device="cpu", optimizer="EXACT_SGD", batch_size=64, threads=1,
                         timing=ONE_ROUND, memory_limit_bytes=2**30)


def _score_asking_comm(pool, folder) -> pd.DataFrame:
    """`_plans()` scored on the analytic backend, the dreamshard task's comm asked for at 2 devices."""
    tasks, plans = _plans()
    asked = MeasuredComm(timing=TIMING, device_counts=(2,), protocols=("dreamshard",))
    return score(AnalyticBackend(pool), pool.features, tasks, plans, ANALYTIC, MeasurementStore(folder, "space"), 0,
                 progress=False, measured_comm=asked)


def test_a_measurement_with_more_ranks_than_cores_is_labelled_oversubscribed(tmp_path, pool, launches, monkeypatch):
    asks = []
    monkeypatch.setattr(measured, "honest_limit", lambda device: asks.append(device) or 1)  # 2 ranks on 1 core
    devices = _score_asking_comm(pool, tmp_path)
    dreamshard = devices[devices["protocol"] == "dreamshard"]
    assert set(dreamshard["comm_source"]) == {"measured-oversubscribed"}
    assert dreamshard["comm_cv"].notna().all(), "an oversubscribed measurement keeps its CV across rounds"
    assert set(devices.loc[devices["protocol"] == "autoshard", "comm_source"]) == {"analytic"}
    assert asks == ["cpu"], "the honest limit is asked once per score, not per plan"
    model = CommModel({2: {"forward": [1.0, 0.0, 0.0], "backward": [2.0, 0.0, 0.0]}}, {})
    modelled = score(AnalyticBackend(pool), pool.features, *_plans(), ANALYTIC, MeasurementStore(tmp_path, "space"), 0,
                     progress=False, comm_model=model)
    assert set(modelled["comm_source"]) == {"oversubscribed-model"}, "fitted at 2 ranks, but on 1 core"


def test_settings_follow_the_objective_and_bad_values_name_the_field(smoke_params):
    cfg = config(smoke_params)
    assert cfg.comm is not None and cfg.comm.protocols == ("dreamshard",)
    assert cfg.comm.device_counts == tuple(smoke_params["profile"]["comm"]["device_counts"])
    assert config(smoke_params, measure=False).comm is None
    for field, value in [("rounds", 0), ("runs", 0), ("warmup", -1), ("measure", "yes")]:
        with pytest.raises(ConfigError, match=rf"evaluate\.comm\.{field}: {value!r}"):
            config(smoke_params, **{field: value})
    with pytest.raises(ConfigError, match="evaluate.comm.rouns"):
        config(smoke_params, rouns=3)


def test_launches_are_chunked_in_the_order_given_and_each_devices_round_cv_is_read_back(tmp_path, monkeypatch):
    """At most LAUNCH_PLACEMENTS a launch, in the order given (a task's placements together), each
    filed when it ends; rank_cvs reads each device's CV across rounds from what was filed."""
    launched = []

    def launch(placements, batch_size, device, timing, timeout_s=600):  # rank d: width x (1 + d) / 100, round-free
        launched.append(sorted({tuple(p) for p in placements}))
        return [[(0.01 * w * (1 + d), 0.01 * w) for d, w in enumerate(p)] for p in placements]
    monkeypatch.setattr(comm_store, "measure_comm_many", launch)
    monkeypatch.setattr(comm_store, "LAUNCH_PLACEMENTS", 2)
    store = MeasurementStore(tmp_path, "space")
    placements = [[40, 8], [8, 40], [24, 8], [16, 8], [32, 8]]
    records = placement_records(placements, store, 64, "cpu", TIMING, seed=0)
    assert launched == [sorted(map(tuple, placements[i:i + 2])) for i in (0, 2, 4)], "not chunked in the order given"
    assert set(records) == set(map(placement_key, placements))
    assert all(comm_store.rank_cvs(r) == [0.0, 0.0] for r in records.values()), "the fake launch repeats itself"


def test_tasks_whose_ranks_the_machine_cannot_launch_take_their_comm_from_the_model(tmp_path, pool, launches,
                                                                                     monkeypatch):
    """On CUDA one rank needs one GPU (`comm.can_measure`): a task with more devices than GPUs is
    never launched (NCCL would refuse it); its comm comes from the model, labelled."""
    monkeypatch.setattr(measured, "can_measure", lambda world, device: False)
    devices = _score_asking_comm(pool, tmp_path)
    assert not launches.calls
    assert set(devices["comm_source"]) == {"analytic"}
