"""Independent, named random streams derived from the one seed in params.yaml.

Each purpose (the pool's specs, a table's trace, the task split, one task ...) gets its own
stream, so changing one part of the study (say, the number of tasks) never shifts the random
numbers of another (the pool, the other tasks).
"""

import zlib
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager

import numpy as np


def rng(seed: int, *keys: str | int) -> np.random.Generator:
    """A generator for `seed` and a path of keys, e.g. ``rng(0, "trace", 17)``."""
    words = [int(seed)]
    for key in keys:
        words.append(zlib.crc32(key.encode()) if isinstance(key, str) else int(key))
    return np.random.default_rng(np.random.SeedSequence(words))


@contextmanager
def threads(count: int) -> Iterator[None]:
    """Run torch on `count` threads, and restore the caller's setting after."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def one_thread() -> AbstractContextManager[None]:
    """Run torch on one thread: multi-threaded CPU reductions change the order of float sums,
    so training with a fixed seed would not give the same weights twice."""
    return threads(1)
