"""Sharding tasks: T tables of the pool on D devices with a memory cap per device.

Two protocols, as in the papers:
- `autoshard`: train tasks draw from the train half of the pool; test tasks mix a ratio r
  of unseen tables (from the test half) with seen ones, one group of tasks per r.
- `dreamshard`: train tasks from the train pool, test tasks from the test pool.
Every task is checked feasible: first-fit-decreasing must find a placement under the cap.

A third, `tight`, puts the memory cap near the bin-packing optimum: its test tasks draw tables
like its base protocol's test tasks, then take a cap of `cap_slack` (drawn per task in the
range) times the lowest per-device maximum memory a placement was found to reach (binary
search on the cap with first-fit-decreasing; `packing.memory_bounds`). That bound is reached
by a placement, so the cap is never below the slack; the optimum lies between it and
max(largest table, total / devices). Tight tasks come from their own function and random
streams, so the two papers' tasks stay the same for a seed.
"""

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from autoshard.core.atomic import atomic_file
from autoshard.core.errors import ConfigError, invalid
from autoshard.core.params import Fields, Section, bounded, choice, read
from autoshard.core.seeding import rng
from autoshard.data.packing import first_fit_decreasing, memory_bounds

__all__ = ["first_fit_decreasing"]  # re-exported: callers import it from here

PROTOCOLS = ("autoshard", "dreamshard")
GIB = 2**30


@dataclass(frozen=True)
class Task:
    """One sharding problem. `tables` are pool table ids."""

    name: str
    protocol: str
    split: str
    tables: tuple[int, ...]
    devices: int
    memory_bytes: int
    unseen_ratio: float


@dataclass(frozen=True)
class ProtocolConfig:
    """One protocol's task shape and counts (`tasks.autoshard`, `tasks.dreamshard`)."""

    name: str
    tables: int
    devices: int
    memory_bytes: int
    train_tasks: int = bounded(lo=0)
    test_tasks: int = bounded(lo=0)
    unseen_ratios: tuple[float, ...] = bounded(lo=0, hi=1)


@dataclass(frozen=True)
class TightConfig:
    """`tasks.tight`: test tasks of `base`'s kind whose cap is a slack over the packing bound."""

    tables: int
    devices: int
    cap_slack: tuple[float, float] = bounded(lo=1.0)
    base: str = choice(PROTOCOLS)
    test_tasks: int = bounded(lo=0)


@dataclass(frozen=True)
class TaskConfig(Section):
    """The `tasks` section of params.yaml."""

    section = "tasks"
    train_share: float = bounded(lo=0, hi=1, lo_open=True)
    max_draws: int
    protocols: tuple[ProtocolConfig, ...]
    tight: TightConfig

    @classmethod
    def from_params(cls, values: dict) -> "TaskConfig":
        """`parse`, with one protocol per name of PROTOCOLS from its sub-section."""
        f = Fields(cls.section, values)
        cfg = read(cls, f, protocols=tuple(_protocol(f.sub(name), name) for name in PROTOCOLS))
        f.done()
        return cfg


def _protocol(f: Fields, name: str) -> ProtocolConfig:
    """A protocol's sub-section: its cap in GiB, and unseen ratios for AutoShard's only
    (DreamShard's test tasks are all of unseen tables)."""
    memory_bytes = int(f.number("memory_per_device_gib", lo=0, lo_open=True) * GIB)
    ratios = {} if name == "autoshard" else {"unseen_ratios": (1.0,)}
    cfg = read(ProtocolConfig, f, name=name, memory_bytes=memory_bytes, **ratios)
    f.done()
    return cfg


def split_pool(num_tables: int, train_share: float, seed: int, stream: str = "tasks"
               ) -> tuple[np.ndarray, np.ndarray]:
    """A seeded split of table ids into disjoint, sorted train and test pools (the random stream
    `stream`, whose section names `train_share` in the error)."""
    order = rng(seed, stream, "split").permutation(num_tables)
    cut = int(round(train_share * num_tables))
    if cut < 1 or cut >= num_tables:
        raise invalid(f"{stream}.train_share", train_share,
                      f"leaves an empty train or test pool of {num_tables} tables")
    return np.sort(order[:cut]), np.sort(order[cut:])


