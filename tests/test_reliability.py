"""The reliability battery: kills at random moments, crash table, hostile input,
fuzzed configs, concurrent schedulers and storage faults."""

import itertools
import json
import math
import os
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile

import gts_test_broken_import
import gts_test_tasks as tasks
import pytest
from conftest import marked_pids, wait_until
from helpers import journal_lines, ledger_rows, make_config
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from test_process_control import finish, launch, started

from gpu_task_scheduler import (
    ConfigError,
    ConfigManager,
    GPUTaskScheduler,
    GTSError,
    LedgerError,
    RunStatus,
    SchedulerBusyError,
    Sweep,
)
from gpu_task_scheduler.gpu_task import GPUTask
from gpu_task_scheduler.records.ledger import Ledger

# The battery runs this test with other seeds too: GTS_KILL_SEED=711 python -m pytest -k sigkill
KILL_SEED = int(os.environ.get("GTS_KILL_SEED", "20261122"))
RUNS = 60  # long enough that no launch gets far before the next kill, however fast the machine
KILLS = 25


WARM_SCRIPT = """import sys, time
journal, i = sys.argv[1], sys.argv[2]
with open(journal, "a") as handle:
    handle.write(f"start i-{i},\\n")
time.sleep(0.1)
with open(journal, "a") as handle:
    handle.write(f"end i-{i},\\n")
"""


