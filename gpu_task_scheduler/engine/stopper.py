"""The sweep's early_stop rules at work: what running runs report, fed to the rules as it arrives.

The rules (``tuning/stopping.py``) are pure; this module keeps what they decide
over, reads the runs' metrics files, and writes every verdict to the ledger
before the loop acts on it, so that a restarted scheduler decides as the one
before it did:

* ASHA's value of each run at each rung it reached is a verdict row. A run that
  resumes after an interruption has its rungs already: it is not judged at one
  of them twice. A run the rule stopped is settled ``pruned`` by the next start
  (``records/prior.settle_running``), even if the scheduler was killed before
  the run's end was recorded.
* The median rule decides over whole curves: they are read again from the
  runs' metrics files when the scheduler starts.

Reading costs one ``open`` of each running run's metrics file per look (the
loop looks every :data:`LOOK_INTERVAL` seconds while a run with a rule is
running, less often when many are) and the bytes that are new; the same on a shared file system (Ray),
where change notification does not reach the machine that watches.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from ..errors import closest, did_you_mean
from ..recordclass import Record
from ..records.ledger import Ledger
from ..records.ledger.trials import pruned_cause
from ..records.metrics import MAX_METRICS, MetricsReader, run_points
from ..records.paths import RunPaths, UnsafePathError
from ..sweep.expand import RunSpec, Sweep
from ..tuning.stopping import Asha, Curve, Median, Pausing, Rule, Verdict
from .pauses import COPYING, PAUSE, PAUSING, Pauses

# Seconds between looks at the running runs' metrics files: 20 ms, or 5 ms per watched run when
# more than 4 run at once (at most 200 opens a second, also on a slow shared file system). A run
# at a rung waits in report() for its verdict until the next look: at 0.1 s a pause took 0.1 s of
# its slot before anything of the run's end (bench/pause_free_bench.py: a median of 97 ms from a
# command's last report to its slot being free, 2 slots, 2 cores).
LOOK_INTERVAL = 0.02
LOOK_PER_RUN = 0.005


Value = float | list[float]  # a run's value at a rung: the metric's, or (several objectives) each one's


class _Watched(Record, frozen=False):
    spec: RunSpec
    rule: Rule
    reader: MetricsReader
    stopped: bool = False  # the rule stopped it: what it reports after that counts for nothing
    judged: float | None = None  # ASHA: the highest rung it went on from, not yet told to the run
    seen: bool = False  # it reported the rule's metric at least once
    last_step: float = float("-inf")  # a pausing method: the last step it reported (it waits at rungs past it)
    # A pausing method: what its earlier attempts reported up to the step it resumes from, not yet
    # told to the method (a kill -9 between a report and the look that reads it leaves such points).
    backlog: tuple[tuple[float, Value], ...] = ()
    resumed_at: float = float("-inf")  # a pausing method: the step this attempt went on from (points up to it are late)
    decided: Verdict | None = None  # a pausing method's verdict, reached when its snapshot was whole (not yet given)
    resume_checked: bool = False  # a resumed attempt's first report was checked against its resume step
    others: frozenset[str] = frozenset()  # the other metric names it reported (the reader keeps at most 100)
    steps_without: int = 0  # its reports at or past the rule's min_step without the metric


logger = logging.getLogger("gpu_task_scheduler")

# A run that reports a close spelling of the rule's metric at this many steps past min_step, but
# never the metric itself, is warned about at once (a typo); any other run that lacks it, at its end.
TYPO_STEPS = 3


# What one look reads of one run's metrics at most (some 25,000 lines: ~0.15 s of the loop's time): a
# run that writes faster is judged a look or two late, instead of holding the loop for seconds.
LOOK_BYTES = 1 << 20


class Stopper:
    def __init__(self, sweep: Sweep, ledger: Ledger, root: str) -> None:
        self._rules = sweep.stopping
        self._unjudged = sweep.unjudged
        self._ledger = ledger
        self._watched: dict[str, _Watched] = {}
        # ASHA, per stage: rung -> {run: its value there}; and per run: the rungs it has a value at.
        # MO-ASHA's value is each objective's (a list).
        self._rungs: dict[str | None, dict[float, dict[str, Value]]] = {}
        self._reached: dict[str, dict[float, Value]] = {}
        # The median rule, per stage: run -> its curve of the metric.
        self._curves: dict[str | None, dict[str, Curve]] = {}
        self._warned: set[tuple[str | None, str]] = set()  # (stage, metric): said once a sweep
        # The pausing methods (promotion ASHA, Hyperband): what runs next is theirs to say, too.
        self.pauses = Pauses(sweep, ledger, afresh=sweep.options.force_rerun, root=root)
        self._restore(root)

    @property
    def watching(self) -> bool:
        return bool(self._watched)

    @property
    def interval(self) -> float:
        """Seconds until the next look at the running runs' metrics files."""
        return max(LOOK_INTERVAL, LOOK_PER_RUN * len(self._watched))

    # --- what was recorded before this start ---------------------------------------

    def _restore(self, root: str) -> None:
        stages = self._ledger.run_stages()
        for name, stage in stages.items():
            rule = self._rules.get(stage)
            if isinstance(rule, Median):
                try:
                    paths = RunPaths.recorded(root, name)
                except UnsafePathError:
                    continue
                if paths.unsafe(records_only=True) is not None:  # its records reach outside its folder
                    continue
                curve = self._curves.setdefault(stage, {}).setdefault(name, Curve())
                for step, metrics in run_points(paths):  # across its attempts
                    if rule.metric in metrics:
                        curve.add(step, metrics[rule.metric], rule)
        for name, rung, value in self._recorded():
            if isinstance(self._rules.get(stages.get(name)), Asha):
                self._note_rung(stages.get(name), name, rung, value)

    def _recorded(self, name: str | None = None) -> Iterable[tuple[str, float, Value]]:
        """ASHA's recorded values at rungs (of the run ``name``): MO-ASHA's, each objective's."""
        several = self._ledger.verdict_objectives(name)
        for run, rung, _step, value, _stop, _cause in self._ledger.verdicts(name):
            yield run, rung, several.get((run, rung), value)

    def _note_rung(self, stage: str | None, name: str, rung: float, value: Value) -> None:
        self._rungs.setdefault(stage, {}).setdefault(rung, {})[name] = value
        self._reached.setdefault(name, {})[rung] = value

    def _forget_rungs(self, name: str) -> None:
        for rung in self._reached.pop(name, {}):
            for table in self._rungs.values():
                table.get(rung, {}).pop(name, None)

    # --- running runs ----------------------------------------------------------------

    def watch(self, spec: RunSpec, paths: RunPaths, resume_step: float | None = None) -> None:
        """A run of a stage with a rule started (its metrics file is new: an earlier attempt's was
        moved); ``resume_step``: it goes on from there, its curve up to it is its earlier attempts'."""
        rule = self._rules.get(spec.stage)
        if rule is None:
            return
        self._watched[spec.name] = _Watched(spec, rule, MetricsReader(paths.metrics, keep_points=True))
        if isinstance(rule, Asha):  # what the ledger keeps of it now (dropped if it starts afresh)
            self._forget_rungs(spec.name)
            for name, rung, value in self._recorded(spec.name):
                self._note_rung(spec.stage, name, rung, value)
            reached = self._reached.get(spec.name)
            self._watched[spec.name].judged = max(reached) if reached else None  # resumed: judged there
        elif isinstance(rule, Pausing):  # its method keeps its rungs; a resumed run was judged up to its step
            if resume_step is not None:
                watched = self._watched[spec.name]
                watched.last_step = watched.resumed_at = resume_step
                watched.backlog = tuple(_points(rule, (p for p in run_points(paths) if p[0] <= resume_step)))
                if rule.method == "pbt":  # only its checkpoint's step: a snapshot taken now is of that one
                    watched.backlog = watched.backlog[-1:]
        else:
            curve = self._curves.setdefault(spec.stage, {})[spec.name] = Curve()
            if resume_step is not None:
                for step, metrics in run_points(paths):
                    if step <= resume_step and rule.metric in metrics:
                        curve.add(step, metrics[rule.metric], rule)

    def held(self, name: str) -> Verdict | None:
        """The pause ``name``'s method holds it in, when an attempt of it starts all the same: one of an
        earlier start that a restarted scheduler follows (it still runs on a cluster), told to pause
        (a rung, an exploit, a turn) before that scheduler was killed, its end not heard. The pause
        is carried out on it now; its method resumes it as any paused run once it ended so. Its
        reports are judged no more (they were, before the kill)."""
        watched = self._watched.get(name)
        rung = self.pauses.paused_at(name) if watched is not None and isinstance(watched.rule, Pausing) else None
        if watched is None or rung is None:
            return None
        watched.stopped = True
        cause = self.pauses.pause_cause(name, rung, None)
        return Verdict(True, rung, float("nan"), f"{cause} (decided before the scheduler restarted)", rung, True)

    def owes_a_look(self, name: str) -> bool:
        """Whether ``name`` has points of an earlier attempt waiting to be judged (its backlog)."""
        watched = self._watched.get(name)
        return watched is not None and bool(watched.backlog)

    def look(self, name: str) -> Verdict | None:
        """Read what ``name`` reported since the last look; the verdict that stops it, if one does
        (written to the ledger, not yet committed)."""
        self._settle_copy()
        watched = self._watched.get(name)
        if watched is None or watched.stopped:
            return None
        verdict, watched.decided = watched.decided, None  # a snapshot's decision, once it was whole
        if verdict is None:
            verdict = self._read(watched, judge=name not in self._unjudged)
        watched.stopped = verdict is not None
        return verdict

    def _settle_copy(self, *, wait: bool = False) -> None:
        """A top member's snapshot, once its copy is whole: its decision recorded (Pauses.settle)
        and carried out as the decision it waited for (:meth:`_pausing`)."""
        settled = self.pauses.settle(wait=wait)
        if settled is None:
            return
        spec, rung, step, decision, value = settled
        watched = self._watched.get(spec.name)
        if watched is not None:
            watched.decided = self._carried_out(watched, rung, step, decision, value)

    def take_judged(self, name: str) -> float | None:
        """The highest ASHA rung ``name`` went on from since the last call, to tell the run (a Python
        run's ``report()`` waits at a rung until it knows, so that it trains no step it may not need)."""
        watched = self._watched.get(name)
        if watched is None:
            return None
        judged, watched.judged = watched.judged, None
        return judged

    def ended(self, name: str, *, stopped: bool = False) -> None:
        """The run ended: what it reported last still counts for the others (ASHA's rungs, the
        median rule's curves), but nothing it reported can stop it now. What a run the rule
        stopped reported after that (until it saw it was stopped) counts for nothing: the rule's
        tables stay what they would be had it stopped at once. ``stopped``: the scheduler stopped
        it (Ctrl-C, a timeout, a pause): one that had not reported yet is not said to report no
        metrics."""
        self._settle_copy()
        self.pauses.abandon(name)  # its snapshot, if one is still copied: recorded as none, before its end
        watched = self._watched.pop(name, None)
        if watched is not None and not watched.stopped:  # a stopped run's last reports came too late
            self._read(watched, judge=False)
            if not watched.seen and not stopped:  # one stopped (interrupted) before its first report is no typo
                self._warn_missing(watched, ended=True)

    def _check_resume(self, watched: _Watched, first: float) -> None:
        """A resumed attempt's first report at or before the step it went on from: it did not go
        on from its checkpoint (it ignores GTS_RESUME_STEP, or reports before it saves), and trains
        those steps again at every resume. Said once a run: in the log, `gts status` and the page."""
        name, resumed = watched.spec.name, watched.resumed_at
        if first > resumed:
            return
        span = f"steps {first:g} to {resumed:g}" if first < resumed else f"step {first:g}"
        what = (
            f"it trained {span} again, and will at every resume (does it load its checkpoint and go on from the "
            "step after GTS_RESUME_STEP? does it report before it saves?)"
        )
        text = (
            f"{name} resumed after step {resumed:g} (GTS_RESUME_STEP) but reported step {first:g} again: {what}. "
            "The checkpoint protocol: save into GTS_CHECKPOINT_DIR, then report that step; on resume, load it "
            "and train from the step after GTS_RESUME_STEP"
        )
        logger.warning("%s", text)
        self._ledger.note(name, text)

    def _warn_missing(self, watched: _Watched, *, ended: bool) -> None:
        """Say once per stage that runs do not report the rule's metric: a misspelt ``metric`` must
        not leave a whole grid unjudged without a word."""
        spec = watched.spec
        metric = _wanted(watched)
        if (spec.stage, metric) in self._warned or (ended and not watched.others and watched.reader.problem):
            return  # a metrics file that could not be read is warned about where it is read
        self._warned.add((spec.stage, metric))
        where = "early_stop" if spec.stage is None else f"stage {spec.stage!r}'s early_stop"
        if watched.others:
            what = f"reported {', '.join(repr(n) for n in sorted(watched.others)[:10])} but not {metric!r}"
        else:
            what = f"reported no metrics, so not {metric!r}"
        logger.warning(
            "%s %s%s, the metric %s judges by%s A run that does not report it is never stopped early "
            "(report it with report(step, %s=...) or as a key of a line in $GTS_METRICS_FILE)",
            spec.name,
            "ended having " if ended else "has ",
            what,
            where,
            did_you_mean(metric, watched.others) if watched.others else ".",
            metric,
        )

    def _read(self, watched: _Watched, *, judge: bool) -> Verdict | None:
        reader, rule = watched.reader, watched.rule
        reader.read(LOOK_BYTES)
        if reader.points and watched.resumed_at > float("-inf") and not watched.resume_checked:
            watched.resume_checked = True
            self._check_resume(watched, reader.points[0][0])
        found = _points(rule, reader.points or ())
        if watched.backlog:  # the earlier attempts' points first (the method skips a rung it has a value at)
            found[:0], watched.backlog = watched.backlog, ()
        if found:
            watched.seen = True
        elif reader.points and not watched.seen:
            if len(watched.others) < MAX_METRICS:
                watched.others |= {name for _, metrics in reader.points for name in metrics}
            watched.steps_without += sum(1 for step, _ in reader.points if step >= rule.min_step)
            if watched.steps_without >= TYPO_STEPS and closest(_wanted(watched), watched.others):
                self._warn_missing(watched, ended=False)
        if reader.points:
            reader.points.clear()  # the rules keep what they need; the reader keeps nothing
        if not found:
            return None
        if isinstance(rule, Asha):
            return self._asha(watched, rule, found, judge=judge)
        if isinstance(rule, Pausing):
            return self._pausing(watched, rule, found)
        assert isinstance(rule, Median)  # one metric: its values are numbers
        return self._median(watched.spec, rule, [(s, v) for s, v in found if not isinstance(v, list)], judge=judge)

    def _asha(
        self, watched: _Watched, rule: Asha, points: Iterable[tuple[float, Value]], *, judge: bool
    ) -> Verdict | None:
        spec = watched.spec
        table = self._rungs.setdefault(spec.stage, {})
        reached = self._reached.setdefault(spec.name, {})
        for step, value in points:
            rung = rule.rung_for(step, reached)
            if rung is None:
                continue
            others = [v for run, v in table.get(rung, {}).items() if run != spec.name]
            objectives: list[float] | None = None
            if isinstance(value, list):
                objectives, value_at = value, value[0]
                verdict = rule.judge_several(rung, step, value, [v for v in others if isinstance(v, list)])
            else:
                value_at = value
                verdict = rule.judge(rung, step, value, [v for v in others if not isinstance(v, list)])
            stop = verdict.stop and judge
            self._note_rung(spec.stage, spec.name, rung, value)
            self._ledger.record_verdict(
                spec.name,
                rung=rung,
                step=step,
                value=value_at,
                stop=stop,
                cause=verdict.cause if stop else "",
                objectives=objectives,
            )
            if stop:
                return verdict
            watched.judged = rung
        return None

    def _pausing(self, watched: _Watched, rule: Pausing, points: Iterable[tuple[float, Value]]) -> Verdict | None:
        """Each value at a rung the run had none at goes to its method, which says whether it goes on;
        a run that goes on is told so up to the step it reported (report() waits at every rung of
        the rule, and a Hyperband bracket judges at some of them only)."""
        points = list(points)
        for index, (step, value) in enumerate(points):
            if self.pauses.copying:  # told once the snapshot being copied is whole, in their order
                watched.backlog = (*points[index:], *watched.backlog)
                return None
            # A point of an earlier attempt is told late: the run trains past it already, so no
            # snapshot of its checkpoint can be of that step (population-based training).
            decided = self.pauses.reached(watched.spec, step, value, late=step <= watched.resumed_at)
            if decided is not None and decided[1] == COPYING:  # it waits in report() for the copy
                watched.backlog = (*points[index + 1 :], *watched.backlog)
                return None
            if decided is not None:
                verdict = self._carried_out(watched, decided[0], step, decided[1], value)
                if verdict is not None:
                    return verdict
            else:
                self._went_on(watched, step)
        return None

    def _carried_out(self, watched: _Watched, rung: float, step: float, decision: str, value: Value) -> Verdict | None:
        """A pausing method's decision at ``rung``: the verdict that pauses the run, or None (it goes on)."""
        if decision == PAUSE or decision in PAUSING:
            cause = self.pauses.pause_cause(watched.spec.name, rung, value)
            first = value[0] if isinstance(value, list) else value
            return Verdict(True, step, first, cause, rung=rung, pause=True)
        self._went_on(watched, step)
        return None

    @staticmethod
    def _went_on(watched: _Watched, step: float) -> None:
        rule = watched.rule
        assert isinstance(rule, Pausing)
        if rule.crossed(watched.last_step, step):
            watched.judged = step
        watched.last_step = max(watched.last_step, step)

    def _median(
        self, spec: RunSpec, rule: Median, points: Iterable[tuple[float, float]], *, judge: bool
    ) -> Verdict | None:
        curves = self._curves.setdefault(spec.stage, {})
        curve = curves.setdefault(spec.name, Curve())
        for step, value in points:
            curve.add(step, value, rule)
        if not judge or curve.best is None or curve.last_step is None:
            return None
        # Judged at the last point of each look (a few times a second), so that what a decision
        # costs does not grow with how often the run reports.
        step = curve.last_step
        others = [c for run, c in curves.items() if run != spec.name]
        verdict = rule.judge(step, value, curve.best, others)
        if verdict.stop:
            self._ledger.record_verdict(spec.name, rung=step, step=step, value=value, stop=True, cause=verdict.cause)
            return verdict
        return None


def _points(rule: Rule, reports: Iterable[tuple[float, dict[str, float]]]) -> list[tuple[float, Value]]:
    """The reports that are points of ``rule``: of its metric, or (several objectives) of every one."""
    return [(step, value) for step, metrics in reports for value in (rule.value_in(metrics),) if value is not None]


def _wanted(watched: _Watched) -> str:
    """The metric a run's reports lack: the rule's, or (MO-ASHA) the first objective it never reported."""
    rule = watched.rule
    if rule.objectives:
        return next((m for m in rule.metrics if m not in watched.others), rule.metric)
    return rule.metric


def cause_of(verdict: Verdict) -> str:
    """``pruned at step 3: loss 1.92, rung cutoff 0.87``."""
    return pruned_cause(verdict.step, verdict.cause)
