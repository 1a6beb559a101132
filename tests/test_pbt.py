"""Population-based training's decisions (tuning/pbt.py), as tables: its config, when a member
exploits another, how its values are explored, and that the same events decide the same."""

import pytest

from gpu_task_scheduler import ConfigError
from gpu_task_scheduler.records.ledger.trials import TrialEvent
from gpu_task_scheduler.tuning.base import CONTINUE, Next
from gpu_task_scheduler.tuning.pbt import EXPLOIT, SNAPSHOT, SNAPSHOT_YIELD, YIELD, Exploit, Pbt, parse_pbt, pbt_rule

PBT = {"metric": "loss", "mode": "min", "interval": 4, "max_step": 40, "perturb": {"lr": [0.5, 2.0]}}


def population(values, **keys):
    """A population of members m0.. with these lr values, under PBT with ``keys``."""
    pbt = Pbt(parse_pbt({**PBT, **keys}))
    for number, lr in enumerate(values):
        pbt.began(f"m{number}", 0, {"lr": lr, "width": 64})
    return pbt


@pytest.mark.parametrize(
    "raw, words",
    [
        ([], "pbt must be a dict"),
        ({**PBT, "metrc": "loss"}, "unknown key 'metrc' in pbt.*metric"),
        ({**PBT, "mode": "lower"}, "mode must be min"),
        ({**PBT, "interval": 0}, "interval must be a number of steps above 0"),
        ({**PBT, "max_step": 4}, "max_step must be a number above interval"),
        ({**PBT, "quantile": 0.6}, "quantile must be a fraction above 0 and at most 0.5"),
        ({**PBT, "perturb": {"lr": [0.5, -1]}}, "pbt.perturb.lr must be a list of factors above 0"),
        ({**PBT, "perturb": {}}, "give perturb or resample"),
        ({**PBT, "resample": {"dropout": {"uniform": [0.5]}}}, "pbt.resample.dropout"),
        ({**PBT, "resample_probability": 2}, "resample_probability must be a number from 0 to 1"),
        ({**PBT, "keep": -1}, "keep must be a whole number"),
    ],
)
def test_a_bad_pbt_is_refused_with_what_to_write(raw, words):
    with pytest.raises(ConfigError, match=words):
        parse_pbt(raw)


def event(kind, name, **fields):
    """A trial event of the ledger (records/ledger/trials.py) with the fields given, None elsewhere."""
    return TrialEvent(kind, None, name, None, **{"rung": None, "step": None, "value": None, "decision": None, **fields})


def a_copies_b(a, b, step, detail):
    """The ledger's events of member ``a`` (starting values ``a``) copying ``b``'s snapshot of ``step``."""
    return [
        event("began", "a", detail={"values": a}),
        event("began", "b", detail={"values": b}),
        event("rung", "b", rung=step, step=step, value=0.1, decision="snapshot"),
        event("rung", "a", rung=step, step=step, value=0.9, decision="exploit", detail=detail),
        event("resumed", "a"),
    ]


def tell(pbt, member, step, value):
    """What the engine does with a report: the decision there, or None when it is judged at no interval."""
    rung = pbt.rung_reached(member, step)
    return None if rung is None else pbt.report(member, rung, value, step)


def test_a_member_is_judged_at_each_multiple_of_interval_and_never_at_max_step():
    pbt = population([1.0, 2.0, 3.0, 4.0])
    for member, value in (("m0", 0.1), ("m1", 0.2), ("m2", 0.3)):
        assert tell(pbt, member, 3, value) is None  # before its first interval
        assert tell(pbt, member, 5, value) is not None  # judged at 4, by its first report past it
    assert tell(pbt, "m3", 3, 0.9) is None
    assert tell(pbt, "m3", 4, 0.9) == EXPLOIT  # at its interval, in the bottom quarter
    assert tell(pbt, "m3", 4, 0.9) is None  # a step it reported already
    assert pbt.rung_reached("m0", 7) is None and pbt.rung_reached("m0", 9) == 8  # once an interval
    fresh = population([1.0, 2.0])
    tell(fresh, "m0", 40, 0.1)
    assert tell(fresh, "m1", 40, 0.9) is None  # at max_step: done


@pytest.mark.parametrize(
    "reports, decision",
    [
        ([("m0", 4, 0.1)], SNAPSHOT),  # the first at an interval: too few to rank, kept as a donor
        ([("m1", 4, 0.9), ("m0", 4, 0.1)], SNAPSHOT),  # the top: its checkpoint is kept for the others
        ([("m0", 4, 0.1), ("m1", 4, 0.9)], EXPLOIT),  # the bottom, with a top member's snapshot to copy
        ([("m0", 4, 0.1), ("m1", 4, 0.9), ("m2", 4, 0.5), ("m3", 4, 0.3)], CONTINUE),  # in the middle
        # Ahead of the others, it is ranked where they are (its value at 4, the worst there), not by
        # its value at 8 (the best of all: a metric that grows as runs train favours the one ahead).
        ([("m0", 4, 0.1), ("m2", 4, 0.2), ("m3", 4, 0.3), ("m3", 8, 0.0)], EXPLOIT),
    ],
)
def test_each_decision_at_an_interval(reports, decision):
    pbt = population([1.0, 2.0, 3.0, 4.0], mode="min")
    *before, (member, step, value) = reports  # the decision on the last report
    for name, at, there in before:
        tell(pbt, name, at, there)
    assert tell(pbt, member, step, value) == decision


