"""params.yaml is the one source of defaults: every config the study reads holds exactly the
values of its parameter file, no config field has a default that is a parameter, and the
command's defaults are params.yaml's."""

import dataclasses
import importlib
import pkgutil
import re
from pathlib import Path

import pytest
from study_configs import PARAMS, ROOT, top_configs

import autoshard
from autoshard.core.params import _CHECKS, Section, flatten, load_params, merge
from autoshard.costmodel.dataset import SEEN_MULTI, UNSEEN_MULTI

GIB = 2**30
FILES = {"params.yaml": PARAMS} | {f"configs/{p.name}": merge(PARAMS, load_params(p))
                                   for p in sorted((ROOT / "configs").glob("*.yaml"))}


def _measured_on(values: dict, params: dict) -> dict:
    """Where a study's backend settings are: the profile's, timed as `evaluate.timing` says."""
    return params["profile"] | {"device": "cpu", "timing": params["evaluate"]["timing"]}


# Nested configs whose values are not their field's sub-section: (config, field) -> that section.
SECTION_OF = {
    ("EvaluateConfig", "backend"): _measured_on,
    ("TransferConfig", "backend"): _measured_on,
    ("AblationConfig", "backend"): _measured_on,
    ("AblationConfig", "rl"): lambda values, params: params["rl"],
    ("EvaluateConfig", "comm"): lambda values, params: values["comm"] | {
        "device_counts": params["profile"]["comm"]["device_counts"],
        "protocols": [p for p, o in values["objective"].items() if o == "synchronized_stages"]},
}
# Fields derived from parameters of other names: (config, field) -> the value they must hold.
DERIVED = {
    ("BackendConfig", "device"): lambda values, params, where: "cpu",
    ("BackendConfig", "memory_limit_bytes"): lambda values, params, where: int(values["memory_limit_gib"] * GIB),
    ("ProtocolConfig", "memory_bytes"): lambda values, params, where: int(values["memory_per_device_gib"] * GIB),
    ("TransferConfig", "memory_bytes"): lambda values, params, where: int(values["memory_per_device_gib"] * GIB),
    ("ProtocolConfig", "name"): lambda values, params, where: where.split(".")[-2],
    ("ProtocolConfig", "unseen_ratios"): lambda values, params, where: values.get("unseen_ratios", [1.0]),
    ("EvaluateConfig", "best_of"): lambda values, params, where: params["rl"]["best_of"],
    ("CostStageConfig", "mape_targets"): lambda values, params, where: {
        SEEN_MULTI: values["mape_targets"]["seen"], UNSEEN_MULTI: values["mape_targets"]["unseen"]},
}


def _plain(value):
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _lookup(values: dict, name: str):
    """The parameter `name` of a section: its own key, or the key of one of its sub-sections that
    the config holds flat (`profile.collect.chunk_size` as `chunk_size`, `profile.comm.tasks` as
    `comm_tasks`)."""
    if name in values:
        return values[name]
    for sub, inner in values.items():
        if isinstance(inner, dict):
            for key in (name, name.removeprefix(f"{sub}_")):
                if key in inner:
                    return inner[key]
    raise KeyError(name)


