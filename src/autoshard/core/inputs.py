"""The validation layer of the `autoshard` command: every value from outside (arguments, table
files, plan files, TorchRec files, model files) checked for type, range and consistency before
any work starts. A refusal is a `ConfigError` of one line naming the file, row and field; values
are shown escaped (`shown`), so no input can split the line. Never imports torch."""

from __future__ import annotations

import json
import math
import os
import re
import stat
from collections.abc import Callable
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import NamedTuple, TypeVar

from autoshard.core.errors import ConfigError

T = TypeVar("T")

# Bounds beyond any real model (production models reach 80 million rows, dims of 2048 and
# sequence features of a few thousand lookups a sample) that keep every size exact in int64.
MAX_TABLES = 1_000_000
MAX_ROWS = 2**31          # 32 GiB even at dim 4 in fp32
MAX_DIM = 4096
MAX_POOLING_FACTOR = 65_536  # lookups per sample: a sequence feature's reach a few thousand
MAX_ZIPF_ALPHA = 10
MAX_DEVICES = 65_536
MAX_MEMORY = 2**50        # bytes per device (1 PiB)
MAX_BEST_OF = 1024
MAX_SEED = 2**32 - 1
MAX_RUNS = 1000
MAX_FILE_BYTES = 256 * 2**20
NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]{0,127}")
NAME_RULE = "letters, digits, '_' and '-', at most 128, as TorchRec's parameter names allow"
MODULE = re.compile(r"[A-Za-z0-9_]{1,64}(\.[A-Za-z0-9_]{1,64}){0,15}")
MODULE_RULE = "names of letters, digits and '_' joined by '.', as a module's path in a PyTorch model"


def shown(value: object, limit: int = 60) -> str:
    """`value` for a message: escaped (no newline or control character survives) and cut short."""
    if isinstance(value, str) and len(value) > limit:
        return ascii(value[:limit]) + "..."
    text = ascii(value)
    return text if len(text) <= limit + 2 else text[:limit] + "..."


NUMBER = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")  # no 1_0, no digits of other scripts


def decimal(value: int | float | str) -> Decimal | None:
    """The exact value of a number or of a plain decimal string, else None."""
    if isinstance(value, str) and not NUMBER.fullmatch(value):
        return None
    try:
        return Decimal(value)
    except (InvalidOperation, ValueError, ArithmeticError):
        return None


def number(value: object, field: str, lo: float, hi: float, whole: bool = False) -> int | float:
    """A JSON/YAML number or a numeric string, finite, in [lo, hi], and an exact Python int when
    `whole` (so 1e19 is refused as too large, never wrapped around in int64)."""
    if isinstance(value, bool) or value is None or not isinstance(value, (int, float, str)):
        raise ConfigError(f"{field}: {shown(value)} (not a number)")
    exact = decimal(value.strip() if isinstance(value, str) else value)
    if exact is None or not exact.is_finite():
        raise ConfigError(f"{field}: {shown(value)} (not a number)")
    if whole and exact != exact.to_integral_value():
        raise ConfigError(f"{field}: {shown(value)} (expected a whole number)")
    if exact < Decimal(str(lo)):
        raise ConfigError(f"{field}: {shown(value)} (must be at least {lo})")
    if exact > Decimal(str(hi)):
        raise ConfigError(f"{field}: {shown(value)} (must be at most {hi})")
    return int(exact) if whole else float(exact)


def integer(value: object, field: str, lo: int, hi: int) -> int:
    """An int (JSON's, not a bool, a float or a string) in [lo, hi]."""
    if type(value) is not int:
        raise ConfigError(f"{field}: {shown(value)} (expected an integer)")
    if not lo <= value <= hi:
        raise ConfigError(f"{field}: {shown(value)} (expected {lo}..{hi})")
    return value