@pytest.mark.parametrize(
    "size, quantile, bottom, top",
    [
        (2, 0.25, ["m1"], ["m0"]),  # at least one each, once two reported
        (4, 0.25, ["m3"], ["m0"]),
        (8, 0.25, ["m6", "m7"], ["m0", "m1"]),
        (5, 0.5, ["m3", "m4"], ["m0", "m1"]),  # at most half each
    ],
)
def test_the_bottom_quantile_copies_the_top_one(size, quantile, bottom, top):
    pbt = population([1.0] * size, quantile=quantile)
    for number in range(size):  # m0 best
        pbt.members[f"m{number}"].last_value = 0.1 * (number + 1)
    assert pbt._quantiles() == (bottom, top)


def test_an_exploit_copies_a_top_members_snapshot_and_perturbs_its_values():
    pbt = population([1.0, 2.0, 3.0, 4.0])
    tell(pbt, "m1", 4, 0.5)
    assert tell(pbt, "m0", 6, 0.1) == SNAPSHOT  # the top of two: its checkpoint at step 6 is kept
    tell(pbt, "m2", 4, 0.3)
    assert tell(pbt, "m3", 4, 0.9) == EXPLOIT
    exploit = pbt.exploit_of("m3")
    assert exploit.member == "m3" and exploit.donor == "m0" and exploit.step == 6 and exploit.value == 0.1
    assert exploit.values["lr"] in (0.5, 2.0) and "width" not in exploit.values  # the donor's lr 1.0, x0.5 or x2
    assert exploit.changed == {"lr": f"x{exploit.values['lr']:g}"}
    assert pbt.paused == {"m3": 6} and pbt.next(more_new=True) == Next("resume", "m3", 6)  # it resumes at once
    assert pbt.needed_snapshots("m0") == {6}
    pbt.resumed("m3")
    assert pbt.values_of("m3") == exploit.values and pbt.members["m3"].last_step == 6 and not pbt.paused
    assert pbt.rung_reached("m3", 7) is None  # judged again at the next interval after the step it went on from
    assert tell(pbt, "m0", 8, 0.09) == SNAPSHOT  # a top member goes on
    assert pbt.needed_snapshots("m0") == {8}  # its snapshot at 6 is no longer needed


def test_a_member_ahead_goes_back_where_it_is_ranked_once_an_interval_and_never_loops():
    """A member that ran ahead is ranked where the others are, and if it is in the bottom there it
    copies a top member's snapshot of that interval: it goes back, once for each interval it newly
    reaches (judged there again, it copies only a snapshot of that interval or later), so even
    behind a donor that never goes on it reaches max_step."""
    pbt = population([1.0, 2.0])
    tell(pbt, "m1", 4, 0.5)
    assert tell(pbt, "m0", 4, 0.1) == SNAPSHOT  # m0 goes no further while m1 goes on
    assert tell(pbt, "m1", 8, 0.9) == EXPLOIT  # ranked at 4 (m0 has not reached 8): back to m0's step 4
    assert pbt.exploit_of("m1").step == 4
    pbt.resumed("m1")
    # Judged at 8 again: no snapshot at 8 or later to copy; the first at 8, it is kept as a donor there.
    assert tell(pbt, "m1", 8, 0.95) == SNAPSHOT
    step, reports, copies = 9, 0, 1
    while step < 40 and reports < 1000:  # m1 trains on; m0 never does
        reports += 1
        if tell(pbt, "m1", step, 0.95) == EXPLOIT:
            copies += 1
            pbt.resumed("m1")
            step = int(pbt.members["m1"].last_step)
        step += 1
    assert step == 40 and copies <= 40 // 4  # at most once an interval


def test_a_member_first_at_an_interval_is_kept_as_a_donor_there_whatever_it_is_ranked_at():
    """The first judged at an interval is ranked at an earlier one (too few are at its own); kept as a
    donor all the same, it is the top member the next one there can copy. (It went on with no
    snapshot: a lightning sweep whose worst member was judged only after such a member copied none.)"""
    pbt = population([1.0, 2.0, 3.0, 4.0])
    assert tell(pbt, "m0", 4, 0.9) == SNAPSHOT  # alone at 4
    assert tell(pbt, "m1", 4, 0.1) == SNAPSHOT  # the top of two
    assert tell(pbt, "m2", 4, 0.3) == CONTINUE  # in the middle
    assert tell(pbt, "m3", 4, 0.4) == CONTINUE
    assert tell(pbt, "m3", 8, 0.35) == SNAPSHOT  # the first at 8, ranked at 4 (in the middle there)
    assert pbt.needed_snapshots("m3") == {8}
    assert tell(pbt, "m0", 8, 0.8) == EXPLOIT  # ranked at 8 against m3, the bottom of two
    exploit = pbt.exploit_of("m0")
    assert (exploit.donor, exploit.step) == ("m3", 8)
    assert tell(pbt, "m2", 8, 0.5) == CONTINUE  # the third at 8: not among the first, in the middle


