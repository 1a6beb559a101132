"""Population-based training's decisions (tuning/pbt.py), as tables: its config, when a member
exploits another, how its values are explored, and that the same events decide the same."""

import pytest

from gpu_task_scheduler import ConfigError
from gpu_task_scheduler.tuning.pbt import Exploit, Pbt, parse_pbt

PBT = {"metric": "loss", "mode": "min", "interval": 4, "max_step": 40, "perturb": {"lr": [0.5, 2.0]}}


def population(values, **keys):
    """A population of members m0.. with these lr values, under PBT with ``keys``."""
    pbt = Pbt(parse_pbt({**PBT, **keys}))
    for number, lr in enumerate(values):
        pbt.began(f"m{number}", {"lr": lr, "width": 64})
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


def test_a_member_is_judged_every_interval_steps_and_never_at_max_step():
    pbt = population([1.0, 2.0, 3.0, 4.0])
    for member, value in (("m0", 0.1), ("m1", 0.2), ("m2", 0.3)):
        assert pbt.report(member, 3, value) is None  # before its first interval
    assert pbt.report("m3", 3, 0.9) is None
    assert pbt.report("m3", 4, 0.9) is not None  # at its interval, in the bottom quarter
    assert pbt.report("m3", 4, 0.9) is None  # a step it reported already
    fresh = population([1.0, 2.0])
    fresh.report("m0", 40, 0.1)
    assert fresh.report("m1", 40, 0.9) is None  # at max_step: done


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


def test_an_exploit_copies_a_top_member_at_its_step_and_perturbs_its_values():
    pbt = population([1.0, 2.0, 3.0, 4.0])
    pbt.report("m0", 6, 0.1)  # the best, at step 6
    pbt.report("m1", 4, 0.5)
    pbt.report("m2", 4, 0.6)
    exploit = pbt.report("m3", 4, 0.9)
    assert exploit.member == "m3" and exploit.donor == "m0" and exploit.step == 6
    assert exploit.values["lr"] in (0.5, 2.0) and exploit.values["width"] == 64  # the donor's lr 1.0, x0.5 or x2
    assert exploit.changed == {"lr": f"x{exploit.values['lr']:g}"}
    pbt.exploited(exploit)
    assert pbt.members["m3"].values == exploit.values and pbt.members["m3"].last_step == 6
    assert pbt.report("m3", 7, 0.1) is None  # judged again only an interval after the step it went on from
    assert pbt.report("m0", 8, 0.09) is None  # a top member goes on


def test_the_same_events_give_the_same_decisions_and_other_seeds_others():
    def run(seed):
        pbt = population([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0], seed=seed)
        decided = []
        for step in range(4, 40, 4):
            for number in range(8):
                exploit = pbt.report(f"m{number}", step, (number + 1) / step)
                if exploit is not None:
                    pbt.exploited(exploit)
                    decided.append((exploit.member, exploit.donor, exploit.values["lr"]))
        return decided

    assert run(0) == run(0)  # a restart replays the same
    assert run(0) != run(1)
    # Asynchronous, as Ray Tune's: a member is ranked against the latest values of those that have
    # reported, so the second to report at step 4 is the bottom of two, and copies the first.
    assert run(0)[0] == ("m1", "m0", 0.5)


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
    pbt.began("a", {"dropout": 0.1})
    pbt.began("b", {"dropout": 0.2})
    pbt.report("a", 4, 0.1)
    exploit = pbt.report("b", 4, 0.9)
    assert isinstance(exploit, Exploit)
    assert (exploit.values["dropout"] != 0.1) is resampled and 0.0 <= exploit.values["dropout"] <= 0.5
    assert exploit.changed == ({"dropout": "resampled"} if resampled else {})


def test_an_integer_value_stays_an_integer_when_perturbed():
    pbt = Pbt(parse_pbt({**PBT, "perturb": {"batch": [0.5, 2.0]}}))
    pbt.began("a", {"batch": 1})
    pbt.began("b", {"batch": 3})
    pbt.report("a", 4, 0.1)
    exploit = pbt.report("b", 4, 0.9)
    assert exploit.values["batch"] in (1, 2) and isinstance(exploit.values["batch"], int)  # 1 x 0.5 is 1, not 0