def table_name(value: object, where: str) -> str:
    """A table name TorchRec and the plan file can hold."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str):
        raise ConfigError(f"{where}, field name: {shown(value)} (expected a string)")
    name = value.strip()
    if not name:
        raise ConfigError(f"{where}, field name: empty")
    if not NAME.fullmatch(name):
        raise ConfigError(f"{where}, field name: {shown(name)} (a table name has {NAME_RULE})")
    return name


def module_path(value: object, where: str) -> str:
    """A module path (`sparse.ebc`): where in the user's model a table's module sits."""
    if not isinstance(value, str):
        raise ConfigError(f"{where}: {shown(value)} (expected a string)")
    path = value.strip()
    if not MODULE.fullmatch(path):
        raise ConfigError(f"{where}: {shown(path)} (a module path has {MODULE_RULE})")
    return path


def check_arguments(args) -> None:
    """The command's numeric options, bounded (argparse has only made them ints)."""
    bounds = {"devices": (1, MAX_DEVICES), "best_of": (1, MAX_BEST_OF), "seed": (0, MAX_SEED),
              "runs": (1, MAX_RUNS), "batch_size": (1, 2**20)}
    for name, (lo, hi) in bounds.items():
        value = getattr(args, name, None)
        if value is None:
            continue
        option = "--" + name.replace("_", "-")
        if value < lo:
            raise ConfigError(f"{option}: {value} (must be at least {lo})")
        if value > hi:
            raise ConfigError(f"{option}: {value} (must be at most {hi})")


def regular_file(path: Path, what: str) -> os.stat_result:
    """`path`'s status if it is a regular file of at most MAX_FILE_BYTES: a FIFO or a device
    is refused before it is opened, so reading it can never hang."""
    try:
        st = path.stat()
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file ({what})") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the {what} ({exc.strerror})") from None
    if stat.S_ISDIR(st.st_mode):
        raise ConfigError(f"{path}: a folder, not a {what}")
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(f"{path}: not a regular file (a FIFO, socket or device), not a {what}")
    if st.st_size > MAX_FILE_BYTES:
        raise ConfigError(f"{path}: {st.st_size} bytes, larger than a {what} can be ({MAX_FILE_BYTES} bytes)")
    return st


def read_text(path: Path, what: str) -> str:
    """The UTF-8 text of a regular file (see `regular_file`)."""
    regular_file(path, what)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the {what} ({exc.strerror})") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not a text file (binary content)") from None
    if "\x00" in text:
        raise ConfigError(f"{path}: not a text file (binary content)")
    return text


def _unique_keys(pairs: list[tuple[str, object]]) -> dict:
    keys = [k for k, _ in pairs]
    for k in keys:
        if keys.count(k) > 1:
            raise ValueError(f"duplicate key {shown(k)}")
    return dict(pairs)


def _no_constant(token: str):
    raise ValueError(f"{token} is not a JSON number")