def test_a_member_that_ended_still_ranks_where_it_was_judged_and_is_copied():
    pbt = population([1.0, 2.0, 3.0])
    tell(pbt, "m1", 4, 0.5)  # the first at 4: a snapshot
    tell(pbt, "m0", 4, 0.1)
    pbt.ended("m0")  # its value at 4 is still a value at 4; the best of those running is m1
    assert pbt.best() == "m1" and tell(pbt, "m2", 4, 0.9) == EXPLOIT and pbt.exploit_of("m2").donor == "m0"


@pytest.mark.parametrize(
    "ended, bottom",
    [
        ([], ["m6", "m7"]),
        (["m7"], ["m5", "m6"]),  # the worst ended: the next worst that still train copy
        (["m6", "m7"], ["m4", "m5"]),
        (["m2", "m3", "m4", "m5", "m6", "m7"], []),  # only the top trains on: no one copies
        (["m0"], ["m6", "m7"]),  # a top member that ended is still a top member (a donor)
    ],
)
def test_the_bottom_that_copies_is_of_the_members_that_still_train(ended, bottom):
    pbt = population([1.0] * 8, quantile=0.25)
    for number in range(8):  # m0 best
        pbt.members[f"m{number}"].last_value = 0.1 * (number + 1)
    for name in ended:
        pbt.ended(name)
    values = {name: member.last_value for name, member in pbt.members.items()}
    assert pbt._quantiles(values) == (bottom, ["m0", "m1"])


def test_a_member_that_ran_to_its_end_ahead_of_the_others_takes_no_bottom_place_from_them():
    # Two members ran ahead to the end (a loaded machine started them first) and were the worst at
    # 4; the two worst of those still training copy there, not the members that ended.
    pbt = population([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0])
    for name, value in (("m6", 0.95), ("m7", 0.99)):
        tell(pbt, name, 4, value)
        tell(pbt, name, 8, value)
        pbt.ended(name)
    for name, value in (("m0", 0.1), ("m1", 0.2), ("m2", 0.3), ("m3", 0.4)):
        tell(pbt, name, 4, value)
    # 7 ranked at 4: m0 and m1 the top, m6 and m7 the worst; the bottom two that train are m3 and m4
    assert tell(pbt, "m4", 4, 0.5) == EXPLOIT  # was: it went on, m6 and m7 holding the bottom places
    assert pbt.exploit_of("m4").donor in ("m0", "m1")


def test_the_same_events_give_the_same_decisions_and_other_seeds_others():
    def run(seed, kind=int):
        pbt = population([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0], seed=seed)
        decided = []
        for step in range(4, 40, 4):
            for number in range(8):
                if tell(pbt, f"m{number}", kind(step), (number + 1) / step) == EXPLOIT:
                    exploit = pbt.exploit_of(f"m{number}")
                    pbt.resumed(f"m{number}")
                    decided.append((exploit.member, exploit.donor, exploit.values["lr"]))
        return decided

    assert run(0) == run(0)  # a restart replays the same
    assert run(0, float) == run(0)  # also from the ledger, whose steps are floats (a report's may be ints)
    assert run(0) != run(1)
    # Ranked once half the population reached an interval: the fourth judged at step 4 is the
    # bottom of four, and copies the first's snapshot.
    assert run(0)[0] == ("m3", "m0", 0.5)


@pytest.mark.parametrize("probability, resampled", [(0.0, False), (1.0, True)])
def test_a_resampled_value_is_drawn_again_with_its_probability(probability, resampled):
    pbt = Pbt(
        parse_pbt(
            {
                **PBT,
                "perturb": {},
                "resample": {"dropout": {"uniform": [0.0, 0.5]}},
                "resample_probability": probability,
            }
        )
    )
    pbt.began("a", 0, {"dropout": 0.1})
    pbt.began("b", 0, {"dropout": 0.2})
    tell(pbt, "a", 4, 0.1)
    assert tell(pbt, "b", 4, 0.9) == EXPLOIT
    exploit = pbt.exploit_of("b")
    assert isinstance(exploit, Exploit)
    assert (exploit.values["dropout"] != 0.1) is resampled and 0.0 <= exploit.values["dropout"] <= 0.5
    assert exploit.changed == ({"dropout": "resampled"} if resampled else {})


def test_an_integer_value_stays_an_integer_when_perturbed():
    pbt = Pbt(parse_pbt({**PBT, "perturb": {"batch": [0.5, 2.0]}}))
    pbt.began("a", 0, {"batch": 1})
    pbt.began("b", 0, {"batch": 3})
    tell(pbt, "a", 4, 0.1)
    tell(pbt, "b", 4, 0.9)
    exploit = pbt.exploit_of("b")
    assert exploit.values["batch"] in (1, 2) and isinstance(exploit.values["batch"], int)  # 1 x 0.5 is 1, not 0


def crowded(population=4, slots=2, members=2):
    pbt = Pbt(parse_pbt(PBT), population=population, slots=slots)
    for number in range(members):
        pbt.began(f"m{number}", 0, {"lr": 1.0})
    return pbt


