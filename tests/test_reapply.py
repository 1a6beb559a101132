"""After a restore, a run's own hyperparameters win (integrations/reapply.py), against real torch
optimizers and schedulers: a member that loads a donor's optimizer and scheduler state goes on at
its own rate times the schedule's factor at the restored step, for each kind of schedule."""

import math

import pytest

torch = pytest.importorskip("torch", reason="the integrations extra: pip install -e '.[integrations]'")

from gpu_task_scheduler.integrations.reapply import Change, capture, describe, reapply  # noqa: E402

STEPS, COPIED_AT = 12, 5


def warmup(optimizer):
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / 4))


def cosine(optimizer):
    return torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=STEPS)


def warmup_then_cosine(optimizer):
    first = torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=0.25, total_iters=3)
    then = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=STEPS - 3)
    return torch.optim.lr_scheduler.SequentialLR(optimizer, [first, then], milestones=[3])


def step_decay(optimizer):
    return torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.5)


SCHEDULES = {
    "constant": None,
    "warm-up": warmup,
    "cosine": cosine,
    "sequential": warmup_then_cosine,
    "step": step_decay,
}


def built(lr, schedule, weight_decay=0.01, momentum=0.9):
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    decayed, kept = [model.weight], [model.bias]
    optimizer = torch.optim.SGD(
        [{"params": decayed, "weight_decay": weight_decay}, {"params": kept, "weight_decay": 0.0}],
        lr=lr,
        momentum=momentum,
    )
    scheduler = schedule(optimizer) if schedule else None
    return model, optimizer, scheduler


def trained(model, optimizer, scheduler, steps):
    """The rate of each step, as the optimizer used it."""
    rates = []
    for _ in range(steps):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.zero_grad()
        model(torch.ones(2, 3)).sum().backward()
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
    return rates


@pytest.mark.parametrize("name", SCHEDULES)
def test_a_copied_member_trains_at_its_own_rate_times_the_schedules_factor(name):
    schedule = SCHEDULES[name]
    donor = built(0.1, schedule)
    trained(*donor, COPIED_AT)
    own = trained(*built(0.05, schedule), STEPS)  # the member's own rates, had it trained from the start

    model, optimizer, scheduler = built(0.05, schedule)
    fresh = capture([optimizer], [scheduler] if scheduler else [])
    model.load_state_dict(donor[0].state_dict())
    optimizer.load_state_dict(donor[1].state_dict())
    if scheduler is not None:
        scheduler.load_state_dict(donor[2].state_dict())
    assert optimizer.param_groups[0]["lr"] != pytest.approx(own[COPIED_AT])  # the donor's rate, restored
    changes = reapply(fresh, [optimizer], [scheduler] if scheduler else [])
    assert Change(name="lr", restored=0.1, fresh=0.05, scheduled=scheduler is not None) in changes
    after = trained(model, optimizer, scheduler, STEPS - COPIED_AT)
    assert after == pytest.approx(own[COPIED_AT:], rel=1e-9)  # the schedule went on from the restored step


def test_the_other_hyperparameters_take_the_fresh_values_and_flags_stay():
    donor = built(0.1, warmup, weight_decay=0.02, momentum=0.5)
    trained(*donor, 3)
    _, optimizer, scheduler = built(0.1, warmup, weight_decay=0.01, momentum=0.9)
    fresh = capture([optimizer], [scheduler])
    optimizer.load_state_dict(donor[1].state_dict())
    scheduler.load_state_dict(donor[2].state_dict())
    changes = reapply(fresh, [optimizer], [scheduler])
    assert changes == [
        Change(name="weight_decay", restored=0.02, fresh=0.01),
        Change(name="momentum", restored=0.5, fresh=0.9),
    ]  # each said once (two groups), the rate unchanged (the same base): no lr change
    assert [g["weight_decay"] for g in optimizer.param_groups] == [0.01, 0.0]
    assert all(g["momentum"] == 0.9 and g["nesterov"] is False for g in optimizer.param_groups)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.1 * min(1.0, 4 / 4))


