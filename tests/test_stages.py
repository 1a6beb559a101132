"""Stages: later runs wait for the earlier runs they depend on; a failed one blocks its dependents."""

import json
import os
import sys

import gts_test_tasks as tasks
import pytest
from helpers import journal_lines, ledger_rows

from gpu_task_scheduler import GPUTaskScheduler, results
from gpu_task_scheduler.cli.main import main
from gpu_task_scheduler.errors import ConfigError
from gpu_task_scheduler.sweep.expand import Sweep
from gpu_task_scheduler.sweep.overrides import apply_overrides


def staged(root, stages, *, slots=("cpu", "cpu"), global_config=None, **options):
    scheduler = {"gpu": list(slots), "result_root_folder": str(root), **options}
    config = {"scheduler_config": scheduler, "stages": stages}
    if global_config is not None:
        config["global_config"] = global_config
    return config


GRID = [{"lr": [0.1, 0.5], "seed": [0, 1]}]


def two_stages(root, **extra):
    return staged(
        root,
        [
            {"name": "train", "task": "gts_test_tasks:TrainStageTask", "test_config": GRID},
            {"name": "eval", "after": "train", "task": "gts_test_tasks:EvalStageTask", "test_config": GRID},
        ],
        **extra,
    )


# --- expansion --------------------------------------------------------------------


def test_each_run_waits_for_the_runs_with_its_values_of_the_keys_both_stages_sweep(tmp_path):
    config = staged(
        tmp_path,
        [
            {"name": "train", "test_config": GRID},
            {"name": "eval", "after": "train", "test_config": [{"lr": [0.5], "seed": [0, 1], "split": ["a"]}]},
            {"name": "pick", "after": "eval", "match": ["lr"], "test_config": [{"lr": [0.5]}]},
            {"name": "report", "after": ["train", "pick"]},
        ],
        global_config={"epochs": 3},
    )
    runs = list(Sweep(config))
    assert [(r.index, r.name, r.stage) for r in runs] == [
        (0, "train.lr-0.1,seed-0,", "train"),
        (1, "train.lr-0.1,seed-1,", "train"),
        (2, "train.lr-0.5,seed-0,", "train"),
        (3, "train.lr-0.5,seed-1,", "train"),
        (4, "eval.lr-0.5,seed-0,split-a,", "eval"),
        (5, "eval.lr-0.5,seed-1,split-a,", "eval"),
        (6, "pick.lr-0.5,", "pick"),
        (7, "report", "report"),
    ]
    after = {r.name: r.after for r in runs}
    assert after["train.lr-0.1,seed-0,"] == ()
    assert after["eval.lr-0.5,seed-1,split-a,"] == ("train.lr-0.5,seed-1,",)
    assert after["pick.lr-0.5,"] == ("eval.lr-0.5,seed-0,split-a,", "eval.lr-0.5,seed-1,split-a,")
    assert after["report"] == tuple(r.name for r in runs[:4]) + ("pick.lr-0.5,",)  # sweeps nothing: all of them
    assert runs[4].config == {"epochs": 3, "lr": 0.5, "seed": 0, "split": "a"}


def test_a_stage_has_its_own_global_config_over_the_top_level_one(tmp_path):
    config = staged(
        tmp_path,
        [
            {"name": "train", "test_config": [{"lr": [0.1]}]},
            {"name": "eval", "after": "train", "global_config": {"epochs": 1, "split": "test"}},
        ],
        global_config={"epochs": 3},
    )
    runs = list(Sweep(config))
    assert [r.config for r in runs] == [{"epochs": 3, "lr": 0.1}, {"epochs": 1, "split": "test"}]


