"""`gts retry ROOT --failed | --interrupted | RUN...`: runs again from the ledger's record of the sweep."""

import gts_test_tasks as tasks
from helpers import journal_lines, ledger_rows, make_config

from gpu_task_scheduler import GPUTaskScheduler
from gpu_task_scheduler.cli.main import main


def command_sweep(in_tmp):
    root, flag, journal = in_tmp / "r", in_tmp / "flag", in_tmp / "journal"
    config = make_config(root, [{"a": [1, 2, 3]}], global_config={"journal": str(journal)})
    script = 'echo "run $0" >> "$1"; [ "$0" != 2 ] || [ -e "$2" ]'
    config["command"] = ["sh", "-c", script, "{a}", "{journal}", str(flag)]
    return root, flag, journal, config


def test_retry_failed_runs_runs_only_those_without_the_config(in_tmp, capsys):
    root, flag, journal, config = command_sweep(in_tmp)
    first = GPUTaskScheduler(config).start()
    assert [o.name for o in first.failed] == ["a-2,"]
    flag.write_text("")
    assert main(["retry", str(root), "--failed", "--plain"]) == 0
    assert "running 1 run(s) again: a-2," in capsys.readouterr().out
    rows = ledger_rows(root)
    assert {name: rows[name]["status"] for name in rows} == dict.fromkeys(["a-1,", "a-2,", "a-3,"], "succeeded")
    assert rows["a-2,"]["attempts"] == 2 and rows["a-2,"]["run_index"] == 1
    assert sorted(journal_lines(journal)) == ["run 1", "run 2", "run 2", "run 3"]
    assert main(["retry", str(root), "--failed"]) == 0  # nothing left to retry
    assert "no run to retry" in capsys.readouterr().err
    assert main(["status", str(root), "--json"]) == 0 and '"pending": 0' in capsys.readouterr().out


def test_retry_named_runs_and_a_succeeded_one_only_with_force(in_tmp, capsys):
    root, flag, journal, config = command_sweep(in_tmp)
    flag.write_text("")
    GPUTaskScheduler(config).start()
    assert main(["retry", str(root), "a-1,"]) == 2
    assert "a-1, succeeded; add --force" in capsys.readouterr().err
    assert main(["retry", str(root), "a-1", "2", "--force", "--plain"]) == 0  # a prefix and an index
    assert sorted(journal_lines(journal)) == ["run 1", "run 1", "run 2", "run 3", "run 3"]


def test_retry_a_python_task_sweep_by_its_recorded_class(in_tmp):
    root = in_tmp / "r"
    config = make_config(root, [{"a": [1], "succeed_on": [2]}], ignored_keys_for_folder_name=["succeed_on"])
    assert GPUTaskScheduler(config, tasks.FlakyTask).start(reraise_signals=False).failed
    assert main(["retry", str(root), "--failed", "--plain"]) == 0
    assert ledger_rows(root)["a-1,"]["status"] == "succeeded"


def test_retry_says_why_when_the_sweep_was_not_recorded(in_tmp, capsys):
    root = in_tmp / "r"
    config = make_config(root, [{"a": [1]}], global_config={"shape": (2, 3)})  # a tuple is not JSON
    config["command"] = ["false"]
    GPUTaskScheduler(config).start()
    assert main(["retry", str(root), "--failed"]) == 2
    assert "keeps no record of its sweep's config" in capsys.readouterr().err
    assert main(["retry", str(root)]) == 2
    assert "say which runs" in capsys.readouterr().err
