"""The kill battery on population-based training of real frameworks: the test suite's framework PBT
sweeps (``tests/test_integration_sweeps.py``: a Lightning script with a cosine LR schedule, a
``Trainer`` script with its linear one, a Keras script with a ``CosineDecay``; 4 members, 2 slots,
an exploit every 2 epochs, 6 epochs) run by ``gts run`` and SIGKILLed at random moments, again and
again, then run to their end.

    python bench/pbt_framework_kills.py [--frameworks lightning,transformers,keras] [--seeds 3]
                                        [--kills 4] [--within 2,10]

The suite kills these sweeps at two held points (a pause committed, a donor's checkpoint put in
place); this kills them where the clock says, ``--kills`` times a seed, each after a time drawn
from ``--within`` seconds of its start (the runs' imports included). Printed per framework and
seed: the kills made, then what the suite's test checks of the sweep that ended: every member
succeeded; each attempt trained on from the step of the checkpoint it restored, each step once, in
order, to the last; at every optimizer step the rate was the member's own times the schedule's
factor there (after a copy too); a copied member's log says so; the copies audited against PBT's
copy rule (``records/lineage.copy_faults``). A failed check is printed with what it saw.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.join(os.path.dirname(HERE), "tests")
sys.path[:0] = [TESTS, os.path.dirname(HERE)]

import test_integration_sweeps as sweeps  # noqa: E402 (the suite's sweeps and checks)
from run_side import ONE_THREAD  # noqa: E402

from gpu_task_scheduler.records.metrics import attempt_files, run_points  # noqa: E402
from gpu_task_scheduler.records.paths import RunPaths  # noqa: E402


def _processes_under(folder: str) -> list[int]:
    """The pids of the processes whose working folder is in ``folder`` (a sweep's runs)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.readlink(f"/proc/{entry}/cwd").startswith(folder):
                    found.append(int(entry))
            except OSError:
                continue
    return found


def _kill(pids: list[int]) -> None:
    """SIGKILL these processes (the sweep's own, found by :func:`_processes_under`)."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _gts(path: Path, folder: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "gpu_task_scheduler", "run", str(path), "--plain"],
        cwd=str(folder),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, **ONE_THREAD},
        start_new_session=True,
    )


def battery(name: str, seed: int, kills: int, within: tuple[float, float], folder: Path) -> tuple[int, list[str]]:
    """One sweep of ``name`` killed ``kills`` times at moments ``seed`` draws, then run to its end:
    the kills made and the checks that failed (empty: all held)."""
    rng = random.Random(seed)
    path = sweeps._pbt_sweep(folder, name)
    root = folder / "results"
    made = 0
    for _ in range(kills):
        scheduler = _gts(path, folder)
        try:
            scheduler.wait(timeout=rng.uniform(*within))
            break  # it ended before its moment
        except subprocess.TimeoutExpired:
            scheduler.send_signal(signal.SIGKILL)  # the scheduler only: its runs end by their lifeline
            scheduler.wait()
            made += 1
        deadline = time.monotonic() + 60
        while _processes_under(str(folder)) and time.monotonic() < deadline:
            time.sleep(0.2)  # the runs are not this process's children: nothing to wait on but /proc
        left = _processes_under(str(folder))
        if left:
            _kill(left)  # none left behind, whatever the battery finds
            return made, [f"runs still alive 60 s after the scheduler's kill: {left}"]
    last = _gts(path, folder)
    try:
        ended = last.wait(timeout=900)
    except subprocess.TimeoutExpired:
        _kill(_processes_under(str(folder)))
        last.wait()
        return made, ["the last gts run did not end within 900 s"]
    if ended != 0:
        return made, [f"the last gts run exited {ended}"]
    failed = []
    _, _, _, schedule, _, said = sweeps.PBT_FRAMEWORKS[name]
    checks = [
        ("trained at its own rate", lambda: sweeps._check_members_trained_at_their_own_rates(root, schedule, said)),
        ("copy rule", lambda: _no_faults(root)),
        ("each step once", lambda: _each_step_once(root)),
    ]
    for what, check in checks:
        try:
            check()
        except AssertionError as error:
            failed.append(f"{what}: {str(error)[:600] or traceback.format_exc(limit=2)}")
    return made, failed


def _no_faults(root: Path) -> None:
    faults = sweeps._copy_faults(root)
    assert faults == [], faults


def _each_step_once(root: Path) -> None:
    for name, row in sweeps.ledger_rows(root).items():
        for path in attempt_files(RunPaths(row["work_dir"], None)):
            with open(path) as handle:
                steps = [json.loads(line)["step"] for line in handle if line.strip()]
            assert steps == sorted(set(steps)), (name, path, steps)
        curve = [step for step, _ in run_points(RunPaths(row["work_dir"], None))]
        assert curve == sorted(set(curve)) and curve[-1] == sweeps.PBT_EPOCHS, (name, curve)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--frameworks", default=",".join(sweeps.PBT_FRAMEWORKS))
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--first-seed", type=int, default=1)
    parser.add_argument("--kills", type=int, default=4)
    parser.add_argument(
        "--within", default="2,10", help="seconds after a start: the range a kill's moment is drawn from"
    )
    args = parser.parse_args()
    low, high = (float(part) for part in args.within.split(","))
    print(f"{'framework':<13} {'seed':>4} {'kills':>5} {'wall s':>7}  checks")
    for name in args.frameworks.split(","):
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            with tempfile.TemporaryDirectory(prefix=f"gts-pbt-kills-{name}-") as folder:
                start = time.perf_counter()
                made, failed = battery(name, seed, args.kills, (low, high), Path(folder))
                wall = time.perf_counter() - start
            print(f"{name:<13} {seed:>4} {made:>5} {wall:>7.1f}  {'all held' if not failed else 'FAILED'}", flush=True)
            for line in failed:
                print(f"    {line}")


if __name__ == "__main__":
    main()
