"""`--method torchrec`: TorchRec's chosen sharding options read back as our layouts."""

from types import SimpleNamespace

from autoshard.cli.torchrec.method import _placed
from autoshard.cli.user_tables import read_tables
from autoshard.placement.traffic import Links


def _option(kind: str, rows: int, dim: int, rank: int) -> SimpleNamespace:
    shard = SimpleNamespace(offset=(0, 0), size=(rows, dim), rank=rank,
                            perf=SimpleNamespace(fwd_compute=0.25, bwd_compute=0.5))
    return SimpleNamespace(sharding_type=kind, compute_kernel="fused", shards=[shard])


def test_one_column_shard_is_the_whole_table(tmp_path):
    """TorchRec's planner may give a column-wise option of one shard holding every column; it is
    the table-wise layout (it crashed the command once, adding a None width)."""
    path = tmp_path / "t.csv"
    path.write_text("name,rows,dim,pooling_factor\nuser,5000,64,2\n")
    tables = read_tables(path, reuse=False)
    links = Links.from_gib_per_s(100.0, 10.0)
    column = _placed(tables, 0, _option("column_wise", 5000, 64, 3), 256, 4, 2, links)
    table = _placed(tables, 0, _option("table_wise", 5000, 64, 3), 256, 4, 2, links)
    assert column.layout.kind == "table_wise" and column.devices == (3,)
    assert column.layout.pieces == table.layout.pieces
    assert column.layout.pieces[0].cost == 0.75 and column.layout.pieces[0].width is None
