"""The command's defaults are the study's parameters: those of the project's params.yaml (found
from the package, as `project_root` finds the models too), so that the command plans and
measures with the settings the study did; where no project is found (an installed wheel), the
packaged copy below, which a test keeps equal to params.yaml."""

from functools import cache
from pathlib import Path
from typing import Any

from autoshard.core.errors import ConfigError
from autoshard.core.params import flatten, load_params

PACKAGED = {
    "seed": 0,
    "pool.weight_bytes": 4,
    "profile.backend": "fbgemm",
    "profile.optimizer": "EXACT_ROWWISE_ADAGRAD",
    "profile.batch_size": 2048,
    "profile.threads": 1,
    "evaluate.timing.warmup": 1,
    "evaluate.timing.runs": 1,
    "evaluate.timing.rounds": 2,
    "evaluate.milp.node_limit": 50,
    "evaluate.milp.time_limit_s": 30,
    "rl.best_of": 16,
    "columns.ways": [1, 2, 4],
    "columns.candidates": 16,
}


def project_root() -> Path | None:
    """The project's folder (holding dvc.yaml and params.yaml) above this package, if any."""
    for parent in Path(__file__).resolve().parents:
        if (parent / "dvc.yaml").is_file() and (parent / "params.yaml").is_file():
            return parent
    return None


@cache
def study_defaults() -> dict[str, Any]:
    """The value of every name of PACKAGED in the project's params.yaml, else PACKAGED."""
    root = project_root()
    if root is None:
        return dict(PACKAGED)
    path = root / "params.yaml"
    values = flatten(_params(path))
    missing = [name for name in PACKAGED if name not in values]
    if missing:
        raise ConfigError(f"{path}: {missing[0]}: missing (the command's default)")
    return {name: values[name] for name in PACKAGED}


def timed_runs() -> int:
    """Timed runs per shard in the command's one round: as many as the study times a plan's
    shard over its rounds (`evaluate.timing`)."""
    values = study_defaults()
    return values["evaluate.timing.runs"] * values["evaluate.timing.rounds"]


def _params(path: Path) -> dict[str, Any]:
    """params.yaml as `load_params` reads it, parsed by libyaml where PyYAML was built with it: a
    tenth of the pure-Python parser's time, which every command would pay before its first
    line (the parser's help shows these defaults). Anything libyaml refuses goes to
    `load_params`, whose message names the file."""
    import yaml

    fast = getattr(yaml, "CSafeLoader", None)
    if fast is not None:
        try:
            values = yaml.load(path.read_text(), Loader=fast)  # noqa: S506 - libyaml's SafeLoader
        except (OSError, yaml.YAMLError):
            values = None
        if isinstance(values, dict):
            return values
    return load_params(path)
