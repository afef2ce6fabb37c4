"""The pipeline tests' project copy: what `dvc repro` and the stage command run in."""

from pathlib import Path

import pytest

from helpers import copy_project


@pytest.fixture(scope="module")
def clone(tmp_path_factory, smoke_params) -> Path:
    """The project copied (`copy_project`) with the smoke parameters as its params.yaml."""
    return copy_project(tmp_path_factory.mktemp("clone"), smoke_params)