def read_json(path: Path, what: str) -> object:
    """A JSON document read strictly: no duplicate keys, no NaN or Infinity."""
    text = read_text(path, what)
    try:
        return json.loads(text, object_pairs_hook=_unique_keys, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: not a {what} (not JSON: line {exc.lineno}: {exc.msg})") from None
    except (ValueError, RecursionError) as exc:
        raise ConfigError(f"{path}: not a {what} ({str(exc)[:80] or exc.__class__.__name__})") from None


def read_parsed(path: Path, what: str, parse: Callable[[object], T]) -> T:
    """`parse` of the JSON document at `path` (`read_json`); a bad one is one error naming the
    file, then the field `parse` names."""
    doc = read_json(path, what)
    try:
        return parse(doc)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None


def _fields(doc: object, expected: set[str], where: str) -> dict:
    """`doc` is a mapping with exactly the `expected` keys."""
    if not isinstance(doc, dict):
        raise ConfigError(f"{where}: {shown(doc)} (expected an object)")
    missing, extra = sorted(expected - set(doc)), sorted(set(doc) - expected)
    if missing:
        raise ConfigError(f"{where}: field {shown(missing[0])} is missing")
    if extra:
        raise ConfigError(f"{where}: field {shown(extra[0])} is unknown")
    return doc


def _typed(doc: dict, key: str, kinds: tuple[type, ...], where: str) -> object:
    value = doc[key]
    if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
        raise ConfigError(f"{where}, field {key}: {shown(value)} (expected {' or '.join(k.__name__ for k in kinds)})")
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{where}, field {key}: {shown(value)} (not a finite number)")
    return value


PLAN_FORMAT = "autoshard-plan/1"
TORCHREC_FORMAT = "autoshard-torchrec-plan/1"
PLAN_FIELDS = {"format", "method", "options", "tables_file", "devices", "memory_per_device_bytes", "assignment",
               "per_device", "predicted_bottleneck_ms", "predicted", "sharding_seconds", "model_files", "engine"}
SPLIT_FIELDS = {"sharding", "columns", "rows", "replicated"}  # a plan of split tables: `sharding` and any of the rest
SHARDINGS = ("table", "column", "row", "auto")
ROW_KINDS = ("row_wise", "table_row_wise")
TORCHREC_FIELDS = {"format", "world_size", "device_type", "modules"}
PARAMETER_FIELDS = {"sharding_type", "compute_kernel", "ranks", "shards"}
SHARD_FIELDS = {"offsets", "sizes", "placement"}
CACHE_FIELDS = {"load_factor"}  # a cached table's optional `cache_params` (TorchRec's CacheParams)
CACHING_KERNEL = "fused_uvm_caching"  # the one kernel a `cache_params` may come with
TORCHREC_KINDS = ("table_wise", "column_wise", *ROW_KINDS, "data_parallel")


class Cached(NamedTuple):
    """The tables of a plan on TorchRec's UVM caching kernel (CACHING_KERNEL; qualified names) and
    their cache's load factor (TorchRec's `CacheParams.load_factor`)."""

    tables: frozenset[str]
    load_factor: float


class Block(NamedTuple):
    """A table's piece on one device: rows [row, row + rows) and columns [column, column + width),
    `rows` or `width` None for all of them (a whole table is `Block(0, None, 0, None, device)`)."""

    row: int
    rows: int | None
    column: int
    width: int | None
    device: int


class PlanBlocks(NamedTuple):
    """What any plan file places: each table's blocks (by its qualified name, `module.name` where
    it has a module), the devices, [rows, dim] per table where the file says, and each split
    table's TorchRec sharding type (`column_wise`, `row_wise`, `table_row_wise`, `data_parallel`: a
    whole replica on every device)."""

    blocks: dict[str, list[Block]]
    devices: int
    shapes: dict[str, list[int]]
    kinds: dict[str, str]


def plan_assignment(doc: object, path: Path) -> tuple[dict[str, int], int, dict[str, list[int]]]:
    """(device per table, devices, [rows, dim] per table where the file says) of a table-wise plan
    file of ours or of its TorchRec export, every field checked for its exact type."""
    plan = plan_blocks(doc, path)
    split = next((name for name, kind in plan.kinds.items() if kind != "table_wise"), None)
    if split is not None:
        raise ConfigError(f"{path}, table {shown(split)}: {plan.kinds[split]} shards (this reader takes table-wise "
                          "plans)")
    return {name: blocks[0].device for name, blocks in plan.blocks.items()}, plan.devices, plan.shapes


def plan_blocks(doc: object, path: Path) -> PlanBlocks:
    """The blocks of any plan file: ours (table-wise; or split, its `columns` and `rows` listing the
    split tables, `replicated` the data-parallel ones and `assignment` the whole ones) or its
    TorchRec export, every field checked for its exact type, each split table's blocks covering it
    in order."""
    where = str(path)
    if not isinstance(doc, dict) or doc.get("format") not in (PLAN_FORMAT, TORCHREC_FORMAT):
        raise ConfigError(f"{where}: not a plan written by `autoshard plan` (no format {PLAN_FORMAT!r} "
                          f"or {TORCHREC_FORMAT!r})")
    if doc["format"] == TORCHREC_FORMAT:
        return torchrec_blocks(doc, path)
    split = {k for k in SPLIT_FIELDS if k in doc}
    _fields(doc, PLAN_FIELDS | split, where)
    if split and ("sharding" not in split or split == {"sharding"}):
        missing = "sharding" if "sharding" not in split else "columns"
        raise ConfigError(f"{where}: field {missing!r} is missing (a plan of split tables has `sharding` and "
                          "`columns`, `rows` or `replicated`)")
    if split and doc["sharding"] not in SHARDINGS[1:]:
        raise ConfigError(f"{where}, field sharding: {shown(doc['sharding'])} (expected one of "
                          f"{', '.join(SHARDINGS[1:])})")
    devices = integer(doc["devices"], f"{where}, field devices", 1, MAX_DEVICES)
    integer(doc["memory_per_device_bytes"], f"{where}, field memory_per_device_bytes", 1, MAX_MEMORY)
    for key, kinds in (("method", (str,)), ("options", (dict,)), ("tables_file", (str,)), ("predicted", (str,)),
                       ("per_device", (list,)), ("model_files", (dict,)), ("engine", (str,)),
                       ("sharding_seconds", (int, float)), ("assignment", (dict,))):
        _typed(doc, key, kinds, where)
    if doc["predicted_bottleneck_ms"] is not None:
        _typed(doc, "predicted_bottleneck_ms", (int, float), where)
    if len(doc["per_device"]) != devices:
        raise ConfigError(f"{where}, field per_device: {len(doc['per_device'])} devices (the plan has {devices})")
    blocks = {name: [Block(0, None, 0, None, integer(d, f"{where}, field assignment.{shown(name)}", 0, devices - 1))]
              for name, d in doc["assignment"].items()}
    kinds = dict.fromkeys(blocks, "table_wise")
    for name, shards in _typed(doc, "columns", (dict,), where).items() if "columns" in doc else ():
        blocks[_new(name, blocks, f"{where}, columns.{shown(name)}")] = _split_blocks(
            shards, "columns", devices, f"{where}, columns.{shown(name)}")
        kinds[name] = "column_wise"
    for name, entry in _typed(doc, "rows", (dict,), where).items() if "rows" in doc else ():
        at = f"{where}, rows.{shown(name)}"
        entry = _fields(entry, {"kind", "shards"}, at)
        if entry["kind"] not in ROW_KINDS:
            raise ConfigError(f"{at}, field kind: {shown(entry['kind'])} (expected {' or '.join(ROW_KINDS)})")
        blocks[_new(name, blocks, at)] = _split_blocks(entry["shards"], "rows", devices, at)
        kinds[name] = entry["kind"]
    replicated = _typed(doc, "replicated", (list,), where) if "replicated" in doc else []
    for i, name in enumerate(replicated):
        at = f"{where}, replicated[{i}]"
        if not isinstance(name, str):
            raise ConfigError(f"{at}: {shown(name)} (expected a table name)")
        blocks[_new(name, blocks, at)] = [Block(0, None, 0, None, d) for d in range(devices)]
        kinds[name] = "data_parallel"
    return PlanBlocks(blocks, devices, {}, kinds)


def _new(name: str, blocks: dict, where: str) -> str:
    if name in blocks:
        raise ConfigError(f"{where}: the table is placed twice (in field assignment, columns, rows or replicated)")
    return name


SPLITS = {"columns": ("width", 4, MAX_DIM, "the columns left to right", ""),
          "rows": ("rows", 0, MAX_ROWS, "the rows top to bottom", ", field shards")}


def _split_blocks(shards: object, axis: str, devices: int, at: str) -> list[Block]:
    """The shards of a table split along `axis` (`columns`: each a multiple of 4 columns; `rows`:
    on distinct devices), in order, covering it without gaps."""
    size_field, least, most, cover, field = SPLITS[axis]
    if not isinstance(shards, list) or len(shards) < 2:
        raise ConfigError(f"{at}{field}: expected a list of at least two {axis[:-1]} shards")
    start, found = 0, []
    for shard in shards:
        _fields(shard, {"start", size_field, "device"}, at)
        if integer(shard["start"], f"{at}, field start", 0, most) != start:
            raise ConfigError(f"{at}, field start: {shown(shard['start'])} (expected {start}: shards cover {cover})")
        size = integer(shard[size_field], f"{at}, field {size_field}", least, most)
        if axis == "columns" and size % 4:
            raise ConfigError(f"{at}, field width: {size} (column shards are multiples of 4 columns)")
        device = integer(shard["device"], f"{at}, field device", 0, devices - 1)
        found.append(Block(start, size, 0, None, device) if axis == "rows" else Block(0, None, start, size, device))
        start += size
    if axis == "rows" and len({b.device for b in found}) != len(found):
        raise ConfigError(f"{at}: two row shards on one device")
    return found


def torchrec_blocks(doc: dict, path: Path) -> PlanBlocks:
    """The blocks of a TorchRec plan written by `--torchrec`: per module (the module path `""` for
    one EmbeddingBagCollection) each table `table_wise` (one shard), `column_wise` (shards covering
    its columns left to right, multiples of 4 wide), `row_wise` / `table_row_wise` (shards
    covering its rows top to bottom, on distinct ranks) or `data_parallel` (every rank in order,
    no shards: a whole replica on each), one rank per shard, placed on GPU
    `rank % G` of its host for hosts of G GPUs (or on the CPU)."""
    where = str(path)
    _fields(doc, TORCHREC_FIELDS, where)
    world = integer(doc["world_size"], f"{where}, field world_size", 1, MAX_DEVICES)
    device_type = doc["device_type"]
    if device_type not in ("cuda", "cpu"):
        raise ConfigError(f"{where}, field device_type: {shown(device_type)} (expected 'cuda' or 'cpu')")
    modules = doc["modules"]
    if not isinstance(modules, dict) or not modules:
        raise ConfigError(f"{where}, field modules: expected the modules' shardings (an object by module path)")
    blocks, shapes, kinds, devices = {}, {}, {}, []
    for module, params in modules.items():
        if module != "":
            module_path(module, f"{where}, field modules")
        if not isinstance(params, dict) or not params:
            raise ConfigError(f"{where}, field modules[{shown(module)}]: expected the tables' shardings")
        for name, p in params.items():
            qualified = f"{module}.{name}" if module else name
            at = f"{where}, table {shown(qualified)}"
            table_name(name, at)
            blocks[qualified], shape, kinds[qualified] = _torchrec_param(p, world, device_type, at, devices)
            if shape is not None:
                shapes[qualified] = shape
    local = _host_size(devices, world)
    for rank, k, placement in devices:
        if k != rank % local or world % local:
            raise ConfigError(f"{where}, field placement: {shown(placement)} (expected 'rank:{rank}/cuda:"
                              f"{rank % local}': ranks fill hosts of {local} GPUs in order, {world} ranks in all)")
    return PlanBlocks(blocks, world, shapes, kinds)


def _host_size(devices: list[tuple[int, int, object]], world: int) -> int:
    """GPUs per host of the (rank, local GPU, placement) triples: ranks fill hosts of G in order,
    G dividing the world. The file does not say G: it is the smallest one the placements agree
    with (a plan that leaves the last GPU of every host unused still has hosts of 8); where none
    does, the highest GPU seen plus one, which the caller reports."""
    seen = 1 + max((k for _, k, _ in devices), default=0)
    for local in range(seen, world + 1):
        if world % local == 0 and all(k == rank % local for rank, k, _ in devices):
            return local
    return seen


def _local_device(placement: object, rank: int, device_type: str, at: str) -> int:
    """The device index on its host of a shard's placement (`rank:R/cuda:K`; `rank:R/cpu`: 0)."""
    if device_type == "cpu":
        if placement != f"rank:{rank}/cpu":
            raise ConfigError(f"{at}, field placement: {shown(placement)} (expected 'rank:{rank}/cpu')")
        return 0
    prefix = f"rank:{rank}/cuda:"
    index = placement[len(prefix):] if isinstance(placement, str) and placement.startswith(prefix) else ""
    if not index.isdigit() or int(index) > rank or str(int(index)) != index:
        raise ConfigError(f"{at}, field placement: {shown(placement)} (expected {prefix}K, K the rank's GPU on its "
                          "host)")
    return int(index)


def _torchrec_param(p: object, world: int, device_type: str, at: str,
                    devices: list[tuple[int, int, str]]) -> tuple[list[Block], list[int] | None, str]:
    """One parameter's sharding: its blocks, its [rows, dim] (None for a data-parallel table, which
    has no shards) and its sharding type; each shard's (rank, device on its host, placement) is
    added to `devices`."""
    cached = isinstance(p, dict) and "cache_params" in p
    _fields(p, PARAMETER_FIELDS | ({"cache_params"} if cached else set()), at)
    kind = p["sharding_type"]
    if kind not in TORCHREC_KINDS:
        raise ConfigError(f"{at}, field sharding_type: {shown(kind)} (expected one of {', '.join(TORCHREC_KINDS)})")
    _typed(p, "compute_kernel", (str,), at)
    if cached:
        if p["compute_kernel"] != CACHING_KERNEL:
            raise ConfigError(f"{at}, field cache_params: given for compute_kernel {shown(p['compute_kernel'])} "
                              f"(only {CACHING_KERNEL!r} has a cache)")
        cache = _fields(p["cache_params"], CACHE_FIELDS, f"{at}, field cache_params")
        if isinstance(cache["load_factor"], bool) or not isinstance(cache["load_factor"], int | float) or \
                not 0 < cache["load_factor"] <= 1:
            raise ConfigError(f"{at}, field load_factor: {shown(cache['load_factor'])} (above 0, at most 1)")
    ranks, shards = p["ranks"], p["shards"]
    if kind == "data_parallel":
        if ranks != list(range(world)) or any(type(r) is not int for r in ranks):
            raise ConfigError(f"{at}, field ranks: {shown(ranks)} (a data_parallel table is on every rank, 0 to "
                              f"{world - 1} in order)")
        if shards != []:
            raise ConfigError(f"{at}, field shards: {shown(shards)} (a data_parallel table has no shards)")
        return [Block(0, None, 0, None, r) for r in ranks], None, kind
    if not isinstance(ranks, list) or not ranks or (kind == "table_wise" and len(ranks) != 1):
        raise ConfigError(f"{at}, field ranks: {shown(ranks)} (expected one rank per shard)")
    if not isinstance(shards, list) or len(shards) != len(ranks):
        raise ConfigError(f"{at}, field shards: expected {len(ranks)} shard(s), one per rank")
    by_rows = kind in ROW_KINDS
    fixed, offset, found = None, 0, []  # fixed: the size every shard shares (rows, or columns by rows)
    for rank_value, shard in zip(ranks, shards, strict=True):
        rank = integer(rank_value, f"{at}, field ranks", 0, world - 1)
        shard = _fields(shard, SHARD_FIELDS, f"{at}, shard")
        expected = [offset, 0] if by_rows else [0, offset]
        if shard["offsets"] != expected or any(type(v) is not int for v in shard["offsets"]):
            raise ConfigError(f"{at}, field offsets: {shown(shard['offsets'])} (expected {expected})")
        sizes = shard["sizes"]
        if not isinstance(sizes, list) or len(sizes) != 2:
            raise ConfigError(f"{at}, field sizes: {shown(sizes)} (expected [rows, columns])")
        rows = integer(sizes[0], f"{at}, field sizes", 0 if by_rows else 1, MAX_ROWS)
        width = integer(sizes[1], f"{at}, field sizes", 1, MAX_DIM)
        shared, own = (width, rows) if by_rows else (rows, width)
        if fixed is not None and shared != fixed:
            raise ConfigError(f"{at}, field sizes: {shown(sizes)} (every shard has the table's "
                              f"{fixed} {'columns' if by_rows else 'rows'})")
        if kind == "column_wise" and width % 4:
            raise ConfigError(f"{at}, field sizes: {shown(sizes)} (column shards are multiples of 4 columns)")
        local = _local_device(shard["placement"], rank, device_type, at)
        devices.append((rank, local, shard["placement"]))
        fixed = shared
        found.append(Block(offset, rows, 0, None, rank) if by_rows else
                     Block(0, None, offset, width if kind == "column_wise" else None, rank))
        offset += own
    if by_rows and len({b.device for b in found}) != len(found):
        raise ConfigError(f"{at}, field ranks: {shown(ranks)} (row shards on distinct ranks)")
    shape = [offset, fixed] if by_rows else [fixed, offset]
    return found, shape, kind


def check_state(path: Path, what: str, expected: dict, given: object) -> None:
    """A model file's tensors, checked before they are loaded: exactly the names and shapes of
    the module's own (`expected`, a state dict), every floating-point value finite."""
    if not isinstance(given, dict):
        raise ConfigError(f"{path}: not a usable {what} (no tensors)")
    missing, extra = sorted(set(expected) - set(given)), sorted(set(given) - set(expected))
    if missing or extra:
        name, why = (missing[0], "is missing") if missing else (extra[0], "is not expected")
        raise ConfigError(f"{path}: not a usable {what} (tensor {shown(name)} {why})")
    for name, tensor in expected.items():
        value = given[name]
        if type(value) is not type(tensor) or tuple(value.shape) != tuple(tensor.shape):
            raise ConfigError(f"{path}: not a usable {what} (tensor {name}: shape "
                              f"{tuple(getattr(value, 'shape', ()))}, expected {tuple(tensor.shape)})")
        if value.is_floating_point() and not bool(value.isfinite().all()):
            raise ConfigError(f"{path}: not a usable {what} (tensor {name} holds NaN or infinite values)")
