"""What a result root records about a run before it starts (the input of ``engine.decide.before_run``)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

from ..errors import DamagedRecordError
from .known import RootIndex
from .lease import LeaseTerms, wait_all_over
from .ledger import Ledger
from .ledger.record import KnownRun, RunRecord
from .metrics import read_all
from .paths import RunPaths, name_problem
from .protocol import Outcome
from .status import RunStatus

if TYPE_CHECKING:
    from ..sweep.expand import RunSpec  # records sit below the sweep: only its type is needed


class Prior(NamedTuple):
    """What the result root says about a run before it starts."""

    duplicate: bool  # the same config appears earlier in the sweep
    config_hash: str  # this run's config hash
    record: KnownRun | None  # the ledger's row for its name
    folder_ok: bool  # its folder exists (and, when the ledger has no row, is safe to read)
    outcome: Outcome | None  # the outcome file in its folder (read only when the ledger has no row)
    program: str | None = None  # what this run runs (RunSpec.program)
    # When the latest of the runs it depends on ended (read only for a recorded success of a later stage).
    dependencies_ended: float | None = None


def read_prior(spec: RunSpec, known: RootIndex) -> Prior:
    record = known.known(spec.name, spec.index)
    folder_ok = known.has_folder(spec.name)
    outcome = None
    if folder_ok and record is None:
        # Nothing is read from (or, when it runs, written into) the folder of a run the ledger
        # records without a safety check. An unsafe folder counts as absent: the run then
        # starts, and is refused with the reason.
        paths = RunPaths(spec.work_dir, None)
        folder_ok = paths.unsafe() is None
        outcome = Outcome.read(paths.outcome) if folder_ok else None
    dependencies_ended = None
    if spec.after and record is not None and record.status is RunStatus.SUCCEEDED and known.ledger is not None:
        dependencies_ended = known.ledger.last_end(spec.after)
    return Prior(
        duplicate=spec.duplicate,
        config_hash=spec.config_hash,
        record=record,
        folder_ok=folder_ok,
        outcome=outcome,
        program=spec.program,
        dependencies_ended=dependencies_ended,
    )


def adopt(ledger: Ledger, spec: RunSpec, outcome: Outcome, params: str) -> None:
    """Record in the ledger a success that only the run's folder knows of (the ledger was lost)."""
    ledger.adopt(
        name=spec.name,
        run_index=spec.index,
        config_hash=spec.config_hash,
        work_dir=spec.work_dir,
        result=json.dumps(outcome.result),
        ended_at=outcome.finished_at,
        params=params,
        result_file=outcome.large_result_file,
        stage=spec.stage,
    )


def _check_recorded(name: str, work_dir: str | None) -> None:
    """A run the ledger records as active is looked at in its folder: a name no sweep makes, or a
    folder that is not the name's, is refused (DamagedRecordError) before anything is read there."""
    problem = name_problem(name)
    if problem is None and work_dir and os.path.basename(os.path.normpath(work_dir)) != name:
        problem = f"its folder is recorded as {work_dir!r}"
    if problem is not None:
        raise DamagedRecordError(
            f"the ledger records an active run {name!r}, which no sweep makes ({problem}): restore the ledger from "
            "a backup, or use another result root; nothing was run"
        )


def settle_running(
    ledger: Ledger,
    live: Callable[[str], str | None] | None = None,
    terms: LeaseTerms | None = None,
    before_end: Callable[[RunRecord], None] | None = None,
) -> None:
    """Runs a killed scheduler left marked ``running``: succeeded (their folder records it), pruned (the
    early_stop rule had stopped them), paused (a pausing method had paused them), or interrupted.

    ``live``: the token of a run's attempt that is still queued or running on a cluster (the
    launcher's ``live_attempt``). Such a run is left as it is: this start follows that attempt.
    ``terms``: the sweep's lease terms; every other attempt that holds a lease is waited for until it
    is over (released, or not renewed for the lease's period), before anything is settled.

    A run recorded ``interrupted`` is looked at again when its attempt's own record in its folder
    (the outcome file, with that attempt's token) says it succeeded: an attempt on a cluster outlives
    the scheduler that started it, and an earlier start may have settled it while it still ran
    (then been killed before following it). Its success is its end; run again, it would run twice.

    ``before_end(record)``: called before such a run's end is recorded (what it reported is read
    then): the TensorBoard feed's last look at an attempt that ended while no scheduler watched."""
    records = ledger.unsettled()
    for record in records:
        _check_recorded(record.name, record.work_dir)
    if terms is not None:
        # An attempt a killed scheduler left on another machine (a Ray node) may still run: over
        # before its run is settled and runs again, as after a lost node (records/lease.py).
        wait_all_over(
            [
                (RunPaths(record.work_dir, None).lease, record.token)
                for record in records
                if record.token and record.work_dir and (live is None or live(record.name) != record.token)
            ],
            terms,
        )
    for record in records:
        if live is not None and record.token is not None and live(record.name) == record.token:
            continue
        running = record.status is RunStatus.RUNNING
        paths = RunPaths(record.work_dir or "", None)
        safe = record.work_dir and paths.unsafe(records_only=True) is None
        outcome = Outcome.read(paths.outcome, token=record.token) if safe and record.token else None
        if not running and (outcome is None or not outcome.succeeded):
            continue  # interrupted, and nothing since says otherwise
        if safe and before_end is not None:
            before_end(record)
        metrics = read_all(paths.metrics).summary_json() if safe else None  # what it reported before it ended
        pruned = ledger.stop_verdict(record.name)
        paused = ledger.pause_verdict(record.name)
        if outcome is not None and outcome.succeeded and outcome.paused is not None:
            ledger.finish(record.name, RunStatus.PAUSED, cause=paused or outcome.paused, metrics=metrics)
        elif outcome is not None and outcome.succeeded:
            ledger.finish(
                record.name,
                RunStatus.SUCCEEDED if outcome.pruned is None else RunStatus.PRUNED,
                exit_code=0,
                cause=None if outcome.pruned is None else pruned or outcome.pruned,
                result=json.dumps(outcome.result),
                ended_at=outcome.finished_at,
                result_file=outcome.large_result_file,
                metrics=metrics,
            )
        elif pruned is not None:  # the early_stop rule had stopped it: that was its end
            ledger.finish(record.name, RunStatus.PRUNED, cause=pruned, metrics=metrics)
        elif paused is not None:  # a pausing method had paused it: its process ended so
            ledger.finish(record.name, RunStatus.PAUSED, cause=paused, metrics=metrics)
        else:
            ledger.finish(
                record.name,
                RunStatus.INTERRUPTED,
                cause="the scheduler stopped while the run was active",
                metrics=metrics,
            )
