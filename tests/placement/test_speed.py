"""The sharding-speed benchmark's synthetic task."""

from autoshard.placement.speed import synthetic_task


def test_large_synthetic_task(world):
    pool, features, model = world
    task = synthetic_task(pool.features, 40, 16, seed=0)
    assert len(task.tables) == 40 and task.devices == 16
    assert task.memory_bytes >= pool.features["size_bytes"].to_numpy()[list(task.tables)].max()
