"""The decisions of the methods that pause runs (tuning/trials.py), as tables: what a run does at a
rung, and what a free slot runs next."""

import pytest

from gpu_task_scheduler.tuning.trials import CONTINUE, PAUSE, AsyncHyperband, Hyperband, Next, PromotionAsha, Ranking


def asha(mode="min"):
    return PromotionAsha(min_step=1, max_step=27, reduction_factor=3, mode=mode)


def feed(method, events):
    """Replay ``(run, step, value)`` reports of new runs (each begun as next() says); the decisions."""
    decided = []
    for run, step, value in events:
        if run not in method._bracket_of:
            method.began(run, method.next(more_new=True).bracket)
        rung = method.rung_reached(run, step)
        decided.append(None if rung is None else method.report(run, rung, value))
    return decided


@pytest.mark.parametrize(
    "step, rung",
    [(0.5, None), (1, 1.0), (2, 1.0), (3, 3.0), (10, 9.0), (27, None), (40, None)],  # sparse: the highest passed
)
def test_a_report_records_a_value_at_the_highest_rung_it_passed_once(step, rung):
    method = asha()
    method.began("a", 0)
    assert method.rung_reached("a", step) == rung
    if rung == 1.0:
        method.report("a", 1.0, 0.5)
        assert method.rung_reached("a", 2) is None  # recorded there already


@pytest.mark.parametrize(
    "values, decisions",
    [
        # The first two at a rung pause: no run is judged before three values are seen.
        ([0.5, 0.4], [PAUSE, PAUSE]),
        # The third, the best of three: promotable at once, it goes on without pausing.
        ([0.5, 0.4, 0.3], [PAUSE, PAUSE, CONTINUE]),
        # The third, not the best: it pauses, and the best paused one is owed the promotion.
        ([0.5, 0.3, 0.4], [PAUSE, PAUSE, PAUSE]),
    ],
)
def test_a_run_at_a_rung_pauses_unless_it_is_in_the_top_third_there(values, decisions):
    method = asha()
    assert feed(method, [(f"r{i}", 1, value) for i, value in enumerate(values)]) == decisions


def test_a_free_slot_resumes_the_best_owed_run_from_its_rung_before_a_new_configuration():
    method = asha()
    feed(method, [("a", 1, 0.5), ("b", 1, 0.3), ("c", 1, 0.4)])
    assert method.paused == {"a": 1.0, "b": 1.0, "c": 1.0}
    assert method.next(more_new=True) == Next("resume", "b", 1.0, 0)
    method.resumed("b")
    assert method.paused == {"a": 1.0, "c": 1.0}
    # One of three promoted from rung 1: the next slot gets a new configuration, or nothing.
    assert method.next(more_new=True) == Next("new", bracket=0)
    assert method.next(more_new=False) == Next("none")


def test_every_run_of_a_grid_that_keeps_improving_is_promoted_as_it_arrives():
    """Asynchronous promotion judges a run against what its rung has seen: in a grid listed from
    its worst configuration up, each new one is the best yet (bench/pausing_sim.py: 52 % of the
    grid's steps where the grid listed the other way runs 13 %)."""
    values = [0.9, 0.8, 0.7, 0.6, 0.5, 0.4]
    assert feed(asha(), [(f"r{i}", 1, value) for i, value in enumerate(values)]) == [PAUSE, PAUSE] + [CONTINUE] * 4


def test_a_higher_rung_is_promoted_from_first_and_a_lower_run_waits_for_it():
    method = asha()
    feed(method, [(f"r{i}", 1, value) for i, value in enumerate([0.9, 0.8, 0.7, 0.6, 0.55])])  # r2, r3, r4 go on
    assert feed(method, [("r2", 3, 0.5), ("r3", 3, 0.4), ("r4", 3, 0.45)]) == [PAUSE, PAUSE, PAUSE]
    # r5 is the best at rung 1, but r3 is owed a promotion from rung 3: r5 waits for it.
    assert feed(method, [("r5", 1, 0.05)]) == [PAUSE]
    assert method.next(more_new=True) == Next("resume", "r3", 3.0, 0)
    method.resumed("r3")
    assert method.next(more_new=True) == Next("resume", "r5", 1.0, 0)


@pytest.mark.parametrize("mode, best", [("min", "b"), ("max", "a")])
def test_the_mode_says_which_way_is_better(mode, best):
    method = asha(mode)
    feed(method, [("a", 1, 0.5), ("b", 1, 0.3), ("c", 1, 0.4)])
    assert method.next(more_new=False) == Next("resume", best, 1.0, 0)


