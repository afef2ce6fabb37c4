"""`autoshard`: shard your own embedding tables with the study's methods.

  autoshard plan    --tables T --devices D --memory-per-device 16GiB [--method M] --out plan.json
                    (without trained models: each table measured alone here, then LPT; --method milp)
  autoshard plan    ... --sharding column [--column-ways 1,2,4] [--split NAME=K]   (column-wise shards)
  autoshard plan    ... --sharding row|auto [--devices-per-host 8]   (row-wise too; auto: any sharding per table)
  autoshard score   --tables T --plan plan.json [--backend fbgemm|torch|analytic] [--store DIR [--space KEY]]
  autoshard compare --tables T --devices D --memory-per-device 16GiB [--measure]
  autoshard measure --jobs jobs.json --out rows.json   (the portable measurement worker)
  autoshard measure --write-jobs jobs.json [--params params.yaml] [--device cuda]   (its jobs: the profile's shards)
  autoshard store import rows.json --store DIR   (file a worker's rows under their own space)

Bad input is one line on stderr naming the file, row and field, exit status 2, and no output
file (outputs are checked first, written to a temporary file and renamed on success); Ctrl-C or
SIGTERM stop it with one line, status 130 or 143, and no partial output.
"""

import argparse
import json
import math
import sys
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

from autoshard.cli import column_plan, sharding_plan, topology_plan, topology_search
from autoshard.cli import service as planning
from autoshard.cli.constraints import Constraints, read_constraints
from autoshard.cli.defaults import study_defaults, timed_runs
from autoshard.cli.output import Interrupted, check_outputs, interruptible, write_files
from autoshard.cli.plan_files import read_columns, read_plan
from autoshard.cli.service import FIRST_RUN, MEASURED, METHODS, TORCHREC, has_models, outside_range
from autoshard.cli.sharding_plan import COST_METHODS, parse_bandwidths
from autoshard.cli.topology_file import read_topology
from autoshard.cli.user_tables import parse_memory, read_tables
from autoshard.core.errors import ConfigError
from autoshard.core.inputs import SHARDINGS, Block, Cached, check_arguments, shown
from autoshard.measure.names import BACKENDS
from autoshard.methods.registry import GREEDY, POLICY, SAMPLED, ids
from autoshard.placement import caching
from autoshard.placement.topology import DDR_BYTES, Topology


def _why_alike(method: str) -> str:
    """Why a method of the command cannot be told that devices differ (by its registry kind)."""
    if method == TORCHREC:
        return "TorchRec's Topology has one memory and no speed for its devices"
    if method in ids(kind="rl"):
        return "the policy was trained on devices alike: nothing it reads says a device is slower"
    return "its search scores devices alike"


class UsageError(ConfigError):
    """A command line argparse cannot parse."""


class _Parser(argparse.ArgumentParser):
    """argparse whose errors are one line (the usage stays with --help)."""

    def error(self, message: str):
        raise UsageError(f"{message} (see `{self.prog} --help`)")


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tables", required=True, type=Path,
                   help="CSV or YAML (name, rows, dim, pooling_factor[, zipf_alpha][, reuse_bin_0..16]) "
                        "or a pool folder")
    p.add_argument("--weight-bytes", type=int, default=study_defaults()["pool.weight_bytes"], choices=(2, 4),
                   help="bytes per weight (4: fp32, 2: fp16; default pool.weight_bytes)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")


def _task_args(p: argparse.ArgumentParser, topology: bool = False) -> None:
    """The devices: their number and memory (with `topology`, or a --topology file instead)."""
    either = " (or --topology)" if topology else ""
    p.add_argument("--devices", required=not topology, type=int, help=f"number of devices (at least 1){either}")
    p.add_argument("--memory-per-device", required=not topology,
                   help=f"memory of one device: 16GiB, 16 GB, 1.5e10 (bytes){either}")
    if topology:
        p.add_argument("--topology", type=Path, default=None, metavar="FILE",
                       help="a YAML or JSON file of the hosts and each device's relative speed and memory, for "
                            "clusters whose devices differ (cli.topology_file); in place of --devices, "
                            "--memory-per-device and --devices-per-host; with lpt_measured or cost_greedy")
    p.add_argument("--models", type=Path, help="folder of the policy and cost model (default: $AUTOSHARD_MODELS, "
                                               "else data/rl of the project)")
    p.add_argument("--policy", type=Path, help="policy checkpoint (default MODELS/policy.pt)")
    p.add_argument("--cost-model", type=Path, help="cost model (default MODELS/cost_model.pt)")
    p.add_argument("--seed", type=int, default=0, help="seed for sampling (best-of-N, the random heuristic)")


def _measure_args(p: argparse.ArgumentParser) -> None:
    study = study_defaults()
    p.add_argument("--backend", default=study["profile.backend"], choices=BACKENDS,
                   help="how device shards are measured (default profile.backend)")
    p.add_argument("--batch-size", type=int, default=study["profile.batch_size"],
                   help="the training batch (samples per step, all devices together): every table is measured at "
                        "it, and with `plan` its input and output buffers take memory for it (default "
                        "profile.batch_size)")
    p.add_argument("--runs", type=int, default=timed_runs(),
                   help="timed runs per shard, their median (default evaluate.timing's runs x rounds)")


def _cache_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cache", type=Path, default=None,
                   help=f"where the single-table costs that {', '.join(MEASURED)} place on are kept once measured "
                        "here (default $AUTOSHARD_CACHE, else ~/.cache/autoshard): a table measured under the same "
                        "settings, code and machine is not measured again")


