"""Apply an exported TorchRec plan for real: `DistributedModelParallel` over an
`EmbeddingBagCollection` of the tables, one CPU process per rank (gloo, started by torchrun),
and one forward pass whose output must equal the unsharded module's on the same weights. Proves
the plan file is what TorchRec accepts, that it computes the same, and where each table went.

  python -m autoshard.cli.torchrec_check TABLES PLAN.torchrec.json   (a plan for CPU ranks: --torchrec-device cpu)
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
    """Run the plan with one CPU process per rank; returns each rank's output shape, local tables
    and largest difference from the unsharded module's output (beyond TOLERANCE: a failure)."""
    processes = plan_ranks(plan, processes)
    from autoshard.cli.column_plan import read
    from autoshard.cli.user_tables import read_tables

    read(plan, read_tables(tables))  # the plan is for these tables, before any process starts
    with tempfile.TemporaryDirectory(prefix="autoshard-torchrec-") as tmp:
        out = Path(tmp) / "out.json"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}",
               "-m", "autoshard.cli.torchrec_check", "--worker", str(tables), str(plan), str(out)]
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
    from torchrec.modules.embedding_modules import EmbeddingBagCollection
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    from autoshard.cli.user_tables import read_tables
    from autoshard.placement.torchrec import embedding_configs, load_sharding_plan

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    tables = read_tables(tables_path)
    plan = load_sharding_plan(plan_path)
    configs = embedding_configs(tables.features, tables.names)
    ebc = EmbeddingBagCollection(tables=configs, device=torch.device("meta"))
    model = DistributedModelParallel(ebc, device=torch.device("cpu"), plan=plan,
                                     env=ShardingEnv.from_process_group(dist.group.WORLD))
    g = torch.Generator().manual_seed(rank)
    batch = 4
    bags = torch.randint(0, 3, (batch,), generator=g)  # lookups per bag, the same for every table
    values = torch.cat([torch.randint(0, c.num_embeddings, (int(bags.sum()),), generator=g) for c in configs])
    kjt = KeyedJaggedTensor(keys=[c.feature_names[0] for c in configs], values=values,
                            lengths=bags.repeat(len(configs)))
    full = {c.name: torch.randn(c.num_embeddings, c.embedding_dim, generator=torch.Generator().manual_seed(i))
            for i, c in enumerate(configs)}  # the same weights on every rank
    _load_local_shards(model, full)
    pooled = model(kjt)
    reference = EmbeddingBagCollection(tables=configs, device=torch.device("cpu"))
    with torch.no_grad():
        for name, bag in reference.embedding_bags.items():
            bag.weight.copy_(full[name])
    expected = reference(kjt).to_dict()
    got = pooled.to_dict()
    error = max(float((got[k] - expected[k]).abs().max()) for k in expected)
    shape = list(pooled.values().shape)
    local = sorted(n for n, p in plan.plan[""].items() if rank in p.ranks)
    gathered = [None] * world
    dist.all_gather_object(gathered, {"rank": rank, "output_shape": shape, "tables": local,
                                      "max_abs_error": error})
    if rank == 0:
        Path(out_path).write_text(json.dumps({"world_size": world, "ranks": gathered,
                                              "output_width": sum(c.embedding_dim for c in configs)}))
    dist.destroy_process_group()


def _load_local_shards(model, full: dict) -> None:
    """Copy each rank's shards of the tables' weights (`full`, by table name) into the sharded
    module, through its state dict (whose local shards are views of the fused weights)."""
    import torch

    with torch.no_grad():
        for key, value in model.state_dict().items():
            name = key.split(".")[-2]  # ...embedding_bags.<table>.weight
            if name not in full:
                continue
            for shard in value.local_shards():
                (r, c), (h, w) = shard.metadata.shard_offsets, shard.metadata.shard_sizes
                shard.tensor.copy_(full[name][r:r + h, c:c + w])


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        raise ConfigError(f"{message} (see `{self.prog} --help`)")


def main(argv: list[str] | None = None) -> int:
    p = _Parser(prog="python -m autoshard.cli.torchrec_check", description=__doc__.split("\n")[0])
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("tables", type=Path)
    p.add_argument("plan", type=Path)
    p.add_argument("out", type=Path, nargs="?")
    p.add_argument("--processes", type=int, help="one per rank of the plan (the default)")
    try:
        args = p.parse_args(argv)
    except ConfigError as exc:
        print(f"torchrec_check: error: {exc}", file=sys.stderr)
        return 2
    if args.worker:
        _worker(str(args.tables), str(args.plan), str(args.out))
        return 0
    try:
        result = check(args.tables, args.plan, args.processes)
    except (ConfigError, RuntimeError) as exc:
        print(f"torchrec_check: error: {' '.join(str(exc).splitlines())}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("torchrec_check: interrupted", file=sys.stderr)
        return 130
    except subprocess.TimeoutExpired as exc:
        print(f"torchrec_check: error: the processes ran past {exc.timeout} s", file=sys.stderr)
        return 2
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