def test_a_run_resumed_from_its_own_checkpoint_changes_nothing():
    first = built(0.1, cosine)
    trained(*first, 4)
    _, optimizer, scheduler = built(0.1, cosine)
    fresh = capture([optimizer], [scheduler])
    optimizer.load_state_dict(first[1].state_dict())
    scheduler.load_state_dict(first[2].state_dict())
    rate = optimizer.param_groups[0]["lr"]
    assert reapply(fresh, [optimizer], [scheduler]) == []
    assert optimizer.param_groups[0]["lr"] == rate
    assert describe([], "Lightning") == "the values Lightning restored are this run's own"


def test_adam_betas_are_put_back_and_said():
    model = torch.nn.Linear(2, 1)
    donor = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.8, 0.99))
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-4, betas=(0.9, 0.999))
    fresh = capture([optimizer], [])
    optimizer.load_state_dict(donor.state_dict())
    changes = reapply(fresh, [optimizer], [])
    assert optimizer.param_groups[0]["betas"] == (0.9, 0.999) and optimizer.param_groups[0]["lr"] == 5e-4
    assert describe(changes, "the Trainer") == (
        "the Trainer restored another run's values; this run's own are put back: betas (0.8, 0.99) (restored) -> "
        "(0.9, 0.999) (this run's config), lr 0.001 (restored) -> 0.0005 (this run's config)"
    )


def test_a_scheduled_rate_is_said_as_a_base_rate():
    said = describe([Change(name="lr", restored=0.001, fresh=0.0005, scheduled=True)], "Lightning")
    assert said == (
        "Lightning restored another run's values; this run's own are put back: base lr 0.001 (restored) -> "
        "0.0005 (this run's config); the schedule goes on from the restored step"
    )


def test_optimizers_that_are_not_those_built_are_refused():
    _, optimizer, _ = built(0.1, None)
    fresh = capture([optimizer], [])
    other = torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=0.1)
    with pytest.raises(ValueError, match="param groups differ"):
        reapply(fresh, [other], [])
    assert math.isclose(optimizer.param_groups[0]["lr"], 0.1)


def plateau(optimizer):
    return torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, factor=0.5, patience=0)


def reduced(lr, resumed_from=None):
    """A model whose ReduceLROnPlateau halved its rate three times (the loss never improves), built
    with ``lr`` (and its base remembered, as the callbacks do at the start of every attempt); or,
    given ``resumed_from``, built with ``lr`` and restored from that one's state."""
    model, optimizer, scheduler = built(lr, plateau)
    fresh = capture([optimizer], [scheduler])
    if resumed_from is None:
        for _ in range(4):
            scheduler.step(1.0)
        return model, optimizer, scheduler, fresh
    optimizer.load_state_dict(resumed_from[1].state_dict())
    scheduler.load_state_dict(resumed_from[2].state_dict())
    return model, optimizer, scheduler, reapply(fresh, [optimizer], [scheduler])


def test_a_reduce_on_plateau_run_resumed_from_its_own_checkpoint_keeps_its_reductions():
    """It keeps no base_lrs: re-application took the restored rate (0.0125) for a base and put the
    config's 0.1 back, on every resume, saying it restored another run's values."""
    first = reduced(0.1)
    assert first[1].param_groups[0]["lr"] == pytest.approx(0.0125)
    _, optimizer, _, changes = reduced(0.1, resumed_from=first)
    assert changes == [] and optimizer.param_groups[0]["lr"] == pytest.approx(0.0125)


def test_a_reduce_on_plateau_member_copying_a_donor_takes_its_own_rate_times_the_reductions():
    donor = reduced(0.1)
    _, optimizer, scheduler, changes = reduced(0.04, resumed_from=donor)
    assert Change(name="lr", restored=0.1, fresh=0.04, scheduled=True) in changes
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.04 / 8)


def test_a_restored_scheduler_with_no_base_keeps_the_restored_rate():
    """A checkpoint saved before its scheduler had a base: the restored rate is the schedule's
    position, and stays."""
    _, old_optimizer, old_scheduler = built(0.1, plateau)
    for _ in range(4):
        old_scheduler.step(1.0)  # never given a base (an older version of the callbacks)
    _, optimizer, scheduler = built(0.1, plateau)
    fresh = capture([optimizer], [scheduler])
    optimizer.load_state_dict(old_optimizer.state_dict())
    state = old_scheduler.state_dict()
    scheduler.load_state_dict(state)
    delattr(scheduler, "_gts_base_lrs")  # as restored from such a checkpoint into an older callback's
    assert reapply(fresh, [optimizer], [scheduler]) == []
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.0125)