def check(cfg, values: dict, where: str, params: dict, seen: set[str]) -> None:
    """Every field of `cfg` (read from `values`, the section at `where`) holds its parameter."""
    seen.add(type(cfg).__name__)
    for field in dataclasses.fields(cfg):
        name, value, here = field.name, getattr(cfg, field.name), f"{where}.{field.name}"
        rule = (type(cfg).__name__, name)
        if field.default is not dataclasses.MISSING or field.default_factory is not dataclasses.MISSING:
            assert name not in values, f"{here}: a parameter with a default in {type(cfg).__name__}"
        elif rule in DERIVED:
            assert _plain(value) == _plain(DERIVED[rule](values, params, here)), here
        elif dataclasses.is_dataclass(value):
            if rule in SECTION_OF:
                inner = SECTION_OF[rule](values, params)
            else:
                found = _lookup_or_none(values, name)
                inner = found if isinstance(found, dict) else values  # no sub-section: read inline
            check(value, inner, here, params, seen)
        elif value is None and (rule in SECTION_OF or isinstance(_lookup_or_none(values, name), dict)):
            continue  # a nested config its section switches off (`enabled: false`)
        elif isinstance(value, tuple) and value and dataclasses.is_dataclass(value[0]):
            listed = _lookup_or_none(values, name)
            if isinstance(listed, list):  # a list of entries, in order (the primary endpoints)
                assert len(listed) == len(value), here
                for k, (item, raw) in enumerate(zip(value, listed, strict=True)):
                    check(item, raw, f"{here}[{k}]", params, seen)
            else:
                for item in value:  # one config per named sub-section (the tasks' protocols)
                    check(item, values[item.name], f"{where}.{item.name}", params, seen)
        else:
            try:
                expected = _lookup(values, name)
            except KeyError:
                pytest.fail(f"{here}: no parameter of this name (a derived field needs a rule here)")
            assert _plain(value) == _plain(expected), f"{here}: {value!r} vs {expected!r}"


def _lookup_or_none(values: dict, name: str):
    try:
        return _lookup(values, name)
    except KeyError:
        return None


def _config_classes() -> set[str]:
    """Every config the package reads with `core.params`: each `Section`, each dataclass whose
    fields carry its checks, and each class named in a `parse`, `read` or `.config` call."""
    names = set()
    for module in pkgutil.walk_packages(autoshard.__path__, "autoshard."):
        for obj in vars(importlib.import_module(module.name)).values():
            if isinstance(obj, type) and dataclasses.is_dataclass(obj) and obj.__module__ == module.name and (
                    issubclass(obj, Section) or any(_CHECKS in f.metadata for f in dataclasses.fields(obj))):
                names.add(obj.__name__)
    package = Path(autoshard.__path__[0])
    source = "\n".join(p.read_text() for p in package.rglob("*.py") if p != package / "core" / "params.py")
    calls = r"\b(?:parse|read)\(([A-Z]\w*),|\.config\(\s*\"\w+\",\s*([A-Z]\w*)"
    names |= {a or b for a, b in re.findall(calls, source)}
    return names


@pytest.mark.parametrize("source", FILES)
def test_every_config_holds_the_values_of_its_parameter_file(source):
    params = FILES[source]
    configs = top_configs(params)
    assert set(configs) == {k for k, v in params.items() if isinstance(v, dict)}, "a section without its config"
    seen: set[str] = set()
    for section, cfg in configs.items():
        check(cfg, params[section], section, params, seen)
    missing = _config_classes() - seen
    assert not missing, f"configs the parser reads that no section's config holds: {sorted(missing)}"


def test_the_commands_defaults_are_params_yaml(monkeypatch):
    from autoshard.cli import defaults

    assert defaults.PACKAGED == {name: flatten(PARAMS)[name] for name in defaults.PACKAGED}
    defaults.study_defaults.cache_clear()
    assert defaults.study_defaults() == defaults.PACKAGED
    timing = PARAMS["evaluate"]["timing"]
    assert defaults.timed_runs() == timing["runs"] * timing["rounds"]
    monkeypatch.setattr(defaults, "project_root", lambda: None)  # an installed wheel: the packaged copy
    defaults.study_defaults.cache_clear()
    try:
        assert defaults.study_defaults() == defaults.PACKAGED
    finally:
        defaults.study_defaults.cache_clear()


def test_the_command_builds_a_tables_features_as_the_study_built_the_pools():
    """A user's table gets its reuse histogram from a trace of the pool's batch and dispersion:
    the features the cost model and policy learnt from."""
    from autoshard.cli.user_tables import DEFAULT_BAG_DISPERSION, DEFAULT_TRACE_BATCH

    assert DEFAULT_TRACE_BATCH == PARAMS["pool"]["batch_size"]
    assert DEFAULT_BAG_DISPERSION == PARAMS["pool"]["bag_dispersion"]
