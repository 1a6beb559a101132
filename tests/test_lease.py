"""Leases (records/lease.py): when the scheduler may run again an attempt on a machine it lost sight of.

The reader runs on a fake clock; the writer is the real one, on real files."""

import json

import pytest

from gpu_task_scheduler.records.lease import LeaseHolder, LeaseTerms, lease_state, wait_all_over, wait_over

TERMS = LeaseTerms(renew_every=1.0, grace_period=2.0)  # fence_after 3 s, period 3 + 2 + 2 + 1 = 8 s


class Clock:
    """A fake clock whose sleep advances it, and calls ``during(now)`` at each step (a supervisor)."""

    def __init__(self, during=None):
        self.now, self.during = 100.0, during

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds
        if self.during is not None:
            self.during(self.now)


def test_the_terms_leave_a_cut_off_supervisor_time_to_stop_its_run():
    assert TERMS.fence_after == 3.0 and TERMS.period == 8.0
    # The supervisor notices within a renewal, then gives the grace period: all before the lease expires.
    assert TERMS.fence_after + TERMS.renew_every + TERMS.grace_period < TERMS.period


def test_an_attempt_that_never_took_its_lease_is_over_at_once(tmp_path):
    clock = Clock()
    assert wait_over(str(tmp_path / "lease"), "t", TERMS, clock=clock, sleep=clock.sleep) == "it had not started"
    LeaseHolder(str(tmp_path / "lease"), "other attempt").renew()
    assert wait_over(str(tmp_path / "lease"), "t", TERMS, clock=clock, sleep=clock.sleep) == "it had not started"
    assert clock.now == 100.0


def test_a_released_lease_ends_the_wait(tmp_path):
    path = str(tmp_path / "lease")
    holder = LeaseHolder(path, "t")
    holder.renew()

    def supervisor(now):
        if now >= 103:
            holder.release()
        else:
            holder.renew()

    clock = Clock(supervisor)
    assert wait_over(path, "t", TERMS, clock=clock, sleep=clock.sleep).startswith("its processes ended 3.")
    assert lease_state(path, "t") == ("released", holder._renewals)


def test_a_lease_renewed_keeps_the_attempt_alive_and_one_left_alone_expires(tmp_path):
    path = str(tmp_path / "lease")
    holder = LeaseHolder(path, "t")
    holder.renew()

    def supervisor(now):
        if now < 130:  # alive for 30 s, then gone without a word (its machine died)
            holder.renew()

    clock = Clock(supervisor)
    how = wait_over(path, "t", TERMS, clock=clock, sleep=clock.sleep)
    # Its last renewal came at 129.5 (the reader looks every half second): the lease expires a period later.
    assert how.startswith("its lease expired") and clock.now == 129.5 + TERMS.period


@pytest.mark.parametrize("damage", ["delete", "garbage"])
def test_a_lease_that_vanishes_or_turns_to_garbage_still_waits_for_its_period(tmp_path, damage):
    path = tmp_path / "lease"
    LeaseHolder(str(path), "t").renew()

    def vandal(now):
        if damage == "delete":
            path.unlink(missing_ok=True)
        else:
            path.write_text(json.dumps({"token": "t", "state": "released", "renewals": "many"}))

    clock = Clock(vandal)
    assert wait_over(str(path), "t", TERMS, clock=clock, sleep=clock.sleep).startswith("its lease expired")
    assert clock.now >= 100 + TERMS.period


def test_a_lease_the_file_system_refuses_is_an_error_for_the_supervisor(tmp_path):
    holder = LeaseHolder(str(tmp_path / "missing-folder" / "lease"), "t")
    with pytest.raises(OSError):
        holder.renew()
    holder.release()  # never raises: the scheduler then waits for the lease to expire


def test_a_restart_waits_once_for_every_lease_a_killed_scheduler_left(tmp_path):
    """Four attempts: never started, released, renewed until 110 then left alone (its machine
    died), and renewed until 112, when it is released. The wait ends when the last is over, each
    judged on its own: one wait, not one after another (that would end a period after 112)."""
    never, released, dead, late = (str(tmp_path / name) for name in ("never", "released", "dead", "late"))
    LeaseHolder(released, "b").release()
    holders = {"dead": LeaseHolder(dead, "c"), "late": LeaseHolder(late, "d")}
    for holder in holders.values():
        holder.renew()

    def supervisors(now):
        if now < 110:
            holders["dead"].renew()
        if now < 112:
            holders["late"].renew()
        elif lease_state(late, "d")[0] != "released":
            holders["late"].release()

    clock = Clock(supervisors)
    leases = [(never, "a"), (released, "b"), (dead, "c"), (late, "d")]
    wait_all_over(leases, TERMS, clock=clock, sleep=clock.sleep)
    assert clock.now == 109.5 + TERMS.period  # the dead one's last renewal, a period on
    clock = Clock()
    wait_all_over(
        [(never, "a"), (released, "b"), (str(tmp_path / "other"), "x")], TERMS, clock=clock, sleep=clock.sleep
    )
    assert clock.now == 100.0  # nothing to wait for: at once
