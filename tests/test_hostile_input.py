"""Inputs that used to crash or wedge a root: each gives one clear error and writes nothing."""

import os
import sqlite3
import subprocess
import sys

import gts_test_tasks as tasks
import pytest
from helpers import ledger_rows, make_config

from gpu_task_scheduler import ConfigError, GPUTaskScheduler, GTSError, LedgerError, Sweep
from gpu_task_scheduler.results import rows


def _gts(*argv, cwd, stderr=subprocess.PIPE, **kwargs):
    return subprocess.run(
        [sys.executable, "-m", "gpu_task_scheduler", *argv],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=stderr,
        timeout=60,
        **kwargs,
    )


@pytest.mark.parametrize("where", ["global", "test", "key", "nested"])
def test_strings_that_cannot_be_stored_are_refused_up_front(tmp_path, where):
    bad = "name-\udcff"
    test_config = [{"a": [1]}]
    global_config = {}
    if where == "global":
        global_config["path"] = bad
    elif where == "test":
        test_config = [{"a": ["ok", bad]}]
    elif where == "key":
        test_config = [{bad: [1]}]
    else:
        global_config["deep"] = {"list": [[bad]]}
    with pytest.raises(ConfigError, match="surrogate"):
        GPUTaskScheduler(make_config(tmp_path / "r", test_config, global_config=global_config), tasks.RecordTask)
    assert not (tmp_path / "r").exists()


def test_a_yaml_alias_bomb_is_refused_quickly(tmp_path):
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    for level in range(1, 10):
        lines.append(f"a{level}: &a{level} [" + ", ".join([f"*a{level - 1}"] * 10) + "]")
    text = (
        "scheduler_config: {gpu: [cpu]}\nglobal_config:\n"
        + "\n".join("  " + line for line in lines)
        + "\ntest_config: [{v: [1]}]\n"
    )
    assert len(text) < 1000
    (tmp_path / "bomb.yaml").write_text(text)
    with pytest.raises(ConfigError, match="alias"):
        Sweep(str(tmp_path / "bomb.yaml"))


@pytest.mark.parametrize("depth", [150, 900, 5000])
def test_deeply_nested_configs_are_refused(tmp_path, depth):
    value = "[" * depth + "]" * depth
    (tmp_path / "deep.json").write_text(
        '{"scheduler_config": {"gpu": ["cpu"]}, "global_config": {"x": ' + value + '}, "test_config": [{"v": [1]}]}'
    )
    with pytest.raises(ConfigError, match="nested"):
        Sweep(str(tmp_path / "deep.json"))


def test_a_sweep_too_large_to_count_is_refused_before_anything_is_written(tmp_path):
    block = {f"k{i:02d}": [0, 1] for i in range(64)}
    with pytest.raises(ConfigError, match="runs"):
        GPUTaskScheduler(make_config(tmp_path / "r", [block]), tasks.RecordTask).start()
    assert not (tmp_path / "r").exists()


def test_a_py_config_that_exits_is_reported(tmp_path):
    (tmp_path / "c.py").write_text("import sys\nsys.exit(3)\n")
    with pytest.raises(ConfigError, match=r"sys.exit\(3\)"):
        Sweep(str(tmp_path / "c.py"))
    result = _gts("run", "c.py", cwd=tmp_path)
    assert result.returncode == 2 and b"sys.exit(3)" in result.stderr


def test_an_unwritable_scheduler_log_is_one_error_and_nothing_is_written(tmp_path):
    (tmp_path / "file").write_text("")
    config = make_config(tmp_path / "r", [{"a": [1]}], scheduler_log_file_path=str(tmp_path / "file" / "s.log"))
    with pytest.raises(GTSError, match="cannot write the scheduler log"):
        GPUTaskScheduler(config, tasks.RecordTask).start()
    assert sorted(os.listdir(tmp_path)) == ["file"]


