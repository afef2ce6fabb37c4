"""`autoshard plan --topology FILE`: a cluster whose devices differ, in speed or memory, in hosts
of any size (`placement.topology`).

The file (YAML or JSON) lists the hosts in rank order; a host gives its number of devices with
their speed and memory, or each device's own:

    hosts:
      - {devices: 8, speed: 1.0, memory: 80GiB, ddr: 256GiB}   # H100s, 2 TiB of host memory
      - {devices: 8, speed: 0.45, memory: 40GiB}   # A100s of 40 GB
      - devices:                                    # a host whose device 1 is half taken by another job
          - {speed: 1.0, memory: 80GiB}
          - {speed: 0.5, memory: 40GiB}

`speed` is relative (to the device the costs were measured or predicted on: 1), above 0 and at
most 1,000; `memory` (the device's HBM) a size as `--memory-per-device` takes it; `ddr`, if given,
the device's share of its host's memory, which holds tables kept there by TorchRec's UVM caching
kernel (as `--ddr-per-device`: TorchRec's 128 GiB unless given). Anything else is refused in one
line naming the file, the field and the value.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import yaml

from autoshard.cli.user_tables import StrictLoader, parse_memory
from autoshard.core.errors import ConfigError
from autoshard.core.inputs import MAX_DEVICES, read_text, shown
from autoshard.placement.topology import DDR_BYTES, Topology

HOST_FIELDS = ("devices", "speed", "memory", "ddr")
DEVICE_FIELDS = ("speed", "memory", "ddr")
OPTIONAL = ("ddr",)
MAX_SPEED = 1000.0


def read_topology(path: str | Path, ddr_bytes: int = DDR_BYTES) -> Topology:
    """The topology of `path` (see the module); `ddr_bytes` a device's DDR where it gives none."""
    path = Path(path)
    text = read_text(path, "topology file")
    json_file = path.suffix.lower() == ".json"
    try:
        doc = json.loads(text) if json_file else yaml.load(text, Loader=StrictLoader)  # noqa: S506
    except (ValueError, yaml.YAMLError) as exc:
        raise ConfigError(f"{path}: not valid {'JSON' if json_file else 'YAML'} "
                          f"({shown(str(exc).splitlines()[0], 120)})") from None
    except RecursionError:
        raise ConfigError(f"{path}: nested too deeply") from None
    if not isinstance(doc, dict) or set(doc) != {"hosts"}:
        raise ConfigError(f"{path}: expected one field, hosts (a list of hosts), not {shown(doc, 80)}")
    hosts = doc["hosts"]
    if not isinstance(hosts, list) or not hosts:
        raise ConfigError(f"{path}, field hosts: {shown(hosts, 80)} (expected a list of hosts)")
    speeds: list[float] = []
    memories: list[int] = []
    ddrs: list[int] = []
    sizes: list[int] = []
    for h, host in enumerate(hosts):
        at = f"{path}, hosts[{h}]"
        _fields(host, HOST_FIELDS, at)
        devices = host.get("devices")
        if isinstance(devices, list):
            if "speed" in host or "memory" in host or "ddr" in host:
                raise ConfigError(f"{at}: gives its devices one by one and speed, memory or ddr for them all (one "
                                  "or the other)")
            if not devices:
                raise ConfigError(f"{at}, field devices: [] (a host has at least one device)")
            for k, device in enumerate(devices):
                _fields(device, DEVICE_FIELDS, f"{at}.devices[{k}]")
                speeds.append(_speed(device, f"{at}.devices[{k}]"))
                memories.append(_memory(device, f"{at}.devices[{k}]"))
                ddrs.append(_memory(device, f"{at}.devices[{k}]", "ddr", ddr_bytes))
            sizes.append(len(devices))
        else:
            if isinstance(devices, bool) or not isinstance(devices, int) or not 1 <= devices <= MAX_DEVICES:
                raise ConfigError(f"{at}, field devices: {shown(devices)} (a count from 1 to {MAX_DEVICES}, or a "
                                  "list of devices)")
            speeds += [_speed(host, at)] * devices
            memories += [_memory(host, at)] * devices
            ddrs += [_memory(host, at, "ddr", ddr_bytes)] * devices
            sizes.append(devices)
        if len(speeds) > MAX_DEVICES:
            raise ConfigError(f"{path}, field hosts: more than {MAX_DEVICES} devices in all")
    return Topology(np.array(speeds, dtype=float), np.array(memories, dtype=np.int64), tuple(sizes),
                    np.array(ddrs, dtype=np.int64))


def _fields(entry: object, allowed: tuple[str, ...], at: str) -> None:
    if not isinstance(entry, dict):
        raise ConfigError(f"{at}: {shown(entry, 80)} (expected a mapping with {', '.join(allowed)})")
    unknown = [k for k in entry if k not in allowed]
    if unknown:
        raise ConfigError(f"{at}, field {shown(unknown[0])} is unknown (expected {', '.join(allowed)})")
    missing = [k for k in allowed if k not in entry and k not in OPTIONAL
               and not (k != "devices" and isinstance(entry.get("devices"), list))]
    if missing:
        raise ConfigError(f"{at}, field {missing[0]} is missing")


def _speed(entry: dict, at: str) -> float:
    value = entry["speed"]
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or not 0 < value <= MAX_SPEED:
        raise ConfigError(f"{at}, field speed: {shown(value)} (a relative speed above 0 and at most {MAX_SPEED:g})")
    return float(value)


def _memory(entry: dict, at: str, field: str = "memory", default: int | None = None) -> int | None:
    """`entry[field]` as bytes (`default` where an optional field is absent; `_fields` has required the rest)."""
    if field not in entry:
        return default
    value = entry[field]
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ConfigError(f"{at}, field {field}: {shown(value)} (expected a size such as 80GiB)")
    return parse_memory(str(value), f"{at}, field {field}")