@pytest.mark.parametrize(
    "population, slots, members, reports, decision",
    [
        (4, 4, 2, [("m0", 4, 0.1)], SNAPSHOT),  # as many slots as members: nobody waits
        (4, 2, 2, [("m0", 4, 0.1)], SNAPSHOT_YIELD),  # two have not begun: the top keeps a snapshot, then waits
        (4, 2, 2, [("m0", 4, 0.1), ("m1", 4, 0.5)], EXPLOIT),  # an exploit resumes at once all the same
        (4, 2, 4, [("m0", 4, 0.1), ("m1", 4, 0.3), ("m2", 4, 0.2)], CONTINUE),  # all begun, none behind it
        (4, 2, 2, [("m0", 4, 0.5), ("m1", 4, 0.3), ("m1", 5, 0.3)], None),  # a step it was judged at already
        (4, 2, 2, [("m0", 4, 0.1), ("m1", 4, 0.05)], SNAPSHOT_YIELD),  # the new top: a snapshot, then it waits
    ],
)
def test_a_population_larger_than_its_slots_takes_turns(population, slots, members, reports, decision):
    pbt = crowded(population, slots, members)
    *before, (member, step, value) = reports
    for name, at, there in before:
        tell(pbt, name, at, there)
    assert tell(pbt, member, step, value) == decision


def test_turns_go_to_new_members_then_to_the_one_furthest_behind():
    pbt = crowded(population=4, slots=2, members=2)
    assert tell(pbt, "m0", 4, 0.1) == SNAPSHOT_YIELD
    assert pbt.paused == {"m0": 4} and pbt.next(more_new=True) == Next("new")  # m2, m3 first
    pbt.began("m2", 0, {"lr": 1.0})
    pbt.began("m3", 0, {"lr": 1.0})
    assert tell(pbt, "m1", 9, 0.05) == SNAPSHOT_YIELD  # judged at 8, ahead of m0 (waiting at 4)
    assert tell(pbt, "m2", 9, 0.03) == SNAPSHOT_YIELD  # the top at 8
    assert tell(pbt, "m3", 9, 0.04) == YIELD  # in the middle, ahead of m0: it waits without a snapshot
    assert pbt.next(more_new=True) == Next("resume", "m0", 4)  # the one furthest behind
    pbt.resumed("m0")
    assert pbt.paused == {"m1": 9, "m2": 9, "m3": 9}
    assert pbt.values_of("m0") == {"lr": 1.0}  # its own checkpoint, its values
    crowded_again = crowded(population=4, slots=2, members=2)
    tell(crowded_again, "m0", 4, 0.1)
    assert crowded_again.next(more_new=True) == Next("new")
    assert crowded_again.close() and crowded_again.next(more_new=True) == Next("resume", "m0", 4)  # none will begin


@pytest.mark.parametrize(
    "reports, decision",
    [
        ([("m0", 4, 0.1)], SNAPSHOT),  # the first at 4: the others are not an interval behind it
        ([("m0", 4, 0.1), ("m0", 8, 0.1)], SNAPSHOT_YIELD),  # at 8, the others not yet judged at 4: it waits
        ([("m1", 4, 0.2), ("m2", 4, 0.3), ("m3", 4, 0.4), ("m0", 4, 0.1), ("m0", 8, 0.1)], SNAPSHOT),  # all at 4
        ([("m1", 4, 0.2), ("m2", 4, 0.3), ("m0", 4, 0.1), ("m0", 9, 0.1)], SNAPSHOT_YIELD),  # m3 still before 4
        ([("m1", 4, 0.2), ("m2", 4, 0.3), ("m3", 4, 0.4), ("m0", 4, 0.1), ("m0", 12, 0.1)], SNAPSHOT_YIELD),
    ],
)
def test_with_a_slot_each_a_member_more_than_an_interval_ahead_waits_for_the_others(reports, decision):
    pbt = Pbt(parse_pbt(PBT), population=4, slots=4)
    for number in range(4):
        pbt.began(f"m{number}", 0, {"lr": 1.0})
    *before, (member, step, value) = reports
    for name, at, there in before:
        tell(pbt, name, at, there)
    assert tell(pbt, member, step, value) == decision


def test_a_member_that_waits_for_the_others_takes_its_turn_once_none_is_an_interval_behind_it():
    pbt = Pbt(parse_pbt(PBT), population=4, slots=4)
    for number in range(4):
        pbt.began(f"m{number}", 0, {"lr": 1.0})
    pbt.close()
    tell(pbt, "m0", 4, 0.1)
    assert tell(pbt, "m0", 8, 0.1) == SNAPSHOT_YIELD and pbt.paused == {"m0": 8}
    assert pbt.next(more_new=False) == Next("none")  # its slot stays free: m1, m2, m3 not judged yet
    assert tell(pbt, "m1", 4, 0.05) == SNAPSHOT  # the top at 4
    assert tell(pbt, "m2", 4, 0.07) == CONTINUE
    assert pbt.next(more_new=False) == Next("none")  # m3 still is
    assert tell(pbt, "m3", 4, 0.9) == EXPLOIT  # the worst: it goes on from m1's snapshot at 4...
    assert (pbt.exploit_of("m3").donor, pbt.exploit_of("m3").step) == ("m1", 4)
    assert pbt.next(more_new=False) == Next("resume", "m3", 4)  # ...first,
    pbt.resumed("m3")
    assert pbt.next(more_new=False) == Next("resume", "m0", 8)  # and then no member is behind 4: m0's turn