def make_tasks(features: pd.DataFrame, tasks: dict, seed: int
               ) -> tuple[list[Task], np.ndarray, np.ndarray]:
    """All tasks of both protocols, and the train and test pools they draw from."""
    cfg = TaskConfig.from_params(tasks)
    sizes = features["size_bytes"].to_numpy()
    train, test = split_pool(len(features), cfg.train_share, seed)
    out = []
    for p in cfg.protocols:
        _check_protocol(p, sizes, len(train), len(test))
        groups = [("train", 0.0, p.train_tasks)]
        groups += [("test", r, p.test_tasks) for r in p.unseen_ratios]
        for split, ratio, count in groups:
            for k in range(count):
                g = rng(seed, "tasks", p.name, split, f"{ratio:.4f}", k)
                unseen = int(round(ratio * p.tables)) if split == "test" else 0
                tables = draw_feasible(g, p, train, test, unseen, sizes, cfg.max_draws)
                suffix = f"r{ratio:.2f}/" if p.name == "autoshard" and split == "test" else ""
                out.append(Task(name=f"{p.name}/{split}/{suffix}{k:03d}", protocol=p.name,
                                split=split, tables=tables, devices=p.devices,
                                memory_bytes=p.memory_bytes, unseen_ratio=unseen / p.tables))
    return out, train, test


def tight_tasks(features: pd.DataFrame, tasks: dict, seed: int) -> list[Task]:
    """The tight-memory protocol's test tasks (named `tight/test/...`), drawn from the same pool
    split as `make_tasks`'s, each with its own cap."""
    cfg = TaskConfig.from_params(tasks)
    c = cfg.tight
    base = next(p for p in cfg.protocols if p.name == c.base)
    sizes = features["size_bytes"].to_numpy()
    train, test = split_pool(len(features), cfg.train_share, seed)
    # the shape checks of a protocol, with a cap no table exceeds (the cap is set per task)
    shape = ProtocolConfig(name="tight", tables=c.tables, devices=c.devices, memory_bytes=int(sizes.max()),
                           train_tasks=0, test_tasks=c.test_tasks, unseen_ratios=base.unseen_ratios)
    _check_protocol(shape, sizes, len(train), len(test))
    out = []
    for ratio in base.unseen_ratios:
        for k in range(c.test_tasks):
            g = rng(seed, "tasks", "tight", "test", f"{ratio:.4f}", k)
            unseen = int(round(ratio * c.tables))
            tables, cap = _draw_tight(g, c, train, test, unseen, sizes, cfg.max_draws)
            suffix = f"r{ratio:.2f}/" if len(base.unseen_ratios) > 1 else ""
            out.append(Task(name=f"tight/test/{suffix}{k:03d}", protocol="tight", split="test", tables=tables,
                            devices=c.devices, memory_bytes=cap, unseen_ratio=unseen / c.tables))
    return out


def _draw_tight(g: np.random.Generator, c: TightConfig, train: np.ndarray, test: np.ndarray, unseen: int,
                sizes: np.ndarray, max_draws: int) -> tuple[tuple[int, ...], int]:
    """Sorted table ids and a cap of slack x the packing bound under which FFD places them."""
    for _ in range(max_draws):
        tables = np.sort(np.concatenate([g.choice(train, c.tables - unseen, replace=False),
                                         g.choice(test, unseen, replace=False)]))
        _, reached = memory_bounds(sizes[tables], c.devices)
        cap = int(np.ceil(g.uniform(*c.cap_slack) * reached))
        if first_fit_decreasing(sizes[tables], c.devices, cap) is not None:
            return tuple(int(t) for t in tables), cap
    raise invalid("tasks.tight.cap_slack", list(c.cap_slack),
                  f"first-fit-decreasing placed no drawn task under its cap in {max_draws} draws")


