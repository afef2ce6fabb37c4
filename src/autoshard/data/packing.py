"""Bin packing under a per-device memory cap: first-fit-decreasing, the smallest per-device
maximum memory a placement can reach, and a guard that keeps a table-by-table placement from
dead-ending (leaving tables that fit on no device).

The guard's check is first-fit-decreasing (FFD) of the tables still to place into the room
the devices have left: FFD succeeding proves the rest can be placed; FFD failing only says
"may be infeasible". Most steps need no FFD run: a bound on the room FFD can waste
(`surely_packs`) settles them in a few array operations. To make the guarantee hold step
after step, the guard keeps, per task, a certificate: a placement of the remaining tables
that fits. The certificate's device for the current table is always allowed (the certificate
stays valid after it), and any other device allowed leaves a state FFD packs (a new
certificate), so a task FFD can place never dead-ends, whatever order the tables come in.
"""

import numpy as np


def first_fit_decreasing(sizes: np.ndarray, devices: int, capacity: int) -> np.ndarray | None:
    """A placement (device per table) under `capacity`, largest first, or None if FFD fails."""
    load = np.zeros(devices, dtype=np.int64)
    placement = np.full(len(sizes), -1, dtype=np.int64)
    for i in np.argsort(-np.asarray(sizes), kind="stable"):
        fits = np.flatnonzero(load + sizes[i] <= capacity)
        if fits.size == 0:
            return None
        placement[i] = fits[0]
        load[fits[0]] += sizes[i]
    return placement