def test_a_member_that_ended_behind_holds_no_one_back():
    pbt = Pbt(parse_pbt(PBT), population=2, slots=2)
    pbt.began("m0", 0, {"lr": 1.0})
    pbt.began("m1", 0, {"lr": 2.0})
    pbt.close()
    tell(pbt, "m0", 4, 0.1)
    assert tell(pbt, "m0", 8, 0.1) == SNAPSHOT_YIELD
    pbt.ended("m1")  # it failed before its first interval
    assert pbt.next(more_new=False) == Next("resume", "m0", 8)
    pbt.resumed("m0")
    assert tell(pbt, "m0", 12, 0.1) == SNAPSHOT  # nobody trains behind it


def test_a_late_report_keeps_no_snapshot_of_a_step_the_run_went_past():
    """After a restart, an earlier attempt's report is told while the run trains on: its checkpoint
    is no longer of that step, so a top member goes on without a snapshot of it."""
    pbt = population([1.0, 2.0])
    assert pbt.report("m0", 4, 0.1, 4, late=True) == CONTINUE and not pbt.members["m0"].snapshots
    assert tell(pbt, "m1", 4, 0.9) == CONTINUE  # the bottom, with no snapshot to copy


# --- several objectives: ranked by Pareto front, then crowding distance ----------------------

TWO = {"loss": "min", "latency": "min"}


def test_pbt_takes_several_objectives_instead_of_a_metric():
    config = parse_pbt(
        {key: value for key, value in PBT.items() if key not in ("metric", "mode")} | {"objectives": TWO}
    )
    assert config.objectives == (("loss", "min"), ("latency", "min")) and (config.metric, config.mode) == (
        "loss",
        "min",
    )
    assert "on min loss and min latency (by Pareto rank)" in pbt_rule(config).describe()
    with pytest.raises(ConfigError, match="give objectives, or metric and mode for one, not both"):
        parse_pbt({**PBT, "objectives": TWO})


def mo_population(size, **keys):
    pbt = Pbt(
        parse_pbt(
            {key: value for key, value in PBT.items() if key not in ("metric", "mode")} | {"objectives": TWO, **keys}
        )
    )
    for number in range(size):
        pbt.began(f"m{number}", 0, {"lr": 1.0})
    return pbt


def test_with_several_objectives_the_bottom_by_pareto_rank_copies_the_top():
    """m0, m1 and m2 make the front (m0 and m2 its ends, m0 the better loss); m3 is dominated: the
    bottom quarter is m3, the top m0; a member on the front goes on."""
    pbt = mo_population(4)
    for member, value in (("m0", (0.1, 9.0)), ("m1", (0.5, 5.0)), ("m2", (0.9, 1.0)), ("m3", (0.95, 9.5))):
        pbt.members[member].last_value = value
    assert pbt._quantiles() == (["m3"], ["m0"])
    fresh = mo_population(4)
    decisions = [tell(fresh, m, 4, v) for m, v in (("m0", (0.1, 9.0)), ("m1", (0.5, 5.0)), ("m2", (0.9, 1.0)))]
    # m1 and m0 are the two ends of a front of two: equally isolated, m0 first by the first objective
    assert decisions == [SNAPSHOT, EXPLOIT, CONTINUE]
    assert tell(fresh, "m3", 4, (0.95, 9.5)) == EXPLOIT and fresh.exploit_of("m3").donor == "m0"
    with pytest.raises(ValueError, match="value of 2 objectives"):
        tell(fresh, "m0", 8, 0.1)


# --- the copy rule: the weights a member copies are weights its donor earned, never worse than its own


def test_a_donor_that_diverged_after_its_good_snapshot_offers_the_good_one_not_its_latest():
    pbt = population([1.0, 2.0, 3.0, 4.0])
    assert tell(pbt, "m0", 4, 0.1) == SNAPSHOT  # too few to rank: kept
    assert tell(pbt, "m0", 8, 2.4) == SNAPSHOT_YIELD  # still too few at 8: kept, though it diverged
    assert pbt.needed_snapshots("m0") == {4, 8}  # its latest, and its best (what it offers)
    assert tell(pbt, "m1", 4, 0.5) == EXPLOIT  # ranked at 4 below m0
    exploit = pbt.exploit_of("m1")
    assert (exploit.donor, exploit.step, exploit.value) == ("m0", 4, 0.1)  # not step 8, recorded at 2.4