def test_command_line_inputs_end_in_one_message(tmp_path):
    (tmp_path / "s.yaml").write_text(
        "scheduler_config: {gpu: [cpu], scheduler_log_file_path: null}\n"
        "test_config: [{a: [1]}]\ncommand: [echo, '{a}']\n"
    )
    closed = subprocess.run(
        f"{sys.executable} -m gpu_task_scheduler run s.yaml 2>&-",
        shell=True,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        timeout=60,
    )
    assert closed.returncode == 0 and (tmp_path / "results" / "a-1," / "worker.log").read_text() == "1\n"
    cases = [
        (["plot", "results", "--timeline", "-o", "/nonexistent/dir/x.png"], 1, b"cannot write the plot"),
        (["queue", "--gpus", "cpu", "--log-dir", "/proc/gts-test"], 1, b"gts queue:"),
        (["grid", "x {a:>99999999999}", "-p", "a", "1"], 2, b"asks for a width of 99999999999; at most 10000"),
    ]
    for argv, code, message in cases:
        result = _gts(*argv, cwd=tmp_path, input=b"echo hi\n")
        assert result.returncode == code, (argv, result.stderr)
        assert message in result.stderr and b"Traceback" not in result.stderr, (argv, result.stderr)


def test_a_root_path_too_long_for_sqlite_is_refused_with_the_reason(tmp_path):
    root = tmp_path / ("d" * 200) / ("e" * 200) / ("f" * 100)
    with pytest.raises(ConfigError, match="bytes long; SQLite"):
        GPUTaskScheduler(make_config(root, [{"a": [1]}]), tasks.RecordTask)
    assert not (tmp_path / ("d" * 200)).exists()


def test_a_result_too_large_for_the_ledger_is_kept_in_the_run_folder(tmp_path):
    root = tmp_path / "r"
    summary = GPUTaskScheduler(make_config(root, [{"mib": [2]}, {"mib": [0]}]), tasks.BigResultTask).start()
    assert summary.ok
    big = summary.outcomes["mib-2,"]
    assert big.result is None and big.result_file == str(root / "mib-2," / ".gts" / "result.json")
    assert summary.outcomes["mib-0,"].result == {"blob": "", "small": 1}
    stored = ledger_rows(root)
    assert stored["mib-2,"]["result"] is None and stored["mib-2,"]["result_file"] == "result.json"
    table = {row["name"]: row for row in rows(str(root))}
    assert len(table["mib-2,"]["result.blob"]) == 2 << 20 and table["mib-2,"]["result.small"] == 1
    again = GPUTaskScheduler(make_config(root, [{"mib": [2]}, {"mib": [0]}]), tasks.BigResultTask).start()
    assert len(again.skipped) == 2  # the root still works


def _ledger_with(root, sql):
    GPUTaskScheduler(make_config(root, [{"a": [1]}]), tasks.RecordTask).start()
    db = sqlite3.connect(os.path.join(str(root), ".gts", "ledger.sqlite3"))
    db.executescript(sql)
    db.commit()
    db.close()


@pytest.mark.parametrize(
    "sql,message",
    [
        ("UPDATE runs SET status = 'hibernating'", "status 'hibernating'.*newer version"),
        ("UPDATE meta SET value = '13' WHERE key = 'schema_version'", "schema version 13.*newer version"),
        ("ALTER TABLE runs DROP COLUMN status", "no column status"),
    ],
)
def test_a_ledger_this_version_cannot_read_says_why(tmp_path, sql, message):
    root = tmp_path / "r"
    _ledger_with(root, sql)
    with pytest.raises(LedgerError, match=message):
        rows(str(root))
    with pytest.raises(LedgerError, match=message):
        GPUTaskScheduler(make_config(root, [{"a": [1]}]), tasks.RecordTask).start()
    result = _gts("status", str(root), cwd=tmp_path)
    assert result.returncode == 1 and b"Traceback" not in result.stderr


@pytest.mark.parametrize(
    "version, dropped",
    [
        (1, ["result_file", "gpu_leftover", "stage", "node", "program", "metrics"]),
        (2, ["gpu_leftover", "stage", "node", "program", "metrics"]),
        (3, ["stage", "node", "program", "metrics"]),
        (4, ["program", "metrics"]),
        (11, ["slot_seconds", "spans"]),
    ],
)
def test_an_earlier_releases_ledger_is_upgraded_in_place(tmp_path, version, dropped):
    root = tmp_path / "r"
    drops = "".join(f"ALTER TABLE runs DROP COLUMN {column}; " for column in dropped)
    _ledger_with(root, f"{drops}UPDATE meta SET value = '{version}' WHERE key = 'schema_version'")
    assert rows(str(root))[0]["status"] == "succeeded"  # read as it is
    summary = GPUTaskScheduler(make_config(root, [{"a": [1, 2]}]), tasks.RecordTask).start()
    assert summary.skipped == ["a-1,"] and len(summary.succeeded) == 1
    assert {"result_file", "gpu_leftover", "stage", "node", "program", "metrics", "slot_seconds", "spans"} <= set(
        ledger_rows(root)["a-2,"]
    )


