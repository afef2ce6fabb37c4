"""The devices a plan places on: each one's relative speed and memory, and the hosts they sit in.

A cluster of one GPU generation is `uniform`: every device of speed 1 and the same memory, hosts
of one size. Real clusters mix generations, and a device may be shared with another job; TorchRec's
`Topology` can say neither. Here a device's speed divides the compute it is given (a device of speed
0.5 takes twice as long over the same shards) and its memory caps what it holds; communication is
charged at the links' bandwidths whatever the device. Devices are numbered host by host, so a host
is a run of consecutive devices, as TorchRec's ranks fill hosts in order. Each device also has its
share of its host's DDR (TorchRec's `ddr_cap` per rank, 128 GiB unless given), which holds the
tables that TorchRec's UVM caching kernel keeps in host memory (`placement.caching`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autoshard.core.errors import ConfigError

DDR_BYTES = 128 * 1024**3  # TorchRec's DDR_CAP: a rank's host memory by default


@dataclass(frozen=True)
class Topology:
    """`speeds` (relative, > 0), `memories` (HBM, bytes) and `ddrs` (host memory, bytes; None:
    `DDR_BYTES` each) per device; `hosts`: the number of devices of each host, in device order."""

    speeds: np.ndarray
    memories: np.ndarray
    hosts: tuple[int, ...]
    ddrs: np.ndarray | None = None

    def __post_init__(self) -> None:
        if self.ddrs is None:
            object.__setattr__(self, "ddrs", np.full(len(self.memories), DDR_BYTES, dtype=np.int64))
        if not (len(self.speeds) == len(self.memories) == len(self.ddrs) == sum(self.hosts)) or \
                min(self.hosts, default=0) < 1:
            raise ValueError("a topology needs a speed and memories per device and hosts that hold them all")

    @classmethod
    def uniform(cls, devices: int, memory_bytes: int, local: int | None = None,
                ddr_bytes: int = DDR_BYTES) -> Topology:
        """`devices` alike of `memory_bytes` (and `ddr_bytes` of host memory) each, in hosts of
        `local` (default: one host)."""
        local = local or devices
        if devices % local:
            raise ConfigError(f"--devices-per-host: {local} (must divide --devices {devices})")
        return cls(np.ones(devices), np.full(devices, int(memory_bytes), dtype=np.int64), (local,) * (devices // local),
                   np.full(devices, int(ddr_bytes), dtype=np.int64))

    @property
    def devices(self) -> int:
        return len(self.speeds)

    @property
    def alike(self) -> bool:
        """Every device of one speed and one memory, every host of one size."""
        return bool((self.speeds == self.speeds[0]).all() and (self.memories == self.memories[0]).all()
                    and (self.ddrs == self.ddrs[0]).all() and len(set(self.hosts)) == 1)

    @property
    def local(self) -> int | None:
        """Devices per host where every host has as many, else None."""
        return self.hosts[0] if len(set(self.hosts)) == 1 else None

    @property
    def host_starts(self) -> np.ndarray:
        """The first device of each host."""
        return np.concatenate([[0], np.cumsum(self.hosts)[:-1]]).astype(np.int64)

    def document(self) -> dict:
        """The topology as the plan file lists it."""
        return {"hosts": list(self.hosts), "speeds": [float(s) for s in self.speeds],
                "memories_bytes": [int(m) for m in self.memories], "ddrs_bytes": [int(m) for m in self.ddrs]}
