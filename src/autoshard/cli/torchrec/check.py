"""Apply an exported TorchRec plan for real: `DistributedModelParallel` over the tables' modules
(an `EmbeddingBagCollection` per module path, an `EmbeddingCollection` for sequence tables), one
CPU process per rank (gloo, started by torchrun), and one forward pass of every module whose
output must equal the unsharded one's on the same weights. Proves the plan file is what TorchRec
accepts (table-, column-, row- and table-row-wise), that it computes the same, and where each
table went.

  python -m autoshard.cli.torchrec.check TABLES PLAN.torchrec.json   (a plan for CPU ranks: --torchrec-device cpu)
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from autoshard.core.errors import ConfigError
from autoshard.core.inputs import TORCHREC_FORMAT, read_json, torchrec_blocks

TOLERANCE = 1e-4  # float32 sums of a few rows, in another order


def plan_ranks(plan: str | Path, processes: int | None) -> int:
    """The number of processes to run a plan file with: one per rank of a CPU plan."""
    plan = Path(plan)
    doc = read_json(plan, "TorchRec plan")
    if not isinstance(doc, dict) or doc.get("format") != TORCHREC_FORMAT:
        raise ConfigError(f"{plan}: not a TorchRec plan written by `autoshard plan --torchrec`")
    world = torchrec_blocks(doc, plan).devices
    device = doc["device_type"]
    if device != "cpu":
        raise ConfigError(f"{plan}: a plan for {device} ranks; write it with `--torchrec-device cpu` to run it in "
                          "CPU processes")
    if processes is not None and processes != world:
        raise ConfigError(f"--processes: {processes} (the plan has {world} ranks: one process per rank)")
    return world


def check(tables: str | Path, plan: str | Path, processes: int | None = None, timeout_s: float = 600) -> dict:
    """Run the plan with one CPU process per rank; returns each rank's local tables and largest
    difference from the unsharded modules' outputs (beyond TOLERANCE: a failure)."""
    processes = plan_ranks(plan, processes)
    from autoshard.cli.plan_files import read_blocks
    from autoshard.cli.user_tables import read_tables

    read_blocks(plan, read_tables(tables))  # the plan is for these tables, before any process starts
    with tempfile.TemporaryDirectory(prefix="autoshard-torchrec-") as tmp:
        out = Path(tmp) / "out.json"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}",
               "-m", "autoshard.cli.torchrec.check", "--worker", str(tables), str(plan), str(out)]
        done = subprocess.run(cmd, capture_output=True, text=True, env=os.environ | {"OMP_NUM_THREADS": "1"},
                              timeout=timeout_s)
        if done.returncode != 0 or not out.exists():
            tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
            raise RuntimeError(f"TorchRec plan check failed: {' | '.join(tail)}")
        result = json.loads(out.read_text())
    worst = max(r["max_abs_error"] for r in result["ranks"])
    if worst > TOLERANCE:
        raise RuntimeError(f"TorchRec plan check failed: the sharded output differs from the unsharded "
                           f"module's by up to {worst:g}")
    return result


def _worker(tables_path: str, plan_path: str, out_path: str) -> None:
    import torch
    import torch.distributed as dist
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.types import ShardingEnv

    from autoshard.cli.user_tables import read_tables
    from autoshard.placement.torchrec import load_sharding_plan, modules_of

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    tables = read_tables(tables_path)
    plan = load_sharding_plan(plan_path)
    hosts = {len(p.ranks) for m in plan.plan.values() for p in m.values() if p.sharding_type == "table_row_wise"}
    os.environ["LOCAL_WORLD_SIZE"] = str(min(hosts, default=world))  # the ranks of one host, as the plan has them
    modules = modules_of(tables.features, tables.names)
    model = embedding_model(tables, modules, "meta")
    sharded = DistributedModelParallel(model, device=torch.device("cpu"), plan=plan,
                                       env=ShardingEnv.from_process_group(dist.group.WORLD))
    reference = embedding_model(tables, modules, "cpu")
    full = {n: torch.randn(int(r), int(d), generator=torch.Generator().manual_seed(i))
            for i, (n, r, d) in enumerate(zip(tables.names, tables.features["rows"], tables.features["dim"],
                                              strict=True))}  # the same weights on every rank
    _load_local_shards(sharded, full)
    _load_local_shards(reference, full)
    g = torch.Generator().manual_seed(rank)
    error, width, local = 0.0, 0, []
    for path, (rows, sequence) in modules.items():
        kjt = _batch([tables.names[i] for i in rows], tables.features["rows"].to_numpy()[rows], g)
        got, expected = (_outputs(_submodule(m, path)(kjt), sequence) for m in (sharded.module, reference))
        if not expected or set(got) != set(expected):
            raise RuntimeError(f"module {path!r}: the sharded outputs {sorted(got)} are not {sorted(expected)}")
        error = max([error, *(float((got[k] - expected[k]).abs().max()) for k in expected)])
        width += sum(int(tables.features["dim"].iloc[i]) for i in rows)
        local += [f"{path}.{n}" if path else n for n, p in plan.plan[path].items() if rank in p.ranks]
    gathered = [None] * world
    dist.all_gather_object(gathered, {"rank": rank, "tables": sorted(local), "max_abs_error": error})
    if rank == 0:
        Path(out_path).write_text(json.dumps({"world_size": world, "ranks": gathered, "output_width": width}))
    dist.destroy_process_group()