def test_a_donor_offers_no_snapshot_of_the_weights_it_dropped_when_it_copied():
    for seed in range(12):  # whichever donor a seed draws
        pbt = population([1.0, 2.0, 3.0, 4.0], quantile=0.5, seed=seed)
        assert tell(pbt, "m1", 4, 0.2) == SNAPSHOT  # m1's own weights at 4
        assert tell(pbt, "m0", 4, 0.1) == SNAPSHOT
        assert tell(pbt, "m1", 8, 0.3) == EXPLOIT and pbt.exploit_of("m1").donor == "m0"
        pbt.resumed("m1")  # m1 now has m0's weights of step 4: its snapshot of its own is of weights it dropped
        assert pbt.members["m1"].snapshots == [] and pbt.needed_snapshots("m1") == set()
        tell(pbt, "m2", 4, 0.9)
        if tell(pbt, "m3", 4, 0.95) == EXPLOIT:  # m1 ranks in the top (by m0's value), yet offers nothing
            assert pbt.exploit_of("m3").donor == "m0", seed


def _events_of(pbt, reports):
    """Feed ``reports`` ((member, step, value), in order) to ``pbt`` as the engine does, making each
    exploit at once: the trial events the ledger would hold."""

    events = []
    for member, step, value in reports:
        if pbt.paused.get(member) is not None or step <= (pbt.members[member].last_step or 0):
            continue
        rung = pbt.rung_reached(member, step)
        if rung is None:
            continue
        decision = pbt.report(member, rung, value, step)
        detail = None
        if decision == EXPLOIT:
            exploit = pbt.exploit_of(member)
            detail = {"donor": exploit.donor, "step": exploit.step}
        events.append(TrialEvent("rung", None, member, None, rung, step, value, decision, detail))
        if decision in (EXPLOIT, YIELD, SNAPSHOT_YIELD):
            pbt.resumed(member)
            events.append(TrialEvent("resumed", None, member, None, None, None, None, None))
    return events


@pytest.mark.parametrize("seed", range(40))
def test_every_copy_in_random_populations_keeps_the_copy_rule(seed):
    """Random populations whose members improve, stall or diverge (a loss that jumps to chance
    and sticks), reporting in random orders: every exploit copies a snapshot its donor took in
    its current lineage, recorded no worse than the copier's own value at that interval. (Before
    the rule: stale copies and copies of diverged snapshots in most of these seeds.)"""
    import random

    from gpu_task_scheduler.records.lineage import copy_faults

    rng = random.Random(seed)
    size = rng.randint(3, 8)
    pbt = population([rng.uniform(0.01, 2) for _ in range(size)], quantile=rng.choice([0.25, 0.5]), seed=seed)
    curves = {}
    for number in range(size):
        diverge = rng.choice([None, rng.randint(5, 30)])
        rate = rng.uniform(0.01, 0.2)
        curves[f"m{number}"] = [
            2.4 if diverge is not None and step >= diverge else 2.3 * (1 - rate) ** step for step in range(41)
        ]
    clock = {name: 0 for name in curves}
    reports = []
    for _ in range(size * 60):
        name = rng.choice(sorted(curves))
        clock[name] = min(39, clock[name] + rng.randint(1, 3))
        reports.append((name, clock[name], curves[name][clock[name]] + rng.uniform(0, 0.05)))
    events = _events_of(pbt, reports)
    assert copy_faults(events, interval=4, value_of=lambda e: e.value, worse=lambda a, b: a > b) == []


def test_the_audit_finds_a_stale_copy_and_a_copy_worse_than_the_copiers_own():
    from gpu_task_scheduler.records.lineage import copy_faults

    def rung(name, step, value, decision, detail=None):
        return TrialEvent("rung", None, name, None, step - step % 4, step, value, decision, detail)

    resumed = TrialEvent("resumed", None, "d", None, None, None, None, None)
    events = [
        rung("d", 4, 0.2, "snapshot"),
        rung("e", 4, 0.1, "snapshot"),
        rung("d", 8, 0.3, "exploit", {"donor": "e", "step": 4}),
        resumed,  # d dropped its own weights of step 4
        rung("m", 4, 0.9, "exploit", {"donor": "d", "step": 4}),  # a stale copy
        rung("e", 8, 2.4, "snapshot"),
        rung("n", 8, 0.5, "exploit", {"donor": "e", "step": 8}),  # worse than n's own 0.5
    ]
    faults = copy_faults(events, interval=4, value_of=lambda e: e.value, worse=lambda a, b: a > b)
    assert len(faults) == 2 and "not of its current lineage" in faults[0] and "worse than its own 0.5" in faults[1]


def test_a_snapshot_that_could_not_be_taken_is_offered_to_no_member():
    pbt = population([1.0, 2.0, 3.0, 4.0])
    assert tell(pbt, "m0", 4, 0.1) == SNAPSHOT
    assert pbt.unsaved("m0", SNAPSHOT) == CONTINUE  # the copy failed: recorded as none
    assert pbt.members["m0"].snapshots == [] and pbt.needed_snapshots("m0") == set()
    assert tell(pbt, "m1", 4, 0.5) == CONTINUE  # bottom, but nothing to copy


