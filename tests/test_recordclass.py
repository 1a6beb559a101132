"""Record classes behave as the dataclasses they replaced, for gts's code and for a user's."""

from __future__ import annotations

import copy
import dataclasses
import functools
import inspect
import pickle
from typing import ClassVar

import pytest

from gpu_task_scheduler import RunOutcome, RunSpec, SweepSummary
from gpu_task_scheduler.recordclass import Record, field
from gpu_task_scheduler.records.status import RunStatus
from gpu_task_scheduler.sweep.options import SchedulerOptions


class Point(Record):
    x: int
    y: int = 0
    note: str = field(default="", compare=False)
    tags: tuple[str, ...] = ()
    secret: str = field(default="", repr=False)
    unit: ClassVar[str] = "m"  # a class variable, not a field

    @functools.cached_property
    def norm(self) -> int:
        return abs(self.x) + abs(self.y)


@dataclasses.dataclass(frozen=True)
class Reference:  # the same fields, as the standard library makes them
    x: int
    y: int = 0
    note: str = dataclasses.field(default="", compare=False)
    tags: tuple[str, ...] = ()
    secret: str = dataclasses.field(default="", repr=False)
    unit: ClassVar[str] = "m"


class Tally(Record, frozen=False):
    names: list[str] = field(default_factory=list)
    count: int = 0


@dataclasses.dataclass
class ReferenceTally:
    names: list[str] = dataclasses.field(default_factory=list)
    count: int = 0


def test_init_takes_the_fields_in_order_with_their_defaults():
    assert Point(1) == Point(x=1, y=0) and Point(1, 2).y == 2 and Point(1).unit == "m"
    assert list(inspect.signature(Point).parameters) == list(inspect.signature(Reference).parameters)
    assert [p.default for p in inspect.signature(Point).parameters.values()][1:] == [0, "", (), ""]
    for bad in (lambda: Point(), lambda: Point(1, z=3), lambda: Point(1, 2, "", (), "", 6)):
        with pytest.raises(TypeError):
            bad()
    assert Point.y == 0 and Point.note == ""  # the class keeps the defaults, as a dataclass's does

    with pytest.raises(ValueError, match="mutable default list for field 'b' would be shared"):

        class Shared(Record, frozen=False):
            b: list = []  # noqa: RUF012

    class Named(Record):  # fields named as the generated __init__'s own names could have been
        self: int
        fields: dict = field(default_factory=dict)
        MISSING: int = 0

    named = Named(1, {"a": 1}, 2)
    assert (named.self, named.fields, named.MISSING) == (1, {"a": 1}, 2) and Named(3).fields == {}
    with pytest.raises(TypeError, match="non-default field 'b' follows"):

        class Unordered(Record):
            a: int = 0
            b: int


