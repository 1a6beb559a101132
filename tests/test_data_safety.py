"""Data safety against a hostile or careless user, end to end through `gts`: no run gets a folder that
holds other runs, one ledger per root, nothing hangs on a special file, nothing is read outside the root."""

import json
import os
import re
import sqlite3
import subprocess
import sys
import time

import pytest
from conftest import wait_until
from helpers import ledger_rows, record_started

from gpu_task_scheduler.cli.main import main as gts
from gpu_task_scheduler.results import rows

# A task that empties its own folder, then leaves one file that names it: what a careless
# "clean the output folder first" does. Before, a run with no distinguishing keys got the
# result root itself as its folder and this deleted every other run's files.
EMPTY_ITS_FOLDER = 'rm -rf "$GTS_RUN_DIR"/* && echo "$GTS_RUN_NAME" > "$GTS_RUN_DIR/out"'


def _yaml(path, text):
    path.write_text(text)
    return str(path)


def _outputs(root):
    found = {}
    for name in sorted(os.listdir(root)):
        out = root / name / "out"
        if out.is_file():
            found[name] = out.read_text().strip()
    return found


@pytest.mark.parametrize(
    "sweep, options",
    [
        ("test_config: [{}, {seed: [1, 2]}]", ""),  # an empty block
        ("test_config: [{seed: [1, 2]}]", "ignored_keys_for_folder_name: [seed]"),  # no key in the names
        ("global_config: {lr: 0.1}", ""),  # no test_config at all
    ],
    ids=["empty-block", "all-keys-ignored", "no-test-config"],
)
def test_a_run_that_empties_its_own_folder_loses_no_other_run(in_tmp, sweep, options):
    config = _yaml(
        in_tmp / "sweep.yaml",
        f"""
scheduler_config:
  gpu: [cpu]
  result_root_folder: results
  scheduler_log_file_path: null
  {options}
shell: true
command: '{EMPTY_ITS_FOLDER}'
{sweep}
""",
    )
    assert gts(["run", config, "--plain"]) == 0
    root = in_tmp / "results"
    outputs = _outputs(root)
    recorded = {row["name"]: row["status"] for row in rows(str(root))}
    assert set(recorded.values()) == {"succeeded"} and outputs == {name: name for name in recorded}
    assert "run" in recorded and all(name == "run" or name.startswith(("run~", "seed-")) for name in recorded)
    assert (root / ".gts" / "ledger.sqlite3").is_file()  # the root's records survived too
    # And a second start finds every run done: nothing was lost, nothing runs again.
    assert gts(["run", config, "--plain"]) == 0
    assert _outputs(root) == outputs
    assert {name: row["attempts"] for name, row in ledger_rows(root).items()} == dict.fromkeys(recorded, 1)


def test_runs_without_distinguishing_keys_never_share_a_folder(tmp_path):
    from gpu_task_scheduler.sweep.expand import Sweep

    sweep = Sweep(
        {
            "scheduler_config": {
                "gpu": ["cpu"],
                "result_root_folder": str(tmp_path),
                "ignored_keys_for_folder_name": ["s"],
            },
            "test_config": [{}, {"s": [1, 2]}, {"s": [3]}],
        }
    )
    names = [spec.name for spec in sweep]
    assert names[0] == "run" and len(set(names)) == 4 and all(n.startswith("run~") for n in names[1:]), names
    assert all(os.path.dirname(spec.work_dir) == str(tmp_path) for spec in sweep)


# --- one ledger per root ------------------------------------------------------------------------


def _sleeping_sweep(path, root, seconds=30):
    return _yaml(
        path,
        f"""
scheduler_config: {{gpu: [cpu], result_root_folder: {root}, scheduler_log_file_path: null}}
command: [python, -c, "import time; time.sleep({seconds})", "{{x}}"]
test_config: [{{x: [1]}}]
""",
    )


