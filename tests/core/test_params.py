"""The generic config parser: a dataclass's fields are its parameters, checked by type and by the
bounds and choices of their metadata; errors name `section.key` and the value."""

import dataclasses

import pytest

from autoshard.core.errors import ConfigError
from autoshard.core.params import Fields, Section, bounded, choice, inline, parse, read


@dataclasses.dataclass(frozen=True)
class Inner:
    hidden: int
    share: float = bounded(lo=0, hi=1, lo_open=True)


@dataclasses.dataclass(frozen=True)
class Shared:
    epochs: int = bounded(lo=0)


@dataclasses.dataclass(frozen=True)
class Outer(Section):
    section = "outer"
    count: int
    zero_ok: int = bounded(lo=0, hi=10)
    rate: float
    flag: bool
    mode: str = choice(("fast", "slow"))
    sizes: tuple[int, ...]
    shares: tuple[float, ...] = bounded(lo=0, hi=1)
    names: tuple[str, ...] = choice(("a", "b", "c"))
    span: tuple[int, int]
    slack: tuple[float, float] = bounded(lo=1.0)
    address: str | None
    limit: int | None
    inner: Inner
    shared: Shared = inline()
    derived: int
    flush_mb: int = 128  # not a parameter


GOOD = {"count": 3, "zero_ok": 0, "rate": 2, "flag": False, "mode": "slow", "sizes": [16, 32], "shares": [0.5, 1],
        "names": ["b", "a"], "span": [2, 4], "slack": [1.05, 1.25], "address": None, "limit": 5,
        "inner": {"hidden": 8, "share": 0.25}, "epochs": 0}


def outer(**changes):
    """`Outer` from GOOD with `changes` (`...`: the key left out), `derived` given by the caller."""
    return parse(Outer, "outer", {k: v for k, v in (GOOD | changes).items() if v is not ...}, derived=7)


def test_every_type_is_read_from_the_field_of_its_name():
    cfg = outer()
    assert cfg == Outer(count=3, zero_ok=0, rate=2.0, flag=False, mode="slow", sizes=(16, 32), shares=(0.5, 1.0),
                        names=("b", "a"), span=(2, 4), slack=(1.05, 1.25), address=None, limit=5,
                        inner=Inner(hidden=8, share=0.25), shared=Shared(epochs=0), derived=7)
    assert isinstance(cfg.rate, float) and cfg.flush_mb == 128


def test_optional_fields_are_none_when_null_or_absent():
    assert outer(address=..., limit=None).address is None and outer(limit=...).limit is None
    assert outer(address="ray://head:10001").address == "ray://head:10001"


@pytest.mark.parametrize(("changes", "message"), [
    ({"count": 0}, r"outer.count: 0 \(must be at least 1\)"),
    ({"count": 2.5}, r"outer.count: 2.5 \(expected an integer\)"),
    ({"count": True}, r"outer.count: True \(expected an integer\)"),
    ({"zero_ok": -1}, r"outer.zero_ok: -1 \(must be at least 0\)"),
    ({"zero_ok": 11}, r"outer.zero_ok: 11 \(must be at most 10\)"),
    ({"rate": "lots"}, r"outer.rate: 'lots' \(expected a number\)"),
    ({"flag": "yes"}, r"outer.flag: 'yes' \(expected true or false\)"),
    ({"mode": "medium"}, r"outer.mode: 'medium' \(expected one of fast, slow\)"),
    ({"sizes": []}, r"outer.sizes: \[\] \(expected a non-empty list\)"),
    ({"sizes": [16, 0]}, r"outer.sizes\[1\]: 0 \(must be at least 1\)"),
    ({"shares": [0.5, 1.5]}, r"outer.shares\[1\]: 1.5 \(must be at most 1\)"),
    ({"names": ["a", "d"]}, r"outer.names\[1\]: 'd' \(expected one of a, b, c\)"),
    ({"names": ["a", "a"]}, r"outer.names: \['a', 'a'\] \(names a value twice\)"),
    ({"span": [4, 2]}, r"outer.span: \[4, 2\] \(expected \[low, high\] with low <= high\)"),
    ({"span": [1, 2, 3]}, r"outer.span: \[1, 2, 3\] \(expected \[low, high\]"),
    ({"slack": [1.3, 1.1]}, r"outer.slack: \[1.3, 1.1\] \(expected \[low, high\] with 1 <= low <= high\)"),
    ({"slack": [0.9, 1.1]}, r"outer.slack\[0\]: 0.9 \(must be at least 1.0\)"),
    ({"address": ""}, r"outer.address: '' \(expected a non-empty string or null\)"),
    ({"limit": 0}, r"outer.limit: 0 \(must be at least 1\)"),
    ({"inner": {"hidden": 8, "share": 0}}, r"outer.inner.share: 0 \(must be above 0\)"),
    ({"inner": {"hidden": 8, "share": 0.5, "depth": 2}}, r"outer.inner.depth: 2 \(unknown parameter\)"),
    ({"inner": [8]}, r"outer.inner: \[8\] \(expected a mapping\)"),
    ({"inner": ...}, r"outer.inner: missing"),
    ({"epochs": -1}, r"outer.epochs: -1 \(must be at least 0\)"),
    ({"count": ...}, r"outer.count: missing"),
    ({"cuont": 3}, r"outer.cuont: 3 \(unknown parameter\)"),
    ({"derived": 7}, r"outer.derived: 7 \(unknown parameter\)"),  # given by the caller, not read
    ({"flush_mb": 64}, r"outer.flush_mb: 64 \(unknown parameter\)"),  # a default: not a parameter
])
def test_a_bad_value_names_the_parameter_and_the_value(changes, message):
    with pytest.raises(ConfigError, match=message):
        outer(**changes)


def test_a_section_config_reads_its_own_section():
    values = GOOD | {"derived": 1}
    with pytest.raises(ConfigError, match=r"outer: \[1\] \(expected a mapping\)"):
        Outer.from_params([1])
    assert Outer.from_params(values).derived == 1  # a field no caller gives is a parameter too


def test_read_leaves_the_other_keys_to_the_caller():
    f = Fields("outer", {"hidden": 4, "share": 1, "enabled": True})
    assert read(Inner, f) == Inner(hidden=4, share=1.0) and f.boolean("enabled")
    f.done()
    assert Fields("outer", {"sub": {"hidden": 2, "share": 0.5}}).config("sub", Inner).hidden == 2


@pytest.mark.parametrize(("kind", "value"), [(dict[str, float], {"a": 1.0}), (tuple[str, ...], ["a"])])
def test_a_type_the_parser_cannot_read_is_a_programming_error(kind, value):
    odd = dataclasses.make_dataclass("Odd", [("weights", kind)])  # names without a `choice` are not read either
    with pytest.raises(TypeError, match="odd.weights"):
        parse(odd, "odd", {"weights": value})