def _check_protocol(p: ProtocolConfig, sizes: np.ndarray, n_train: int, n_test: int) -> None:
    field = f"tasks.{p.name}"
    if p.memory_bytes < sizes.max():
        raise invalid(f"{field}.memory_per_device_gib", p.memory_bytes / GIB,
                      f"smaller than the largest table, {sizes.max() / GIB:.4f} GiB")
    if p.tables > n_train:
        raise invalid(f"{field}.tables", p.tables, f"more than the {n_train} tables of the train pool")
    most_unseen = round(max(p.unseen_ratios) * p.tables)
    if most_unseen > n_test:
        raise invalid(f"{field}.tables", p.tables,
                      f"needs {most_unseen} unseen tables, the test pool has {n_test}")


def draw_feasible(g: np.random.Generator, p: ProtocolConfig, train: np.ndarray, test: np.ndarray,
                  unseen: int, sizes: np.ndarray, max_draws: int, field: str | None = None) -> tuple[int, ...]:
    """Sorted table ids: `unseen` from `test`, the rest from `train`, redrawn until first-fit-
    decreasing places them under the cap; `field` names the cap in the error when none does."""
    for _ in range(max_draws):
        tables = np.concatenate([g.choice(train, p.tables - unseen, replace=False),
                                 g.choice(test, unseen, replace=False)])
        if first_fit_decreasing(sizes[tables], p.devices, p.memory_bytes) is not None:
            return tuple(int(t) for t in sorted(tables))
    raise invalid(field or f"tasks.{p.name}.memory_per_device_gib", p.memory_bytes / GIB,
                  f"no feasible task of {p.tables} tables on {p.devices} devices "
                  f"in {max_draws} draws")


def save_tasks(path: str | Path, tasks: list[Task], train: np.ndarray, test: np.ndarray,
               seed: int) -> None:
    """Write the task file (JSON) at once."""
    doc = {"seed": seed, "train_tables": train.tolist(), "test_tables": test.tolist(),
           "tasks": [asdict(t) | {"tables": list(t.tables)} for t in tasks]}
    with atomic_file(path) as tmp:
        tmp.write_text(json.dumps(doc, indent=1) + "\n")


def load_tasks(path: str | Path) -> tuple[list[Task], np.ndarray, np.ndarray]:
    """Read a task file written by `save_tasks`: the tasks, the train and the test pool."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
        tasks = [Task(**(t | {"tables": tuple(t["tables"])})) for t in doc["tasks"]]
        return tasks, np.array(doc["train_tables"]), np.array(doc["test_tables"])
    except FileNotFoundError:
        raise ConfigError(f"{path}: task file not found (run `dvc repro synthesize`)") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"{path}: not a task file ({exc.__class__.__name__}: {exc})") from None


def task_summary(tasks: list[Task], features: pd.DataFrame) -> pd.DataFrame:
    """One row per (protocol, split, unseen ratio): counts, sizes and memory headroom."""
    sizes = features["size_bytes"].to_numpy()
    rows = [{"protocol": t.protocol, "split": t.split, "unseen_ratio": t.unseen_ratio,
             "tables": len(t.tables), "devices": t.devices,
             "memory_per_device_MiB": t.memory_bytes / 2**20,
             "memory_fill": sizes[list(t.tables)].sum() / (t.devices * t.memory_bytes)}
            for t in tasks]
    return (pd.DataFrame(rows)
            .groupby(["protocol", "split", "unseen_ratio", "tables", "devices",
                      "memory_per_device_MiB"], as_index=False)
            .agg(tasks=("memory_fill", "size"), mean_memory_fill=("memory_fill", "mean"),
                 max_memory_fill=("memory_fill", "max")))

def shards(placement: np.ndarray, tables: tuple[int, ...] | list[int], devices: int
           ) -> list[tuple[int, ...]]:
    """The pool table ids on each device, sorted."""
    ids = np.asarray(tables)
    return [tuple(sorted(int(t) for t in ids[placement == d])) for d in range(devices)]
