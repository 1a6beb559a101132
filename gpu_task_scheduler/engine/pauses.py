"""The sweep's pausing method at work (``early_stop`` with ``promotion: true``, or ``hyperband``):
what it is told, written down before anything acts on it, and replayed at every start.

The methods (``tuning/trials.py``) are pure: told which configurations began in which bracket,
each value at a rung, each promotion and each end, in order, they decide the same. This module
keeps that order in the ledger's table ``trial_events`` and replays it when the scheduler starts,
so that a start after a kill -9 goes on with the decisions the one before it made:

* a ``rung`` event (with its decision, continue or pause) is committed before the run is told;
* ``began`` and ``resumed`` are committed with the attempt they start (``Ledger.record_attempt``);
* ``ended`` is written with the run's end; a run the ledger says is done is told ended again at the
  next start, so an end lost to a kill is not lost to the method;
* ``closed``: the sweep had no more new configurations, which Hyperband's brackets wait for.
* a report at a rung that a kill left unjudged (the run waited in ``report()`` for the decision) is
  told when the next start begins, before anything runs (:meth:`Pauses._catch_up`).

A paused run holds no slot: its process ended, its checkpoint folder stays. The engine asks
:meth:`Pauses.owed` whenever a slot is free, and resumes what it names before it starts anything
new. A paused run that the method never promotes stays ``paused``, as a pruned run stays pruned.

Population-based training's exploit, in the order it is made, and what a kill -9 at each point
leaves (``tests/test_pbt_sweep.py`` kills the scheduler at each one, ``tests/pbt_kill_driver.py``):

1. *decided*: the member reported at an interval; the ``rung`` event with the decision, the donor,
   the donor's step and the member's new values is committed before the member is told. Killed
   before the commit, nothing was decided: the member runs again from its last step and reports
   there again. Killed after, the replay makes the same exploit pending.
2. *owed*: the member is told to pause, its process ends, and a slot is free. An attempt killed
   with the scheduler before its pause was recorded is settled, and the pending exploit makes the
   member owed all the same.
3. *installed*: the donor's snapshot is put in place of the member's checkpoint
   (``records/checkpoints.install``: whole or not at all). Killed during or after it, no ``resumed``
   event is committed: the exploit is still pending, and the next start makes it again from the
   snapshot, which the method keeps until then (``Pbt.needed_snapshots``).
4. *set aside*: the member's metrics file, which ends at its own step, is kept aside as its last
   attempt's, and the donor's step is written as where it goes on (``records/resume.go_on_from``).
   Killed after it: as after 3 (a second time moves nothing).
5. *committed*: the member's new attempt and the ``resumed`` event, in one transaction. Killed
   after it, the exploit is made (the replay has it no more) and the member's attempt was
   interrupted: it is run again from ``records/resume.last_step``, which finds no metrics file of
   its own and reads the donor's step (before step 4 moved it, it read the member's own last step
   and resumed the donor's weights at it).
6. *prepared*: the launcher rotates the log and starts the process; its first report makes the
   metrics file the new attempt's, whose last step the checkpoint holds.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple

from ..gpu.devices import format_size
from ..records import checkpoints
from ..records.ledger import Ledger
from ..records.ledger.trials import TrialEvent, paused_cause, value_words
from ..records.metrics import run_points
from ..records.paths import RunPaths, UnsafePathError, name_problem
from ..records.resume import go_on_from
from ..records.status import RunStatus
from ..sweep.expand import RunSpec, Sweep
from ..tuning.base import CONTINUE, PAUSE
from ..tuning.methods import Method, method_for
from ..tuning.pbt import EXPLOIT, PAUSING, SNAPSHOTS, TURNS, Pbt, PbtRule
from ..tuning.stopping import Pausing
from ..tuning.trials import PromotionAsha

logger = logging.getLogger("gpu_task_scheduler")

DRAW_SEED = 20261126  # the order promotion ASHA draws a grid's configurations in (Pauses.drawn)
KEYS_META = "trial_method_keys"  # the ledger's meta key for the keys of the methods its trial_events are of


COPYING = "copying"  # a top member's snapshot is being copied: its decision is recorded once it is whole


class _Told(NamedTuple):
    """A value told to a run's method at a rung: the method, the rung, its decision there, the value
    the ledger's column records (the first objective's) and the event's detail."""

    method: Method
    rung: float
    decision: str
    first: float
    detail: dict[str, Any]


