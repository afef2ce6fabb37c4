"""The communication of a sharded plan: the bytes each piece's device moves in the output
exchange of one training step, within its host and across hosts, and their time at the links'
bandwidths.

With a global batch B over D devices in hosts of L (H = D / L hosts), a piece of width w whose
output has m values per sample (1 pooled; a sequence table's lookups per sample otherwise), let
u = B/D * m * w * 4 bytes, one rank's share of the piece's output. Forward, then backward (the
gradients retrace the same bytes), the piece's device moves:

- table-wise or column-wise (an all-to-all): its output to the D - 1 other ranks, (L - 1) u
  within its host and (D - L) u across;
- row-wise, pooled (partial sums reduce-scattered over all D, gathered back): (L - 1) u within
  and (D - L) u across, on each of the D devices, so a row-wise table moves D times what it
  moves whole; a sequence table's row shard only returns its rows' lookups: 1/D of that;
- table-row-wise, pooled (reduce-scatter within its host, then an all-to-all across hosts):
  (L - 1) H u within and (H - 1) u across, on each of the host's L devices.

A data-parallel table (a replica on every device, each serving its 1/D of the batch) has no
output exchange; its gradient, the whole table's S = rows * w * 4 bytes, is all-reduced every
step, hierarchically (reduce-scatter within the host, all-reduce of each 1/L slice across hosts,
all-gather within the host): each device moves 2 (L - 1) / L * S within its host and
2 (H - 1) / H * S / L across (`gradient_bytes`).

Each piece is charged on its own device, as TorchRec's perf estimator charges a shard's
`fwd_comms` and `bwd_comms` (its formulas count the whole output where these count what leaves
the device); receiving ranks are not charged, and input indices are not counted.
"""

from __future__ import annotations

from dataclasses import dataclass

BYTES_PER_VALUE = 4
GIB_PER_S = 1024**3 / 1000  # bytes per ms
TORCHREC_GIB_PER_S = (600.0, 12.5)  # TorchRec planner's INTRA_NODE_BANDWIDTH, CROSS_NODE_BANDWIDTH


@dataclass(frozen=True)
class Links:
    """Bandwidths in bytes per ms: within a host and across hosts."""

    intra_bytes_per_ms: float
    cross_bytes_per_ms: float

    @classmethod
    def from_gib_per_s(cls, intra: float, cross: float) -> Links:
        return cls(intra * GIB_PER_S, cross * GIB_PER_S)

    @property
    def gib_per_s(self) -> tuple[float, float]:
        return self.intra_bytes_per_ms / GIB_PER_S, self.cross_bytes_per_ms / GIB_PER_S

    def ms(self, intra: float, cross: float) -> float:
        """Time to move `intra` bytes within a host and `cross` bytes across hosts."""
        return intra / self.intra_bytes_per_ms + cross / self.cross_bytes_per_ms


def piece_bytes(kind: str, width: int, values_per_sample: float, sequence: bool, batch: int, world: int,
                local: int) -> tuple[float, float]:
    """(within-host, cross-host) bytes one piece's device moves per step, forward and backward
    together (see the module)."""
    if world == 1:
        return 0.0, 0.0
    hosts = world // local
    share = batch / world * values_per_sample * width * BYTES_PER_VALUE
    if kind in ("table_wise", "column_wise"):
        intra, cross = (local - 1) * share, (world - local) * share
    elif kind == "row_wise":
        scale = 1 / world if sequence else 1.0
        intra, cross = (local - 1) * share * scale, (world - local) * share * scale
    elif kind == "table_row_wise":
        intra, cross = (local - 1) * hosts * share, (hosts - 1) * share
    else:
        raise ValueError(f"kind: {kind!r}")
    return 2 * intra, 2 * cross


def gradient_bytes(rows: int, width: int, world: int, local: int) -> tuple[float, float]:
    """(within-host, cross-host) bytes each device moves per step to all-reduce a data-parallel
    table's gradient (see the module)."""
    if world == 1:
        return 0.0, 0.0
    hosts = world // local
    size = rows * width * BYTES_PER_VALUE
    return 2 * (local - 1) / local * size, 2 * (hosts - 1) / hosts * size / local