@pytest.mark.parametrize(
    ("stages", "top", "message"),
    [
        ([{"name": "a"}, {"name": "b", "after": "c"}], {}, "after names 'c', which is not an earlier stage"),
        ([{"name": "b", "after": "a"}, {"name": "a"}], {}, "it comes later in stages"),
        ([{"name": "a"}, {"name": "a"}], {}, "appears twice"),
        ([{"name": "a/b"}], {}, "letters, digits"),
        ([{"name": "a", "test_config": [{"x": [1]}]}], {"test_config": [{}]}, "both stages and a top-level"),
        ([{"name": "a", "tets_config": []}], {}, "did you mean 'test_config'"),
        (
            [{"name": "a", "test_config": [{"x": [1]}]}, {"name": "b", "after": "a", "test_config": [{"x": [2]}]}],
            {},
            "stage 'b' has a run with x=2, but no run of stage 'a' has those values",
        ),
        ([{"name": "a"}, {"name": "b", "after": "a", "match": ["x"]}], {}, "match names 'x', which stage 'b'"),
        ([{"name": "a", "match": ["x"]}], {}, "match needs after"),
        (
            [{"name": "a", "test_config": [{"x": [1, 2]}]}, {"name": "b", "after": "a", "command": "cat {dep_dir}/m"}],
            {},
            "uses {dep_dir}, but its runs wait for 2 runs each",
        ),
        ([{"name": "a", "command": "cat {dep_dir}/m"}], {}, "stage 'a' runs its own command, and"),
        ([], {}, "stages must be a non-empty list"),
    ],
)
def test_a_stage_config_mistake_is_an_error_before_anything_runs(tmp_path, stages, top, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("{", r"\{")):
        Sweep({**staged(tmp_path, stages), **top})
    assert not os.path.exists(tmp_path / ".gts")


def test_overrides_reach_every_stage_that_sweeps_the_key(tmp_path):
    config = apply_overrides(two_stages(tmp_path), ["seed=7,8", "+fail_lr=0.5"])[0]
    runs = list(Sweep(config))
    assert [r.name for r in runs if r.stage == "eval"][-1] == "eval.lr-0.5,seed-8,"
    assert len(runs) == 8 and all(r.config["fail_lr"] == 0.5 for r in runs)


# --- running --------------------------------------------------------------------------


def test_a_failed_train_run_blocks_only_its_own_eval_run_and_a_rerun_unblocks_it(in_tmp, capsys):
    root, fixed = in_tmp / "r", in_tmp / "fixed"
    config = two_stages(root, global_config={"fail_lr": 0.5, "fixed": str(fixed)})
    summary = GPUTaskScheduler(config).start()
    rows = ledger_rows(root)
    status = {name: row["status"] for name, row in rows.items()}
    assert status == {
        "train.lr-0.1,seed-0,": "succeeded",
        "train.lr-0.1,seed-1,": "succeeded",
        "train.lr-0.5,seed-0,": "failed",
        "train.lr-0.5,seed-1,": "failed",
        "eval.lr-0.1,seed-0,": "succeeded",
        "eval.lr-0.1,seed-1,": "succeeded",
        "eval.lr-0.5,seed-0,": "blocked",
        "eval.lr-0.5,seed-1,": "blocked",
    }
    blocked = rows["eval.lr-0.5,seed-1,"]
    assert blocked["cause"] == "its dependency train.lr-0.5,seed-1, failed (RuntimeError: training diverged at lr=0.5)"
    assert blocked["attempts"] == 0 and blocked["started_at"] is None and blocked["stage"] == "eval"
    assert not os.path.exists(root / "eval.lr-0.5,seed-1,")  # never started: no folder
    assert summary.exit_code == 1 and [o.name for o in summary.blocked] == [
        "eval.lr-0.5,seed-0,",
        "eval.lr-0.5,seed-1,",
    ]
    assert "4 succeeded, 2 failed, 2 blocked, 0 skipped" in summary.report()
    result = json.loads(rows["eval.lr-0.1,seed-1,"]["result"])
    assert result["models"] == [{"lr": 0.1, "seed": 1}]
    assert result["dirs"] == [str(root / "train.lr-0.1,seed-1,")] and result["env"] == result["dirs"][0]

    assert main(["status", str(root)]) == 0
    out = capsys.readouterr().out
    assert "4 succeeded, 2 failed, 2 blocked" in out and "its dependency train.lr-0.5,seed-0, failed" in out
    assert out.splitlines()[1:3] == ["  stage train: 2 succeeded, 2 failed", "  stage eval: 2 succeeded, 2 blocked"]

    # Fixed: the failed and the blocked runs run, the others are not repeated.
    fixed.write_text("")
    summary = GPUTaskScheduler(config).start()
    assert summary.ok and len(summary.skipped) == 4
    assert sorted(o.name for o in summary.succeeded) == [
        "eval.lr-0.5,seed-0,",
        "eval.lr-0.5,seed-1,",
        "train.lr-0.5,seed-0,",
        "train.lr-0.5,seed-1,",
    ]
    assert {row["status"] for row in ledger_rows(root).values()} == {"succeeded"}