def test_a_perturbed_value_past_floats_range_is_kept_not_a_crash():
    pbt = Pbt(parse_pbt({**PBT, "perturb": {"lr": [2.0]}}))
    pbt.began("a", 0, {"lr": 10**400})
    pbt.began("b", 0, {"lr": 1.0e308})
    tell(pbt, "b", 4, 0.1)
    assert tell(pbt, "a", 4, 0.9) == EXPLOIT  # a copies b: 1e308 x 2 is past float's range
    exploit = pbt.exploit_of("a")
    assert exploit.values == {"lr": 1.0e308} and exploit.changed == {"lr": "kept (x2 is out of range)"}
    pbt.resumed("a")
    pbt.began("c", 0, {"lr": 10**400})
    pbt2 = Pbt(parse_pbt({**PBT, "perturb": {"lr": [2.0]}}))
    pbt2.began("x", 0, {"lr": 10**400})
    pbt2.began("y", 0, {"lr": 1})
    tell(pbt2, "x", 4, 0.1)
    assert tell(pbt2, "y", 4, 0.9) == EXPLOIT and pbt2.exploit_of("y").values == {"lr": 10**400}


def test_the_schedule_of_a_member_that_copied_is_its_donors_values_up_to_the_copy():
    """The weights a member ends with were trained with its donor's values up to the step it
    copied at, then its own: --schedule gives those, not the member's own values before the copy."""
    from gpu_task_scheduler.records.lineage import lineages

    events = a_copies_b({"lr": 1.0}, {"lr": 2.0}, 4, {"donor": "b", "step": 4, "values": {"lr": 4.0}})
    schedule = lineages(events)["a"].schedule
    assert [(s.step, s.values, s.donor) for s in schedule] == [(0.0, {"lr": 2.0}, None), (4.0, {"lr": 4.0}, "b")]


def test_a_copy_made_again_at_the_same_step_is_listed_once_with_how_often():
    from gpu_task_scheduler.records.lineage import Segment, copies_text

    again = Segment(8.0, {"lr": 2.0}, "lr-1.0,", {"lr": "x2"}, {"lr": 1.0})
    other = Segment(12.0, {"lr": 1.0}, "lr-0.5,", {"lr": "x0.5"})  # the donor's values not recorded
    assert copies_text([again, again, other]) == "lr-1.0, at 8 (lr 1 x2 = 2) twice; lr-0.5, at 12 (lr x0.5 = 1)"


def test_a_lineage_says_the_values_each_copy_went_on_with():
    """``--lineage`` and the exports name the donor's value at its snapshot, the change and the
    value the member trained with after it."""
    from gpu_task_scheduler.records.lineage import copies_text, lineages

    detail = {"donor": "b", "step": 6, "values": {"lr": 0.002, "wd": 0.0}}
    detail["changed"] = {"lr": "x0.5", "wd": "resampled"}
    events = a_copies_b({"lr": 0.001, "wd": 0.1}, {"lr": 0.004, "wd": 0.0}, 6, detail)
    (copy,) = lineages(events)["a"].exploits
    assert copy.was == {"lr": 0.004, "wd": 0.0}
    assert copies_text([copy]) == "b at 6 (lr 0.004 x0.5 = 0.002, wd resampled = 0)"


def test_a_report_looks_at_a_bounded_number_of_intervals_however_many_there_were():
    """Each report once scanned every interval recorded (8 members x 4,000 intervals: 10 s in the
    loop, again at every start's replay); it looks down from the latest instead."""

    class Counted(dict):
        looked = 0

        def __getitem__(self, key):
            Counted.looked += 1
            return super().__getitem__(key)

        def items(self):
            for item in super().items():
                Counted.looked += 1
                yield item

    pbt = Pbt(parse_pbt({**PBT, "interval": 1, "max_step": 3000}))
    pbt._at = Counted()
    for number in range(8):
        pbt.began(f"m{number}", 0, {"lr": 1.0 + number})
    for step in range(1, 2000):
        for number in range(8):
            name = f"m{number}"
            if pbt.paused.get(name) is not None:
                pbt.resumed(name)
            if tell(pbt, name, step, (number + 1) / step) == EXPLOIT:
                pbt.resumed(name)
        if step == 1990:
            Counted.looked = 0
    assert Counted.looked < 8 * 10 * 20  # the last 10 intervals' reports: a few tables each, not 2,000


def _donor_with(pbt, name, snapshots):
    """``name`` keeps snapshots of ``(step, value)``, in order (each as a top member's would be)."""
    state = pbt.members[name]
    for step, value in snapshots:
        pbt._keep(state, step, value)


@pytest.mark.parametrize(
    "own, copied",
    [
        ({4: 0.5, 8: 0.5, 12: 0.5}, 12),  # each offered one passes: the latest
        ({4: 0.5, 8: 0.5, 12: 0.15}, 4),  # the latest is worse than the copier's own there: the best, never 8
        ({4: 0.05, 8: 0.5, 12: 0.15}, None),  # neither passes: 8 (in between) is never offered
    ],
)
def test_a_donor_offers_its_latest_and_its_best_snapshot_and_the_copier_takes_the_latest_that_passes(own, copied):
    pbt = population([1.0, 2.0])
    _donor_with(pbt, "m0", [(4, 0.1), (8, 0.3), (12, 0.2)])  # best at 4, latest at 12, 8 in between
    for interval, value in own.items():
        pbt._at.setdefault(interval, {})["m1"] = value
    offered = pbt._offer("m0", "m1", since=0)
    assert (offered[0] if offered else None) == copied


