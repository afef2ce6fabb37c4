"""Bin packing under a per-device memory cap: first-fit-decreasing, the smallest per-device
maximum memory a placement can reach, and a guard that keeps a table-by-table placement from
dead-ending (leaving tables that fit on no device).

The guard's check is first-fit-decreasing (FFD) of the tables still to place into the room
the devices have left: FFD succeeding proves the rest can be placed; FFD failing only says
"may be infeasible". To make the guarantee hold step after step, the guard keeps, per task, a
certificate: a placement of the remaining tables that fits. The certificate's device for the
current table is always allowed (the certificate stays valid after it), and any other device
allowed leaves a state FFD packs (a new certificate), so a task FFD can place never dead-ends,
whatever order the tables come in.
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
    found by binary search on the cap with FFD (started from largest-first least-loaded)."""
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


class PackingGuard:
    """Per step of a batched placement (B tasks, tables in a fixed order, D devices): the
    devices that hold the current table *and* leave the remaining tables placeable.

    A device passes when (1) the room left after it exceeds what remains to place by (D - 1)
    of the largest remaining table (then FFD cannot fail), or (2) it is the task's certificate's
    device, or (3) FFD packs the rest after it. Certificates are made only when (1) fails."""

    def __init__(self, sizes: np.ndarray, capacity: np.ndarray, devices: int):
        self.sizes = np.asarray(sizes, dtype=np.float64)         # (B, T), placement order
        self.capacity = np.asarray(capacity, dtype=np.float64)   # (B,)
        self.devices = devices
        self.fallbacks = 0  # (task, step) pairs where no device passed and any with room was allowed
        b, t = self.sizes.shape
        after = np.concatenate([np.zeros((b, 1)), self.sizes[:, ::-1]], axis=1)
        self.rest_sum = np.cumsum(after, axis=1)[:, ::-1][:, 1:]                 # tables after t
        self.rest_max = np.maximum.accumulate(after, axis=1)[:, ::-1][:, 1:]
        self.certificate = np.full((b, t), -1, dtype=np.int64)
        self.certified = np.zeros(b, dtype=bool)

    def _remaining(self, rows: np.ndarray, start: int) -> tuple[np.ndarray, np.ndarray]:
        """Indices and sizes of tables start.. of `rows`, largest first (ties: placement order)."""
        order = start + np.argsort(-self.sizes[rows, start:], axis=1, kind="stable")
        return order, np.take_along_axis(self.sizes[rows], order, axis=1)

    def _certify(self, rows: np.ndarray, t: int, room: np.ndarray) -> None:
        """Certificates for `rows` from table `t` on, by FFD into `room` (rows, D)."""
        order, sizes = self._remaining(rows, t)
        ok, device = pack_rows(room, sizes)
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
        fits = room >= size[:, None]
        d = room.shape[1]
        surely = room.sum(1) - size - self.rest_sum[:, t] >= (d - 1) * self.rest_max[:, t]
        safe = fits & surely[:, None]
        check = np.flatnonzero(~surely)
        if not len(check):
            return safe
        uncertified = check[~self.certified[check]]
        if len(uncertified):
            self._certify(uncertified, t, room[uncertified])
        held = check[self.certified[check]]
        safe[held, self.certificate[held, t]] = True
        # row (task, a): the room left once table t is on device a
        after = (room[check, None, :] - np.eye(d) * size[check, None, None]).reshape(-1, d)
        _, sizes = self._remaining(check, t + 1)
        ok, _ = pack_rows(after, np.repeat(sizes, d, axis=0))
        safe[check] |= fits[check] & ok.reshape(len(check), d)
        stuck = ~safe.any(1) & fits.any(1)
        self.fallbacks += int(stuck.sum())
        safe[stuck] = fits[stuck]
        return safe

    def placed(self, t: int, devices: np.ndarray) -> None:
        """Table `t` went to `devices` (B,): a certificate not followed is dropped (a new one is
        made when needed)."""
        self.certified &= self.certificate[:, t] == np.asarray(devices)