@pytest.mark.parametrize(
    "command, message",
    [
        ("echo {a:>99999999999}", "asks for a width of 99999999999"),
        ("echo {a:.20000f}", "asks for a precision of 20000"),
        (["echo", "{a:099999}"], "asks for a width of 99999;"),
    ],
)
def test_format_specs_that_would_fill_memory_are_refused_before_anything_runs(tmp_path, command, message):
    config = {
        "scheduler_config": {"gpu": ["cpu"], "result_root_folder": str(tmp_path / "r")},
        "command": command,
        "test_config": [{"a": [1]}],
    }
    with pytest.raises(ConfigError, match=message):
        Sweep(config)
    assert not (tmp_path / "r").exists()


def test_a_nested_spec_is_bounded_when_filled_in():
    from gpu_task_scheduler.sweep.templates import fill

    assert fill("{a:{w}}", {"a": 1, "w": ">3"}) == "  1"
    with pytest.raises(ValueError, match="at most 10000"):
        fill("{a:{w}}", {"a": 1, "w": ">99999999999"})


HUGE = 10**400  # YAML and JSON hold such an int; math.isfinite and float arithmetic overflow on it
PBT = {"metric": "loss", "mode": "min", "interval": 4, "max_step": 40, "perturb": {"a": [2]}}


@pytest.mark.parametrize(
    "extra, words",
    [
        ({"scheduler_config": {"budget": {"gpu_hours": HUGE}}}, "budget.*a number > 0"),
        ({"scheduler_config": {"timeout": HUGE}}, "timeout"),
        ({"scheduler_config": {"gpu_memory": HUGE}}, "gpu_memory"),
        ({"scheduler_config": {"checkpoints": {"max_disk": HUGE}}}, "checkpoints.*max_disk is a size above 0"),
        (
            {"pbt": {"metric": "loss", "mode": "min", "interval": HUGE, "max_step": 40, "perturb": {"a": [2]}}},
            "interval",
        ),
        (
            {"pbt": {"metric": "loss", "mode": "min", "interval": 4, "max_step": HUGE, "perturb": {"a": [2]}}},
            "max_step",
        ),
        (
            {"pbt": {"metric": "loss", "mode": "min", "interval": 4, "max_step": 40, "perturb": {"a": [HUGE]}}},
            "perturb",
        ),
        ({"early_stop": {"method": "asha", "metric": "loss", "mode": "min", "max_step": HUGE}}, "max_step"),
    ],
)
def test_a_number_past_floats_range_is_refused_with_the_key_not_a_traceback(tmp_path, extra, words):
    config = {"scheduler_config": {"gpu": ["cpu"], "result_root_folder": str(tmp_path / "r")}, "command": ["true"]}
    config["test_config"] = [{"a": [1, 2]}]
    for key, value in extra.items():
        config[key] = {**config.get(key, {}), **value}
    with pytest.raises(ConfigError, match=words):
        Sweep(config)
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("order", ["forward", "backward"])
def test_a_when_chain_of_3000_keys_is_a_config_not_a_recursion_error(tmp_path, order):
    space = {"k0": {"uniform": [0, 1]}}
    steps = range(1, 3000) if order == "forward" else reversed(range(1, 3000))
    for i in steps:
        space[f"k{i}"] = {"uniform": [0, 1], "when": {f"k{i - 1}": [0.5]}}
    config = {
        "scheduler_config": {"gpu": ["cpu"], "result_root_folder": str(tmp_path / "r")},
        "command": ["true"],
        "search": {"sampler": "random", "n_runs": 2, "metric": "loss", "mode": "min"},
        "test_config": [space],
    }
    assert Sweep(config).search.n_runs == 2
    space["k0"] = {"uniform": [0, 1], "when": {"k2999": [0.5]}}  # and a cycle through all of them is said
    with pytest.raises(ConfigError, match="cycle: k0 -> k2999 -> k2998"):
        Sweep(config)
