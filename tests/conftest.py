"""Shared fixtures: smoke-sized parameters and the repository root."""

import copy
from pathlib import Path

import pytest

from autoshard.core.params import load_params, merge

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def smoke_params() -> dict:
    """params.yaml with configs/smoke.yaml merged over it."""
    return merge(load_params(ROOT / "params.yaml"), load_params(ROOT / "configs" / "smoke.yaml"))


@pytest.fixture
def params(smoke_params) -> dict:
    """A fresh, mutable copy of the smoke parameters for one test."""
    return copy.deepcopy(smoke_params)
