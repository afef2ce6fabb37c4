"""Steps shared by one build's planners: made once per task, errors kept, times not double-counted."""

import time

import pytest

from autoshard.core.errors import ConfigError
from autoshard.data.tasks import Task
from autoshard.methods.chain import Steps

TASK = Task("t", "p", "test", (0, 1), 2, 10, 1.0)


def test_a_step_is_made_once_and_its_error_raised_again():
    steps, made = Steps(), []

    def make():
        made.append(1)
        raise ConfigError("no room")
    for _ in range(2):
        with pytest.raises(ConfigError, match="no room"):
            steps.once(TASK, "a", make)
    assert made == [1]


def test_a_steps_seconds_are_its_own_plus_the_steps_it_called_each_once():
    steps = Steps()

    def start():
        time.sleep(0.05)
        return "start"

    def refine():
        begin = steps.once(TASK, "start", start)
        steps.once(TASK, "start", start)  # asked twice, made and counted once
        time.sleep(0.02)
        return begin + "+refined"
    assert steps.once(TASK, "refine", refine) == "start+refined"
    assert 0.05 <= steps.seconds(TASK, "start") < 0.07
    assert 0.07 <= steps.seconds(TASK, "refine") < 0.1, "the start's time counted once, the refine's own added"
    other = Task("u", "p", "test", (0,), 1, 10, 1.0)
    assert steps.seconds(other, "refine") == 0.0
