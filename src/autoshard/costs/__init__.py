"""Cost backends: how long one device takes to run a shard of tables as one fused operator.

A backend is anything with `name`, `device` and `measure(tables, batch_size) -> ShardCost`
(the `CostBackend` protocol). `make_backend` builds one from the `profile` parameters.
"""

from autoshard.costs.base import CostBackend, ShardCost, ShardTooLarge
from autoshard.costs.factory import BACKENDS, BackendConfig, make_backend, measurement_key

__all__ = ["BACKENDS", "BackendConfig", "CostBackend", "ShardCost", "ShardTooLarge", "make_backend", "measurement_key"]