def test_the_same_events_give_the_same_decisions_so_a_restart_replays_them():
    events = [(f"r{i}", step, 1 / (1 + i) + step / 100) for step in (1, 3) for i in range(9)]
    first, second = asha(), asha()
    assert feed(first, events) == feed(second, events)
    assert first.next(more_new=True) == second.next(more_new=True) and first.paused == second.paused


def test_async_hyperband_brackets_start_their_runs_at_their_own_rungs():
    method = AsyncHyperband(min_step=1, max_step=27, reduction_factor=3)
    brackets = []
    for run in "abcd":
        decided = method.next(more_new=True)
        method.began(run, decided.bracket)
        brackets.append(decided.bracket)
    assert brackets == [0, 1, 2, 3]  # in turn
    assert [method.rung_reached(run, 1) for run in "abcd"] == [1.0, None, None, None]
    assert [method.rung_reached(run, 9) for run in "abcd"] == [9.0, 9.0, 9.0, None]  # bracket 3: none but the end


def test_a_factor_or_step_that_does_not_grow_the_rungs_is_refused():
    with pytest.raises(ValueError, match="rungs"):
        PromotionAsha(min_step=5e-324, max_step=27, reduction_factor=1.5)
    with pytest.raises(ValueError, match="mode"):
        PromotionAsha(min_step=1, max_step=27, mode="lowest")


def hyperband():
    return Hyperband(min_step=1, max_step=27, reduction_factor=3)


def test_hyperbands_brackets_are_sized_and_started_as_the_paper_says():
    """Levels 1, 3, 9 of 27: brackets of 27, 12, 6 and 4 configurations, first judged at 1, 3, 9
    and never (the last runs each to max_step)."""
    method = hyperband()
    assert [(rungs, size) for rungs, size in method._shapes] == [
        ((1.0, 3.0, 9.0), 27),
        ((3.0, 9.0), 12),
        ((9.0,), 6),
        ((), 4),
    ]
    # A grid smaller than a round reaches every bracket, each in its share as it grows.
    brackets = []
    for i in range(49):
        decided = method.next(more_new=True)
        method.began(f"r{i}", decided.bracket)
        brackets.append(decided.bracket)
    assert [brackets[:12].count(b) for b in range(4)] == [7, 3, 1, 1]
    assert [brackets.count(b) for b in range(4)] == [27, 12, 6, 4]
    assert method.next(more_new=True).bracket == 4  # the next round


def _bracket_of_three(values):
    """Three runs in the first bracket, reporting at step 1 in this order; their decisions."""
    method = hyperband()
    for run in values:
        method.began(run, 0)
    decisions = [method.report(run, 1.0, value) for run, value in values.items()]
    return method, decisions


def test_a_rung_judges_no_run_until_every_run_expected_there_reported():
    method, decisions = _bracket_of_three({"a": 0.5, "b": 0.3, "c": 0.4})
    assert decisions == [PAUSE, PAUSE, PAUSE]  # the bracket may take more runs: its rung is not full
    assert method.next(more_new=True).kind == "new"  # (in the bracket furthest behind its share)
    assert method.next(more_new=False) == Next("resume", "b", 1.0, 0)  # no more: the rung is full, b promoted
    method.resumed("b")
    assert method.next(more_new=False) == Next("none") and method.paused == {"a": 1.0, "c": 1.0}


@pytest.mark.parametrize(
    "order", [("a", "b", "c", "d", "e", "f"), ("f", "e", "d", "c", "b", "a"), ("c", "a", "f", "b", "e", "d")]
)
def test_what_a_bracket_promotes_does_not_depend_on_the_order_its_runs_report(order):
    values = {"a": 0.6, "b": 0.1, "c": 0.5, "d": 0.2, "e": 0.4, "f": 0.3}
    method = hyperband()
    for run in order:
        method.began(run, 0)
    method.next(more_new=False)  # the sweep has no more: the bracket holds these six
    decisions = {run: method.report(run, 1.0, values[run]) for run in order}
    promoted = {run for run, decided in decisions.items() if decided == CONTINUE}
    while (decided := method.next(more_new=False)).kind == "resume":
        method.resumed(decided.run)
        promoted.add(decided.run)
    assert promoted == {"b", "d"}  # the best floor(6 / 3), whoever reported last