@pytest.mark.parametrize("kind", ["python", "python-cold", "command", "warm-command", "stages"])
def test_sigkill_at_random_moments_loses_and_repeats_nothing(in_tmp, no_leaked_processes, kind):
    rng = random.Random(KILL_SEED)
    root, journal = in_tmp / "r", str(in_tmp / "journal")
    config = make_config(
        root,
        [{"i": list(range(RUNS))}],
        slots=("cpu", "cpu"),
        global_config={"journal": journal, "sleep": 0.1},
        scheduler_log_file_path=None,
    )
    task = "RecordTask"
    if kind == "python-cold":  # the GPUTask runs started as fresh processes, as without warm starts
        config["scheduler_config"]["prewarm"] = False
    if kind == "command":  # no Python in the run: the command wrapper records the success
        script = 'echo "start i-$1," >> "$0"; sleep 0.1; echo "end i-$1," >> "$0"'
        config["command"], task = ["sh", "-c", script, journal, "{i}"], "-"
    if kind == "warm-command":  # a Python script: forked from the warm process (backends/local/zygote.py)
        (in_tmp / "journaled.py").write_text(WARM_SCRIPT)
        config["command"], task = [sys.executable, str(in_tmp / "journaled.py"), journal, "{i}"], "-"
    names = [f"i-{i}," for i in range(RUNS)]
    if kind == "stages":  # half the runs wait for the other half: no eval run may start before its train run ended
        script = 'echo "start $1" >> "$0"; sleep 0.1; echo "end $1" >> "$0"'
        half = {"test_config": [{"i": list(range(RUNS // 2))}], "command": ["sh", "-c", script, journal, "{run_name}"]}
        config["stages"] = [{"name": "train", **half}, {"name": "eval", "after": "train", **half}]
        del config["test_config"]
        task = "-"
        names = [f"{stage}.i-{i}," for stage in ("train", "eval") for i in range(RUNS // 2)]
    kills = 0
    ended = {}  # a run whose success its folder recorded -> its "end" lines then: never one more
    for _ in range(KILLS):
        scheduler = launch(config, task)
        try:
            scheduler.wait(timeout=rng.uniform(0.05, 0.5))  # a random moment to strike
        except subprocess.TimeoutExpired:
            scheduler.kill()
            kills += 1
        finish(scheduler)
        wait_until(
            lambda: not marked_pids(no_leaked_processes),
            timeout=5,
            message="the killed scheduler's runs to die with it",
        )
        lines = journal_lines(journal)
        for name in _recorded_successes(root, names):
            ended.setdefault(name, lines.count(f"end {name}"))
        if (root / ".gts" / "ledger.sqlite3").exists():
            statuses = [row["status"] for row in ledger_rows(root).values()]
            assert statuses.count("running") <= 2  # never more runs at once than slots
    last = launch(config, task)
    output = finish(last, timeout=120)
    assert last.returncode == 0, output
    assert kills >= 15, f"only {kills} of {KILLS} launches were killed; the sweep is too short"
    lines = journal_lines(journal)
    ends = {name: lines.count(f"end {name}") for name in names}
    assert all(ends.values()), ends  # none lost
    # Nothing run again once it ended: a run whose folder recorded its success (the runner's, or the
    # command wrapper's, outcome file: what the next start adopts) never ends a second time.
    assert {name: ends[name] for name in ended} == ended, ended
    # A run ends twice only where a kill cut its attempt short after its last write and before its
    # process exited (it was running: the lifeline killed it, and its success was never recorded):
    # at most one such attempt per kill. test_keeper.py freezes a wrapper at each of those points.
    assert sum(ends.values()) - RUNS <= kills and all(count <= 2 for count in ends.values()), ends
    for i in range(RUNS // 2 if kind == "stages" else 0):
        assert lines.index(f"end train.i-{i},") < lines.index(f"start eval.i-{i},")
    rows = ledger_rows(root)
    assert sorted(rows) == sorted(names)
    assert {row["status"] for row in rows.values()} == {"succeeded"}
    starts = sum(line.startswith("start") for line in lines)
    print(f"survived {kills} SIGKILLs; {starts} starts for {RUNS} runs")


def _recorded_successes(root, names):
    """The runs whose folder holds a success outcome file (written once the run's process ended)."""
    found = set()
    for name in names:
        try:
            with open(root / name / ".gts" / "outcome.json") as handle:
                outcome = json.load(handle)
        except (OSError, ValueError):
            continue
        if isinstance(outcome, dict) and outcome.get("status") == "succeeded":
            found.add(name)
    return found


def test_an_attempt_that_succeeded_after_its_start_was_settled_is_not_run_again(in_tmp):
    """A cluster's attempt outlives the start that followed it: the next start may settle it as
    interrupted while it runs, then be killed before following it. The attempt then ends with
    success (its folder's outcome file, with its token): no later start may run it a second time.
    An interrupted run whose folder holds another attempt's outcome runs again."""
    root, journal = in_tmp / "r", in_tmp / "journal"
    config = make_config(root, [{"i": [0, 1]}], scheduler_log_file_path=None)
    config["command"] = ["sh", "-c", 'echo "$0" >> "$1"', "{i}", str(journal)]
    assert GPUTaskScheduler(config).start().ok
    with sqlite3.connect(root / ".gts" / "ledger.sqlite3") as db:  # what the killed start had recorded
        db.execute("UPDATE runs SET status = 'interrupted', cause = 'the scheduler stopped while the run was active'")
        db.execute("UPDATE runs SET token = 'another attempt' WHERE name = 'i-1,'")
    summary = GPUTaskScheduler(config).start()
    assert summary.skipped == ["i-0,"] and [outcome.name for outcome in summary.succeeded] == ["i-1,"]
    assert journal_lines(journal) == ["0", "1", "1"]
    rows = ledger_rows(root)
    assert {name: (row["status"], row["attempts"], row["cause"]) for name, row in rows.items()} == {
        "i-0,": ("succeeded", 1, None),
        "i-1,": ("succeeded", 2, None),
    }


def test_a_run_whose_attempt_a_cluster_still_runs_is_left_to_be_followed(in_tmp):
    """settle_running leaves alone a run whose recorded attempt the launcher says is still live
    (its start follows it); the others it settles."""
    from gpu_task_scheduler.records.paths import RootPaths
    from gpu_task_scheduler.records.prior import settle_running

    with Ledger(RootPaths(str(in_tmp / "r"))) as ledger:
        for name in ("live", "gone", "retried"):
            work_dir = str(in_tmp / "r" / name)  # a run's folder is always its name's in the root
            ledger.mark_running(name=name, run_index=0, config_hash="h", slot="s", token=f"t-{name}", work_dir=work_dir)
        live = {"live": "t-live", "retried": "a later attempt's token"}
        settle_running(ledger, live.get)
        assert {r.name: r.status.value for r in ledger.records()} == {
            "live": "running",
            "gone": "interrupted",
            "retried": "interrupted",
        }
        # The start that follows the live attempt records it again, under its token: one attempt.
        again = {"run_index": 0, "config_hash": "h", "slot": "s"}
        assert ledger.mark_running(name="live", token="t-live", work_dir=str(in_tmp / "r" / "live"), **again) == 1
        assert (
            ledger.mark_running(name="gone", token="a new attempt", work_dir=str(in_tmp / "r" / "gone"), **again) == 2
        )


def test_a_followed_attempt_went_on_from_the_step_recorded_at_its_start_not_from_where_it_is(in_tmp):
    """An attempt a restarted scheduler follows (it still runs on a cluster) went on from the step
    recorded when it started (``went_on_from``), not from its last report (``last_step``, where the
    next attempt goes on from): taken for the latter, its earlier reports read as trained again and
    its report at a PBT interval as a late one, never judged (a pool sweep waited 120 s on it)."""
    from gpu_task_scheduler.records.paths import RunPaths
    from gpu_task_scheduler.records.resume import last_step, note_resume, went_on_from

    paths = RunPaths(str(in_tmp / "r" / "lr-1.0,"), None)
    note_resume(paths, None)
    os.makedirs(paths.meta)
    assert went_on_from(paths) is None and last_step(paths) is None  # a first attempt: from step 0
    with open(paths.metrics, "w") as handle:
        handle.writelines(json.dumps({"step": step, "loss": 1 / step}) + "\n" for step in range(1, 9))
    assert went_on_from(paths) is None and last_step(paths) == 8
    note_resume(paths, 4.0)  # an attempt that went on from step 4 and has reported up to 8 since
    assert went_on_from(paths) == 4 and last_step(paths) == 8


def test_a_new_ledger_is_created_without_syncs_and_then_commits_as_any_other(in_tmp):
    """Creating a ledger syncs nothing (it holds nothing a power loss could take); from then on, and
    when it is opened again, it commits with synchronous=NORMAL like every ledger (1 in SQLite's terms)."""
    from gpu_task_scheduler.records.paths import RootPaths

    for _ in ("created", "opened again"):
        with Ledger(RootPaths(str(in_tmp / "r"))) as ledger:
            assert ledger._db.execute("PRAGMA synchronous").fetchone()[0] == 1
            assert ledger._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_only_a_new_ledger_is_created_with_synchronous_off(in_tmp, monkeypatch):
    """The statements a ledger's opening sends SQLite: synchronous=OFF before a new ledger's schema
    and NORMAL once it is written; an existing ledger is opened with NORMAL from the start."""
    import sqlite3 as sqlite

    from gpu_task_scheduler.records.paths import RootPaths

    sent: list[str] = []
    connect = sqlite.connect

    def traced(*args, **kwargs):
        db = connect(*args, **kwargs)
        db.set_trace_callback(lambda statement: sent.append(" ".join(statement.split())))
        return db

    monkeypatch.setattr(sqlite, "connect", traced)
    pragmas = []
    for _ in ("created", "opened again"):
        sent.clear()
        with Ledger(RootPaths(str(in_tmp / "r"))):
            pass
        schema = next(i for i, s in enumerate(sent) if s.startswith("CREATE TABLE IF NOT EXISTS"))
        pragmas.append([(i < schema, s) for i, s in enumerate(sent) if s.startswith("PRAGMA synchronous=")])
    assert pragmas == [
        [(True, "PRAGMA synchronous=OFF"), (False, "PRAGMA synchronous=NORMAL")],
        [(True, "PRAGMA synchronous=NORMAL")],
    ]


def _stopped_by_the_rule(root):
    """The runs with a recorded stop verdict (the ledger read directly; none before it exists)."""
    path = root / ".gts" / "ledger.sqlite3"
    if not path.exists():
        return set()
    with sqlite3.connect(path) as db:
        if not db.execute("SELECT 1 FROM sqlite_master WHERE name = 'verdicts'").fetchall():
            return set()
        return {name for (name,) in db.execute("SELECT name FROM verdicts WHERE stop = 1")}


def test_sigkill_with_early_stopping_repeats_no_pruned_run_and_prunes_the_same_runs(in_tmp, no_leaked_processes):
    rng = random.Random(KILL_SEED)

    def config(root):
        return {
            **make_config(
                root,
                [{"start": [1.0], "floor": [0.1, 0.2, 0.3, 0.5], "decay": [0.5, 0.8, 0.95]}],
                # 0.04 s a step: the kills must come while the sweep still runs. With 0.01, once
                # verdicts came every 20 ms (0.1 s before), the sweep ran out after 5 of the 25
                # launches (a fresh-clone CI run: "only 5 of 25 launches were killed").
                global_config={"steps": 27, "pause": 0.04, "journal": f"{root}.journal"},
                scheduler_log_file_path=None,
            ),
            "early_stop": {"method": "asha", "metric": "loss", "mode": "min", "min_step": 1, "max_step": 27},
        }

    uninterrupted = launch(config(in_tmp / "once"), "CurveTask")
    finish(uninterrupted, timeout=120)
    expected = {name for name, row in ledger_rows(in_tmp / "once").items() if row["status"] == "pruned"}
    assert 3 <= len(expected) < 12
    root, journal = in_tmp / "r", f"{in_tmp / 'r'}.journal"
    stopped_at: dict[str, int] = {}  # a run the rule stopped -> the journal's length when that was seen
    kills = 0
    for _ in range(KILLS):
        scheduler = launch(config(root), "CurveTask")
        try:
            scheduler.wait(timeout=rng.uniform(0.05, 0.5))
        except subprocess.TimeoutExpired:
            scheduler.kill()
            kills += 1
        finish(scheduler)
        wait_until(lambda: not marked_pids(no_leaked_processes), timeout=5, message="the runs to die")
        for name in _stopped_by_the_rule(root):
            stopped_at.setdefault(name, len(journal_lines(journal)))
    last = launch(config(root), "CurveTask")
    output = finish(last, timeout=120)
    assert last.returncode == 0, output
    assert kills >= 15, f"only {kills} of {KILLS} launches were killed; the sweep is too short"
    rows = ledger_rows(root)
    assert {name for name, row in rows.items() if row["status"] == "pruned"} == expected
    assert {row["status"] for name, row in rows.items() if name not in expected} == {"succeeded"}
    lines = journal_lines(journal)
    for name, seen in stopped_at.items():
        assert f"start {name}" not in lines[seen:], f"{name} ran again after the rule stopped it"
    for name in set(rows) - expected:
        assert lines.count(f"end {name}") == 1


def test_a_tpe_search_killed_twice_ends_with_exactly_its_budget(in_tmp, no_leaked_processes):
    optuna = pytest.importorskip("optuna")
    root, journal = in_tmp / "r", str(in_tmp / "journal")
    config = make_config(
        root,
        [{"x1": {"uniform": [-5, 10]}, "x2": {"uniform": [0, 15]}}],
        slots=("cpu",) * 4,
        global_config={"journal": journal, "sleep": 0.1},
        scheduler_log_file_path=None,
    )
    config["search"] = {"sampler": "tpe", "n_runs": 40, "seed": 0, "metric": "value", "mode": "min"}
    for at_least in (8, 20):  # kill -9 once some runs ended, then again later
        scheduler = launch(config, "BraninTask")
        wait_until(
            lambda at_least=at_least: sum(line.startswith("end ") for line in journal_lines(journal)) >= at_least,
            timeout=60,
            message=f"{at_least} runs to end",
        )
        scheduler.kill()
        finish(scheduler)
        wait_until(lambda: not marked_pids(no_leaked_processes), timeout=5, message="the runs to die")
    last = launch(config, "BraninTask")
    output = finish(last, timeout=120)
    assert last.returncode == 0, output
    rows = ledger_rows(root)
    assert len(rows) == 40 and {row["status"] for row in rows.values()} == {"succeeded"}
    storage = optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(root / ".gts" / "optuna.journal"))
    )
    trials = optuna.load_study(study_name="gts", storage=storage).trials
    complete = [t for t in trials if t.state.name == "COMPLETE"]
    assert sorted(t.user_attrs["gts_run"] for t in complete) == sorted(rows)  # each run told once, none lost
    # A trial asked by a killed scheduler before it had all its values ran nothing: told failed.
    assert all(t.state.name == "FAIL" and "gts_run" not in t.user_attrs for t in trials if t not in complete)
    ends = [line.split(" ", 1)[1] for line in journal_lines(journal) if line.startswith("end ")]
    assert set(ends) == set(rows)


def test_ctrl_c_reaches_the_runs_own_subprocesses(in_tmp, no_leaked_processes):
    root = in_tmp / "r"
    scheduler = launch(make_config(root, [{"hang": [True]}], grace_period=5), "GrandchildTask")
    pid_file = root / "hang-True," / "grandchild.pid"
    wait_until(pid_file.exists, message="the grandchild to start")
    grandchild = int(pid_file.read_text())
    scheduler.send_signal(signal.SIGINT)
    finish(scheduler)
    assert scheduler.returncode == -signal.SIGINT
    wait_until(lambda: grandchild not in marked_pids(no_leaked_processes), timeout=5, message="the grandchild to die")
    assert ledger_rows(root)["hang-True,"]["status"] == "interrupted"


def test_a_run_killed_from_outside_is_recorded_with_the_signal(in_tmp):
    root = in_tmp / "r"
    scheduler = launch(make_config(root, [{"a": [1]}]), "BlockTask")
    wait_until(lambda: started(root, "a-1,"), message="the run to start")
    os.kill(int((root / "a-1," / "started").read_text()), signal.SIGKILL)
    output = finish(scheduler)
    assert scheduler.returncode == 1, output
    row = ledger_rows(root)["a-1,"]
    assert (row["status"], row["signal"], row["exit_code"]) == ("failed", "SIGKILL", None)
    assert "fails task a-1, (killed by SIGKILL)" in output


@pytest.mark.parametrize(
    "task, cause",
    [
        (tasks.SelfDeletingTask, "the run folder disappeared"),
        (
            tasks.UnpicklableStateTask,
            "the task could not be loaded in the run's process: RuntimeError: cannot restore this task",
        ),
        (
            gts_test_broken_import.BrokenImportTask,
            "the task could not be loaded in the run's process: ImportError: No module named 'cuda_only_dependency'",
        ),
        (tasks.FullDiskTask, "OSError: [Errno 27] File too large"),
    ],
)
def test_more_failures_are_recorded_with_their_cause(in_tmp, task, cause):
    root = in_tmp / "r"
    summary = GPUTaskScheduler(make_config(root, [{"a": [1]}]), task).start()
    (failed,) = summary.failed
    assert failed.status is RunStatus.FAILED and failed.cause == cause
    assert ledger_rows(root)["a-1,"]["cause"] == cause
    assert summary.exit_code == 1 and cause in summary.report()


def test_a_run_printing_100_mb_is_fine(in_tmp):
    root = in_tmp / "r"
    summary = GPUTaskScheduler(make_config(root, [{"a": [1, 2]}], slots=("cpu", "cpu")), tasks.HugeOutputTask).start()
    assert len(summary.succeeded) == 2
    assert os.path.getsize(root / "a-1," / "worker.log") > 100 * 1024 * 1024
    assert summary.succeeded[0].log_tail == ""  # kept only where it explains a failure; the ledger has it
    assert ledger_rows(root)["a-1,"]["log_tail"].endswith("done printing")
    assert len(ledger_rows(root)["a-1,"]["log_tail"]) < 20 * 1024


HOSTILE = [
    "../../../../etc/passwd",
    "/",
    "..",
    ".",
    "a/b/../../..",
    "nul\0byte",
    "new\nline\r\n",
    "x" * 10_000,
    "; rm -rf ~",
    "$(touch pwned)",
    "`touch pwned`",
    "| cat /etc/shadow",
    "\u202eevil\u202c",
    "😀" * 300,
    "%2F",
    "%00",
    "~",
    "-",
    "--help",
    " ",
    "",
]


@pytest.mark.parametrize("shell", [False, True])
def test_hostile_values_never_run_in_command_sweeps(in_tmp, shell):
    values = [v for v in HOSTILE if "\0" not in v]  # a NUL cannot be passed to any program
    command = (
        'printf \'%s\' "{v}" > "{work_dir}/v.txt"'
        if shell
        else ["sh", "-c", 'printf "%s" "$1" > "$2/v.txt"', "sh", "{v}", "{work_dir}"]
    )
    config = make_config(
        in_tmp / "r",
        [{"v": values}],
        slots=("cpu", "cpu"),
        config_string_value_maxlen=None,
        scheduler_log_file_path=None,
    )
    config.update(command=command, shell=shell)
    summary = GPUTaskScheduler(config).start()
    assert summary.ok and len(summary.succeeded) == len(values)
    written = sorted((in_tmp / "r" / o.name / "v.txt").read_bytes().decode() for o in summary.succeeded)
    assert written == sorted(values)
    assert sorted(os.listdir(in_tmp)) == ["r"] and not (in_tmp / "pwned").exists()


def test_hostile_values_and_keys_are_contained_unique_and_stable(in_tmp):
    root = in_tmp / "r"
    config = make_config(
        root,
        [{"v": HOSTILE}, {"../k": [1], "k/../../x": ["y"]}, {"k\0ey": ["z" * 500]}],
        slots=("cpu", "cpu"),
        config_string_value_maxlen=None,
    )
    first = GPUTaskScheduler(config, tasks.RecordTask).start()
    assert len(first.succeeded) == len(HOSTILE) + 2 and first.ok
    names = [o.name for o in first.succeeded]
    assert len(set(names)) == len(names)
    for outcome in first.succeeded:
        folder = os.path.realpath(outcome.work_dir)
        assert os.path.dirname(folder) == os.path.realpath(root) or folder == os.path.realpath(root)
        assert len(os.path.basename(folder).encode()) <= 255
    assert sorted(os.listdir(in_tmp)) == ["r"] and not (in_tmp / "pwned").exists()
    assert [run.name for run in Sweep(config)] == [run.name for run in Sweep(config)]
    again = GPUTaskScheduler(config, tasks.RecordTask).start()
    assert not again.outcomes and len(again.skipped) == len(HOSTILE) + 2


# --- fuzzed configs -------------------------------------------------------------

scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=12), st.binary(max_size=4))
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6,
)
keys = st.one_of(st.text(max_size=8), st.integers(), st.none())
gpu_entry = st.one_of(
    st.sampled_from(["0", "1", "cpu", "GPU-abc", "MIG-1/2", "0,1", "", "x"]),
    st.integers(-2, 9),
    st.lists(st.one_of(st.text(max_size=3), st.integers(-1, 3)), max_size=3),
    values,
)
option_names = [
    "force_rerun",
    "config_string_value_maxlen",
    "ignored_keys_for_folder_name",
    "max_retries",
    "ignored_characters_for_folder_name",
    "result_root_folder",
    "timeout",
    "grace_period",
    "log_file",
    "scheduler_log_file_path",
    "test_config_string_indicator",
    "skip_existing_folders",
    "forse_rerun",
]
scheduler_configs = st.one_of(
    st.fixed_dictionaries(
        {},
        optional={"gpu": st.one_of(st.lists(gpu_entry, max_size=3), values), **{name: values for name in option_names}},
    ),
    values,
)
blocks = st.lists(
    st.one_of(st.dictionaries(keys, st.one_of(st.lists(values, max_size=3), values), max_size=3), values), max_size=3
)
anything = st.one_of(
    st.fixed_dictionaries(
        {},
        optional={
            "scheduler_config": scheduler_configs,
            "global_config": st.one_of(st.dictionaries(keys, values, max_size=3), values),
            "test_config": st.one_of(blocks, values),
            "extra": values,
        },
    ),
    values,
)
# Mostly valid configs with hostile keys and values, so that expansion and naming get exercised too.
good_slots = st.lists(
    st.one_of(
        st.sampled_from(["0", "1", "cpu", "GPU-ab12", "MIG-3/1/0", "0,1"]),
        st.integers(0, 9),
        st.lists(st.sampled_from(["0", "1", "2"]), min_size=1, max_size=2, unique=True),
    ),
    min_size=1,
    max_size=3,
)
good_options = {
    "force_rerun": st.booleans(),
    "config_string_value_maxlen": st.one_of(st.none(), st.integers(1, 60)),
    "ignored_keys_for_folder_name": st.lists(st.text(min_size=1, max_size=4), max_size=2),
    "ignored_characters_for_folder_name": st.lists(st.text(min_size=1, max_size=2), max_size=3),
    "test_config_string_indicator": st.text(max_size=3),
    "test_config_string_separator": st.text(max_size=3),
    "skip_existing_folders": st.booleans(),
    "max_retries": st.integers(0, 3),
    "timeout": st.one_of(st.none(), st.floats(0.1, 1e6)),
    "grace_period": st.floats(0, 100),
    "log_file": st.one_of(st.none(), st.sampled_from(["worker.log", "logs/out.txt"])),
    "scheduler_log_file_path": st.one_of(st.none(), st.sampled_from(["s.log", "logs/s.log"])),
}
near_valid = st.fixed_dictionaries(
    {
        "scheduler_config": st.fixed_dictionaries(
            {"gpu": good_slots},
            optional={name: st.one_of(strategy, strategy, values) for name, strategy in good_options.items()},
        )
    },
    optional={
        "global_config": st.dictionaries(st.text(min_size=1, max_size=6), values, max_size=3),
        "test_config": st.lists(
            st.dictionaries(st.text(min_size=1, max_size=8), st.lists(values, min_size=1, max_size=3), max_size=3),
            max_size=3,
        ),
    },
)
configs = st.one_of(near_valid, anything)


def _number(value, low, *, strict):
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and (value > low if strict else value >= low)
    )


def _count(value, low):
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def _path_text(value):
    return isinstance(value, str) and value != "" and "\0" not in value


# An oracle written apart from the validation code: what each fuzzed option may be. An accepted
# config must satisfy it, so a check removed from sweep.py shows up as an accepted bad value.
OPTION_ORACLE = {
    "force_rerun": lambda v: isinstance(v, bool),
    "skip_existing_folders": lambda v: isinstance(v, bool),
    "config_string_value_maxlen": lambda v: v is None or _count(v, 1),
    "ignored_keys_for_folder_name": lambda v: isinstance(v, (list, tuple)) and all(isinstance(x, str) and x for x in v),
    "ignored_characters_for_folder_name": lambda v: (
        isinstance(v, (list, tuple)) and all(isinstance(x, str) and x for x in v)
    ),
    "max_retries": lambda v: _count(v, 0),
    "result_root_folder": _path_text,
    "scheduler_log_file_path": lambda v: v is None or _path_text(v),
    "timeout": lambda v: v is None or _number(v, 0, strict=True),
    "grace_period": lambda v: _number(v, 0, strict=False),
    "log_file": lambda v: (
        v is None
        or (
            _path_text(v)
            and not v.startswith("/")
            and ".." not in v.split("/")
            and os.path.normpath(v).split("/")[0] not in (".gts", ".")
        )
    ),
    "test_config_string_indicator": lambda v: isinstance(v, str),
    "test_config_string_separator": lambda v: isinstance(v, str),
    "forse_rerun": lambda v: False,  # an unknown key is never accepted
}


@settings(max_examples=800, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(config=configs)
def test_fuzzed_configs_run_or_raise_config_error_and_write_nothing(config):
    before = os.getcwd()
    with tempfile.TemporaryDirectory() as folder:
        os.chdir(folder)
        try:
            try:
                manager = ConfigManager(config)
                GPUTaskScheduler(config, GPUTask)
            except ConfigError as error:
                assert str(error)
                event("rejected with ConfigError")
            else:
                event("accepted")
                for key, value in config["scheduler_config"].items():
                    assert key == "gpu" or OPTION_ORACLE[key](value), f"accepted {key}={value!r}"
                assert manager.get_num_left_config() == len(manager.sweep)
                for run in itertools.islice(manager.iter_runs(), 20):
                    assert os.sep not in run.name and len(run.name.encode()) <= 255
                manager.get_all_test_config_in_string()
                manager.get_gpu_envs()
            assert os.listdir(folder) == []
        finally:
            os.chdir(before)


# --- concurrent schedulers --------------------------------------------------------


def test_a_second_scheduler_names_the_running_one(in_tmp):
    root = in_tmp / "r"
    config = make_config(root, [{"a": [1]}], grace_period=5)
    first = launch(config, "BlockTask")
    wait_until(lambda: started(root, "a-1,"), message="the first scheduler's run to start")
    before = (ledger_rows(root), tree(root))
    with pytest.raises(SchedulerBusyError, match=f"pid {first.pid} on host"):
        GPUTaskScheduler(config, tasks.BlockTask).start()
    # Checked while the first one still runs: the refused one changed no record, file or run.
    assert (ledger_rows(root), tree(root)) == before and ledger_rows(root)["a-1,"]["status"] == "running"
    first.send_signal(signal.SIGTERM)
    finish(first)
    assert ledger_rows(root)["a-1,"]["status"] == "interrupted"


def tree(root):
    """Every path under root, with each file's size and modification time. (Not the folders'
    times, nor SQLite's side files: reading the ledger with sqlite3, as ledger_rows does, makes
    and removes those.)"""
    found = {}
    for path in sorted(root.rglob("*")):
        if path.name.endswith(("-wal", "-shm")):
            continue
        info = path.lstat()
        found[str(path.relative_to(root))] = "folder" if path.is_dir() else (info.st_size, info.st_mtime_ns)
    return found


def test_a_lock_left_by_a_killed_scheduler_is_taken_over(in_tmp, monkeypatch):
    root = in_tmp / "r"
    config = make_config(root, [{"a": [1]}])
    first = launch(config, "BlockTask")
    wait_until(lambda: started(root, "a-1,"), message="the run to start")
    first.kill()
    finish(first)
    assert f"pid {first.pid}" in (root / ".gts" / "lock").read_text()  # stale content, no holder
    monkeypatch.setenv("GTS_TEST_SLEEP", "0")
    assert GPUTaskScheduler(config, tasks.BlockTask).start().ok


# --- storage faults -----------------------------------------------------------------


def test_a_result_root_that_cannot_be_created(in_tmp):
    (in_tmp / "file").write_text("")
    with pytest.raises(GTSError, match="cannot create the result root"):
        GPUTaskScheduler(
            make_config(in_tmp / "file" / "r", [{"a": [1]}], scheduler_log_file_path=None), tasks.RecordTask
        ).start()
    assert sorted(os.listdir(in_tmp)) == ["file"]


class _FailingConnection:
    """Passes everything to a real sqlite3 connection, but the disk fills up
    when the ledger records the end of the first run."""

    def __init__(self, db):
        self._db = db

    def execute(self, sql, *params):
        if sql.lstrip().startswith("UPDATE runs SET status"):
            raise sqlite3.OperationalError("database or disk is full")
        return self._db.execute(sql, *params)

    def __getattr__(self, name):
        return getattr(self._db, name)

    def __enter__(self):
        return self._db.__enter__()

    def __exit__(self, *exc):
        return self._db.__exit__(*exc)


def test_a_full_disk_under_the_ledger_stops_cleanly_and_loses_nothing(in_tmp, monkeypatch):
    root, journal = in_tmp / "r", str(in_tmp / "journal")
    config = make_config(root, [{"a": [1, 2, 3]}], global_config={"journal": journal})
    real_init = Ledger.__init__

    def failing_init(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        self._db = _FailingConnection(self._db)

    monkeypatch.setattr(Ledger, "__init__", failing_init)
    with pytest.raises(LedgerError, match="database or disk is full.*Nothing is lost"):
        GPUTaskScheduler(config, tasks.RecordTask).start()
    monkeypatch.setattr(Ledger, "__init__", real_init)
    summary = GPUTaskScheduler(config, tasks.RecordTask).start()
    assert summary.skipped == ["a-1,"]  # its child had recorded its success
    assert [journal_lines(journal).count(f"end a-{i},") for i in (1, 2, 3)] == [1, 1, 1]


def test_a_batch_commits_once_at_its_end_and_a_start_at_once(in_tmp):
    """Group commit: the writes of one turn of the loop share a transaction, but a run's
    'running' record is committed before its process can exist, and an error keeps what was written."""
    from gpu_task_scheduler.records.paths import RootPaths

    paths = RootPaths(str(in_tmp / "r"))
    with Ledger(paths) as ledger:

        def seen():  # what another process (gts status, a restart) would read now
            reader = Ledger.read_only(paths)
            try:
                return {r.name: r.status.value for r in reader.records()}
            finally:
                reader.close()

        start = {"run_index": 0, "config_hash": "h", "slot": "cpu0", "token": "t", "work_dir": "w"}
        with ledger.batch():
            ledger.mark_running(name="a", **start)
            assert seen() == {"a": "running"}
            ledger.finish("a", RunStatus.SUCCEEDED)
            ledger.set_meta("k", "v")
            assert seen() == {"a": "running"}  # not yet
        assert seen() == {"a": "succeeded"} and ledger.get_meta("k") == "v"
        with pytest.raises(RuntimeError), ledger.batch():
            ledger.finish("a", RunStatus.FAILED)
            raise RuntimeError("the loop failed after the write")
        assert seen() == {"a": "failed"}


def test_a_damaged_ledger_is_reported_with_the_way_out(in_tmp):
    root, journal = in_tmp / "r", str(in_tmp / "journal")
    config = make_config(root, [{"a": [1, 2]}], global_config={"journal": journal})
    GPUTaskScheduler(config, tasks.RecordTask).start()
    ledger = root / ".gts" / "ledger.sqlite3"
    for suffix in ("-wal", "-shm"):
        if (root / ".gts" / f"ledger.sqlite3{suffix}").exists():
            (root / ".gts" / f"ledger.sqlite3{suffix}").unlink()
    ledger.write_bytes(b"this is not a database" * 100)
    with pytest.raises(LedgerError, match="is damaged .*Move it aside"):
        GPUTaskScheduler(config, tasks.RecordTask).start()
    ledger.rename(root / ".gts" / "ledger.broken")
    summary = GPUTaskScheduler(config, tasks.RecordTask).start()
    assert summary.skipped == ["a-1,", "a-2,"] and journal_lines(journal).count("end a-1,") == 1