@pytest.mark.parametrize(
    "snapshot, own, copied",
    [
        ((0.3, 1.0), (0.2, 2.0), True),  # worse on loss, better on latency: not dominated, copied
        ((0.3, 3.0), (0.2, 2.0), False),  # worse on both: dominated, not copied
        ((0.2, 2.0), (0.2, 2.0), True),  # equal: not worse
    ],
)
def test_with_several_objectives_worse_means_dominated(snapshot, own, copied):
    pbt = mo_population(2)
    _donor_with(pbt, "m0", [(4, snapshot)])
    pbt._at.setdefault(4, {})["m1"] = own
    assert (pbt._offer("m0", "m1", since=0) is not None) == copied


def test_only_the_snapshots_still_needed_are_kept():
    """The latest and the best of each lineage, those a decided exploit copies, and ``keep`` more
    before the latest of the best member; no other."""
    pbt = population([1.0, 2.0, 3.0, 4.0], keep=1)
    _donor_with(pbt, "m0", [(4, 0.1), (8, 0.3), (12, 0.25), (16, 0.2)])  # best 4, latest 16
    _donor_with(pbt, "m1", [(4, 0.6), (8, 0.7), (12, 0.8)])
    pbt.members["m0"].last_value, pbt.members["m1"].last_value = 0.2, 0.8  # m0 is the best member
    assert pbt.needed_snapshots("m0") == {4, 12, 16}  # best, latest, and keep=1 before the latest
    assert pbt.needed_snapshots("m1") == {4, 12}  # its best and latest only (not the best member)
    pbt._exploits["m2"] = Exploit("m2", "m1", 8, {"lr": 1.0})  # decided, not yet made: its snapshot stays
    assert pbt.needed_snapshots("m1") == {4, 8, 12}
    pbt.resumed("m2")
    assert pbt.needed_snapshots("m1") == {4, 12}


@pytest.mark.parametrize("keep, kept", [(0, {"m0": set(), "m1": set()}), (2, {"m0": {12, 16}, "m1": set()})])
def test_once_every_member_has_ended_only_keeps_latest_of_the_best_are_needed(keep, kept):
    """No member copies a snapshot once the population has finished (every member began and ended,
    no exploit or turn owed): only the ``keep`` latest of the member that ended best are kept."""
    pbt = Pbt(parse_pbt({**PBT, "keep": keep}), population=2, slots=2)
    for number in range(2):
        pbt.began(f"m{number}", 0, {"lr": 1.0})
    _donor_with(pbt, "m0", [(4, 0.1), (8, 0.3), (12, 0.25), (16, 0.2)])
    _donor_with(pbt, "m1", [(4, 0.6), (8, 0.7)])
    pbt.members["m0"].last_value, pbt.members["m1"].last_value = 0.2, 0.8
    pbt.ended("m0")
    assert not pbt.finished and pbt.needed_snapshots("m0") >= {4, 16}  # m1 may still copy them
    pbt._turns["m1"] = 8.0  # m1 waits for its turn: it may still resume, and copy
    pbt.ended("m1")
    assert pbt.finished  # its end drops the turn it waited for
    assert {name: pbt.needed_snapshots(name) for name in ("m0", "m1")} == kept


def test_a_member_about_to_go_on_from_a_copy_counts_at_the_step_it_goes_on_from():
    """For the wait that keeps a population with a slot each together, a member that will resume
    from a donor's snapshot at 8 is at 8, not at 4 where it was judged: a member at 12 is not an
    interval ahead of it, and goes on."""
    pbt = Pbt(parse_pbt(PBT), population=4, slots=4)
    for number in range(4):
        pbt.began(f"m{number}", 0, {"lr": 1.0})
    pbt.close()
    for member, value in (("m0", 0.1), ("m1", 0.05), ("m2", 0.07)):
        tell(pbt, member, 4, value)
    for member, value in (("m1", 0.04), ("m2", 0.07), ("m0", 0.1)):
        tell(pbt, member, 8, value)  # they wait for m3, not judged yet
    assert tell(pbt, "m3", 4, 0.9) == EXPLOIT
    assert (pbt.exploit_of("m3").donor, pbt.exploit_of("m3").step) == ("m1", 8)
    assert tell(pbt, "m2", 12, 0.06) not in (YIELD, SNAPSHOT_YIELD)


@pytest.mark.parametrize("kept", ["snapshot", "snapshot+yield"])
def test_a_snapshot_taken_as_its_member_waits_its_turn_is_in_the_lineage_as_any(kept):
    """A top member that waits for its turn keeps a snapshot all the same (snapshot+yield): a copy
    of it is of the donor's lineage, with the donor's schedule, and no fault."""
    from gpu_task_scheduler.records.lineage import copy_faults, lineages

    events = a_copies_b({"lr": 1.0}, {"lr": 2.0}, 4, {"donor": "b", "step": 4, "values": {"lr": 4.0}})
    events[2] = events[2]._replace(decision=kept)
    schedule = lineages(events)["a"].schedule
    assert [(s.step, s.values, s.donor) for s in schedule] == [(0.0, {"lr": 2.0}, None), (4.0, {"lr": 4.0}, "b")]
    assert copy_faults(events, interval=4, value_of=lambda e: e.value, worse=lambda one, other: one > other) == []
