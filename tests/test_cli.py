"""The gts command, in-process and as a subprocess."""

import email
import json
import os
import signal
import subprocess
import sys

import pytest
from conftest import wait_until

from gpu_task_scheduler import ConfigManager, GPUTaskScheduler, RunStatus
from gpu_task_scheduler.cli.main import main as gts
from gpu_task_scheduler.cli.progress import LiveStatus

TESTS = os.path.dirname(os.path.abspath(__file__))
WRITE_RESULT = (
    "import json, sys; print('training with lr', sys.argv[1]); "
    "json.dump({{'loss': float(sys.argv[1]) ** 2}}, open(sys.argv[2] + '/result.json', 'w'))"
)


def write_yaml(path, text):
    path.write_text(text)
    return str(path)


@pytest.fixture
def command_sweep(in_tmp):
    return write_yaml(
        in_tmp / "sweep.yaml",
        f"""
scheduler_config:
  gpu: [cpu, cpu]
  scheduler_log_file_path: null
command: ["python", "-c", "{WRITE_RESULT}", "{{lr}}", "{{work_dir}}"]
test_config:
  - lr: [0.1, 0.2]
  - lr: [0.3]
    extra: ["x y"]
""",
    )


def test_run_a_command_sweep_then_status_and_results(command_sweep, in_tmp, capsys):
    assert gts(["run", command_sweep, "--plain"]) == 0
    root = in_tmp / "results"
    assert (root / "lr-0.1," / "worker.log").read_text() == "training with lr 0.1\n"
    assert gts(["status", str(root)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{root}: 3 succeeded") and "extra-xy,lr-0.3," in out and "worker.log" in out
    assert "left no result" not in out  # each wrote its result.json
    assert gts(["status", str(root), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["counts"]["succeeded"] == 3 and report["counts"]["pending"] == 0
    assert {run["exit"] for run in report["runs"]} == {"0"}
    assert gts(["results", str(root), "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["lr"], r.get("extra"), r["status"], round(r["result.loss"], 4)) for r in rows] == [
        (0.1, None, "succeeded", 0.01),
        (0.2, None, "succeeded", 0.04),
        (0.3, "x y", "succeeded", 0.09),
    ]
    assert gts(["results", str(root), "--format", "csv"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == "name,lr,status,duration,result.loss,slot_hours,extra"
    assert gts(["results", str(root)]) == 0
    assert capsys.readouterr().out.splitlines()[0].split() == [
        "name",
        "lr",
        "status",
        "duration",
        "result.loss",
        "slot_hours",
        "extra",
    ]
    manager_rows = ConfigManager(command_sweep).get_results()
    assert [r["result.loss"] for r in manager_rows] == [r["result.loss"] for r in rows]


def test_status_shows_a_retried_runs_time_over_its_attempts_and_its_last_attempts(in_tmp, capsys):
    """A run that failed once and succeeded at its retry: its duration in ``gts status`` is its
    attempts' total, and says its last attempt's beside it; a run of one attempt shows one."""
    once = "import os, sys, time; m = sys.argv[1] + '/tried'; t = os.path.exists(m); open(m, 'w')"
    once += "; time.sleep(0 if t else 0.5); sys.exit(0 if t else 1)"
    config = write_yaml(
        in_tmp / "retried.yaml",
        f"""
scheduler_config: {{gpu: [cpu], max_retries: 1, scheduler_log_file_path: null}}
command: ["python", "-c", "{once}", "{{work_dir}}", "{{n}}"]
test_config: [{{n: [1]}}]
""",
    )
    assert gts(["run", config, "--plain"]) == 0
    capsys.readouterr()
    assert gts(["status", str(in_tmp / "results"), "--json"]) == 0
    (run,) = json.loads(capsys.readouterr().out)["runs"]
    assert run["attempts"] == 2 and run["duration"] - run["last_duration"] >= 0.5, run
    assert gts(["status", str(in_tmp / "results")]) == 0
    assert f"{run['duration']:.1f}s (last {run['last_duration']:.1f}s)" in capsys.readouterr().out
    from gpu_task_scheduler.results import duration_text

    assert duration_text(3.0, 3.0) == "3.0s" and duration_text(None, 1.0) is None


def test_results_as_a_dataframe(command_sweep, in_tmp):
    from gpu_task_scheduler.results import to_dataframe

    assert gts(["run", command_sweep, "--plain"]) == 0
    frame = to_dataframe(str(in_tmp / "results"))
    assert list(frame["lr"]) == [0.1, 0.2, 0.3] and frame["result.loss"].max() == pytest.approx(0.09)


def test_dry_run_lists_and_changes_nothing(command_sweep, in_tmp, capsys):
    assert gts(["run", command_sweep, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "3 runs: 3 run" in out and sorted(os.listdir(in_tmp)) == ["sweep.yaml"]
    assert gts(["run", command_sweep, "--plain"]) == 0
    from helpers import ledger_rows
    from test_reliability import tree

    before = (ledger_rows(in_tmp / "results"), tree(in_tmp / "results"))
    capsys.readouterr()
    assert gts(["run", command_sweep, "--dry-run", "--force-rerun"]) == 0
    assert "3 runs: 3 run" in capsys.readouterr().out
    assert gts(["run", command_sweep, "--dry-run"]) == 0
    assert "3 runs: 3 skip" in capsys.readouterr().out
    assert (ledger_rows(in_tmp / "results"), tree(in_tmp / "results")) == before  # records and files alike


def test_exit_codes(in_tmp, capsys):
    failing = write_yaml(
        in_tmp / "f.yaml",
        """
scheduler_config: {gpu: [cpu], scheduler_log_file_path: null}
command: "sh -c 'exit {code}'"
test_config: [{code: [0, 3]}]
""",
    )
    assert gts(["run", failing, "--plain"]) == 1
    rows = {r["name"]: r for r in json.loads(_out(capsys, ["results", str(in_tmp / "results"), "--format", "json"]))}
    assert rows["code-3,"]["status"] == "failed"
    assert "the command failed with exit code 3" in _out(capsys, ["status", str(in_tmp / "results"), "--json"])
    bad = write_yaml(
        in_tmp / "bad.yaml", "scheduler_config: {gpu: [cpu]}\ncommand: [echo, '{nope}']\ntest_config: [{a: [1]}]\n"
    )
    assert gts(["run", bad]) == 2
    assert "placeholder {nope}, which is not a config key" in capsys.readouterr().err
    assert not (in_tmp / "results" / "a-1,").exists()
    assert gts(["run", str(in_tmp / "missing.yaml")]) == 2
    assert gts(["run", failing, "--task", "no_such_module:Task"]) == 2
    assert "cannot import the task 'no_such_module:Task'" in capsys.readouterr().err
    assert gts(["status", str(in_tmp / "nowhere")]) == 2  # bad usage
    assert gts(["run"]) == 2
    assert "needs a config file" in capsys.readouterr().err
    with pytest.raises(SystemExit) as raised:
        gts(["run", failing, "--no-such-flag"])
    assert raised.value.code == 2
    assert gts([]) == 2


def _out(capsys, argv):
    capsys.readouterr()
    assert gts(argv) == 0
    return capsys.readouterr().out


def test_task_from_the_config_or_the_command_line(in_tmp, capsys):
    config = write_yaml(
        in_tmp / "t.yaml",
        f"""
scheduler_config: {{gpu: [cpu], scheduler_log_file_path: null}}
global_config: {{journal: {in_tmp / "journal"}}}
test_config: [{{a: [1, 2]}}]
""",
    )
    assert gts(["run", config]) == 2
    assert "no task to run" in capsys.readouterr().err
    assert gts(["run", config, "--task", "gts_test_tasks:RecordTask", "--gpus", "cpu", "cpu"]) == 0
    assert (in_tmp / "journal").read_text().count("end") == 2
    with open(config, "a") as handle:
        handle.write("task: gts_test_tasks:RecordTask\n")
    assert gts(["run", config, "--force-rerun", "--plain"]) == 0
    assert (in_tmp / "journal").read_text().count("end") == 4


def test_gpus_override_and_groups(in_tmp, capsys):
    config = write_yaml(
        in_tmp / "g.yaml",
        """
scheduler_config: {gpu: [cpu], scheduler_log_file_path: null}
command: ["sh", "-c", "echo $CUDA_VISIBLE_DEVICES {gpus} > {work_dir}/gpus.txt"]
test_config: [{a: [1]}]
""",
    )
    assert gts(["run", config, "--gpus", "4+5"]) == 0
    assert (in_tmp / "results" / "a-1," / "gpus.txt").read_text() == "4,5 4,5\n"


HOSTILE = ["; touch pwned", "$(touch pwned)", "`touch pwned`", "a' b \"c", "&& touch pwned"]


@pytest.mark.parametrize("shell", [False, True])
def test_values_never_reach_a_shell_unquoted(in_tmp, shell):
    command = (
        "printf '%s' {v} > {work_dir}/v.txt"
        if shell
        else ["sh", "-c", 'printf \'%s\' "$1" > "$2"/v.txt', "sh", "{v}", "{work_dir}"]
    )
    config = {
        "scheduler_config": {"gpu": ["cpu"], "scheduler_log_file_path": None},
        "test_config": [{"v": HOSTILE}],
        "command": command,
        "shell": shell,
    }
    summary = GPUTaskScheduler(config).start()
    assert summary.ok
    written = sorted((in_tmp / "results" / o.name / "v.txt").read_text() for o in summary.succeeded)
    assert written == sorted(HOSTILE)
    assert not (in_tmp / "pwned").exists()


def test_callbacks(in_tmp):
    events = []
    config = {
        "scheduler_config": {"gpu": ["cpu"], "scheduler_log_file_path": None},
        "test_config": [{"code": [0, 1]}],
        "command": ["sh", "-c", "exit {code}"],
    }
    summary = GPUTaskScheduler(
        config,
        on_run_start=lambda spec, slot: events.append(("start", spec.name, slot.name)),
        on_run_end=lambda outcome: events.append(("end", outcome.name, outcome.status)),
        on_sweep_end=lambda s: events.append(("sweep", len(s.succeeded), len(s.failed))),
    ).start()
    assert events == [
        ("start", "code-0,", "cpu0"),
        ("end", "code-0,", RunStatus.SUCCEEDED),
        ("start", "code-1,", "cpu0"),
        ("end", "code-1,", RunStatus.FAILED),
        ("sweep", 1, 1),
    ]
    assert summary.exit_code == 1


def test_a_raising_callback_does_not_stop_the_sweep(in_tmp):
    def explode(outcome):
        raise RuntimeError("callback bug")

    config = {
        "scheduler_config": {"gpu": ["cpu"], "scheduler_log_file_path": None},
        "test_config": [{"a": [1, 2]}],
        "command": ["true"],
    }
    assert len(GPUTaskScheduler(config, on_run_end=explode).start().succeeded) == 2


def test_notify_command_gets_the_summary_on_stdin(in_tmp, capsys):
    config = {
        "scheduler_config": {
            "gpu": ["cpu"],
            "scheduler_log_file_path": None,
            "notify_command": [sys.executable, "-c", "import sys; open('notified.json', 'w').write(sys.stdin.read())"],
        },
        "test_config": [{"code": [0, 2]}],
        "command": ["sh", "-c", "exit {code}"],
    }
    summary = GPUTaskScheduler(config).start()
    report = json.loads((in_tmp / "notified.json").read_text())
    assert report["counts"] == {
        "succeeded": 1,
        "failed": 1,
        "interrupted": 0,
        "blocked": 0,
        "pruned": 0,
        "paused": 0,
        "skipped": 0,
        "not_started": 0,
        "detached": 0,
        "left_nothing": 1,  # it succeeded, and wrote no result.json and reported nothing
    }
    from gpu_task_scheduler.records.status import NOTHING_LEFT

    said = [line for line in summary.report().splitlines() if "left no result" in line]
    assert said == [f"  1 succeeded but left no result and reported no metric ({NOTHING_LEFT}): code-0,"]
    assert gts(["status", str(in_tmp / "results"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["left_nothing"] == 1
    assert gts(["status", str(in_tmp / "results")]) == 0
    assert f"\n  1 succeeded but left no result and reported no metric ({NOTHING_LEFT})\n" in capsys.readouterr().out
    assert report["exit_code"] == 1
    assert {run["name"]: run["status"] for run in report["runs"]} == {"code-0,": "succeeded", "code-2,": "failed"}


def test_email_report_through_a_local_smtp_server(in_tmp, smtp_server, monkeypatch):
    monkeypatch.setenv("GTS_TEST_SMTP_USER", "alice")
    monkeypatch.setenv("GTS_TEST_SMTP_PASSWORD", "s3cret")
    config = {
        "scheduler_config": {
            "gpu": ["cpu"],
            "scheduler_log_file_path": None,
            "notify_email": {
                "host": "127.0.0.1",
                "port": smtp_server.server_address[1],
                "sender": "gts@example.org",
                "recipients": ["alice@example.org", "bob@example.org"],
                "allow_insecure_auth": True,
                "username_env": "GTS_TEST_SMTP_USER",
                "password_env": "GTS_TEST_SMTP_PASSWORD",
            },
        },
        "test_config": [{"code": [0, 3]}],
        "command": ["sh", "-c", "echo output-{code}; exit {code}"],
    }
    GPUTaskScheduler(config).start()
    (raw,) = smtp_server.messages
    message = email.message_from_string(raw)
    assert message["To"] == "alice@example.org, bob@example.org"
    assert "1 succeeded, 1 failed, 0 skipped" in message["Subject"]
    body = message.get_payload(decode=True).decode()
    assert "the command failed with exit code 3" in body and "output-3" in body
    assert smtp_server.auth and smtp_server.auth[0].startswith("AUTH PLAIN")


def test_email_settings_are_validated(in_tmp):
    from gpu_task_scheduler import ConfigError

    with pytest.raises(ConfigError, match="notify_email"):
        ConfigManager({"scheduler_config": {"gpu": ["cpu"], "notify_email": {"host": "x", "password": "inline"}}})


# --- grid ------------------------------------------------------------------------------------


def test_grid_order_and_placeholders(capsys):
    assert (
        gts(
            [
                "grid",
                "train --lr {lr} --bs {bs} # {job_index}",
                "-p",
                "lr",
                "0.1",
                "0.01",
                "-p",
                "bs",
                "32",
                "64",
                "--sampling-mode",
                "grid",
            ]
        )
        == 0
    )
    assert capsys.readouterr().out.splitlines() == [
        "train --lr 0.1 --bs 32 # 0",
        "train --lr 0.1 --bs 64 # 1",
        "train --lr 0.01 --bs 32 # 2",
        "train --lr 0.01 --bs 64 # 3",
    ]
    assert gts(["grid", "x {a}", "-p", "a", "1", "2", "3", "--n-samples", "2", "--sampling-mode", "grid"]) == 0
    assert capsys.readouterr().out.splitlines() == ["x 1", "x 2"]
    # The default is simple_hypersearch's: a random sample of the grid, each point at most once.
    samples = set()
    for seed in range(20):
        assert gts(["grid", "x {a}", "-p", "a", *map(str, range(10)), "--n-samples", "3", "--seed", str(seed)]) == 0
        lines = capsys.readouterr().out.splitlines()
        assert len(set(lines)) == 3 and set(lines) <= {f"x {i}" for i in range(10)}
        samples.add(tuple(lines))
    assert len(samples) > 1 and ("x 0", "x 1", "x 2") not in samples or len(samples) > 10
    assert gts(["grid", "x {b}", "-p", "a", "1"]) == 2
    assert "{b}, which is not a parameter" in capsys.readouterr().err


def test_shuffled_grid_is_a_seeded_permutation(capsys):
    argv = (
        ["grid", "{a}-{b}", "-p", "a"]
        + [str(i) for i in range(13)]
        + ["-p", "b", "x", "y", "z", "--sampling-mode", "shuffled_grid"]
    )
    assert gts(argv + ["--seed", "7"]) == 0
    first = capsys.readouterr().out.splitlines()
    assert gts(argv + ["--seed", "7"]) == 0
    assert capsys.readouterr().out.splitlines() == first
    assert gts(argv + ["--seed", "8"]) == 0
    other = capsys.readouterr().out.splitlines()
    expected = sorted(f"{a}-{b}" for a in range(13) for b in "xyz")
    assert sorted(first) == sorted(other) == expected and first != other and first != expected


# --- queue -------------------------------------------------------------------------------------


def _gts(*args, **kwargs):
    return subprocess.run(
        [sys.executable, "-m", "gpu_task_scheduler", *args], capture_output=True, text=True, timeout=120, **kwargs
    )


def test_queue_runs_stdin_commands_on_the_slots(in_tmp):
    lines = "echo one $CUDA_VISIBLE_DEVICES\n# a comment\n\necho two; exit 4\necho three $CUDA_VISIBLE_DEVICES\n"
    result = _gts("queue", "--gpus", "0", "1+2", "--log-dir", "logs", input=lines, cwd=str(in_tmp))
    assert result.returncode == 1, result.stderr
    assert "2 succeeded, 1 failed" in result.stderr
    jobs = sorted(os.listdir(in_tmp / "logs"))
    assert len([j for j in jobs if j.startswith("job-")]) == 3  # named by their commands (see test_new_user)
    outputs = {(in_tmp / "logs" / j / "worker.log").read_text().split(" ")[0] for j in jobs if j.startswith("job")}
    assert outputs == {"one", "two\n", "three"}
    ok = _gts("queue", "--gpus", "0", input="true\ntrue\n", cwd=str(in_tmp))
    assert ok.returncode == 0 and (in_tmp / "gts-queue").is_dir()


def test_a_queue_on_many_slots_runs_every_command(in_tmp):
    """With 16 runs at once the scheduler holds many descriptors; each command's shell still
    finds its lifeline (dash reads only one-digit descriptors in a redirection)."""
    lines = "".join(f"echo {i} > out-{i}; sleep 0.2\n" for i in range(32))
    result = _gts("queue", "--gpus", *["cpu"] * 16, "--log-dir", "q", input=lines, cwd=str(in_tmp))
    assert result.returncode == 0, result.stderr
    assert "32 succeeded, 0 failed" in result.stderr
    assert sorted(int((in_tmp / f"out-{i}").read_text()) for i in range(32)) == list(range(32))


def test_queue_reads_its_input_as_it_comes(in_tmp):
    """The first command runs while stdin is still open, as with a fifo or `tail -f`."""
    queue = subprocess.Popen(
        [sys.executable, "-m", "gpu_task_scheduler", "queue", "--gpus", "0", "--log-dir", "q"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        cwd=str(in_tmp),
    )
    try:
        queue.stdin.write(b"echo first > first.txt\n")
        queue.stdin.flush()
        wait_until(lambda: (in_tmp / "first.txt").exists(), message="the first command to run before input ends")
        output = queue.communicate(b"echo second > second.txt\n", timeout=60)[0].decode()
    finally:
        if queue.poll() is None:
            queue.kill()
            queue.wait()
    assert queue.returncode == 0, output
    assert (in_tmp / "second.txt").read_text() == "second\n"


# --- plots, help, live status ---------------------------------------------------------------


def test_plots(command_sweep, in_tmp, capsys):
    assert gts(["run", command_sweep, "--plain"]) == 0
    root = str(in_tmp / "results")
    assert gts(["plot", root, "--timeline", "-o", str(in_tmp / "timeline.png")]) == 0
    assert gts(["plot", root, "--metric", "loss", "--by", "lr", "-o", str(in_tmp / "loss.png")]) == 0
    for name in ("timeline.png", "loss.png"):
        data = (in_tmp / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    assert gts(["plot", root, "--metric", "accuracy", "--by", "lr", "-o", str(in_tmp / "x.png")]) == 2
    assert "no succeeded run has the result 'accuracy'. Results: loss" in capsys.readouterr().err
    assert gts(["plot", root, "-o", str(in_tmp / "x.png")]) == 2


REPORT_LOSS = (
    "import json, os, sys; lr, wd = float(sys.argv[1]), float(sys.argv[2]); "
    "print(json.dumps({{'step': 1, 'loss': lr + wd}}), file=open(os.environ['GTS_METRICS_FILE'], 'a'))"
)


def test_a_metric_plot_draws_one_line_per_setting_of_the_other_parameters(in_tmp):
    """Not one single-point line per run: reported metrics, results, status and duration are no
    parameters; a reported metric (no result) is plotted by its last value."""
    from gpu_task_scheduler.reports.plots import metric_lines

    sweep = write_yaml(
        in_tmp / "sweep.yaml",
        f"""
scheduler_config: {{gpu: [cpu, cpu], scheduler_log_file_path: null}}
command: ["python", "-c", "{REPORT_LOSS}", "{{lr}}", "{{wd}}"]
test_config:
  - {{lr: [0.1, 0.2, 0.3], wd: [0.0, 0.5]}}
""",
    )
    assert gts(["run", sweep, "--plain"]) == 0
    root = str(in_tmp / "results")
    key, groups = metric_lines(root, "loss", "lr")
    assert key == "metrics.loss" and sorted(groups) == ["wd=0.0", "wd=0.5"]
    assert [row["metrics.loss"] for row in sorted(groups["wd=0.5"], key=lambda row: row["lr"])] == pytest.approx(
        [0.6, 0.7, 0.8]
    )
    assert gts(["plot", root, "--metric", "loss", "--by", "lr", "-o", str(in_tmp / "loss.png")]) == 0
    assert (in_tmp / "loss.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("command", ["run", "queue", "grid", "status", "results", "plot"])
def test_every_subcommand_has_help_with_an_example(command):
    result = _gts(command, "--help")
    assert result.returncode == 0 and "examples:" in result.stdout and f"gts {command}" in result.stdout


def test_a_command_parses_and_helps_alike_whether_its_parser_is_built_alone_or_with_all(capsys):
    """main() builds only the subcommand it runs; what that parser says and takes is the same."""
    from gpu_task_scheduler.cli.commands import COMMANDS
    from gpu_task_scheduler.cli.main import build_parser

    assert list(COMMANDS)[:3] == ["run", "queue", "grid"]  # gts --help lists them in this order
    for name in COMMANDS:
        helps = []
        for parser in (build_parser(), build_parser(name)):
            with pytest.raises(SystemExit):
                parser.parse_args([name, "--help"])
            helps.append(capsys.readouterr().out)
        assert helps[0] == helps[1] and f"usage: gts {name}" in helps[0]
    alone = build_parser("queue").parse_args(["queue", "--gpus", "0", "1", "--timeout", "5"])
    every = build_parser().parse_args(["queue", "--gpus", "0", "1", "--timeout", "5"])
    assert vars(alone) == vars(every) and alone.timeout == 5.0


def test_status_and_results_as_subprocesses(command_sweep, in_tmp):
    assert gts(["run", command_sweep, "--plain"]) == 0
    status = _gts("status", "results", "--json", cwd=str(in_tmp))
    assert status.returncode == 0 and json.loads(status.stdout)["counts"]["succeeded"] == 3
    results = _gts("results", "results", "--format", "csv", cwd=str(in_tmp))
    assert results.returncode == 0 and len(results.stdout.splitlines()) == 4


def test_live_status_line():
    import io

    from gpu_task_scheduler.engine.summary import RunOutcome, SweepSummary
    from gpu_task_scheduler.gpu.devices import Slot
    from gpu_task_scheduler.sweep.expand import Sweep

    stream = io.StringIO()
    live = LiveStatus(4, stream, tick=0.05, width=200)
    runs = list(Sweep({"scheduler_config": {"gpu": ["cpu"]}, "test_config": [{"a": [1, 2, 3, 4]}]}))
    live.on_run_start(runs[0], Slot("gpu0", ("0",)))
    live.on_run_start(runs[1], Slot("gpu1", ("1",)))
    assert "0 done, 0 failed, 2 running, 2 pending, 0 skipped" in live.line()
    assert live.line().endswith("| gpu0: a-1, | gpu1: a-2,")  # which run is where
    live.on_run_end(RunOutcome(name=runs[0].name, work_dir="", status=RunStatus.SUCCEEDED, duration=10.0))
    assert (
        "1 done, 0 failed, 1 running, 2 pending" in live.line() and "ETA 0:00:15" in live.line()
    )  # 3 runs left, 10 s each, 2 at a time
    live.on_run_end(RunOutcome(name=runs[1].name, work_dir="", status=RunStatus.INTERRUPTED, duration=1.0))
    assert "1 done, 0 failed, 1 interrupted, 0 running" in live.line()  # not counted as failed
    draws = stream.getvalue().count("\r\033[K")
    wait_until(
        lambda: stream.getvalue().count("\r\033[K") >= draws + 3,
        timeout=5,
        message="the line to be redrawn while nothing starts or ends",
    )
    live.on_sweep_end(SweepSummary())
    text = stream.getvalue()
    assert text.endswith("\n") and text.count("\n") == 1  # ends the line once, and draws nothing after it
    live.on_run_start(runs[2], Slot("gpu0", ("0",)))
    assert stream.getvalue() == text


def test_live_status_line_fits_the_terminal():
    import io

    from gpu_task_scheduler.gpu.devices import Slot
    from gpu_task_scheduler.sweep.expand import Sweep

    stream = io.StringIO()
    live = LiveStatus(1, stream, width=50)
    (run,) = Sweep({"scheduler_config": {"gpu": ["cpu"]}, "test_config": [{"a": ["x" * 200]}]})
    live.on_run_start(run, Slot("gpu0", ("0",)))
    live.close()
    drawn = [part.rstrip("\n") for part in stream.getvalue().split("\r\033[K") if part]
    assert drawn and all(len(line) <= 49 for line in drawn) and drawn[-1].endswith("…")


@pytest.mark.parametrize("columns, room", [(None, 79), ("120", 119), ("0", 79)])
def test_a_terminal_that_reports_0_columns_gets_a_line_of_columns_or_80(monkeypatch, columns, room):
    import io

    class ZeroWide(io.StringIO):
        def fileno(self):
            return 0

    monkeypatch.setattr(os, "get_terminal_size", lambda fd=0: os.terminal_size((0, 0)))
    if columns is None:
        monkeypatch.delenv("COLUMNS", raising=False)
    else:
        monkeypatch.setenv("COLUMNS", columns)
    live = LiveStatus(1, ZeroWide())
    assert len(live._fitted()) == min(room, len(live.line())) and live._columns() == room + 1


def test_the_python_api_shows_the_status_line_on_a_terminal_and_can_turn_it_off(in_tmp, monkeypatch):
    import io

    class Terminal(io.StringIO):
        def isatty(self):
            return True

        def fileno(self):
            raise io.UnsupportedOperation

    config = {
        "scheduler_config": {"gpu": ["cpu"], "scheduler_log_file_path": None},
        "test_config": [{"a": [1, 2]}],
        "command": ["true"],
    }
    for choice, shown in ((True, True), (False, False)):
        terminal = Terminal()
        monkeypatch.setattr(sys, "stderr", terminal)
        GPUTaskScheduler(config, live_status=choice).start()
        assert ("[gts] " in terminal.getvalue()) is shown
    monkeypatch.setenv("TERM", "dumb")
    from gpu_task_scheduler.cli.progress import wanted

    assert not wanted(Terminal())


def test_queue_in_process(in_tmp, monkeypatch, capsys):
    import io

    monkeypatch.setattr(sys, "stdin", io.StringIO("echo x > x.txt\nexit 5\n"))
    assert gts(["queue", "--gpus", "cpu", "--log-dir", "q"]) == 1
    assert (in_tmp / "x.txt").read_text() == "x\n"
    report = json.loads(_out(capsys, ["status", "q", "--json"]))
    assert [(run["status"], run["exit"], run["cause"]) for run in report["runs"]] == [
        ("succeeded", "0", None),
        ("failed", "5", "the command failed with exit code 5"),
    ]


def test_grid_and_plot_as_subprocesses(command_sweep, in_tmp):
    grid = _gts("grid", "x {a}", "-p", "a", "1", "2", "--sampling-mode", "shuffled_grid", "--seed", "3")
    assert grid.returncode == 0 and sorted(grid.stdout.split("\n")[:-1]) == ["x 1", "x 2"]
    assert gts(["run", command_sweep, "--plain"]) == 0
    plot = _gts("plot", "results", "--timeline", "-o", "t.svg", cwd=str(in_tmp))
    assert plot.returncode == 0 and (in_tmp / "t.svg").read_text().lstrip().startswith("<?xml")


def test_live_status_on_a_terminal(command_sweep, in_tmp, monkeypatch):
    import io

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    assert gts(["run", command_sweep]) == 0
    text = terminal.getvalue()
    assert "\r\033[K[gts] 3 done, 0 failed, 0 running, 0 pending, 0 skipped" in text
    assert "receives task lr-0.1," in text  # log lines still show, above the status line


def test_status_while_a_sweep_runs(in_tmp, capsys):
    from helpers import make_config
    from test_process_control import finish, launch, started

    root = in_tmp / "r"
    scheduler = launch(make_config(root, [{"a": [1, 2]}], slots=("cpu",), grace_period=5), "BlockTask")
    try:
        wait_until(lambda: started(root, "a-1,"), message="the first run to start")
        report = json.loads(_out(capsys, ["status", str(root), "--json"]))
        assert report["counts"]["running"] == 1 and report["counts"]["pending"] == 1
    finally:
        scheduler.send_signal(2)
        finish(scheduler)


def test_a_killed_queue_takes_its_shell_commands_with_it(in_tmp, no_leaked_processes):
    from conftest import marked_pids

    queue = subprocess.Popen(
        [sys.executable, "-m", "gpu_task_scheduler", "queue", "--gpus", "0", "1"],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=str(in_tmp),
    )
    queue.stdin.write(b"touch a.started; sleep 600\ntouch b.started; sleep 600 & sleep 600\n")
    queue.stdin.flush()
    wait_until(
        lambda: (in_tmp / "a.started").exists() and (in_tmp / "b.started").exists(), message="both commands to start"
    )
    queue.kill()
    queue.wait()
    queue.stdin.close()
    wait_until(
        lambda: not marked_pids(no_leaked_processes),
        timeout=10,
        message="the commands (and their own children) to die with the queue",
    )


@pytest.mark.parametrize("case", ["ledger lost", "one outcome and the ledger lost", "force_rerun", "skip_existing"])
def test_dry_run_says_what_a_real_run_then_does(command_sweep, in_tmp, capsys, case):
    assert gts(["run", command_sweep, "--plain"]) == 0
    root = in_tmp / "results"
    options = ""
    if case != "force_rerun":
        (root / ".gts" / "ledger.sqlite3").unlink()
    if case == "one outcome and the ledger lost":
        (root / "lr-0.1," / ".gts" / "outcome.json").unlink()
    elif case == "force_rerun":
        options = "\n  force_rerun: true"
    elif case == "skip_existing":
        for outcome in root.glob("*/.gts/outcome.json"):
            outcome.unlink()
        options = "\n  skip_existing_folders: true"
    text = (
        open(command_sweep).read().replace("scheduler_log_file_path: null", "scheduler_log_file_path: null" + options)
    )
    open(command_sweep, "w").write(text)
    capsys.readouterr()
    assert gts(["run", command_sweep, "--dry-run"]) == 0
    shown = capsys.readouterr().out
    # python -c: forked warm, or cold where the `python` on PATH is not the one running (said why)
    assert shown.splitlines()[-1].startswith("warm starts: ")
    lines = shown.splitlines()[:-2]
    said = {os.path.basename(line.split()[-1]): line.split()[1] for line in lines}
    summary = GPUTaskScheduler(command_sweep).start()
    done = {**dict.fromkeys(summary.skipped, "skip"), **dict.fromkeys(summary.outcomes, "run")}
    assert said == done and len(said) == 3, (case, said, done)


def test_a_queue_line_run_by_hand_fails_with_the_commands_status(tmp_path):
    from gpu_task_scheduler.backends.local.tasks import CommandFailed, ShellLineTask

    assert ShellLineTask({"command": "true"}, str(tmp_path)).main() is None
    with pytest.raises(CommandFailed) as failed:
        ShellLineTask({"command": "exit 3"}, str(tmp_path)).main()
    assert failed.value.code == 3 and str(failed.value) == "the command failed with exit code 3"
    with pytest.raises(CommandFailed) as killed:
        ShellLineTask({"command": "kill -TERM $$"}, str(tmp_path)).main()
    assert killed.value.code == 128 + signal.SIGTERM and "signal 15" in str(killed.value)


@pytest.mark.parametrize("shell", [False, True])
def test_a_command_run_by_hand_runs_what_the_scheduler_would(tmp_path, monkeypatch, shell):
    from gpu_task_scheduler.backends.local.tasks import CommandFailed, CommandTask

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    template = (
        'echo "{v} {gpus}" > {work_dir}/out'
        if shell
        else ["sh", "-c", 'echo "$1" > "$0/out"', "{work_dir}", "{v} {gpus}"]
    )
    parts = [template] if shell else template
    task = CommandTask({"v": "$(id)"}, str(tmp_path), parts=parts, shell=shell)
    assert task.main() is None and (tmp_path / "out").read_text() == "$(id) 3\n"
    with pytest.raises(CommandFailed) as failed:
        CommandTask({}, str(tmp_path), parts=["exit 5"] if shell else ["sh", "-c", "exit 5"], shell=shell).main()
    assert failed.value.code == 5
