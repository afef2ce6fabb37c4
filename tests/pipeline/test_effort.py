"""The measuring effort: a slower machine measures with fewer rounds, a faster one with more,
within the limits, the same machine always as much, and only the rounds change."""

from types import SimpleNamespace

import pytest
from study_configs import PARAMS

from autoshard.core.errors import ConfigError
from autoshard.pipeline import effort as efforts

CFG = efforts.EffortConfig(scale=True, reference_ms=18.0, least=2, most=2.0)


def _at(ms: float, cfg: efforts.EffortConfig = CFG) -> efforts.Effort:
    return efforts.decide({efforts.SPEED: ms}, cfg)


def test_the_reference_machine_and_its_own_noise_measure_as_written():
    for ms in (18.0, 14.0, 24.0):  # within a factor sqrt(2) of the reference: the level stays 0
        effort = _at(ms)
        assert effort.level == 0 and [effort.rounds(r) for r in (1, 2, 3, 5)] == [1, 2, 3, 5]


def test_a_slow_machine_measures_with_fewer_rounds_never_below_the_least():
    twice, eightfold = _at(36.0), _at(8 * 18.0)  # the 8x: 117-168 ms against 14-18
    assert (twice.level, eightfold.level) == (1, 3)
    assert [twice.rounds(r) for r in (2, 3, 4, 8)] == [2, 2, 2, 4]
    assert [eightfold.rounds(r) for r in (2, 3, 16)] == [2, 2, 2]
    assert eightfold.rounds(1) == 1  # a single round stays single: never more than written on a slow machine


def test_a_fast_machine_measures_more_up_to_most_times_as_written():
    fast, faster = _at(9.0), _at(2.0)
    assert (fast.level, faster.level) == (-1, -3)
    assert [fast.rounds(r) for r in (1, 2, 3)] == [2, 4, 6]
    assert [faster.rounds(r) for r in (1, 2, 3)] == [2, 4, 6]  # capped at 2x


def test_scaling_off_measures_as_written_on_any_machine():
    off = efforts.EffortConfig(scale=False, reference_ms=18.0, least=2, most=2.0)
    assert _at(8 * 18.0, off).rounds(3) == 3


def test_scaled_changes_the_rounds_only_and_leaves_the_stage_params_alone():
    params = SimpleNamespace(seed=0, profile={"rounds": 3, "runs": 1, "backend": "fbgemm"},
                             evaluate={"timing": {"rounds": 4, "runs": 1}, "tight_tasks": 20}, rl={"best_of": 16})
    out = efforts.scaled(params, _at(36.0))
    assert out.profile == {"rounds": 2, "runs": 1, "backend": "fbgemm"}
    assert out.evaluate == {"timing": {"rounds": 2, "runs": 1}, "tight_tasks": 20}
    assert out.rl == params.rl and out.seed == 0
    assert params.profile["rounds"] == 3 and params.evaluate["timing"]["rounds"] == 4  # a copy: the stage's untouched
    partial = efforts.scaled(SimpleNamespace(profile={"backend": "fbgemm"}), _at(36.0))  # the evaluate stage's profile
    assert partial.profile == {"backend": "fbgemm"}


def test_the_decided_effort_round_trips_and_a_missing_file_names_the_stage(tmp_path):
    effort = _at(40.0)
    path = efforts.save(effort, tmp_path / "profile" / "effort.json")
    assert efforts.load(path) == effort and effort.summary()["factor"] == pytest.approx(40 / 18, abs=1e-4)
    with pytest.raises(ConfigError, match="dvc repro profile"):
        efforts.load(tmp_path / "nowhere.json")


def test_params_yaml_declares_the_reference_the_rounds_were_sized_for():
    cfg = efforts.EffortConfig.from_params(PARAMS["effort"])
    assert cfg.scale and cfg.least >= 2 and cfg.reference_ms > 0