def test_a_run_that_ends_before_its_rung_is_expected_there_no_more():
    method = hyperband()
    for run in "abc":
        method.began(run, 0)
    method.next(more_new=False)
    assert [method.report(run, 1.0, value) for run, value in (("a", 0.5), ("b", 0.3))] == [PAUSE, PAUSE]
    method.ended("c")  # failed at step 0: the rung is full with a and b
    assert method.next(more_new=False) == Next("resume", "b", 1.0, 0)


def test_a_grid_smaller_than_the_rungs_need_still_trains_its_best_to_max_step():
    """Nine configurations leave one value at rung 9, whose top third is no run: once the grid has no
    more, every rung promotes at least its best (the paper's ASHA assumes an endless stream)."""
    method = asha()
    feed(method, [(f"r{i}", 1, 0.1 * (i + 1)) for i in range(9)])
    reached = {}
    while (decided := method.next(more_new=False)).kind == "resume":
        method.resumed(decided.run)
        for step in (3, 9, 27):  # it goes on while its method lets it, to max_step
            if step <= decided.step:
                continue
            reached[decided.run] = step
            rung = method.rung_reached(decided.run, step)
            if rung is None or method.report(decided.run, rung, 0.1 * int(decided.run[1:]) / step) == PAUSE:
                break
    assert reached == {"r0": 27, "r1": 3, "r2": 3}  # the top third of rung 1, and the best to the end


def test_a_rung_above_one_not_yet_judged_is_not_full_however_empty():
    """No run is expected at rung 3 before rung 1 promoted any: rung 3 must not be judged empty
    (it was, once, and the run promoted to it later paused there for good)."""
    method = hyperband()
    for run in "abcd":
        method.began(run, 0)
    method.close()  # the sweep has no more: the bracket's rung 1 fills with these four
    assert [method.report(run, 1.0, value) for run, value in zip("abcd", (0.5, 0.3, 0.4, 0.6), strict=True)] == [
        PAUSE
    ] * 4
    assert method.next(more_new=False) == Next("resume", "b", 1.0, 0)
    method.resumed("b")
    assert method.report("b", 3.0, 0.2) == CONTINUE  # alone at rung 3, where it was the one expected


def test_with_the_whole_grid_begun_at_once_a_rung_promotes_its_best_only_once_no_running_run_can_reach_it():
    """A grid no larger than the slots (or a cluster's queue places) has no more new runs from the
    start: a rung promotes at least its best only once every running run has recorded a value there,
    not the first to arrive (seen on Slurm: the worse of three went on, the best paused)."""
    method = asha()
    for run in "abc":
        method.began(run, 0)
    method.close()
    assert [method.report(run, 1.0, value) for run, value in zip("abc", (0.5, 0.3, 0.4), strict=True)] == [PAUSE] * 3
    assert method.next(more_new=False) == Next("resume", "b", 1.0, 0)
    method.resumed("b")
    assert method.report("b", 3.0, 0.2) == CONTINUE  # alone at rung 3, and no running run can reach it
    assert method.report("b", 9.0, 0.1) == CONTINUE
    assert method.next(more_new=False) == Next("none") and method.paused == {"a": 1.0, "c": 1.0}


# --- several objectives: ranked by Pareto front, then crowding distance --------------------------

TWO = (("loss", "min"), ("latency", "min"))


@pytest.mark.parametrize(
    "modes, values, order",
    [
        (["min"], {"a": 0.5, "b": 0.3, "c": 0.3}, ["b", "c", "a"]),  # one metric: by value, then name
        (["max"], {"a": 0.5, "b": 0.3, "c": 0.3}, ["a", "b", "c"]),
        # The front a, b, d (b in its middle), then c: the ends of a front first, then the middle.
        (["min", "min"], {"a": (1, 4), "b": (2, 2), "c": (3, 3), "d": (4, 1)}, ["a", "d", "b", "c"]),
        # A higher latency is better here: c is on the front now, and b is dominated by c.
        (["min", "max"], {"a": (1, 4), "b": (2, 2), "c": (2, 3), "d": (4, 1)}, ["a", "c", "b", "d"]),
        (["min", "min"], {"b": (1, 1), "a": (1, 1)}, ["a", "b"]),  # equal points: the name
    ],
)
def test_a_rung_ranks_one_metric_by_value_and_several_by_front_then_crowding(modes, values, order):
    assert Ranking(modes).order(values) == order