def test_a_blocked_run_blocks_the_runs_that_wait_for_it_and_gts_retry_failed_runs_them(in_tmp, capsys):
    root, flag, journal, deps = in_tmp / "r", in_tmp / "flag", in_tmp / "journal", in_tmp / "deps"
    log = ["sh", "-c", 'echo "$0" >> "$1"', "{run_name}", str(journal)]
    config = staged(
        root,
        [
            {
                "name": "a",
                "test_config": [{"x": [1, 2]}],
                "command": ["sh", "-c", '[ "$0" = 1 ] || [ -e "$1" ]', "{x}", str(flag)],
            },
            {"name": "b", "after": "a", "test_config": [{"x": [1, 2]}], "command": log},
            {
                "name": "c",
                "after": "b",
                "command": ["sh", "-c", 'echo c >> "$0"; echo "$GTS_DEP_DIRS" > "$1"', str(journal), str(deps)],
            },
        ],
    )
    summary = GPUTaskScheduler(config).start()
    assert {o.name: o.cause for o in summary.blocked} == {
        "b.x-2,": "its dependency a.x-2, failed (the command failed with exit code 1)",
        "c": "its dependency b.x-2, is blocked",
    }
    assert journal_lines(journal) == ["b.x-1,"]
    flag.write_text("")
    assert main(["retry", str(root), "--failed", "--plain"]) == 0
    assert "running 3 run(s) again: a.x-2,, b.x-2,, c" in capsys.readouterr().out
    assert journal_lines(journal) == ["b.x-1,", "b.x-2,", "c"]
    assert journal_lines(deps) == [str(root / "b.x-1,"), str(root / "b.x-2,")]  # one folder per line
    assert {row["status"] for row in ledger_rows(root).values()} == {"succeeded"}


def test_a_run_waiting_for_its_dependency_does_not_hold_up_the_runs_behind_it(in_tmp):
    """train x=0 finishes only once eval x=1 has run: if the waiting eval x=0 held the queue,
    eval x=1 would never start and train x=0 would give up."""
    root, go = in_tmp / "r", in_tmp / "go"
    wait = f'i=0; while [ ! -e "{go}" ] && [ $i -lt 3000 ]; do i=$((i+1)); sleep 0.01; done; [ -e "{go}" ]'
    config = staged(
        root,
        [
            {
                "name": "train",
                "test_config": [{"x": [0, 1]}],
                "shell": True,
                "command": f"if [ {{x}} = 0 ]; then {wait}; fi",
            },
            {
                "name": "eval",
                "after": "train",
                "test_config": [{"x": [0, 1]}],
                "shell": True,
                "command": f'if [ {{x}} = 1 ]; then touch "{go}"; fi',
            },
        ],
        slots=("cpu", "cpu", "cpu"),
    )
    summary = GPUTaskScheduler(config).start()
    assert summary.ok and summary.succeeded_count == 4


def test_dry_run_status_and_results_know_the_stages(in_tmp, capsys):
    root = in_tmp / "r"
    config_file = in_tmp / "sweep.json"
    config_file.write_text(json.dumps(two_stages(str(root), global_config={"fail_lr": 0.5})))
    sys.path.insert(0, os.path.dirname(tasks.__file__))
    assert main(["run", str(config_file), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "r/eval.lr-0.1,seed-0,  (after train.lr-0.1,seed-0,)" in out and "8 runs: 8 run" in out
    assert main(["run", str(config_file), "--plain"]) == 1
    capsys.readouterr()
    assert main(["run", str(config_file), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "run again (blocked)" in out and "run again (failed)" in out and "skip (succeeded)" in out

    assert main(["results", str(root), "--stage", "train", "--format", "json"]) == 0
    table = json.loads(capsys.readouterr().out)
    assert [(row["stage"], row["lr"], row["seed"], row["status"]) for row in table] == [
        ("train", 0.1, 0, "succeeded"),
        ("train", 0.1, 1, "succeeded"),
        ("train", 0.5, 0, "failed"),
        ("train", 0.5, 1, "failed"),
    ]
    assert results.best(str(root), "loss", stage="train")["name"] == "train.lr-0.1,seed-0,"
    averaged = results.aggregate(str(root), "seed")
    assert [(row["stage"], row["lr"], row["runs"]) for row in averaged] == [("train", 0.1, 2), ("eval", 0.1, 2)]
    assert averaged[0]["result.loss.mean"] == pytest.approx(1.5)
    assert main(["results", str(root), "--stage", "evl"]) == 2
    assert "did you mean 'eval'?" in capsys.readouterr().err