class _Copying(NamedTuple):
    spec: RunSpec
    method: Pbt
    rung: float
    step: float
    value: float  # what the value column records (the first objective's)
    original: Any  # what the run reported (several objectives: each one's)
    decision: str
    detail: dict[str, Any]
    thread: threading.Thread
    found: dict[str, Any]  # "copied": what the copy made, or "error"
    cancel: threading.Event  # set: the copy is given up (it stops between files, leaving nothing)


def _say_left_out(what: str, skipped: list[str]) -> None:
    """Warn of the entries a checkpoint copy left out (records/checkpoints.py), if any."""
    if skipped:
        count = len(skipped)
        logger.warning(
            "%s leaves out %d entr%s that %s not a file, a folder or a link: %s",
            what,
            count,
            "y" if count == 1 else "ies",
            "is" if count == 1 else "are",
            ", ".join(skipped[:5]),
        )


class Pauses:
    def __init__(
        self, sweep: Sweep, ledger: Ledger, *, afresh: bool = False, read_only: bool = False, root: str = ""
    ) -> None:
        """``afresh``: every run starts again from step 0 (force_rerun): the history goes.
        ``read_only``: to say what a start would do (``--dry-run``), writing nothing. ``root``: the
        result root (population-based training copies checkpoints between its runs' folders)."""
        self._ledger, self._root, self._read_only = ledger, root, read_only
        limits = sweep.options.checkpoints
        self._max_disk = None if limits is None else limits.max_disk  # checkpoints: {max_disk}: no snapshot past it
        self._copying: _Copying | None = None  # a top member's snapshot being copied (population-based training)
        self._ends_after_copy: list[str] = []  # members that ended meanwhile: told once its decision is recorded
        rules = {stage: rule for stage, rule in sweep.stopping.items() if isinstance(rule, Pausing)}
        population = sweep.search.n_runs if sweep.search is not None else sweep.size
        self._rules = rules
        self._methods: dict[str | None, Method] = {
            stage: method_for(rule, population=population, slots=sweep.parallel) for stage, rule in rules.items()
        }
        self._stage_of: dict[str, str | None] = {}  # the runs the methods know: they began in a bracket
        self._ended: set[str] = set()
        self._specs: dict[str, RunSpec] = {}  # paused runs this start can resume (their specs seen)
        # Members that went on from a donor's snapshot in this start, and the donor: the snapshots
        # that made unneeded (the member's own, the one it copied) go once its attempt is committed
        self._copied_from: dict[str, str] = {}
        # The methods' keys as the history was made with them: another method's history is no replay.
        keys = json.dumps(
            {
                str(stage): [r.method, r.metric, r.mode, r.min_step, r.max_step, r.reduction_factor]
                + ([repr(r.config)] if isinstance(r, PbtRule) else [])
                + ([[list(objective) for objective in r.objectives]] if r.objectives else [])
                for stage, r in rules.items()
            }
        )
        recorded = ledger.get_meta(KEYS_META)
        if recorded not in (None, keys) and not afresh and self._methods:
            logger.warning(
                "the early_stop method's keys changed since its decisions were recorded (%s, now %s): it starts "
                "again from what the runs reported, and a run it had paused resumes from its checkpoint as a new one",
                recorded,
                keys,
            )
            afresh = True
        if afresh and not read_only:
            ledger.forget_trials()
        if not afresh:
            self._replay()
            if root and not read_only:
                self._catch_up()
        if self._methods and not read_only and recorded != keys:
            ledger.set_meta(KEYS_META, keys)
        if root and not read_only:
            self._clear_unfinished_snapshots()

    def _clear_unfinished_snapshots(self) -> None:
        """Population-based training: the snapshots a killed scheduler left half-copied, removed,
        and those of a population that had finished (a kill came before they were removed)."""
        for name, stage in self._stage_of.items():
            if not isinstance(self._rules.get(stage), PbtRule):
                continue
            try:
                checkpoints.clear_unfinished(RunPaths.recorded(self._root, name))
            except OSError as error:  # UnsafePathError too: a link planted where snapshots go
                logger.warning("%s: could not remove a snapshot left half-copied (%s)", name, error)
        for method in self._methods.values():
            if isinstance(method, Pbt) and method.finished:
                self._collect(method, list(method.members))

    def _collect(self, method: Pbt, names: Iterable[str]) -> None:
        """Remove each of ``names``' snapshots that no member can copy any more (``Pbt.needed_snapshots``);
        not of a member whose snapshot is being copied now (its decision collects it)."""
        if not self._root or self._read_only:
            return
        for name in names:
            if self._copying is not None and self._copying.spec.name == name:
                continue
            try:
                checkpoints.collect(RunPaths.recorded(self._root, name), method.needed_snapshots(name))
            except OSError as error:  # UnsafePathError too: a link planted where snapshots go
                logger.warning("%s: could not remove the snapshots no member copies any more (%s)", name, error)

    def __bool__(self) -> bool:
        return bool(self._methods)

    def drawn(self, runs: Iterable[RunSpec]) -> Iterator[RunSpec]:
        """A grid's runs in the order promotion ASHA takes them as new configurations: drawn at
        random, by a fixed seed (the same order at every start). ASHA promotes a run that is in the
        top of what its rung has seen so far, which assumes configurations come at random; a grid
        written from its worst configuration up (learning rates ascending, say) would make each new
        one the best yet, and promote them all. Hyperband judges a rung once it is full: the order
        it takes them in decides nothing, so it takes them as written."""
        specs = list(runs)
        random.Random(DRAW_SEED).shuffle(specs)
        return iter(specs)

    @property
    def draws_at_random(self) -> bool:
        """Whether the sweep's one method takes a grid's configurations in a drawn order (:meth:`drawn`)."""
        return list(self._methods) == [None] and isinstance(self._methods[None], PromotionAsha)

    def _replay(self) -> None:
        skipped = differed = 0
        refused: set[str] = set()
        for event in self._ledger.trial_events():
            if event.kind == "closed":
                for method in self._methods.values():
                    method.close()
                continue
            found, name = self._methods.get(event.stage), event.name
            if found is None or name is None:
                continue  # its stage has no pausing method now
            if name_problem(name) is not None:  # a damaged record: a member named '../victim', say
                refused.add(name)
                continue
            method = found
            try:
                if event.kind == "began":
                    if name not in self._stage_of:
                        method.began(name, event.bracket or 0, (event.detail or {}).get("values"))
                        self._stage_of[name] = event.stage
                elif name not in self._stage_of or name in self._ended:
                    continue
                elif event.kind == "rung":
                    value = self._value_of(event)
                    if event.step is None or value is None or event.rung is None:
                        skipped += 1
                    elif method.rung_reached(name, event.step) == event.rung:
                        # late, or a snapshot that could not be taken: no snapshot of that step
                        late = bool((event.detail or {}).get("late") or (event.detail or {}).get("unsaved"))
                        decided = method.report(name, event.rung, value, event.step, late=late)
                        if decided != event.decision:
                            differed += 1  # the same events give the same decisions: changed by hand?
                            if isinstance(method, Pbt) and decided in SNAPSHOTS and event.decision not in SNAPSHOTS:
                                # Kept now (a rule of a later version), not then: there is no such snapshot.
                                method.unsaved(name, decided)
                            elif isinstance(method, Pbt) and decided == EXPLOIT and event.decision != EXPLOIT:
                                method.unmade(name, str(event.decision))  # a copy a later rule decides, not made then
                            elif isinstance(method, Pbt) and decided in TURNS and event.decision not in TURNS:
                                method.went_on(name)  # a wait a later rule decides, not made then
                elif event.kind == "resumed":
                    if name in method.paused:
                        method.resumed(name)
                elif event.kind == "ended":
                    method.ended(name)
                    self._ended.add(name)
            except (ValueError, IndexError, KeyError, TypeError):  # an event of another rule (its keys changed since)
                skipped += 1
        if differed:
            logger.warning(
                "%d recorded decision(s) of the early_stop method differ from what its recorded events decide now "
                "(was the ledger changed by hand, or was the sweep begun by another version?): it goes on from what "
                "the events decide",
                differed,
            )
        if refused:
            logger.error(
                "the ledger's trial_events name %d run(s) that cannot be run folders of this result root (%s): "
                "their events are left out (was the ledger changed by hand?)",
                len(refused),
                "; ".join(str(name_problem(name)) for name in sorted(refused)[:3]),
            )
        if skipped:
            logger.warning(
                "%d recorded event(s) of the early_stop method do not fit it as it is now (were its keys changed?); "
                "they are left out",
                skipped,
            )

    def _value_of(self, event: TrialEvent) -> Any:
        """A recorded value at a rung: several objectives' from the event's detail, in the rule's
        order (the value column holds the first: what a reader of one number sees)."""
        metrics = self._rules[event.stage].metrics
        if len(metrics) == 1:
            return event.value
        recorded = (event.detail or {}).get("objectives")
        return [recorded[metric] for metric in metrics] if isinstance(recorded, dict) else None

    # --- what the loop asks --------------------------------------------------------------

    def knows(self, name: str) -> bool:
        """Whether ``name`` began under a pausing method (a start of it goes on as the same trial)."""
        return name in self._stage_of

    def known(self) -> list[str]:
        """The runs the methods know, in the order they began."""
        return list(self._stage_of)

    def paused_at(self, name: str) -> float | None:
        """The rung step ``name`` is paused at, or None."""
        if name not in self._stage_of:
            return None
        return self._methods[self._stage_of[name]].paused.get(name)

    def owed(self) -> RunSpec | None:
        """The paused run a free slot resumes now (promoted by its method), if one is owed and its
        spec is known to this start (a run paused in an earlier start is, once the queue reached it)."""
        for method in self._methods.values():
            decided = method.next(more_new=True)
            if decided.kind == "resume" and decided.run in self._specs:
                return self._specs[decided.run]
        return None

    def close(self) -> bool:
        """The sweep has no more new configurations for now (recorded when it changes a method):
        whether a method may owe a promotion it did not owe before."""
        changed = False
        for method in self._methods.values():
            changed = method.close() or changed
        if changed:
            self._ledger.record_trial_event("closed")
        return changed

    # --- what happened ---------------------------------------------------------------------

    def began(self, spec: RunSpec) -> None:
        """``spec`` starts as a new configuration (if its stage has a pausing method)."""
        method = self._methods.get(spec.stage)
        if method is None or spec.name in self._stage_of:
            return
        bracket = method.next(more_new=True).bracket
        method.began(spec.name, bracket, spec.config)
        self._stage_of[spec.name] = spec.stage
        self._ended.discard(spec.name)
        detail = {"values": method.values_of(spec.name)} if isinstance(method, Pbt) else None
        self._ledger.record_trial_event("began", stage=spec.stage, name=spec.name, bracket=bracket, detail=detail)

    def resumed(self, spec: RunSpec) -> None:
        """``spec`` (named by :meth:`owed`) starts again from its checkpoint."""
        method = self._methods[spec.stage]
        exploit = method.exploit_of(spec.name) if isinstance(method, Pbt) else None
        method.resumed(spec.name)
        if exploit is not None:
            self._copied_from[spec.name] = exploit.donor
        self._specs.pop(spec.name, None)
        # The donor's snapshot it copied goes with the donor's next one (not now: this is committed
        # with the attempt it starts, and a start after a kill before that copies it again).
        self._ledger.record_trial_event("resumed", stage=spec.stage, name=spec.name)

    def reached(
        self, spec: RunSpec, step: float, value: float | list[float], *, late: bool = False
    ) -> tuple[float, str] | None:
        """``spec`` reported ``value`` at ``step`` (several objectives: each one's): the rung it
        records a value at and the method's decision there (:data:`CONTINUE` or :data:`PAUSE`,
        written to the ledger, not committed), or None when the step is at no new rung of it.
        ``late``: an earlier attempt's report, told after the run went on past it (recorded so: a
        replay decides the same)."""
        if spec.name in self._copied_from:  # its attempt is committed: it can go on from nothing else
            method = self._methods[spec.stage]
            assert isinstance(method, Pbt)
            self._collect(method, [spec.name, self._copied_from.pop(spec.name)])
        told = self._tell(spec.stage, spec.name, step, value, late=late)
        if told is None:
            return None
        method, rung, decision, first, detail = told
        if isinstance(method, Pbt) and decision in SNAPSHOTS and not self._read_only:
            self._copy(spec, method, rung, step, (first, value), decision, detail)
            return rung, COPYING
        if isinstance(method, Pbt):
            exploit = method.exploit_of(spec.name)
            if decision == EXPLOIT and exploit is not None:
                detail.update(donor=exploit.donor, step=exploit.step, values=exploit.values, changed=exploit.changed)
            if late:
                detail["late"] = True
        self._record_rung(spec.stage, spec.name, rung, step, first, decision, detail)
        return rung, decision

    def _tell(
        self, stage: str | None, name: str, step: float, value: float | list[float], *, late: bool
    ) -> _Told | None:
        """``value`` at ``step`` told to ``name``'s method, if it is at a new rung of it."""
        method = self._methods.get(stage)
        if method is None or name not in self._stage_of or name in self._ended:
            return None
        rung = method.rung_reached(name, step)
        if rung is None:
            return None
        decision = method.report(name, rung, tuple(value) if isinstance(value, list) else value, step, late=late)
        if not isinstance(value, list):
            return _Told(method, rung, decision, value, {})
        # several objectives: each one's (the value column holds the first)
        return _Told(
            method, rung, decision, value[0], {"objectives": dict(zip(self._rules[stage].metrics, value, strict=True))}
        )

    def _catch_up(self) -> None:
        """The runs a killed scheduler left interrupted while they waited at a rung for its decision
        (it was killed between their report there and the decision): their reports are told now, in
        the order the runs began, before anything starts. Told once a run started again, the decision
        would come after it trained on past the rung (a resumed attempt waits at no rung it goes on
        from: a LightGBM run trains its next 30 rounds in less than a second; seen under load, a run
        to be paused at round 10 trained to 40). A run paused so is recorded paused, committed.
        Population-based training is not caught up here: its decisions at an interval (a snapshot
        of the member's checkpoint, an exploit) are made once the member runs again, told late."""
        caught = False
        for name, stage in list(self._stage_of.items()):
            method = self._methods[stage]
            if isinstance(method, Pbt) or name in self._ended or name in method.paused:
                continue
            record = self._ledger.get(name)
            if record is None or record.status is not RunStatus.INTERRUPTED:
                continue
            try:
                paths = RunPaths.recorded(self._root, name)
            except UnsafePathError:
                continue
            if paths.unsafe(records_only=True) is not None:
                continue
            rule = self._rules[stage]
            for step, metrics in run_points(paths):
                value = rule.value_in(metrics)
                told = None if value is None else self._tell(stage, name, step, value, late=False)
                if told is None:
                    continue
                _, rung, decision, first, detail = told
                self._record_rung(stage, name, rung, step, first, decision, detail)
                caught = True
                went_on = decision == CONTINUE
                logger.info(
                    "%s: its report at step %g was never judged (its scheduler stopped first): judged now, %s",
                    name,
                    step,
                    "it goes on from there" if went_on else "it is paused there, and resumes if it is promoted",
                )
                if not went_on:
                    cause = self.pause_cause(name, rung, value)
                    self._ledger.finish(name, RunStatus.PAUSED, cause=cause, ended_at=record.ended_at)
                    break
        if caught:
            self._ledger.commit()

    def _record_rung(
        self,
        stage: str | None,
        name: str,
        rung: float,
        step: float,
        value: float,
        decision: str,
        detail: dict[str, Any],
    ) -> None:
        self._ledger.record_trial_event(
            "rung",
            stage=stage,
            name=name,
            rung=rung,
            step=step,
            value=value,
            decision=decision,
            detail=detail or None,
        )

    # --- a top member's snapshot, copied off the loop ---------------------------------------

    def _copy(
        self,
        spec: RunSpec,
        method: Pbt,
        rung: float,
        step: float,
        value: tuple[float, Any],
        decision: str,
        detail: dict[str, Any],
    ) -> None:
        """Copy ``spec``'s checkpoint to its snapshot of ``step`` in a thread of its own: a checkpoint
        of many GB must not hold the loop (runs starting and ending, Ctrl-C) for the seconds it
        takes. The member waits in report() meanwhile; the decision is recorded once the copy is
        whole (:meth:`settle`), so that a recorded snapshot is always whole."""
        paths = RunPaths(spec.work_dir, None)
        found: dict[str, Any] = {}
        cancel = threading.Event()
        others = [name for name in method.members if name != spec.name] if self._root else []

        def copy() -> None:
            try:
                members = [paths, *(RunPaths.recorded(self._root, name) for name in others)]
                # What the members' checkpoints and snapshots take now, and what this one would add:
                # a walk of their folders (read in this thread too: it reads no file's data)
                found["use"] = checkpoints.disk_use_of(members)
                found["own"] = checkpoints.disk_use(paths)  # its checkpoint and snapshots
                found["need"] = checkpoints.disk_use(paths, snapshots=False)
                if self._max_disk is not None and found["use"] + found["need"] > self._max_disk:
                    found["over"] = True
                    return
                found["copied"] = checkpoints.take_snapshot(paths, step, cancelled=cancel.is_set)
            except BaseException as error:  # said, and recorded as no snapshot, by settle()
                found["error"] = error

        thread = threading.Thread(target=copy, name=f"gts-snapshot-{spec.name}", daemon=True)
        thread.start()
        self._copying = _Copying(spec, method, rung, step, value[0], value[1], decision, detail, thread, found, cancel)

    def _record_disk(self, used: int, *, refused: bool = False) -> None:
        """What the population's checkpoints and snapshots take (for gts status), and how many
        snapshots checkpoints.max_disk refused so far."""
        try:
            before = json.loads(self._ledger.get_meta(checkpoints.DISK_META) or "{}")
            count = int(before.get("refused", 0)) if isinstance(before, dict) else 0
        except (ValueError, TypeError):  # changed by hand: counted again from here
            count = 0
        disk = {"bytes": used, "max_disk": self._max_disk, "refused": count + refused, "at": time.time()}
        self._ledger.set_meta(checkpoints.DISK_META, json.dumps(disk))

    def abandon(self, name: str) -> None:
        """``name`` ended (stopped, killed) while its snapshot was copied: the copy is given up (it
        stops between files and leaves nothing; the loop does not wait for it) and recorded as no
        snapshot, before the run's end, as a replay will read it."""
        if self._copying is not None and self._copying.spec.name == name:
            self._copying.cancel.set()
            self.settle()

    @property
    def copying(self) -> bool:
        """Whether a snapshot is being copied: until it is whole, population-based training decides
        nothing more and nothing starts (no copy of a member's checkpoint runs beside it)."""
        return self._copying is not None

    def settle(self, *, wait: bool = False) -> tuple[RunSpec, float, float, str, Any] | None:
        """The snapshot being copied, once it is whole (``wait``: for it), its decision recorded:
        ``(spec, rung, step, decision, value)``; None while it is copied, or when none is. A copy
        that failed is recorded as no snapshot (``unsaved``: the member goes on without one, and no
        member copies it)."""
        copying = self._copying
        if copying is None:
            return None
        if wait:
            copying.thread.join()
        if copying.thread.is_alive() and not copying.cancel.is_set():
            return None
        self._copying = None
        spec, name, decision, detail = copying.spec, copying.spec.name, copying.decision, dict(copying.detail)
        paths = RunPaths(spec.work_dir, None)
        found = copying.found
        copied = None if copying.cancel.is_set() else found.get("copied")
        if copied is None:
            why = "it ended first" if copying.cancel.is_set() else found.get("error")
            if found.get("over") and not copying.cancel.is_set():
                assert self._max_disk is not None
                why = (
                    f"it would take the checkpoints of the population to {format_size(found['use'] + found['need'])}"
                    f", past checkpoints: {{max_disk: {format_size(self._max_disk)}}}"
                )
                detail["over_disk"] = True
            logger.warning(
                "%s: could not keep a snapshot of its checkpoint at step %g (%s): no member copies it there",
                name,
                copying.step,
                why,
            )
            decision = copying.method.unsaved(name, decision)
            detail["unsaved"] = True
        else:
            _say_left_out(f"{name}: its snapshot of step {copying.step:g}", copied.skipped)
            try:
                checkpoints.collect(paths, copying.method.needed_snapshots(name))
            except OSError as error:
                logger.warning("%s: could not remove its older snapshots (%s)", name, error)
        self._record_rung(spec.stage, spec.name, copying.rung, copying.step, copying.value, decision, detail)
        if "use" in found:  # what the population's take now: this member's measured again, its older snapshots gone
            own = checkpoints.disk_use(paths)
            self._record_disk(found["use"] - found["own"] + own, refused=bool(found.get("over")))
        ends, self._ends_after_copy = self._ends_after_copy, []
        for ended in ends:
            self.ended(ended)
        return spec, copying.rung, copying.step, decision, copying.original

    def pause_cause(self, name: str, rung: float, value: float | list[float] | None) -> str:
        """Why ``name`` pauses at ``rung``: a promotion it waits for, or the member it copies (``value``:
        its value there; None: not known here, a pause decided before a restart)."""
        stage = self._stage_of[name]
        method = self._methods[stage]
        # several objectives: each one's value there
        there = dict(zip(self._rules[stage].metrics, value, strict=True)) if isinstance(value, list) else value
        if not isinstance(method, Pbt):
            return paused_cause(rung, there)
        exploit = method.exploit_of(name)
        if exploit is None and method.population > method.slots:
            return (
                f"waits for its turn after step {rung:g} ({method.population} members on {method.slots} slots: "
                "the population trains together)"
            )
        if exploit is None:
            return (
                f"waits for its turn after step {rung:g} (members more than an interval behind it train first: "
                "the population trains together)"
            )
        changed = ", ".join(f"{key} {how}" for key, how in sorted(exploit.changed.items())) or "its values kept"
        shown = value_words(there)
        return (
            f"exploits {exploit.donor} at step {exploit.step:g} ({shown}{' ' if shown else ''}at step {rung:g}, "
            f"{changed}): "
            "it resumes from a copy of that member's checkpoint"
        )

    def resume_words(self, name: str) -> str:
        """How ``name`` (named by :meth:`owed`) resumes, for the log."""
        method = self._methods[self._stage_of[name]]
        if isinstance(method, Pbt):
            exploit = method.exploit_of(name)
            if exploit is None:
                return f"takes its turn: it resumes from its checkpoint of step {method.paused[name]:g}"
            return f"resumes from a copy of {exploit.donor}'s checkpoint of step {exploit.step:g}"
        return f"is promoted from rung {method.paused[name]:g}: it resumes from its checkpoint"

    def values(self, name: str) -> dict[str, Any] | None:
        """``name``'s current values of what its method changes (population-based training), or None."""
        if name not in self._stage_of:
            return None
        method = self._methods.get(self._stage_of[name])
        return method.values_of(name) if isinstance(method, Pbt) else None

    def resuming(self, spec: RunSpec) -> float | None:
        """``spec``, named by :meth:`owed`, is about to resume: the step it resumes from if that is
        not its own last one (an exploit's: the donor's snapshot is put in place of its checkpoint,
        and its metrics file kept aside, so that the donor's step is the one record of where it
        goes on: records/resume.py). OSError: the exploit could not be made now (it is made again
        at the next try, from the snapshot it keeps)."""
        method = self._methods[spec.stage]
        exploit = method.exploit_of(spec.name) if isinstance(method, Pbt) else None
        if exploit is None:
            return None
        member = RunPaths(spec.work_dir, None)
        try:
            donor = RunPaths.recorded(self._root, exploit.donor)
            copied = checkpoints.install(member, donor, exploit.step)
        except FileNotFoundError:
            logger.warning(
                "%s: the snapshot of %s at step %g it was to copy is gone: it goes on from its own checkpoint",
                spec.name,
                exploit.donor,
                exploit.step,
            )
            return None
        except UnsafePathError as error:  # a link or a non-folder planted on the way: nothing is copied
            logger.warning(
                "%s: the snapshot of %s at step %g was not copied (%s): it goes on from its own checkpoint",
                spec.name,
                exploit.donor,
                exploit.step,
                error,
            )
            return None
        _say_left_out(f"{spec.name}: its copy of {exploit.donor}'s snapshot", copied.skipped)
        record = self._ledger.get(spec.name)
        go_on_from(member, exploit.step, record.attempts if record is not None else 0)
        return exploit.step

    def paused(self, spec: RunSpec) -> None:
        """``spec`` is paused (it ended so, or an earlier start left it so): this start may resume it."""
        if self.paused_at(spec.name) is not None:
            self._specs[spec.name] = spec

    def ended(self, name: str) -> None:
        """``name`` ended for good (succeeded, failed, stopped, blocked): it waits for nothing.
        While another member's snapshot is copied, its end is told after that member's decision
        is recorded: the method then sees them in the order a replay of the ledger will."""
        if name not in self._stage_of or name in self._ended:
            return
        if self._copying is not None and self._copying.spec.name != name:
            self._ends_after_copy.append(name)
            return
        stage = self._stage_of[name]
        method = self._methods[stage]
        method.ended(name)
        self._ended.add(name)
        self._specs.pop(name, None)
        self._ledger.record_trial_event("ended", stage=stage, name=name)
        donor = self._copied_from.pop(name, None)
        if isinstance(method, Pbt) and (method.finished or donor is not None):
            # The population's end: every snapshot but keep's goes (no member copies one now: a
            # kill before this end is committed leaves the members ended by their outcomes)
            self._collect(method, list(method.members) if method.finished else [name, donor or name])
            if method.finished:
                logger.info("population-based training ended: its members' snapshots removed%s", _kept_words(method))
                if self._root and not self._read_only:
                    members = [RunPaths.recorded(self._root, member) for member in method.members]
                    self._record_disk(checkpoints.disk_use_of(members))

    def stuck(self) -> list[RunSpec]:
        """The paused runs of this start that no method will promote (nothing runs, nothing is owed),
        each given once."""
        stuck = list(self._specs.values())
        self._specs.clear()
        return stuck


def _kept_words(method: Pbt) -> str:
    keep = method.config.keep
    return f" but the {keep} latest of the member that ended best (keep: {keep})" if keep else ""


__all__ = ["CONTINUE", "PAUSE", "PAUSING", "Pauses"]