def test_betas_restored_as_a_list_are_no_change():
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.999))
    fresh = capture([optimizer], [])
    state = optimizer.state_dict()
    state["param_groups"][0]["betas"] = [0.9, 0.999]  # as a JSON or YAML round trip gives them back
    optimizer.load_state_dict(state)
    assert reapply(fresh, [optimizer], []) == []


def test_the_schedulers_inside_a_sequential_lr_get_the_members_base_also_before_the_milestone():
    donor = built(0.1, warmup_then_cosine)
    trained(*donor, 2)  # copied during the warm-up, before the milestone (3)
    _, optimizer, scheduler = built(0.05, warmup_then_cosine)
    fresh = capture([optimizer], [scheduler])
    optimizer.load_state_dict(donor[1].state_dict())
    scheduler.load_state_dict(donor[2].state_dict())
    reapply(fresh, [optimizer], [scheduler])
    for inner in scheduler._schedulers:
        assert inner.base_lrs == [0.05, 0.05], type(inner).__name__


@pytest.mark.parametrize("name", ["warm-up", "cosine", "step"])
def test_after_the_values_are_put_back_get_last_lr_gives_the_members_rate(name):
    donor = built(0.1, SCHEDULES[name])
    trained(*donor, COPIED_AT)
    _, optimizer, scheduler = built(0.05, SCHEDULES[name])
    fresh = capture([optimizer], [scheduler])
    optimizer.load_state_dict(donor[1].state_dict())
    scheduler.load_state_dict(donor[2].state_dict())
    reapply(fresh, [optimizer], [scheduler])
    assert scheduler.get_last_lr() == [group["lr"] for group in optimizer.param_groups]
    assert scheduler.get_last_lr()[0] == pytest.approx(donor[1].param_groups[0]["lr"] / 2)


def test_a_trainer_group_with_no_weight_decay_still_has_none_after_a_copy():
    """The Trainer puts biases and norms in a group of their own with weight_decay 0: its
    args' weight_decay is the first group's, not theirs."""
    from types import SimpleNamespace

    from gpu_task_scheduler.integrations.transformers import _from_args

    donor = built(0.1, None, weight_decay=0.05)
    _, optimizer, _ = built(0.1, None, weight_decay=0.01)
    optimizer.load_state_dict(donor[1].state_dict())
    args = SimpleNamespace(learning_rate=0.1, weight_decay=0.01, adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8)
    reapply(_from_args(args, optimizer, []), [optimizer], [])
    assert [group["weight_decay"] for group in optimizer.param_groups] == [0.01, 0.0]


def test_a_schedules_own_settings_are_the_members_after_a_copy():
    """A cosine schedule's floor (eta_min) set from the config: the donor's came back with its
    state and stayed; the member's own is put back, and said."""

    def floor(eta_min):
        return lambda optimizer: torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=STEPS, eta_min=eta_min)

    donor = built(0.1, floor(0.01))
    trained(*donor, COPIED_AT)
    _, optimizer, scheduler = built(0.05, floor(0.001))
    fresh = capture([optimizer], [scheduler])
    optimizer.load_state_dict(donor[1].state_dict())
    scheduler.load_state_dict(donor[2].state_dict())
    assert scheduler.eta_min == 0.01
    changes = reapply(fresh, [optimizer], [scheduler])
    assert scheduler.eta_min == 0.001 and Change(name="eta_min", restored=0.01, fresh=0.001) in changes
    own = built(0.05, floor(0.001))  # the member resumed from its own checkpoint: nothing changes
    trained(*own, COPIED_AT)
    _, optimizer, scheduler = built(0.05, floor(0.001))
    fresh = capture([optimizer], [scheduler])
    optimizer.load_state_dict(own[1].state_dict())
    scheduler.load_state_dict(own[2].state_dict())
    rate = optimizer.param_groups[0]["lr"]
    assert reapply(fresh, [optimizer], [scheduler]) == []
    assert scheduler.eta_min == 0.001 and optimizer.param_groups[0]["lr"] == rate == own[1].param_groups[0]["lr"]