def parser() -> argparse.ArgumentParser:
    top = _Parser(prog="autoshard", description=__doc__.split("\n")[0],
                  formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    sub = top.add_subparsers(dest="command", required=True)
    plan = sub.add_parser("plan", help="place the tables on devices and write the plan")
    _common(plan)
    _task_args(plan, topology=True)
    plan.add_argument("--method", default=None,
                      help=f"one of {', '.join(METHODS)} (default {POLICY} where the trained models are found, "
                           f"else {FIRST_RUN} on single-table costs measured on this machine; {GREEDY} with "
                           "--sharding column)")
    plan.add_argument("--best-of", type=int, default=None,
                      help="rl_best_of_n: the best of N sampled placements by predicted bottleneck "
                           "(default rl.best_of)")
    plan.add_argument("--sharding", default="table", choices=SHARDINGS,
                      help="table: every table whole on one device; column: tables may be split into column "
                           "shards, chosen with the placement (split-then-place on the cost model); row: tables may "
                           "be split by rows over every device (row-wise) or a host's (table-row-wise); auto: any of "
                           "these, chosen per table with the placement (row and auto: LPT over each table's shardings "
                           f"on per-piece costs, measured here with {FIRST_RUN}, predicted with {GREEDY})")
    plan.add_argument("--devices-per-host", type=int, default=None,
                      help="with --sharding row or auto: devices per host, the ranks a table-row-wise table spans "
                           "(default: all devices, one host)")
    plan.add_argument("--bandwidths", default=None, metavar="INTRA,CROSS",
                      help="with --sharding row or auto: the links' bandwidths in GiB/s, within a host and across "
                           "hosts, at which each piece's output exchange is charged (default TorchRec's planner's, "
                           "600,12.5)")
    plan.add_argument("--column-ways", default=None,
                      help="with --sharding column or auto: the numbers of column shards a table may be split into "
                           "(default columns.ways; each shard a multiple of 4 columns)")
    plan.add_argument("--split", action="append", metavar="NAME=K",
                      help="with --sharding column: split table NAME into K column shards (repeatable)")
    _measure_args(plan)
    plan.add_argument("--constraints", type=Path, default=None, metavar="FILE",
                      help="a YAML or JSON file pinning tables to devices ({name: {device: 3}}), keeping groups "
                           "on one device ({name: {group: g}}) and restricting sharding types ({name: "
                           "{sharding_types: [row_wise]}}); with --sharding table, row or auto")
    _cache_arg(plan)
    plan.add_argument("--out", required=True, type=Path, help="plan file to write (JSON)")
    plan.add_argument("--torchrec", type=Path, help="also write the plan as a TorchRec sharding plan (JSON)")
    plan.add_argument("--torchrec-device", default="cuda", choices=("cuda", "cpu"),
                      help="device type of the TorchRec plan's shards")
    plan.add_argument("--cache-load-factor", type=float, default=None, metavar="F",
                      help="sharded, on cuda: a table that fits no device's HBM whole may be kept in host memory by "
                           "TorchRec's UVM caching kernel, F of it cached in HBM (above 0, at most 1; default "
                           f"TorchRec's {caching.LOAD_FACTOR})")
    plan.add_argument("--ddr-per-device", default=None, metavar="SIZE",
                      help="sharded, on cuda: each device's share of its host's memory, which holds the cached "
                           "tables (default TorchRec's 128GiB; a --topology file may give it per host)")
    score = sub.add_parser("score", help="measure a plan's device shards")
    _common(score)
    score.add_argument("--plan", required=True, type=Path, help="a plan of `autoshard plan` or its --torchrec file")
    _measure_args(score)
    score.add_argument("--store", type=Path, default=None,
                       help="a measurement store (the study's: data/measurements): shards measured there "
                            "under the same settings are read, new ones measured and added")
    score.add_argument("--space", default=None,
                       help="with --store: read the plan's shards from this space (one imported with `autoshard "
                            "store import`, measured elsewhere) instead of this machine's; nothing is measured")
    compare = sub.add_parser("compare", help="every method on the same tables")
    _common(compare)
    _task_args(compare)
    compare.add_argument("--best-of", type=int, default=study_defaults()["rl.best_of"],
                         help=f"N for the {SAMPLED} row (default rl.best_of)")
    compare.add_argument("--measure", action="store_true", help="also measure every plan")
    _measure_args(compare)
    _cache_arg(compare)
    worker = sub.add_parser("measure", help="measure the shards of a job file (see autoshard.measure.worker), "
                                            "or write the job files of the profile stage's shards")
    worker.add_argument("--jobs", type=Path, help="job file (JSON): shards, backend, pool")
    worker.add_argument("--out", type=Path, help="with --jobs: rows to write (JSON)")
    worker.add_argument("--write-jobs", type=Path, metavar="JOBS",
                        help="instead: write the job files of the profile stage's shards under --params, one per "
                             "pass (JOBS for the main pass, JOBS-stem.TAG.json for pass TAG)")
    worker.add_argument("--params", type=Path, help="with --write-jobs: the study's parameters (default params.yaml)")
    worker.add_argument("--device", choices=("auto", "cpu", "cuda"), help="with --write-jobs: the worker's device "
                                                                          "(default profile.device)")
    worker.add_argument("--backend", choices=BACKENDS, help="with --write-jobs: the worker's backend "
                                                            "(default profile.backend)")
    worker.add_argument("--passes", help="with --write-jobs: only these passes, comma-separated (main, repeat-1, "
                                         "..., remeasure; default all)")
    store = sub.add_parser("store", help="the measurement store")
    store_sub = store.add_subparsers(dest="store_command", required=True)
    imported = store_sub.add_parser("import", help="file the rows of `autoshard measure` (measured on any machine) "
                                                   "in the store under their own space")
    imported.add_argument("rows", type=Path, help="a rows file of `autoshard measure`")
    imported.add_argument("--store", required=True, type=Path, help="the store (the study's: data/measurements)")
    imported.add_argument("--pass", dest="tag", default="",
                          help="file the rows as this independent pass of their space (a stage's tag, "
                               "e.g. repeat-1) instead of the space itself")
    return top


def _print_devices(doc: dict) -> None:
    frame = pd.DataFrame(doc["per_device"]).drop(columns="names")
    frame["memory_share"] = frame["memory_share"].map("{:.1%}".format)
    print(frame.to_string(index=False))
    predicted = doc["predicted_bottleneck_ms"]
    splits = [f"{len(doc[k])} split into {what} shards" for k, what in (("columns", "column"), ("rows", "row"))
              if doc.get(k)] + ([f"{len(doc['replicated'])} data-parallel"] if doc.get("replicated") else [])
    split = f" ({', '.join(splits)})" if splits else ""
    tables = sum(len(doc.get(k, ())) for k in ("assignment", "columns", "rows", "replicated"))
    print(f"\nmethod {doc['method']}: {tables} tables{split} on {doc['devices']} devices in "
          f"{doc['sharding_seconds']:.3f} s; predicted bottleneck "
          f"{'n/a (no cost model)' if predicted is None else f'{predicted:.3f} ms'}")


def _check_plan_options(args: argparse.Namespace, folder: Path) -> None:
    """`--method` is known (unset: the policy where the trained models are, in `folder` or
    given, else FIRST_RUN on costs measured here), and options it does not use are refused
    rather than ignored (a `--policy` it does not use is still checked, by `planning.load_models`)."""

    whole = args.sharding == "column" or (args.sharding == "table" and args.constraints is None
                                          and args.cluster is None)  # no sharded plan
    unused = {"--column-ways": args.column_ways if args.sharding in ("table", "row") else None,
              "--split": args.split if args.sharding != "column" else None,
              "--devices-per-host": args.devices_per_host if whole else None,
              "--bandwidths": args.bandwidths if whole else None,
              "--constraints": args.constraints if args.sharding == "column" else None}
    for option, value in unused.items():
        if value is not None:
            raise ConfigError(f"{option}: --sharding {args.sharding} does not use it")
    if args.sharding == "column":
        if args.method not in (None, GREEDY):
            raise ConfigError(f"--method: {shown(args.method)} (with --sharding column only cost_greedy, "
                              "split-then-place on the cost model, places column shards)")
        args.method = GREEDY
    if args.sharding in ("row", "auto") or args.constraints is not None or args.cluster is not None:  # sharded
        if args.method is None:
            args.method = GREEDY if has_models(folder) or args.cost_model else FIRST_RUN
            if args.method == FIRST_RUN:
                print(f"no trained models in {folder}: each piece's cost measured alone on this machine (--method "
                      f"{GREEDY} to predict them)", file=sys.stderr)
        on_topology = args.cluster is not None and args.sharding == "table" and args.method in (
            *topology_plan.METHODS, *topology_search.METHODS)
        if args.method not in (*COST_METHODS, TORCHREC) and not on_topology:
            raise ConfigError(f"--method: {shown(args.method)} (with --sharding {args.sharding}: "
                              f"{', '.join(COST_METHODS)} (the costs of every piece measured here or predicted) or "
                              "torchrec (TorchRec's planner))")
        per_host = args.devices_per_host
        if per_host is not None and not (1 <= per_host <= args.devices and args.devices % per_host == 0):
            raise ConfigError(f"--devices-per-host: {per_host} (between 1 and --devices {args.devices}, and "
                              "dividing it)")

        args.links = parse_bandwidths(args.bandwidths)
    _check_caching(args, sharded=args.sharding in ("row", "auto") or args.constraints is not None
                   or args.cluster is not None)
    if args.method is None:
        args.method = POLICY if has_models(folder) or args.policy or args.cost_model else FIRST_RUN
        if args.method == FIRST_RUN:
            print(f"no trained models in {folder}: placing with {FIRST_RUN} on each table's cost measured alone on "
                  "this machine (--method to choose another)", file=sys.stderr)
    if args.method not in METHODS:
        raise ConfigError(f"--method: {shown(args.method)} (expected one of {', '.join(METHODS)})")
    if args.method != SAMPLED and args.best_of is not None:
        raise ConfigError(f"--best-of: only --method rl_best_of_n uses it (not --method {args.method})")
    if args.best_of is None:
        args.best_of = study_defaults()["rl.best_of"]


def _check_caching(args: argparse.Namespace, sharded: bool) -> None:
    """`args.load_factor`: the UVM caching kernel's cache load factor where a sharded plan for
    GPUs by our methods may use it, else None; `--cache-load-factor` and `--ddr-per-device` are
    refused where nothing uses them."""
    used = sharded and args.torchrec_device == "cuda" and args.method in (*COST_METHODS, TORCHREC)
    for option, value in (("--cache-load-factor", args.cache_load_factor), ("--ddr-per-device", args.ddr_per_device)):
        if value is not None and not used:
            raise ConfigError(f"{option}: only a sharded plan (--sharding row or auto, --constraints or --topology) "
                              "for --torchrec-device cuda by lpt_measured, cost_greedy or torchrec keeps tables in "
                              "host memory")
    factor = caching.LOAD_FACTOR if args.cache_load_factor is None else args.cache_load_factor
    if not (math.isfinite(factor) and 0 < factor <= 1):
        raise ConfigError(f"--cache-load-factor: {shown(args.cache_load_factor)} (above 0, at most 1)")
    args.load_factor = factor if used else None


def _topology(args: argparse.Namespace) -> None:
    """`args.cluster`: the --topology file's devices, which then stand for --devices,
    --memory-per-device and --devices-per-host (refused beside them); else those three, alike."""
    args.cluster = None
    args.ddr_bytes = (DDR_BYTES if getattr(args, "ddr_per_device", None) is None else
                      parse_memory(args.ddr_per_device, "--ddr-per-device"))
    if args.topology is None:
        for option, value in (("--devices", args.devices), ("--memory-per-device", args.memory_per_device)):
            if value is None:
                raise ConfigError(f"{option}: required (or --topology FILE)")
        return
    given = [o for o, v in (("--devices", args.devices), ("--memory-per-device", args.memory_per_device),
                            ("--devices-per-host", args.devices_per_host)) if v is not None]
    if given:
        raise ConfigError(f"{given[0]}: --topology {args.topology} gives the devices (one or the other)")
    on_topology = (*COST_METHODS, *topology_plan.METHODS, *topology_search.METHODS)
    if args.method in METHODS and args.method not in on_topology:
        raise ConfigError(f"--method: {args.method} places on devices alike ({_why_alike(args.method)}); with "
                          f"--topology, {', '.join(on_topology)}")
    if args.method not in (*on_topology, None):
        raise ConfigError(f"--method: {shown(args.method)} (with --topology, one of {', '.join(on_topology)})")
    if args.sharding == "column":
        raise ConfigError("--sharding: column places on devices alike; with --topology, table, row or auto")
    if args.method in (*topology_plan.METHODS, *topology_search.METHODS) and args.sharding != "table":
        why = "its key prices no split" if args.method in topology_plan.METHODS else "it moves whole tables"
        raise ConfigError(f"--sharding: {args.sharding} with --method {args.method}, which places every table whole "
                          f"({why}; {' or '.join(COST_METHODS)} split tables on a topology)")
    args.cluster = read_topology(args.topology, args.ddr_bytes)
    args.devices, args.memory_per_device = args.cluster.devices, str(int(args.cluster.memories.max()))
    args.devices_per_host = args.cluster.local
    if args.torchrec is not None and args.cluster.local is None:
        raise ConfigError(f"--torchrec: TorchRec's topology has one number of devices per host, and "
                          f"{args.topology} has hosts of {', '.join(map(str, sorted(set(args.cluster.hosts))))}")


def cmd_plan(args: argparse.Namespace) -> int:

    _topology(args)
    check_arguments(args)
    folder = planning.models_folder(args.models)
    _check_plan_options(args, folder)
    memory = parse_memory(args.memory_per_device)
    check_outputs({"--out": args.out, "--torchrec": args.torchrec},
                  [args.tables, args.policy, args.cost_model, args.constraints, *planning.default_files(folder)])
    sharded = args.sharding in ("row", "auto") or args.constraints is not None or args.cluster is not None
    estimated = sharded and args.backend == "analytic" and topology_search.STARTS.get(args.method, args.method) not in (
        GREEDY, TORCHREC)
    tables = read_tables(args.tables, args.weight_bytes, reuse=not estimated)  # TorchRec's estimate reads no reuse
    if sharded:
        return _plan_sharded(args, tables, memory, folder)
    held = tables.memory(args.batch_size)
    task = planning.make_task(tables, args.devices, memory, held)
    if args.sharding == "column":
        return _plan_columns(args, tables, task, folder)
    models = planning.load_models(args.method, args.policy, args.cost_model,
                                  need_torch=args.method == SAMPLED, folder=folder)
    options = {"best_of": args.best_of, "seed": args.seed} if args.method == SAMPLED else {}
    singles = _singles(tables, args) if args.method in MEASURED else None
    costs = None if singles is None else singles.source()
    if args.method == TORCHREC:  # TorchRec's planner on the user's modules, at the training batch
        from autoshard.cli.torchrec import method as torchrec_method

        result = torchrec_method.plan(tables, "table", args.devices, args.devices, memory, args.batch_size,
                                      parse_bandwidths(None), args.torchrec_device)
        placement = np.array([p.devices[0] for p in result.placed], dtype=np.int64)
        seconds, costs = result.seconds, result.costs
    else:
        placement, seconds = planning.timed_place(args.method, tables, task, models, best_of=args.best_of,
                                                  seed=planning.seed_for(tables, args.seed),
                                                  single_costs=None if singles is None else singles.costs,
                                                  memory=held)
    planning.check_memory(f"--method {args.method}", task, placement, held,
                          "try a memory-aware heuristic such as size_lookup_greedy, or more memory")
    doc = planning.plan_document(args.method, options | {"batch_size": args.batch_size}, tables, task, placement,
                                 models, seconds, costs=costs, memory=held)
    _note_range(doc, tables, models)
    outputs = {args.out: json.dumps(doc, indent=1, default=_plain, allow_nan=False)}
    if args.torchrec is not None:
        blocks = {n: [Block(0, None, 0, None, int(d))] for n, d in zip(tables.names, placement, strict=True)}
        outputs[args.torchrec] = _torchrec_export(tables, blocks, {}, task.devices, args)
    return _write_and_show(args, doc, outputs)


def _torchrec_export(tables, blocks: dict, kinds: dict, devices: int, args: argparse.Namespace,
                     cached: Cached | None = None) -> str:
    """The plan as TorchRec's `ShardingPlan` in JSON (`--torchrec`), for `--torchrec-device`,
    written without torch (`placement.torchrec.plan_json`: the file TorchRec's generators give),
    the tables of `cached` on the UVM caching kernel with their `cache_params`."""
    from autoshard.placement.torchrec import plan_json

    doc = plan_json(tables.features, tables.names, blocks, kinds, devices, getattr(args, "devices_per_host", None),
                    args.torchrec_device, cached)
    return json.dumps(doc, indent=1, allow_nan=False)


def _singles(tables, args: argparse.Namespace):
    """Every table measured alone on this machine with `--backend`, `--batch-size` and `--runs`,
    through the cache (`cli.singles`); a table too large to measure here is refused."""
    from autoshard.cli.singles import cache_folder, measure_singles
    from autoshard.data.pool import Pool

    folder = cache_folder(args.cache)
    if folder.exists() and not folder.is_dir():
        raise ConfigError(f"--cache: {folder} (not a folder)")
    pool = Pool(features=tables.features, traces=tables.traces)
    singles = measure_singles(pool, _backend_config(tables, args, training=True), folder,
                              progress=not args.json and sys.stderr.isatty())
    unmeasured = np.flatnonzero(~np.isfinite(singles.costs))
    if len(unmeasured):
        i = int(unmeasured[0])
        raise ConfigError(f"{tables.source}: row {i + 1} ({tables.names[i]}): too large to measure alone on this "
                          f"machine ({len(unmeasured)} such tables; use a method that needs no measurement, "
                          "e.g. --method size_lookup_greedy)")
    return singles


def _write_and_show(args: argparse.Namespace, doc: dict, outputs: dict) -> int:
    """Write the plan's files at once, then show the plan (as JSON with `--json`)."""
    write_files(outputs)
    if args.json:
        print(json.dumps(doc, default=_plain))
    else:
        _print_devices(doc)
    return 0


def _plan_sharded(args: argparse.Namespace, tables, memory: int, folder: Path) -> int:
    """`plan --sharding row|auto`: every table's sharding chosen with its placement
    (`cli.sharding_plan`), on piece costs measured here or predicted by the cost model, or by
    TorchRec's planner (`cli.torchrec.method`)."""

    local = args.devices_per_host or args.devices
    topology = args.cluster or Topology.uniform(args.devices, memory, local, args.ddr_bytes)
    constraints = (read_constraints(args.constraints, tables, args.devices, local, args.sharding,
                                    tables.memory(args.batch_size), memory)
                   if args.constraints is not None else Constraints())
    if args.method == TORCHREC and constraints.places:
        raise ConfigError(f"--constraints: {args.constraints} pins or groups tables, which TorchRec's planner "
                          "cannot be told (lpt_measured and cost_greedy honour them; torchrec takes sharding_types)")
    if args.method == TORCHREC and args.column_ways is not None:
        raise ConfigError("--column-ways: --method torchrec does not use it (TorchRec's planner chooses column shards)")
    ways = (column_plan.parse_ways(args.column_ways or ",".join(map(str, study_defaults()["columns.ways"])))
            if args.sharding == "auto" and args.method != TORCHREC else ())
    models = planning.Models(cost_model=None, policy=None, files={})
    if args.method == TORCHREC:
        from autoshard.cli.torchrec import method as torchrec_method

        result = torchrec_method.plan(tables, args.sharding, args.devices, local, memory, args.batch_size, args.links,
                                      args.torchrec_device, constraints.kinds, args.load_factor, args.ddr_bytes)
    elif args.method in topology_plan.METHODS:
        result = topology_plan.plan(args.method, tables, topology, args.batch_size, constraints,
                                    planning.seed_for(tables, args.seed))
    else:
        start = topology_search.STARTS.get(args.method, args.method)  # the method whose placement it improves
        if args.method in topology_search.METHODS and constraints.places:
            raise ConfigError(f"--constraints: {args.constraints} pins or groups tables, which --method {args.method} "
                              f"moves on a topology ({start} honours them)")
        if start == GREEDY:
            models = planning.load_models(GREEDY, args.policy, args.cost_model, folder=folder)
            costs = sharding_plan.predicted(tables, models)
        elif args.backend == "analytic":
            costs = sharding_plan.estimated(tables, args.batch_size, args.torchrec_device)
        else:
            from autoshard.cli.singles import cache_folder

            costs = sharding_plan.measured(tables, _backend_config(tables, args, training=True),
                                           cache_folder(args.cache), progress=not args.json and sys.stderr.isatty())
        result = sharding_plan.plan(tables, args.sharding, topology, args.batch_size, ways, costs, args.links,
                                    constraints, args.load_factor)
        if args.method in topology_search.METHODS:
            result = topology_search.plan(args.method, result, topology)
    options = {"sharding": args.sharding, "devices_per_host": local, "batch_size": args.batch_size,
               "column_ways": list(ways), "bandwidths_gib_per_s": list(args.links.gib_per_s),
               "constraints": None if args.constraints is None else str(args.constraints),
               "cache_load_factor": args.load_factor}
    doc = sharding_plan.document(args.method, options, tables, topology, result, models.files,
                                 models.engine)
    _note_range(doc, tables, models)
    _note_unused_ddr(doc, args)
    outputs = {args.out: json.dumps(doc, indent=1, default=_plain, allow_nan=False)}
    if args.torchrec is not None:
        blocks, kinds = sharding_plan.blocks(tables, result.placed)
        outputs[args.torchrec] = _torchrec_export(tables, blocks, kinds, args.devices, args,
                                                  sharding_plan.cached(tables, result.placed, args.load_factor))
    return _write_and_show(args, doc, outputs)


def _plan_columns(args: argparse.Namespace, tables, task, folder: Path) -> int:
    """`plan --sharding column`: split-then-place on the cost model, the plan file listing each
    split table's column shards, and optionally its TorchRec export (`column_wise` shardings)."""
    import time


    ways = column_plan.parse_ways(args.column_ways or ",".join(map(str, study_defaults()["columns.ways"])))
    fixed = column_plan.parse_splits(args.split, tables)
    models = planning.load_models(GREEDY, args.policy, args.cost_model, need_torch=True, folder=folder)
    start = time.perf_counter()
    result = column_plan.plan(models.cost_model, tables, task, ways, fixed)
    seconds = time.perf_counter() - start
    planning.check_memory("--sharding column", task, result.placement,
                          column_plan.shard_memory(tables, result.shards, args.batch_size),
                          "try more memory, or --sharding auto, which counts the batch's buffers as it places")
    options = {"column_ways": list(ways), "split": {tables.names[t]: k for t, k in fixed.items()},
               "batch_size": args.batch_size}
    doc = column_plan.document(options, tables, task, result, models.cost_model, models.files, seconds,
                               args.batch_size)
    planning.finite_predictions(np.array([doc["predicted_bottleneck_ms"]]), models)
    _note_range(doc, tables, models)
    outputs = {args.out: json.dumps(doc, indent=1, default=_plain, allow_nan=False)}
    if args.torchrec is not None:
        blocks: dict[str, list[Block]] = {}
        for shard, d in sorted(zip(result.shards, result.placement, strict=True), key=lambda p: p[0].start):
            blocks.setdefault(tables.names[shard.table], []).append(
                Block(0, None, shard.start, None if shard.whole else shard.width, int(d)))
        kinds = {n: "column_wise" for n, b in blocks.items() if len(b) > 1}
        outputs[args.torchrec] = _torchrec_export(tables, blocks, kinds, task.devices, args)
    return _write_and_show(args, doc, outputs)


def _note_range(doc: dict | None, tables, models) -> None:
    """Say on stderr, in one line, when tables lie outside the cost model's fitted range (and keep the
    line in the plan file's `warnings`)."""

    line = outside_range(tables, models)
    if line is None:
        return
    print(f"autoshard: {line}", file=sys.stderr)
    if doc is not None:
        doc["warnings"] = [*doc.get("warnings", []), line]


def _note_unused_ddr(doc: dict, args: argparse.Namespace) -> None:
    """Say on stderr, in one line (kept in the plan file's `warnings`), when a --topology file
    gives host memory (`ddr`) that this plan cannot use: no table is kept there."""
    if args.cluster is None or args.load_factor is not None or (args.cluster.ddrs == args.ddr_bytes).all():
        return
    line = (f"{args.topology}: field ddr: unused by this plan (only a plan for --torchrec-device cuda by "
            f"{' or '.join(COST_METHODS)} keeps tables in host memory)")
    print(f"autoshard: {line}", file=sys.stderr)
    doc["warnings"] = [*doc.get("warnings", []), line]


def _plain(value):
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def _backend_config(tables, args: argparse.Namespace, training: bool = False):
    """How to measure: `--backend` at `--batch-size` bags (with `training`, a plan's training
    batch, at most the traces' bags: a larger batch is for the memory, the costs scale with it)."""
    from autoshard.cli.singles import study_backend
    from autoshard.measure.timing import one_round

    bags = tables.trace_batch
    batch = min(args.batch_size, bags) if training else args.batch_size
    if batch < 1 or batch > bags:
        raise ConfigError(f"--batch-size: {args.batch_size} (between 1 and the traces' {bags} bags)")
    if args.runs < 1:
        raise ConfigError(f"--runs: {args.runs} (must be at least 1)")
    timing = one_round(study_defaults()["evaluate.timing.warmup"], args.runs)
    return study_backend(args.backend, batch, timing)


def _backend(tables, args: argparse.Namespace):
    from autoshard.data.pool import Pool
    from autoshard.measure.backends import make_backend

    return make_backend(Pool(features=tables.features, traces=tables.traces), _backend_config(tables, args))


def measure_stored(tables, placement: np.ndarray, devices: int, args: argparse.Namespace) -> pd.DataFrame:
    """`measure`'s frame, through the measurement store at `args.store`: shards stored under the
    same settings (backend, batch, runs, code, machine, the tables' features and traces) are
    read; the others are measured as one batch and added. With `--space`, every shard is read
    from that space (imported, measured elsewhere) and none is measured."""
    from autoshard.core.seeding import rng
    from autoshard.data.pool import Pool
    from autoshard.measure.backends import make_backend
    from autoshard.measure.batches import BatchJob, measure_batch_job
    from autoshard.measure.store import shard_key, store_for, values

    cfg = _backend_config(tables, args)
    pool = Pool(features=tables.features, traces=tables.traces)
    if args.space is not None:  # a worker's pool: the tables without the names this command gives them
        pool = Pool(features=tables.features.drop(columns="name", errors="ignore"), traces=tables.traces)
    store = store_for(args.store, cfg, pool, args.space, "--space")
    shards = [[int(t) for t in np.flatnonzero(placement == d)] for d in range(devices)]
    todo = store.missing(s for s in shards if s)
    store.refuse_measuring(todo, f"the plan {args.plan}")
    if todo:
        job = BatchJob(shards=tuple(todo), calibration=tuple(next(s for s in shards if s)), backend=cfg, pool={},
                       store_root=str(args.store), space=store.folder.name, order=rng(0, "score", *todo),
                       label=f"autoshard score {args.plan.name}")
        measure_batch_job(job, make_backend(pool, cfg))
    known = store.read()
    rows = []
    for d, shard in enumerate(shards):
        forward, backward = values(known[shard_key(shard)])[:2] if shard else (0.0, 0.0)
        rows.append({"device": d, "tables": len(shard), "forward_ms": forward, "backward_ms": backward,
                     "total_ms": forward + backward})
    return pd.DataFrame(rows)


def measure(tables, placement: np.ndarray, devices: int, args: argparse.Namespace, backend=None) -> pd.DataFrame:
    """`measure_shards` of a table-wise placement (every table one whole shard)."""
    from autoshard.placement.column_split import ColumnShard

    whole = [ColumnShard(t, 0, d, d) for t, d in enumerate(tables.features["dim"].tolist())]
    return measure_shards(tables, whole, placement, devices, args, backend)


def measure_shards(tables, shards: list, placement: np.ndarray, devices: int, args: argparse.Namespace,
                   backend=None) -> pd.DataFrame:
    """Per device of a plan of column shards (`plan_files.read_columns`): its tables (whole or in part),
    its columns, and measured forward, backward and total compute (ms), each column shard
    measured at its width."""
    import torch

    torch.set_num_threads(1)
    backend = backend or _backend(tables, args)
    rows = []
    for d in range(devices):
        mine = [s for s, p in zip(shards, placement, strict=True) if p == d]
        ids, widths = [s.table for s in mine], [s.width for s in mine]
        whole = all(s.whole for s in mine)
        cost = (backend.measure(ids, args.batch_size) if whole else backend.measure(ids, args.batch_size, widths)) \
            if mine else None
        rows.append({"device": d, "tables": len(mine), "columns": sum(widths),
                     "forward_ms": cost.forward_ms if cost else 0.0, "backward_ms": cost.backward_ms if cost else 0.0,
                     "total_ms": cost.total_ms if cost else 0.0})
    return pd.DataFrame(rows)


def cmd_score(args: argparse.Namespace) -> int:

    check_arguments(args)
    if args.space is not None and args.store is None:
        raise ConfigError("--space: only with --store (the store that holds the space)")
    tables = read_tables(args.tables, args.weight_bytes)
    if args.store is not None:  # the store holds whole-table shards
        frame = measure_stored(tables, *read_plan(args.plan, tables), args)
    else:
        frame = measure_shards(tables, *read_columns(args.plan, tables), args)
    bottleneck = float(frame["total_ms"].max())
    source = args.backend if args.space is None else f"space {args.space}"
    if args.json:
        print(json.dumps({"plan": str(args.plan), "backend": args.backend, "space": args.space,
                          "batch_size": args.batch_size, "measured_bottleneck_ms": bottleneck,
                          "per_device": frame.to_dict("records")}))
    else:
        print(frame.round(3).to_string(index=False))
        print(f"\nmeasured bottleneck ({source}, batch {args.batch_size}): {bottleneck:.3f} ms")
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from autoshard.data.features import feature_matrix
    from autoshard.placement.shards import predicted_bottleneck

    check_arguments(args)
    memory = parse_memory(args.memory_per_device)
    tables = read_tables(args.tables, args.weight_bytes)
    task = planning.make_task(tables, args.devices, memory)
    models = planning.load_models(SAMPLED, args.policy, args.cost_model, need_torch=True,
                                  folder=planning.models_folder(args.models))
    _note_range(None, tables, models)
    seed = planning.seed_for(tables, args.seed)
    backend = _backend(tables, args) if args.measure else None
    singles = _singles(tables, args).costs
    rows = []
    features = feature_matrix(tables.features)
    for name in METHODS:
        try:
            placement, seconds = planning.timed_place(name, tables, task, models, seed=seed, best_of=args.best_of,
                                                      single_costs=singles)
        except ConfigError as exc:
            rows.append({"method": name, "status": f"no plan: {exc}"})
            continue
        predicted = predicted_bottleneck(models.cost_model, features, task, placement)
        planning.finite_predictions(np.array([predicted]), models)
        row = {"method": name, "status": "ok", "seconds": seconds, "predicted_ms": predicted}
        if backend is not None:
            row["measured_ms"] = float(measure(tables, placement, task.devices, args, backend)["total_ms"].max())
        rows.append(row)
    frame = pd.DataFrame(rows)
    if args.json:
        print(frame.to_json(orient="records"))
    else:
        print(frame.round(4).to_string(index=False))
        print("\npredicted_ms: the cost model's estimate; measured_ms: measured with --backend (with --measure)")
    return 0


def cmd_measure(args: argparse.Namespace) -> int:
    from autoshard.measure.worker import measure_rows, read_job

    if args.write_jobs is not None:
        return write_jobs(args)
    for option, given in (("--params", args.params), ("--device", args.device),
                          ("--backend", args.backend), ("--passes", args.passes)):
        if given:
            raise ConfigError(f"{option}: only with --write-jobs")
    if args.jobs is None or args.out is None:
        raise ConfigError("measure: --jobs and --out are required (or --write-jobs to write job files)")
    check_outputs({"--out": args.out}, [args.jobs])
    job = read_job(args.jobs)
    try:
        doc = measure_rows(job)
    except ConfigError as exc:
        raise ConfigError(f"{args.jobs}: {exc}") from None
    write_files({args.out: json.dumps(doc, indent=1) + "\n"})
    rows = doc["rows"]
    ok = sum(r["status"] == "ok" for r in rows)
    print(f"measured {ok} of {len(rows)} shards with {rows[0]['backend']} on {rows[0]['device']} "
          f"(space {doc['space']}): wrote {args.out}")
    return 0


def write_jobs(args: argparse.Namespace) -> int:
    """`measure --write-jobs`: the profile's job files, one per pass, and how to measure and
    import each (`cli.worker_jobs`)."""
    from autoshard.cli.worker_jobs import write_plan
    from autoshard.core.params import load_params
    from autoshard.core.paths import Paths

    if args.jobs is not None or args.out is not None:
        raise ConfigError("--write-jobs: not with --jobs or --out (write the job files, then measure each)")
    params_file = args.params or Path("params.yaml")
    check_outputs({"--write-jobs": args.write_jobs}, [params_file])
    params = load_params(params_file)
    only = [name.strip() for name in args.passes.split(",")] if args.passes is not None else None
    try:
        files = write_plan(params, args.write_jobs, args.device, args.backend, only)
    except ConfigError as exc:
        raise ConfigError(f"{params_file}: {exc}") from None
    check_outputs({f"--write-jobs ({f.tag or 'main'} pass)": f.path for f in files}, [params_file])
    write_files({f.path: f.text for f in files})
    store = Paths().measurements
    for f in files:
        rows = f.path.with_name(f"rows{'.' + f.tag if f.tag else ''}.json")
        imported = f"autoshard store import {rows} --store {store}" + (f" --pass {f.tag}" if f.tag else "")
        worker = "PYTHONPATH=src python -m autoshard.measure.portable" if f.portable else "autoshard measure"
        print(f"wrote {f.path}: {f.shards} shards, {len(f.text.encode()) / 1024:.0f} KiB; there: {worker} "
              f"--jobs {f.path.name} --out {rows.name}; here: {imported}")
    return 0


def cmd_store(args: argparse.Namespace) -> int:
    """`store import`: a worker's rows, checked first, filed under their own space."""
    import hashlib

    from autoshard.measure.store import import_rows
    from autoshard.measure.worker import read_rows

    if args.store.exists() and not args.store.is_dir():
        raise ConfigError(f"--store: {shown(str(args.store))} (not a folder)")
    rows = read_rows(args.rows)
    digest = hashlib.sha256(args.rows.read_bytes()).hexdigest()[:12]
    store, new = import_rows(args.store, rows.space, rows.settings, rows.records,
                             f"autoshard store import {args.rows.name} (sha256 {digest})", args.tag)
    host = rows.settings["machine"]
    where = f"pass {shown(args.tag)} of space {rows.space}" if args.tag else f"space {rows.space}"
    done = "imported" if new else "already imported (nothing changed):"
    print(f"{done} {len(rows.records)} shards into {where} of {args.store} ({rows.settings['backend']['backend']}, "
          f"batch {rows.settings['backend']['batch_size']}, measured on {host.get('gpu', '?')} / "
          f"{host.get('cpu', '?')}); read it with --space {rows.space}")
    return 0


def _one_line(text: str) -> str:
    return " ".join(text.split("\n")) if "\n" in text else text


def main(argv: list[str] | None = None) -> int:
    """Run the command; every failure is one line on stderr (status 2 for bad input, 130/143
    when interrupted), never a traceback, and no library's warnings."""
    commands = {"plan": cmd_plan, "score": cmd_score, "compare": cmd_compare, "measure": cmd_measure,
                "store": cmd_store}
    prog = "autoshard"
    try:
        with interruptible(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # libraries' warnings (torch.load, TorchRec) are not the command's output
            args = parser().parse_args(argv)
            prog = f"autoshard {args.command}"
            return commands[args.command](args)
    except ConfigError as exc:
        print(f"{prog}: error: {_one_line(str(exc))}", file=sys.stderr)
        return 2
    except Interrupted as exc:
        print(f"{prog}: interrupted by {exc}; no partial output left", file=sys.stderr)
        return exc.status
    except OSError as exc:
        where = f"{shown(exc.filename)}: " if exc.filename else ""
        print(f"{prog}: error: {where}{_one_line(exc.strerror or str(exc))}", file=sys.stderr)
        return 2
    except MemoryError:
        print(f"{prog}: error: out of memory (try fewer or smaller tables)", file=sys.stderr)
        return 2
    except Exception as exc:  # noqa: BLE001 - a bug, still reported in one line
        print(f"{prog}: internal error: {exc.__class__.__name__}: {_one_line(str(exc))[:200]} (please report it)",
              file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
