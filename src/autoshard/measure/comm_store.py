"""Measured all-to-alls of placements, filed so that each is measured once per settings.

A placement's all-to-all depends only on each device's summed embedding width (in device
order) and the batch, so it is filed under `placement_key` ("64,32,0,48") in a space whose key
covers everything else that can change the value: the shard space it belongs to (a tagged
pass, an independent re-measurement, gets its own), batch size, device count, timing settings,
device, machine and libraries, and the measuring code. The files are the shard store's
(`measure.store.MeasurementStore`): atomic, append-only, first file by name wins, so an
interrupted run resumes with the launches it finished.

The missing placements of one device count are measured in torchrun launches of at most
LAUNCH_PLACEMENTS, each filed when it ends, in `rounds` interleaved rounds: each round times
every placement once, in a seeded shuffled order, so a machine that drifts during the launch
spreads over all of them; a rank's value is the median over rounds of its per-round median over
runs.
"""

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass

import numpy as np
from tqdm.auto import tqdm

from autoshard.core.digest import key, machine, source_digest
from autoshard.core.params import bounded
from autoshard.core.seeding import rng
from autoshard.measure.comm import measure_comm_many
from autoshard.measure.interleaved import round_cv
from autoshard.measure.store import MeasurementStore
from autoshard.measure.timing import one_round

MEASURING_CODE = ("autoshard.measure.comm", "autoshard.measure.comm_store")
SECONDS_PER_PLACEMENT_ROUND = 2.0  # the launch's timeout: a guard only (~0.1 s each on 2 CPU cores)
LAUNCH_PLACEMENTS = 200  # placements per launch, filed when it ends: what an interruption can lose (~35 s)


@dataclass(frozen=True)
class CommTiming:
    """How placements' all-to-alls are measured (`evaluate.comm`): `warmup` untimed and `runs`
    timed all-to-alls per placement and round, `rounds` interleaved rounds in one launch."""

    rounds: int
    warmup: int = bounded(lo=0)
    runs: int


def placement_key(widths: Iterable[int]) -> str:
    """A placement's name in the comm store: each device's summed width, in device order."""
    return ",".join(str(int(w)) for w in widths)


def comm_space(store: MeasurementStore, batch_size: int, world: int, timing: CommTiming,
               device: str) -> MeasurementStore:
    """The comm store of `world`-device placements measured under `store`'s space (its folder
    `comm/<key>`): the key covers every setting that can change a measured value."""
    return MeasurementStore(store.folder / "comm", key(
        store.folder.name, int(batch_size), int(world), asdict(timing), device, machine(device),
        source_digest(*MEASURING_CODE)))


def placement_records(placements: Iterable[Sequence[int]], store: MeasurementStore, batch_size: int, device: str,
                      timing: CommTiming, seed: int, label: str = "score") -> dict[str, dict]:
    """The store record of every placement (each device's summed width), by `placement_key`: read
    where filed under `store`'s space, else measured, in launches of at most LAUNCH_PLACEMENTS per
    device count, and filed. `label` says who measured (and seeds the rounds' orders)."""
    distinct = {placement_key(p): [int(w) for w in p] for p in placements}
    by_world: dict[int, dict[str, list[int]]] = {}
    for name, widths in distinct.items():
        by_world.setdefault(len(widths), {})[name] = widths
    out = {}
    for world, group in sorted(by_world.items()):
        space = comm_space(store, batch_size, world, timing, device)
        known = space.read()
        todo = {k: w for k, w in group.items() if k not in known}
        if todo:
            print(f"all-to-all ({label}): {len(todo)} placements x {timing.rounds} rounds on {world} processes, "
                  f"{len(group) - len(todo)} read back", flush=True)
            names = list(todo)  # in the order given (task by task): a task's placements share a launch
            for start in tqdm(range(0, len(names), LAUNCH_PLACEMENTS), desc="all-to-all launches"):
                part = names[start:start + LAUNCH_PLACEMENTS]
                space.write(measure_rounds([todo[k] for k in part], batch_size, device, timing,
                                           rng(seed, "comm", label, world, part[0])), label)
            known = space.read()
        out.update({k: known[k] for k in group})
    return out


def measure_rounds(placements: Sequence[Sequence[int]], batch_size: int, device: str, timing: CommTiming,
                   order) -> dict[str, dict]:
    """Store records of `placements` (one device count) measured in one launch of `timing.rounds`
    rounds, each in an order shuffled by `order` (a numpy generator): per device the median over
    rounds (`forward_ms`, `backward_ms`) and every round's values (`rounds`)."""
    sequence = [int(i) for _ in range(timing.rounds) for i in order.permutation(len(placements))]
    measured = measure_comm_many([placements[i] for i in sequence], batch_size, device,
                                 one_round(timing.warmup, timing.runs),
                                 timeout_s=60 + SECONDS_PER_PLACEMENT_ROUND * len(sequence))
    per: dict[int, list] = {i: [] for i in range(len(placements))}
    for i, values in zip(sequence, measured, strict=True):
        per[i].append([[float(f), float(b)] for f, b in values])
    records = {}
    for i, rounds in per.items():
        per_device = list(zip(*rounds, strict=True))  # per rank: its (forward, backward) in every round
        records[placement_key(placements[i])] = {
            "forward_ms": [statistics.median(r[0] for r in rank) for rank in per_device],
            "backward_ms": [statistics.median(r[1] for r in rank) for rank in per_device],
            "rounds": rounds}
    return records


def rank_cvs(record: Mapping) -> list[float]:
    """A record's CV across rounds of each device's forward + backward time (`round_cv`): how
    repeatable that measurement is."""
    rounds = np.asarray(record["rounds"], dtype=float).sum(axis=2)  # rounds x devices: forward + backward
    return [round_cv(rounds[:, d]) for d in range(rounds.shape[1])]


def ranks(record: Mapping) -> list[tuple[float, float]]:
    """A record's (forward, backward) ms per device."""
    return [(float(f), float(b)) for f, b in zip(record["forward_ms"], record["backward_ms"], strict=True)]