@pytest.mark.parametrize(
    "modes, value", [(["min"], (0.1, 0.2)), (["min", "min"], 0.1), (["min", "min"], (0.1,)), (["min", "min"], (1, "x"))]
)
def test_a_value_of_the_wrong_shape_is_refused(modes, value):
    """(A replayed event of a rule whose objectives changed is left out, not told.)"""
    with pytest.raises(ValueError, match="value of"):
        Ranking(modes).checked(value)


def test_promotion_asha_with_two_objectives_promotes_the_pareto_best_of_a_rung():
    """Six runs at rung 1 promote floor(6 / 3) = 2: the ends of the front (b is the front's middle,
    less isolated; c and e are dominated), the best place first."""
    method = PromotionAsha(min_step=1, max_step=27, reduction_factor=3, objectives=TWO)
    points = {"a": (0.2, 9.0), "b": (0.5, 5.0), "c": (0.6, 6.0), "d": (0.9, 1.0), "e": (0.95, 9.5), "f": (1.0, 9.9)}
    decisions = feed(method, [(run, 1, value) for run, value in points.items()])
    # None goes on at once: the first two see too few runs, and from then on a, an end of the front,
    # leads (the ends of a front tie: the name), then a and d (the sixth makes the top two)
    assert decisions == [PAUSE, PAUSE, PAUSE, PAUSE, PAUSE, PAUSE]
    resumed = []
    while (decided := method.next(more_new=False)).kind == "resume":
        method.resumed(decided.run)
        resumed.append(decided.run)
    assert resumed == ["a", "d"]
    assert method.paused == {run: 1.0 for run in "bcef"}


def test_promotion_asha_with_two_objectives_lets_a_run_on_at_once_when_it_leads_its_rung():
    method = PromotionAsha(min_step=1, max_step=27, reduction_factor=3, objectives=TWO)
    feed(method, [("a", 1, (0.5, 5.0)), ("b", 1, (0.6, 6.0))])
    assert feed(method, [("c", 1, (0.1, 1.0))]) == [CONTINUE]  # it dominates both: the top third of 3


@pytest.mark.parametrize("order", [tuple("abcdef"), tuple("fedcba"), tuple("cafbed")])
def test_hyperband_with_two_objectives_promotes_the_pareto_best_whatever_the_order_runs_report(order):
    points = {"a": (0.2, 9.0), "b": (0.5, 5.0), "c": (0.6, 6.0), "d": (0.9, 1.0), "e": (0.95, 9.5), "f": (1.0, 9.9)}
    method = Hyperband(min_step=1, max_step=27, reduction_factor=3, objectives=TWO)
    for run in order:
        method.began(run, 0)
    method.next(more_new=False)  # the sweep has no more: the bracket holds these six
    decisions = {run: method.report(run, 1.0, points[run]) for run in order}
    promoted = {run for run, decided in decisions.items() if decided == CONTINUE}
    while (decided := method.next(more_new=False)).kind == "resume":
        method.resumed(decided.run)
        promoted.add(decided.run)
    assert promoted == {"a", "d"}  # the ends of the front a, b, d: floor(6 / 3) of them
    assert method.paused == {run: 1.0 for run in "bcef"}


@pytest.mark.parametrize("dimensions", [2, 3])
def test_the_fronts_are_the_non_dominated_ranks_also_with_ties_and_equal_points(dimensions):
    """The fronts (two objectives: one sort and bisection; more: peeled) against the definition: a
    point's rank is 0 when nothing dominates it, else one more than the highest rank of those that do."""
    import random

    from gpu_task_scheduler.tuning.pareto import fronts, pareto_order

    def dominates(a, b):
        return all(x <= y for x, y in zip(a, b, strict=True)) and a != b

    rng = random.Random(7)
    for _ in range(300):
        points = [[rng.randint(0, 5) for _ in range(dimensions)] for _ in range(rng.randint(1, 25))]
        rank = {}
        for i in sorted(range(len(points)), key=lambda i: sum(points[i])):  # dominators have smaller sums
            rank[i] = max((rank[j] + 1 for j in rank if dominates(points[j], points[i])), default=0)
        found = fronts(points)
        assert [sorted(front) for front in found] == [
            sorted(i for i in rank if rank[i] == r) for r in range(max(rank.values()) + 1)
        ], points
        assert sorted(pareto_order(points)) == list(range(len(points)))
