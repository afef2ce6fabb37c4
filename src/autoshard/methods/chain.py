"""Steps shared by the planners of one build: each step of a task made once, timed once.

A method may start from another method's placement (`cost_greedy_local_search` from
`cost_greedy`'s, `sync_milp` from `sync_local_search`'s) or share a prepared input with it. The
planners of one build share a `Steps` record: a step (another method's placement, or a named
input) is made on its first call for a task and reused, its error raised again, whatever order the
planners are called in. Each step's own time excludes the steps it called, so a planner's
`seconds(task)` is the time of every step it needed, made now or reused: what making its
placement from scratch costs.
"""

import time
from collections.abc import Callable
from typing import Any

from autoshard.core.errors import ConfigError
from autoshard.data.tasks import Task


class Steps:
    """The steps made so far, per task: results (or the `ConfigError` raised), own times, and
    which steps each step called."""

    def __init__(self) -> None:
        self._done: dict[tuple[Task, str], Any] = {}
        self._own: dict[tuple[Task, str], float] = {}
        self._calls: dict[tuple[Task, str], set[str]] = {}
        self._open: list[tuple[tuple[Task, str], float]] = []  # steps being made, with time spent in callees

    def once(self, task: Task, step: str, make: Callable[[], Any]) -> Any:
        """The result of `step` for `task`, made by `make()` on the first call."""
        key = (task, step)
        if self._open:
            self._calls.setdefault(self._open[-1][0], set()).add(step)
        if key not in self._done:
            start = time.perf_counter()
            self._open.append((key, 0.0))
            try:
                self._done[key] = make()
            except ConfigError as exc:  # Infeasible too (a subclass): no placement, recorded like one
                self._done[key] = exc
            finally:
                _, inner = self._open.pop()
                total = time.perf_counter() - start
                self._own[key] = total - inner
                if self._open:
                    parent, spent = self._open[-1]
                    self._open[-1] = (parent, spent + total)
        result = self._done[key]
        if isinstance(result, Exception):
            raise result
        return result

    def seconds(self, task: Task, step: str) -> float:
        """Own time of `step` and of every step it needed for `task` (each counted once)."""
        seen, todo, total = set(), [step], 0.0
        while todo:
            s = todo.pop()
            if s in seen:
                continue
            seen.add(s)
            total += self._own.get((task, s), 0.0)
            todo += self._calls.get((task, s), ())
        return total