def memory_bounds(sizes: np.ndarray, devices: int) -> tuple[int, int]:
    """(lower, reached): the optimum per-device maximum memory lies between them. `lower` is
    max(largest table, ceil(total / devices)); `reached` is the lowest maximum of a placement
    found by binary search on the cap with FFD, between `lower` and the maximum of the
    largest-first least-loaded placement (which FFD's anomalies may not beat)."""
    sizes = np.asarray(sizes, dtype=np.int64)
    lower = int(max(sizes.max(), -(-int(sizes.sum()) // devices)))
    load = np.zeros(devices, dtype=np.int64)
    for i in np.argsort(-sizes, kind="stable"):
        load[load.argmin()] += sizes[i]
    reached, lo = int(load.max()), lower
    while lo < reached:
        mid = (lo + reached) // 2
        placement = first_fit_decreasing(sizes, devices, mid)
        if placement is None:
            lo = mid + 1
        else:
            reached = int(np.bincount(placement, weights=sizes, minlength=devices).max())
    return lower, reached


def pack_rows(room: np.ndarray, sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """FFD of many independent problems at once: row n puts `sizes[n]` (sorted largest first;
    zero pads) into devices with `room[n]` left. Returns (ok (N,), device (N, R), -1 unplaced)."""
    room = np.array(room, dtype=np.float64)
    rows = np.arange(room.shape[0])
    ok = np.ones(room.shape[0], dtype=bool)
    device = np.full(sizes.shape, -1, dtype=np.int64)
    for j in range(sizes.shape[1]):
        fits = room >= sizes[:, j, None]
        first = fits.argmax(1)
        placed = fits[rows, first]
        ok &= placed
        room[rows, first] -= np.where(placed, sizes[:, j], 0.0)
        device[:, j] = np.where(placed, first, -1)
    return ok, device


def surely_packs(room: np.ndarray, rest_sum: np.ndarray, rest_min: np.ndarray,
                 rest_max: np.ndarray) -> np.ndarray:
    """(N,): rows where FFD cannot fail to place tables of total `rest_sum`, sizes in
    [`rest_min`, `rest_max`], into devices with `room` (N, D) left. FFD fails at a table of size
    s only when every device has less than s left, so each device d has taken more than
    max(0, room_d - s): g(s) = sum_d max(0, room_d - s) + s - rest_sum <= 0. g is convex and
    piecewise linear, so checking g > 0 at the interval's ends and at every room_d inside is
    enough."""
    s = np.concatenate([rest_min[:, None], rest_max[:, None], np.clip(room, rest_min[:, None], rest_max[:, None])],
                       axis=1)                                                        # (N, D + 2)
    g = np.maximum(room[:, None, :] - s[:, :, None], 0).sum(2) + s - rest_sum[:, None]
    return (g > 0).all(1) | (rest_sum == 0)


class PackingGuard:
    """Per step of a batched placement (B tasks, tables in a fixed order, D devices): the
    devices that hold the current table *and* leave the remaining tables placeable.

    A device passes when the room left after it surely packs the rest (`surely_packs`), or FFD
    packs the rest after it, or, where neither holds for any device, it is the device of the
    task's certificate (kept while followed, else FFD's packing of the current state)."""

    def __init__(self, sizes: np.ndarray, capacity: np.ndarray, devices: int):
        self.sizes = np.asarray(sizes, dtype=np.float64)         # (B, T), placement order
        self.capacity = np.asarray(capacity, dtype=np.float64)   # (B,)
        self.devices = devices
        self.fallbacks = 0  # (task, step) pairs where no device passed and any with room was allowed
        b, t = self.sizes.shape
        after = self.sizes[:, ::-1]
        self.rest_sum = _after(np.cumsum(after, axis=1), 0.0)  # of the tables after each step
        self.rest_max = _after(np.maximum.accumulate(after, axis=1), 0.0)
        self.rest_min = _after(np.minimum.accumulate(after, axis=1), 0.0)
        self.certificate = np.full((b, t), -1, dtype=np.int64)
        self.certified = np.zeros(b, dtype=bool)
        self._packed: tuple | None = None  # the step's FFD runs: (t, rows, devices, ok, order, packing)

    def _remaining(self, rows: np.ndarray, start: int) -> tuple[np.ndarray, np.ndarray]:
        """Indices and sizes of tables start.. of `rows`, largest first (ties: placement order)."""
        order = start + np.argsort(-self.sizes[rows, start:], axis=1, kind="stable")
        return order, np.take_along_axis(self.sizes[rows], order, axis=1)

    def _adopt(self, rows: np.ndarray, order: np.ndarray, device: np.ndarray, ok: np.ndarray) -> None:
        certificate = self.certificate[rows]
        np.put_along_axis(certificate, order, device, axis=1)
        self.certificate[rows] = certificate
        self.certified[rows] = ok

    def allowed(self, t: int, memory: np.ndarray) -> np.ndarray:
        """(B, D): devices with room for table `t` after which the rest still packs; where no
        device passes, every device with room (counted in `fallbacks`). A row with no room at
        all is all False: the caller reports it."""
        room = self.capacity[:, None] - np.asarray(memory, dtype=np.float64)
        size = self.sizes[:, t]
        d = room.shape[1]
        fits = room >= size[:, None]
        self._packed = None
        # room left beyond what is left to place by (D - 1) largest tables: g > 0 whatever the device
        easy = room.sum(1) - size - self.rest_sum[:, t] >= (d - 1) * self.rest_max[:, t]
        if easy.all():
            return fits
        safe = fits & easy[:, None]
        hard = np.flatnonzero(~easy)
        after = room[hard, None, :] - np.eye(d) * size[hard, None, None]   # (H, A, D): table t on device a
        stats = (np.repeat(x[hard, t], d) for x in (self.rest_sum, self.rest_min, self.rest_max))
        safe[hard] = fits[hard] & surely_packs(after.reshape(-1, d), *stats).reshape(len(hard), d)
        local, actions = np.nonzero(fits[hard] & ~safe[hard])
        if len(local):
            rows = hard[local]
            order, sizes = self._remaining(rows, t + 1)
            ok, device = pack_rows(after[local, actions], sizes)
            safe[rows[ok], actions[ok]] = True
            self._packed = (t, rows, actions, ok, order, device)
        stuck = np.flatnonzero(~safe.any(1) & fits.any(1))
        fresh = stuck[~self.certified[stuck]]
        if len(fresh):
            order, sizes = self._remaining(fresh, t)
            ok, device = pack_rows(room[fresh], sizes)
            self._adopt(fresh, order, device, ok)
        held = stuck[self.certified[stuck]]
        safe[held, self.certificate[held, t]] = True
        stuck = ~safe.any(1) & fits.any(1)
        self.fallbacks += int(stuck.sum())
        safe[stuck] = fits[stuck]
        return safe

    def placed(self, t: int, devices: np.ndarray) -> None:
        """Table `t` went to `devices` (B,): a certificate followed is kept, else FFD's packing
        after that device, if `allowed` made one; else none (made when needed)."""
        devices = np.asarray(devices)
        followed = self.certified & (self.certificate[:, t] == devices)
        self.certified = followed
        if self._packed is not None and self._packed[0] == t:
            _, rows, actions, ok, order, device = self._packed
            chosen = (devices[rows] == actions) & ~followed[rows]
            self._adopt(rows[chosen], order[chosen], device[chosen], ok[chosen])
        self._packed = None


def _after(running: np.ndarray, empty: float) -> np.ndarray:
    """Per step t, a running statistic over reversed columns turned into one over the columns
    after t (`empty` for the last)."""
    b = running.shape[0]
    return np.concatenate([running[:, ::-1][:, 1:], np.full((b, 1), empty)], axis=1)