def embedding_model(tables, modules: dict, device: str):
    """The model the plan is for: its embedding modules at their paths (the root itself where a
    plan has the one module `""`)."""
    import torch

    from autoshard.placement.torchrec import embedding_module

    built = {path: embedding_module(tables.features.iloc[rows], [tables.names[i] for i in rows], sequence, device)
             for path, (rows, sequence) in modules.items()}
    if list(built) == [""]:
        return built[""]
    root = torch.nn.Module()
    for path, module in built.items():
        parent = root
        *above, last = path.split(".")
        for part in above:
            if not hasattr(parent, part):
                parent.add_module(part, torch.nn.Module())
            parent = getattr(parent, part)
        parent.add_module(last, module)
    return root


def _submodule(model, path: str):
    return model.get_submodule(path) if path else model


def _batch(names: list[str], rows, g):
    """A batch of 4 samples for the module's features (named as its tables), 0 to 2 lookups each."""
    import torch
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    from autoshard.placement.torchrec import split_name

    bags = torch.randint(0, 3, (4,), generator=g)
    values = torch.cat([torch.randint(0, int(r), (int(bags.sum()),), generator=g) for r in rows])
    return KeyedJaggedTensor(keys=[split_name(n)[1] for n in names], values=values, lengths=bags.repeat(len(names)))


def _outputs(out, sequence: bool) -> dict:
    """A module's output by feature: pooled embeddings, or a sequence module's per-lookup ones."""
    return {k: v.values() for k, v in out.items()} if sequence else out.to_dict()


def _load_local_shards(model, full: dict) -> None:
    """Copy each rank's shards of the tables' weights (`full`, by qualified table name) into the
    module, through its state dict (a sharded module's local shards are views of its fused
    weights; an unsharded one's are the weights themselves)."""
    import torch

    with torch.no_grad():
        for key, value in model.state_dict().items():
            for kind in (".embedding_bags.", ".embeddings."):
                if kind in f".{key}":
                    module, _, rest = f".{key}".partition(kind)
                    name = f"{module.strip('.')}.{rest.split('.')[0]}".strip(".")
                    break
            else:
                continue
            shards = value.local_shards() if hasattr(value, "local_shards") else None
            if shards is None:
                value.copy_(full[name])
                continue
            for shard in shards:
                (r, c), (h, w) = shard.metadata.shard_offsets, shard.metadata.shard_sizes
                shard.tensor.copy_(full[name][r:r + h, c:c + w])


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        raise ConfigError(f"{message} (see `{self.prog} --help`)")


def main(argv: list[str] | None = None) -> int:
    p = _Parser(prog="python -m autoshard.cli.torchrec.check", description=__doc__.split("\n")[0])
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("tables", type=Path)
    p.add_argument("plan", type=Path)
    p.add_argument("out", type=Path, nargs="?")
    p.add_argument("--processes", type=int, help="one per rank of the plan (the default)")
    try:
        args = p.parse_args(argv)
    except ConfigError as exc:
        print(f"torchrec.check: error: {exc}", file=sys.stderr)
        return 2
    if args.worker:
        _worker(str(args.tables), str(args.plan), str(args.out))
        return 0
    try:
        result = check(args.tables, args.plan, args.processes)
    except (ConfigError, RuntimeError) as exc:
        print(f"torchrec.check: error: {' '.join(str(exc).splitlines())}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("torchrec.check: interrupted", file=sys.stderr)
        return 130
    except subprocess.TimeoutExpired as exc:
        print(f"torchrec.check: error: the processes ran past {exc.timeout} s", file=sys.stderr)
        return 2
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