def test_a_frozen_record_cannot_be_changed_once_made():
    point = Point(1, 2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        point.x = 5
    with pytest.raises(dataclasses.FrozenInstanceError):
        point.other = 5
    with pytest.raises(dataclasses.FrozenInstanceError):
        del point.y
    assert (point.x, point.y) == (1, 2) and not hasattr(point, "other")


def test_equality_hash_and_repr_are_a_dataclass_s():
    a, b = Point(1, 2, note="first"), Point(1, 2, note="second")
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1  # note takes no part, as compare=False says
    assert a != Point(1, 3) and a != Reference(1, 2) and a != (1, 2)
    assert hash(a) == hash(Reference(1, 2))  # the hash of the same fields, in the same order
    assert repr(a) == repr(Reference(1, 2, note="first")).replace("Reference", "Point")
    assert repr(a) == "Point(x=1, y=2, note='first', tags=())"
    with pytest.raises(TypeError):
        hash(Point(1, tags=[]))  # an unhashable field, as for a dataclass


def test_a_mutable_record_is_changed_unhashable_and_gets_fresh_defaults():
    tally, other = Tally(), Tally()
    tally.names.append("a")
    tally.count += 1
    assert tally == Tally(["a"], 1) and other.names == [] and tally.names is not other.names
    assert repr(tally) == repr(ReferenceTally(["a"], 1)).replace("ReferenceTally", "Tally")
    with pytest.raises(TypeError):
        hash(tally)


def test_the_dataclasses_module_sees_a_dataclass():
    point = Point(-3, 4, tags=("a",), secret="s")
    assert dataclasses.is_dataclass(Point) and dataclasses.is_dataclass(point)
    ours, reference = dataclasses.fields(Point), dataclasses.fields(Reference)
    assert [(f.name, f.type, f.default, f.repr, f.compare) for f in ours] == [
        (f.name, f.type, f.default, f.repr, f.compare) for f in reference
    ]
    assert dataclasses.fields(Tally)[0].default_factory is list
    assert dataclasses.asdict(point) == dataclasses.asdict(Reference(-3, 4, tags=("a",), secret="s"))
    moved = dataclasses.replace(point, y=5)
    assert moved == Point(-3, 5, tags=("a",), secret="s") and point.y == 4
    assert point._replace(y=5) == moved and point._asdict() == dataclasses.asdict(point)
    assert Point._fields == ("x", "y", "note", "tags", "secret")


def test_copies_pickles_matching_and_cached_properties_work():
    point = Point(-3, 4, tags=("a",))
    for twin in (copy.copy(point), copy.deepcopy(point), pickle.loads(pickle.dumps(point))):
        assert twin == point and twin is not point
        with pytest.raises(dataclasses.FrozenInstanceError):
            twin.x = 0
    assert point.norm == 7 and point.__dict__["norm"] == 7  # computed once, kept in the instance
    match point:
        case Point(x, y):
            assert (x, y) == (-3, 4)
        case _:
            pytest.fail("a record matches positionally, as a dataclass does")
    tally = pickle.loads(pickle.dumps(Tally(["a"], 2)))
    assert tally == Tally(["a"], 2)


def test_a_record_class_derives_from_one_other_as_a_dataclass_does():
    class Located(Point):
        place: str = "here"
        y: int = 9  # declared again: keeps its place, takes the new default

    @dataclasses.dataclass(frozen=True)
    class ReferenceLocated(Reference):
        place: str = "here"
        y: int = 9

    located = Located(1, place="there")
    assert Located._fields == tuple(f.name for f in dataclasses.fields(ReferenceLocated))
    assert repr(located) == repr(ReferenceLocated(1, place="there")).replace("ReferenceLocated", "Located")
    assert located.y == 9 and located != Point(1, 9) and isinstance(located, Point) and located.norm == 10
    assert [f.name for f in dataclasses.fields(located)] == ["x", "y", "note", "tags", "secret", "place"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        located.place = "elsewhere"
    with pytest.raises(TypeError, match="frozen if and only if its base is"):

        class Thawed(Point, frozen=False):
            z: int = 0

    with pytest.raises(TypeError, match="__init__, __hash__ is made for it"):

        class Handmade(Record):
            z: int = 0

            def __init__(self) -> None:
                pass

            def __hash__(self) -> int:
                return 0

    with pytest.raises(TypeError, match="one record class alone"):

        class Mixed(Point, Reference):
            z: int = 0


def test_gts_s_public_records_keep_their_dataclass_fields():
    assert [f.name for f in dataclasses.fields(RunOutcome)][:4] == ["name", "work_dir", "status", "attempts"]
    assert [f.name for f in dataclasses.fields(RunSpec)][:3] == ["index", "block", "test_config"]
    outcome = RunOutcome("a", "/w", RunStatus.FAILED, exit_code=1, log_tail="boom")
    assert dataclasses.replace(outcome, log_tail="") == RunOutcome("a", "/w", RunStatus.FAILED, exit_code=1)
    summary = SweepSummary()
    summary.record(outcome)
    summary.record(dataclasses.replace(outcome, name="b", status=RunStatus.SUCCEEDED))
    assert summary.outcomes["b"].log_tail == "" and summary.outcomes["a"].log_tail == "boom"
    assert [f.name for f in dataclasses.fields(summary)][-2:] == ["_succeeded_not_kept", "_left_nothing_not_kept"]
    given = dataclasses.fields(SchedulerOptions)[-1]
    assert given.name == "given" and not given.repr and not given.compare
