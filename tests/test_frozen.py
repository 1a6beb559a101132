"""@frozen behaves as @dataclass(frozen=True) does, for everything the package does with its records."""

from __future__ import annotations

import copy
import dataclasses
import functools
import pickle

import pytest

from gpu_task_scheduler.frozen import frozen


@frozen
class Point:
    x: int
    y: int = 0
    note: str = dataclasses.field(default="", compare=False)
    tags: tuple[str, ...] = ()

    @functools.cached_property
    def norm(self) -> int:
        return abs(self.x) + abs(self.y)


@dataclasses.dataclass(frozen=True)
class Reference:  # the same fields, as the standard library makes them
    x: int
    y: int = 0
    note: str = dataclasses.field(default="", compare=False)
    tags: tuple[str, ...] = ()


def test_an_instance_cannot_be_changed_once_made():
    point = Point(1, 2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        point.x = 5
    with pytest.raises(dataclasses.FrozenInstanceError):
        point.other = 5
    with pytest.raises(dataclasses.FrozenInstanceError):
        del point.y
    assert (point.x, point.y) == (1, 2) and not hasattr(point, "other")


def test_equality_hash_and_repr_are_a_frozen_dataclass_s():
    a, b = Point(1, 2, note="first"), Point(1, 2, note="second")
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1  # note takes no part, as compare=False says
    assert a != Point(1, 3) and a != Reference(1, 2)
    assert hash(a) == hash(Reference(1, 2, tags=()))  # the hash of the same fields, in the same order
    assert repr(a) == "Point(x=1, y=2, note='first', tags=())"
    assert dataclasses.is_dataclass(a) and [f.name for f in dataclasses.fields(a)] == ["x", "y", "note", "tags"]


def test_replace_asdict_copies_pickles_and_cached_properties_work():
    point = Point(-3, 4, tags=("a",))
    moved = dataclasses.replace(point, y=5)
    assert moved == Point(-3, 5, tags=("a",)) and point.y == 4
    assert dataclasses.asdict(point) == {"x": -3, "y": 4, "note": "", "tags": ("a",)}
    for twin in (copy.copy(point), copy.deepcopy(point), pickle.loads(pickle.dumps(point))):
        assert twin == point and twin is not point
        with pytest.raises(dataclasses.FrozenInstanceError):
            twin.x = 0
    assert point.norm == 7 and point.norm == 7  # computed once, kept in the instance