def test_two_roots_through_one_linked_gts_never_both_run(in_tmp, no_leaked_processes):
    (in_tmp / "a" / ".gts").mkdir(parents=True)
    (in_tmp / "b").mkdir()
    os.symlink(in_tmp / "a" / ".gts", in_tmp / "b" / ".gts")
    first = subprocess.Popen(
        [sys.executable, "-m", "gpu_task_scheduler", "run", _sleeping_sweep(in_tmp / "a.yaml", "a"), "--plain"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        ledger = in_tmp / "a" / ".gts" / "ledger.sqlite3"
        wait_until(lambda: ledger.exists() or first.poll() is not None, message="the first sweep's ledger")
        second = subprocess.run(
            [sys.executable, "-m", "gpu_task_scheduler", "run", _sleeping_sweep(in_tmp / "b.yaml", "b", 0), "--plain"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert second.returncode != 0
        assert "symbolic link" in second.stderr and "share one ledger" in second.stderr, second.stderr
        assert "Traceback" not in second.stderr
        assert not (in_tmp / "b" / "x-1,").exists()  # the second sweep started nothing
        for command in (["status", "b"], ["results", "b"]):  # the readers refuse it too
            result = subprocess.run(
                [sys.executable, "-m", "gpu_task_scheduler", *command], capture_output=True, text=True, timeout=60
            )
            assert result.returncode != 0 and "symbolic link" in result.stderr, result.stderr
    finally:
        first.terminate()
        first.communicate(timeout=60)


def test_a_records_folder_in_use_through_another_root_stops_a_second_scheduler(tmp_path):
    """The same .gts folder reached from another root without a link (a bind mount): that root's
    scheduler holds the lock on .gts itself, which this root's lock does not cover."""
    import fcntl

    from gpu_task_scheduler import SchedulerBusyError
    from gpu_task_scheduler.records.ledger.lock import SweepLock
    from gpu_task_scheduler.records.paths import RootPaths

    (tmp_path / "a" / ".gts").mkdir(parents=True)
    other = os.open(tmp_path / "a" / ".gts", os.O_RDONLY | os.O_DIRECTORY)  # as the other root's scheduler
    try:
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(SchedulerBusyError, match="two sweeps never share one ledger"):
            SweepLock(RootPaths(str(tmp_path / "a"))).acquire()
        fcntl.flock(other, fcntl.LOCK_UN)
        lock = SweepLock(RootPaths(str(tmp_path / "a")))
        lock.acquire()  # and once it is free, the root is ours (the root's own lock was released above)
        lock.release()
    finally:
        os.close(other)


# --- special files where the ledger goes --------------------------------------------------------


def _gts_subprocess(*args, timeout=30):
    return subprocess.run(
        [sys.executable, "-m", "gpu_task_scheduler", *args], capture_output=True, text=True, timeout=timeout
    )


@pytest.mark.parametrize("where", ["ledger.sqlite3", "ledger.sqlite3-wal"])
def test_a_fifo_ledger_fails_every_command_at_once(in_tmp, where):
    config = _sleeping_sweep(in_tmp / "s.yaml", "results", 0)
    (in_tmp / "results" / ".gts").mkdir(parents=True)
    if where != "ledger.sqlite3":
        sqlite3.connect(in_tmp / "results" / ".gts" / "ledger.sqlite3").close()
    os.mkfifo(in_tmp / "results" / ".gts" / where)
    commands = [
        ["status", "results"],
        ["status", "results", "--json"],
        ["results", "results"],
        ["logs", "results", "--failed"],
        ["retry", "results", "--failed"],
        ["plot", "results", "--timeline", "-o", "p.png"],
        ["run", config, "--dry-run"],
        ["run", config, "--plain"],
    ]
    started = time.monotonic()
    for command in commands:
        result = _gts_subprocess(*command)
        assert result.returncode != 0 and "not a regular file" in result.stderr, (command, result.stderr)
        assert "Traceback" not in result.stderr
    assert time.monotonic() - started < 5 * len(commands)
    assert not (in_tmp / "results" / "x-1,").exists()


def test_an_empty_ledger_file_says_so(in_tmp, capsys):
    (in_tmp / "results" / ".gts").mkdir(parents=True)
    (in_tmp / "results" / ".gts" / "ledger.sqlite3").write_bytes(b"")
    assert gts(["status", "results"]) != 0
    error = capsys.readouterr().err
    assert "is empty (0 bytes)" in error and "no such table" not in error


# --- paths read from the ledger ----------------------------------------------------------------


def _plant_row(root, **changes):
    db = sqlite3.connect(root / ".gts" / "ledger.sqlite3")
    try:
        for key, value in changes.items():
            if key == "log_file":
                db.execute("UPDATE meta SET value = ? WHERE key = 'log_file'", (value,))
            else:
                db.execute(f"UPDATE runs SET {key} = ?", (value,))
        db.commit()
    finally:
        db.close()


@pytest.mark.parametrize(
    "plant",
    [
        {"name": "../../outside"},
        {"name": "{secret}"},
        {"log_file": "{secret}/worker.log"},
        {"log_file": "../../../outside/worker.log"},
    ],
)
def test_paths_in_the_ledger_never_reach_outside_the_root(in_tmp, capsys, plant):
    config = _yaml(
        in_tmp / "s.yaml",
        """
scheduler_config: {gpu: [cpu], result_root_folder: deep/results, scheduler_log_file_path: null}
command: [python, -c, "import sys; print('hello'); sys.exit(3)", "{x}"]
test_config: [{x: [1]}]
""",
    )
    assert gts(["run", config, "--plain"]) == 1
    root = in_tmp / "deep" / "results"
    secret = in_tmp / "outside"
    secret.mkdir()
    (secret / "worker.log").write_text("SECRET\n")
    (secret / "result.json").write_text('{"secret": 1}')
    plant = {key: value.format(secret=secret) for key, value in plant.items()}
    _plant_row(root, **plant)
    capsys.readouterr()
    name = plant.get("name", "x-1,")
    gts(["logs", str(root), name])
    gts(["logs", str(root), "--failed"])
    gts(["results", str(root), "--format", "json"])
    gts(["status", str(root), "--json"])
    captured = capsys.readouterr()
    assert "SECRET" not in captured.out + captured.err and "secret" not in captured.out
    assert "Traceback" not in captured.err


def test_deleting_the_records_mid_sweep_stops_the_sweep_and_says_so(in_tmp, no_leaked_processes):
    import shutil

    config = _yaml(
        in_tmp / "s.yaml",
        """
scheduler_config: {gpu: [cpu], result_root_folder: results, scheduler_log_file_path: null}
command: [python, -c, "import os, time; open(os.environ['GTS_RUN_DIR'] + '/started', 'w'); time.sleep(0.3)", "{x}"]
test_config: [{x: [1, 2, 3, 4, 5, 6]}]
""",
    )
    sweep = subprocess.Popen(
        [sys.executable, "-m", "gpu_task_scheduler", "run", config, "--plain"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=in_tmp,
    )
    try:
        wait_until(lambda: (in_tmp / "results" / "x-1," / "started").exists(), message="the first run to start")
        shutil.rmtree(in_tmp / "results" / ".gts")
        _, stderr = sweep.communicate(timeout=60)
    finally:
        if sweep.poll() is None:
            sweep.kill()
            sweep.communicate()
    assert sweep.returncode != 0 and "was deleted or replaced while the sweep ran" in stderr, stderr
    assert not (in_tmp / "results" / "x-6,").exists()  # it stopped instead of running on unrecorded


# --- stale results after a change -----------------------------------------------------------------

STAGED = """
scheduler_config: {{gpu: [cpu], result_root_folder: results, scheduler_log_file_path: null}}
stages:
  - name: train
    global_config: {{epochs: {epochs}}}
    test_config: [{{lr: [1, 2]}}]
    command: [python, -c, "import sys; open(sys.argv[1] + '/model', 'w').write(sys.argv[2] + 'x' + sys.argv[3])",
              "{{work_dir}}", "{{lr}}", "{{epochs}}"]
  - name: eval
    after: train
    test_config: [{{lr: [1, 2]}}]
    command: [python, -c, "import sys; open(sys.argv[1] + '/score', 'w').write(open(sys.argv[2] + '/model').read())",
              "{{work_dir}}", "{{dep_dir}}"]
  - name: report
    after: eval
    command: [sh, -c, 'cat "$0"/../eval.*/score > "$0"/report{extra}', "{{work_dir}}"]
"""


def _staged(in_tmp, epochs=1, extra=""):
    return _yaml(in_tmp / "staged.yaml", STAGED.format(epochs=epochs, extra=extra))


def test_dependents_run_again_after_accept_changes_reran_what_they_read(in_tmp, capsys):
    root = in_tmp / "results"
    assert gts(["run", _staged(in_tmp), "--plain"]) == 0
    assert (root / "eval.lr-1," / "score").read_text() == "1x1" and (root / "report" / "report").read_text() == "1x12x1"
    config = _staged(in_tmp, epochs=3)
    assert gts(["run", config, "--plain"]) == 2  # a change is refused until the user chooses
    assert "config changed (epochs: 1 -> 3)" in capsys.readouterr().err
    assert gts(["run", config, "--plain", "--accept-changes"]) == 0
    # The runs that read the retrained models ran again: nothing stays "succeeded" on old outputs.
    assert (root / "eval.lr-2," / "score").read_text() == "2x3"
    assert (root / "report" / "report").read_text() == "1x32x3"
    assert {name: row["attempts"] for name, row in ledger_rows(root).items()} == {
        "train.lr-1,": 2,
        "train.lr-2,": 2,
        "eval.lr-1,": 2,
        "eval.lr-2,": 2,
        "report": 2,
    }
    # And a start after that runs nothing again.
    assert gts(["run", config, "--plain"]) == 0
    assert {row["attempts"] for row in ledger_rows(root).values()} == {2}


def test_a_dependency_rerun_by_gts_retry_reruns_its_dependents(in_tmp):
    root = in_tmp / "results"
    config = _staged(in_tmp)
    assert gts(["run", config, "--plain"]) == 0
    assert gts(["retry", str(root), "train.lr-1,", "--force"]) == 0
    assert gts(["run", config, "--plain"]) == 0
    rows = ledger_rows(root)
    assert rows["eval.lr-1,"]["attempts"] == 2 and rows["report"]["attempts"] == 2
    assert rows["eval.lr-2,"]["attempts"] == 1  # its train run did not run again


def test_a_changed_command_is_a_config_change(in_tmp, capsys):
    root = in_tmp / "results"
    assert gts(["run", _staged(in_tmp), "--plain"]) == 0
    capsys.readouterr()
    changed = _staged(in_tmp, extra=".txt")
    assert gts(["run", changed, "--dry-run"]) == 2
    assert gts(["run", changed, "--plain"]) == 2
    error = capsys.readouterr().err
    assert "report: config changed (command:" in error and "report.txt" in error, error
    assert gts(["run", changed, "--plain", "--accept-changes"]) == 0
    assert (root / "report" / "report.txt").read_text() == "1x12x1"
    assert ledger_rows(root)["eval.lr-1,"]["attempts"] == 1  # only what changed ran again


@pytest.mark.parametrize(
    "option, value, words",
    [
        ("test_config_string_separator", "';'", "test_config_string_separator: ',' -> ';'"),
        ("config_string_value_maxlen", "2", "config_string_value_maxlen: 30 -> 2"),
        ("ignored_keys_for_folder_name", "[seed]", "ignored_keys_for_folder_name: [] -> ['seed']"),
    ],
)
def test_a_naming_change_is_a_config_change_that_says_what_changed(in_tmp, capsys, option, value, words):
    sweep = """
scheduler_config: {{gpu: [cpu], result_root_folder: results, scheduler_log_file_path: null{extra}}}
command: [python, -c, "print(1)", "{{lr}}", "{{seed}}"]
test_config: [{{lr: [0.001, 0.002], seed: [1]}}]
"""
    assert gts(["run", _yaml(in_tmp / "s.yaml", sweep.format(extra="")), "--plain"]) == 0
    capsys.readouterr()
    changed = _yaml(in_tmp / "s.yaml", sweep.format(extra=f", {option}: {value}"))
    assert gts(["run", changed, "--plain"]) == 2
    error = capsys.readouterr().err
    assert "folder name changed (its result is in 'lr-0.001,seed-1,'" in error and words in error, error
    assert gts(["run", changed, "--plain", "--keep"]) == 2  # a result is not moved between folders
    assert "not moved between folders" in capsys.readouterr().err
    assert len(ledger_rows(in_tmp / "results")) == 2  # nothing ran
    assert gts(["run", changed, "--plain", "--accept-changes"]) == 0
    assert len(ledger_rows(in_tmp / "results")) == 4


# --- GPU placement without declared memory ---------------------------------------------------------


@pytest.fixture
def fake_gpus(in_tmp, monkeypatch):
    import fake_nvml

    path = in_tmp / "nvml.json"
    monkeypatch.setenv(fake_nvml.ENV, str(path))

    def set_up(*gpus):
        fake_nvml.write_state(str(path), [{"name": "Fake H100 80GB", "total": 80 * 10**9, **gpu} for gpu in gpus])

    return set_up


def _gpu_sweep(in_tmp, values, gpus="[0, 1]"):
    return _yaml(
        in_tmp / "gpu.yaml",
        f"""
scheduler_config: {{gpu: {gpus}, result_root_folder: results, gpu_poll_interval: 0.1}}
task: gts_test_tasks:FakeGpuTask
global_config: {{alloc_gb: 50, hold: 0.2}}
test_config: [{{i: {values}}}]
""",
    )


def test_a_gpu_another_process_fills_gets_no_run(in_tmp, fake_gpus, capsys):
    fake_gpus({"processes": [{"pid": 1, "used": int(79.9e9)}]}, {})  # gpu 0: 0.1 GB free, under the margin
    assert gts(["run", _gpu_sweep(in_tmp, "[0, 1, 2]"), "--plain"]) == 0
    assert {row["result.gpu"] for row in rows(str(in_tmp / "results"))} == {"1"}
    log = (in_tmp / "results" / "scheduler.log").read_text()
    assert "gpu0 no memory available" in log and re.search(r"-\d[\d.]* GiB", log) is None, log


def test_a_gpu_with_less_free_memory_than_the_learned_peak_gets_no_run(in_tmp, fake_gpus):
    fake_gpus({}, {})
    assert gts(["run", _gpu_sweep(in_tmp, "[0, 1]", gpus="[1]"), "--plain"]) == 0  # learns a 50 GB peak
    # Now another user holds 45 GB of gpu 0: 35 GB free cannot take a run that peaked at 50 GB.
    fake_gpus({"processes": [{"pid": 1, "used": 45 * 10**9}]}, {})
    assert gts(["run", _gpu_sweep(in_tmp, "[0, 1, 2, 3]"), "--plain"]) == 0
    placed = {row["i"]: row["result.gpu"] for row in rows(str(in_tmp / "results"))}
    assert placed == {0: "1", 1: "1", 2: "1", 3: "1"}, placed


def test_available_memory_is_never_shown_negative():
    from gpu_task_scheduler.gpu.capacity import available_words

    assert available_words(-(60 * 2**30)) == "no memory available"
    assert available_words(0) == "no memory available"
    assert available_words(2**30) == "1.0 GiB available"


# --- no tracebacks on bad values ------------------------------------------------------------------


@pytest.mark.parametrize(
    "override, message",
    [
        ("scheduler_config=1", "names scheduler_config; name a key in it (e.g. scheduler_config.timeout=600)"),
        ("global_config=3", "names global_config; name a key in it"),
        ("model.lr=1,2", "gives several values to model.lr, a key inside a dict, which is not swept"),
        ("scheduler_config.timeout=1,2", "give one value, or a list as scheduler_config.timeout=[1,2]"),
        ("empty.x=1", "unknown key 'x' in global_config.empty (override 'empty.x=1'); global_config.empty (over"),
        ("scheduler_config.gpu_poll_interval=1e300", "at most 31536000 (a year)"),
        ("scheduler_config.grace_period=1e300", "at most 31536000 (a year)"),
    ],
)
def test_bad_overrides_get_one_line_errors(in_tmp, capsys, override, message):
    config = _yaml(
        in_tmp / "s.yaml",
        """
scheduler_config: {gpu: [cpu], result_root_folder: results}
global_config: {model: {lr: 0.1}, empty: {}}
command: [echo, "{a}"]
test_config: [{a: [1]}]
""",
    )
    assert gts(["run", config, override, "--dry-run"]) == 2
    error = capsys.readouterr().err
    assert message in error and "Traceback" not in error and "Valid keys: ." not in error, error
    assert not (in_tmp / "results").exists()


def test_a_huge_grace_period_on_the_command_line_is_refused_before_anything_runs(in_tmp, capsys):
    config = _sleeping_sweep(in_tmp / "s.yaml", "results", 0)
    assert gts(["run", config, "--grace-period", "1e300", "--plain"]) == 2
    assert "at most 31536000" in capsys.readouterr().err and not (in_tmp / "results").exists()


@pytest.mark.parametrize(
    "edit, field",
    [
        ("UPDATE runs SET result = '{bad'", "result = '{bad', which is not JSON"),
        ("UPDATE runs SET params = '[1'", "params = '[1', which is not a JSON object"),
        ("UPDATE runs SET started_at = 'yesterday'", "started_at = 'yesterday', which is not a time"),
        ("UPDATE runs SET attempts = 'many'", "attempts = 'many', which is not an integer"),
        ("UPDATE meta SET value = 'many' WHERE key = 'sweep_runs'", "the sweep's size as 'many', not a number"),
    ],
)
def test_a_hand_edited_ledger_names_the_bad_field_and_the_rest_stays_readable(in_tmp, edit, field):
    config = _yaml(
        in_tmp / "s.yaml",
        """
scheduler_config: {gpu: [cpu], result_root_folder: results, scheduler_log_file_path: null}
command: [python, -c, "import json, os; json.dump(dict(x=1), open(os.environ['GTS_RUN_DIR'] + '/result.json', 'w'))",
          "{a}"]
test_config: [{a: [1, 2]}]
""",
    )
    assert gts(["run", config, "--plain"]) == 0
    db = sqlite3.connect(in_tmp / "results" / ".gts" / "ledger.sqlite3")
    db.execute(edit if "meta" in edit else edit + " WHERE name = 'a-1,'")
    db.commit()
    db.close()
    for command in (["status", "results"], ["status", "results", "--json"], ["results", "results"]):
        result = _gts_subprocess(*command)
        assert result.returncode == 0 and "Traceback" not in result.stderr, (command, result.stderr)
        # results reads no size; status reads no result or parameters (it shows neither)
        unread = ("meta" in edit and command[0] == "results") or (command[0] == "status" and "JSON" in field)
        said = field in result.stderr or unread
        assert said and "a-2," in result.stdout, (command, result.stderr)


def test_retry_after_a_narrower_sweep_replaced_the_record_says_why_and_fails(in_tmp, capsys):
    sweep = """
scheduler_config: {{gpu: [cpu], result_root_folder: results, scheduler_log_file_path: null}}
command: [python, -c, "import sys; sys.exit(int(sys.argv[1]) % 2)", "{{a}}"]
test_config: [{{a: {values}}}]
"""
    assert gts(["run", _yaml(in_tmp / "s.yaml", sweep.format(values="[1, 2, 3]")), "--plain"]) == 1  # 1, 3 fail
    assert gts(["run", _yaml(in_tmp / "s.yaml", sweep.format(values="[2, 4]")), "--plain"]) == 0  # the record now
    capsys.readouterr()
    assert gts(["retry", "results", "--failed", "--plain"]) == 2
    captured = capsys.readouterr()
    assert "2 of the runs to retry are not in the sweep results recorded last" in captured.err, captured.err
    assert "a-1,, a-3," in captured.err and "running" not in captured.out


def test_a_placeholder_one_block_lacks_is_an_error_before_anything_runs(in_tmp, capsys):
    config = _yaml(
        in_tmp / "s.yaml",
        """
scheduler_config: {gpu: [cpu], result_root_folder: results}
command: [echo, "{a}", "{b}"]
test_config: [{a: [1], b: [2]}, {a: [3]}]
""",
    )
    assert gts(["run", config, "--plain"]) == 2
    error = capsys.readouterr().err
    assert "uses {b}, which the runs of test_config[1] do not have (their keys: a)" in error, error
    assert not (in_tmp / "results").exists()


# --- small ones, each with its test ------------------------------------------------------------------


def test_gpu_ids_are_ascii_digits_and_an_inherited_cuda_visible_devices_is_named_as_given(in_tmp, capsys, monkeypatch):
    from gpu_task_scheduler.gpu.nvml import visible_ids

    config = _sleeping_sweep(in_tmp / "s.yaml", "results", 0)
    assert gts(["run", config, "--gpus", "١", "--dry-run"]) == 2
    assert "is not a GPU id" in capsys.readouterr().err
    assert visible_ids({"CUDA_VISIBLE_DEVICES": "١"}) == []  # CUDA stops at it
    for given in ("-1", "abc"):
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", given)
        assert gts(["run", config, "--gpus", "0", "--plain"]) != 0
        assert f"CUDA_VISIBLE_DEVICES={given!r}" in capsys.readouterr().err


def test_a_kept_change_is_the_base_of_the_next_one(in_tmp, capsys):
    sweep = """
scheduler_config: {{gpu: [cpu], result_root_folder: results, scheduler_log_file_path: null}}
command: [echo, "{{a}}"]
global_config: {{{extra}}}
test_config: [{{a: [1]}}]
"""
    assert gts(["run", _yaml(in_tmp / "s.yaml", sweep.format(extra="y: 1")), "--plain"]) == 0
    assert gts(["run", _yaml(in_tmp / "s.yaml", sweep.format(extra="y: 1, z: 1")), "--plain", "--keep"]) == 0
    capsys.readouterr()
    assert gts(["run", _yaml(in_tmp / "s.yaml", sweep.format(extra="y: 1, z: 1.0")), "--plain"]) == 2
    assert "config changed (z: 1 -> 1.0)" in capsys.readouterr().err


def test_a_stage_named_twice_in_after_is_waited_for_once():
    from gpu_task_scheduler.sweep.expand import Sweep

    stages = [
        {"name": "a", "test_config": [{"x": [1]}]},
        {"name": "b", "test_config": [{"x": [1]}]},
        {"name": "c", "after": ["a", "b", "a"], "test_config": [{"x": [1]}]},
    ]
    *_, last = Sweep({"scheduler_config": {"gpu": ["cpu"]}, "stages": stages})
    assert last.after == ("a.x-1,", "b.x-1,")


def test_control_characters_in_values_never_reach_the_terminal_raw(in_tmp):
    config = _yaml(
        in_tmp / "s.yaml",
        """
scheduler_config: {gpu: [cpu], result_root_folder: results, scheduler_log_file_path: log.txt}
command: [echo, "{a}"]
test_config: [{a: ["x\\e[2Jy"]}]
""",
    )
    result = _gts_subprocess("run", config, "--plain")
    assert result.returncode == 0 and "\x1b" not in result.stderr and "x\\x1b" in result.stderr, result.stderr
    assert "\x1b" in (in_tmp / "log.txt").read_text()  # the file keeps what the values are


def test_logs_of_a_run_that_has_not_started_say_so(in_tmp, capsys):
    config = _yaml(
        in_tmp / "s.yaml",
        """
scheduler_config: {gpu: [cpu], result_root_folder: results, scheduler_log_file_path: null}
command: [python, -c, "import sys; sys.exit(int(sys.argv[1]))", "{a}"]
test_config: [{a: [1, 0]}]
""",
    )
    assert gts(["run", config, "--plain"]) == 1
    db = sqlite3.connect(in_tmp / "results" / ".gts" / "ledger.sqlite3")
    db.execute("DELETE FROM runs WHERE name = 'a-0,'")  # as if it had not started yet
    db.commit()
    db.close()
    capsys.readouterr()
    assert gts(["logs", "results", "a-0,"]) != 0
    assert "a-0, has not started yet (it is pending)" in capsys.readouterr().err


def test_watch_after_the_scheduler_was_killed_says_so_and_fails(in_tmp, no_leaked_processes):
    root = in_tmp / "results"
    sweep = subprocess.Popen(
        [sys.executable, "-m", "gpu_task_scheduler", "run", _sleeping_sweep(in_tmp / "s.yaml", "results"), "--plain"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_until(lambda: (root / "x-1,").exists(), message="the run's folder")
    finally:
        sweep.kill()  # kill -9: the run it started ends with its lifeline
        sweep.wait()
    result = _gts_subprocess("status", str(root), "--watch", timeout=60)
    assert result.returncode == 1, result.stderr
    assert "the sweep is no longer running" in result.stderr and "1 stale" in result.stderr, result.stderr


# --- the read side on large roots -----------------------------------------------------------------


def test_ranked_top_rows_are_the_sorted_rows_head(in_tmp):
    """results --sort --top ranks in SQLite; what it gives equals sorting every row, for results
    in the ledger, in run folders, scalar results, missing keys, non-numbers, ties and parameters."""
    import random

    from gpu_task_scheduler.records.ledger import Ledger
    from gpu_task_scheduler.records.paths import RootPaths
    from gpu_task_scheduler.records.status import RunStatus
    from gpu_task_scheduler.results import best, metric, rows, sort_rows, top_rows

    rng = random.Random(5)
    root = in_tmp / "root"
    with Ledger(RootPaths(str(root))) as ledger:
        for index in range(60):
            name = f"run-{index},"
            record_started(
                ledger, root, index, name, {"lr": rng.choice([0.1, 0.2, 0.3]), "tag": rng.choice(["a", "b"])}
            )
            kind = index % 6
            result = {
                0: {"loss": rng.choice([0.5, 0.25, 1.0])},
                1: {"loss": "nan?"},
                2: {"acc": rng.random()},
                3: rng.random(),
                4: None,  # its result is the folder's result.json
                5: {"loss": rng.random(), "lr": 9.0},
            }[kind]
            if kind == 4:
                (root / name).mkdir(parents=True)
                (root / name / "result.json").write_text(json.dumps({"loss": rng.random()}))
            status = RunStatus.FAILED if index % 7 == 0 else RunStatus.SUCCEEDED  # best() skips these
            ledger.finish(name, status, result=None if result is None else json.dumps(result))
    everything = rows(str(root))
    for key in ("loss", "result.loss", "lr", "result", "acc", "missing"):
        for descending in (False, True):
            for count in (1, 7, 60, 100):
                expected = sort_rows(everything, key, descending=descending)[:count]
                assert top_rows(str(root), key, count, descending=descending) == expected, (key, descending, count)
            succeeded = sort_rows([r for r in everything if r["status"] == "succeeded"], key, descending=descending)
            first = succeeded[0] if succeeded and metric(succeeded[0], key) is not None else None
            assert best(str(root), key, maximize=descending) == first, (key, descending)


def test_retry_while_a_scheduler_holds_the_root_fails_before_saying_it_runs(in_tmp, no_leaked_processes):
    config = _yaml(
        in_tmp / "s.yaml",
        """
scheduler_config: {gpu: [cpu, cpu], result_root_folder: results, scheduler_log_file_path: null}
command: [python, -c, "import sys, time; time.sleep(30 * (int(sys.argv[1]) - 1)); sys.exit(1)", "{x}"]
test_config: [{x: [1, 2]}]
""",
    )
    sweep = subprocess.Popen(
        [sys.executable, "-m", "gpu_task_scheduler", "run", config, "--plain"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        ledger = in_tmp / "results" / ".gts" / "ledger.sqlite3"
        wait_until(  # x-1 fails at once while x-2 runs on
            lambda: ledger.exists() and ledger_rows(in_tmp / "results").get("x-1,", {}).get("status") == "failed",
            message="x-1, to fail",
        )
        result = _gts_subprocess("retry", "results", "--failed", "--plain")
    finally:
        sweep.terminate()
        sweep.wait(timeout=60)
    assert result.returncode != 0 and "another scheduler is already running" in result.stderr, result.stderr
    assert "running 1 run(s) again" not in result.stdout


def test_a_peak_learned_on_larger_gpus_never_makes_a_run_impossible(in_tmp, fake_gpus):
    fake_gpus({}, {})
    assert gts(["run", _gpu_sweep(in_tmp, "[0]"), "--plain"]) == 0
    db = sqlite3.connect(in_tmp / "results" / ".gts" / "ledger.sqlite3")
    db.execute("UPDATE runs SET gpu_memory_peak = ?", (95 * 10**9,))  # as if seen on a 141 GB GPU
    db.commit()
    db.close()
    assert gts(["run", _gpu_sweep(in_tmp, "[0, 1, 2]"), "--plain"]) == 0  # they run, on the whole GPU each
    assert {row["status"] for row in rows(str(in_tmp / "results"))} == {"succeeded"}


def test_status_of_a_large_root_lists_what_did_not_succeed_and_json_lists_every_run(in_tmp, capsys):
    from gpu_task_scheduler.records.ledger import Ledger
    from gpu_task_scheduler.records.paths import RootPaths
    from gpu_task_scheduler.records.status import RunStatus

    root = in_tmp / "root"
    with Ledger(RootPaths(str(root))) as ledger, ledger.batch():
        for index in range(1005):
            name = f"i-{index},"
            ledger.mark_running(name=name, run_index=index, config_hash="h", slot="cpu0", token="t", work_dir=name)
            ledger.finish(name, RunStatus.FAILED if index % 500 == 3 else RunStatus.SUCCEEDED, exit_code=0)
    assert gts(["status", str(root)]) == 0
    out = capsys.readouterr().out
    assert "1002 succeeded, 3 failed" in out and "i-3," in out and "i-1003," in out and "i-4," not in out
    assert "(3 of 1005 recorded runs listed: those that did not succeed" in out
    assert gts(["status", str(root), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert len(report["runs"]) == 1005 and report["runs"][4]["name"] == "i-4,"
    assert report["counts"]["failed"] == 3 and report["runs"][3]["status"] == "failed"
