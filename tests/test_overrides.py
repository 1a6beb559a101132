"""Command-line overrides (``gts run sweep.yaml lr=0.1,0.01 +seed=1,2``): a table of cases, then end to end."""

import pytest

from gpu_task_scheduler import ConfigError
from gpu_task_scheduler.cli.main import main
from gpu_task_scheduler.sweep.overrides import apply_overrides

BASE = {
    "scheduler_config": {"gpu": ["cpu"]},
    "global_config": {"wd": 0.0, "model": {"layers": 4, "act": "relu"}},
    "test_config": [{"lr": [0.1], "bs": [32]}, {"lr": [0.5]}],
}


def changed(overrides):
    config, _ = apply_overrides(BASE, overrides)
    return config


CASES = [
    # a swept key: the values in every block that has it
    (["lr=0.1,0.01"], "test_config", [{"lr": [0.1, 0.01], "bs": [32]}, {"lr": [0.1, 0.01]}]),
    (["bs=64"], "test_config", [{"lr": [0.1], "bs": [64]}, {"lr": [0.5]}]),
    # a global key: fixed, or swept in every block when given several values
    (["wd=0.1"], "global_config", {"wd": 0.1, "model": {"layers": 4, "act": "relu"}}),
    (
        ["wd=0.1,0.2"],
        "test_config",
        [{"lr": [0.1], "bs": [32], "wd": [0.1, 0.2]}, {"lr": [0.5], "wd": [0.1, 0.2]}],
    ),
    (["global_config.wd=1e-3"], "global_config", {"wd": 0.001, "model": {"layers": 4, "act": "relu"}}),
    # nested keys: one value each
    (["model.layers=8"], "global_config", {"wd": 0.0, "model": {"layers": 8, "act": "relu"}}),
    (
        ["global_config.model.act=[gelu, tanh]"],
        "global_config",
        {"wd": 0.0, "model": {"layers": 4, "act": ["gelu", "tanh"]}},
    ),
    (["+model.dropout=0.1"], "global_config", {"wd": 0.0, "model": {"layers": 4, "act": "relu", "dropout": 0.1}}),
    # scheduler_config
    (["scheduler_config.timeout=600"], "scheduler_config", {"gpu": ["cpu"], "timeout": 600}),
    (["scheduler_config.gpu=[0, 1]"], "scheduler_config", {"gpu": [0, 1]}),
    # new keys, with +
    (["+seed=1"], "global_config", {"wd": 0.0, "model": {"layers": 4, "act": "relu"}, "seed": 1}),
    (["+seed=1,2"], "test_config", [{"lr": [0.1], "bs": [32], "seed": [1, 2]}, {"lr": [0.5], "seed": [1, 2]}]),
    # YAML values: floats in every form, strings, lists, quoted commas
    (["lr=1e-3,.5,1E2"], "test_config", [{"lr": [0.001, 0.5, 100.0], "bs": [32]}, {"lr": [0.001, 0.5, 100.0]}]),
    (["bs=[1, 2],'a,b',null"], "test_config", [{"lr": [0.1], "bs": [[1, 2], "a,b", None]}, {"lr": [0.5]}]),
    (["task=pkg.mod:Train"], "task", "pkg.mod:Train"),
]


@pytest.mark.parametrize("overrides, section, expected", CASES)
def test_an_override_changes_only_what_it_names(overrides, section, expected):
    config = changed(overrides)
    assert config[section] == expected
    moved = overrides == ["wd=0.1,0.2"]  # a global key given several values moves to the blocks
    if moved:
        assert config["global_config"] == {"model": {"layers": 4, "act": "relu"}}
    for other in set(BASE) - {section} - ({"global_config"} if moved else set()):
        assert config[other] == BASE[other]
    assert BASE["test_config"][0] == {"lr": [0.1], "bs": [32]}  # the input is not changed


ERRORS = [
    (["lrr=0.1"], "unknown key 'lrr' in the config .*did you mean 'lr'.* To add it, write \\+lrr=0.1"),
    (["+lr=0.1"], "adds 'lr', which the config has; drop the \\+"),
    (["model.depth=3"], "unknown key 'depth' in global_config"),
    (["nothing.here=3"], "unknown key 'nothing' in global_config"),
    (["lr"], "is not KEY=VALUE"),
    (["=3"], "is not KEY=VALUE"),
    (["a..b=3"], "is not KEY=VALUE"),
    (["test_config.lr=3"], "name the swept key itself"),
    (["lr=[1, 2"], "not YAML"),
    (["wd.x=1"], "global_config.wd is not a dict"),
]


@pytest.mark.parametrize("overrides, message", ERRORS)
def test_a_bad_override_is_a_clear_error(overrides, message):
    with pytest.raises(ConfigError, match=message):
        apply_overrides(BASE, overrides)


def test_overrides_sweep_a_real_run_and_show_in_the_dry_run(in_tmp, capsys):
    (in_tmp / "s.yaml").write_text(
        "scheduler_config: {gpu: [cpu], result_root_folder: r}\n"
        "global_config: {wd: 0.0}\n"
        "test_config: [{lr: [0.1]}]\n"
        "command: [sh, -c, 'echo $0 $1 > {work_dir}/args', '{lr}', '{wd}']\n"
    )
    argv = ["run", "s.yaml", "lr=1e-3,0.01", "wd=0.5", "scheduler_config.max_retries=1", "--plain"]
    assert main([*argv, "--dry-run"]) == 0
    shown = capsys.readouterr().out
    assert "override: lr swept over [0.001, 0.01] in 1 test_config block(s)" in shown
    assert "override: global_config.wd = 0.5" in shown and "2 runs: 2 run" in shown
    assert main(argv) == 0
    assert (in_tmp / "r" / "lr-0.001," / "args").read_text() == "0.001 0.5\n"
    assert (in_tmp / "r" / "lr-0.01," / "args").read_text() == "0.01 0.5\n"


def test_overrides_may_follow_the_gpus(in_tmp, capsys):
    (in_tmp / "s.yaml").write_text(
        "scheduler_config: {gpu: [0], result_root_folder: r}\ntest_config: [{lr: [1]}]\ncommand: ['true']\n"
    )
    assert main(["run", "--gpus", "cpu", "cpu", "s.yaml", "lr=2,3", "--dry-run"]) == 0
    shown = capsys.readouterr().out
    assert "r/lr-2," in shown and "r/lr-3," in shown


def test_a_changed_config_stops_gts_run_until_the_user_chooses(in_tmp, capsys):
    (in_tmp / "s.yaml").write_text(
        "scheduler_config: {gpu: [cpu], result_root_folder: r}\n"
        "global_config: {wd: 0.0}\n"
        "test_config: [{lr: [0.1]}]\n"
        "command: [sh, -c, 'echo $0 >> {work_dir}/ran', '{wd}']\n"
    )
    assert main(["run", "s.yaml", "--plain"]) == 0
    capsys.readouterr()
    assert main(["run", "s.yaml", "wd=0.5", "--dry-run"]) == 2  # what a start would say
    assert "config changed (wd: 0.0 -> 0.5)" in capsys.readouterr().err
    assert main(["run", "s.yaml", "wd=0.5", "--plain"]) == 2
    assert "--accept-changes" in capsys.readouterr().err
    assert main(["run", "s.yaml", "wd=0.5", "--keep", "--plain"]) == 0
    assert (in_tmp / "r" / "lr-0.1," / "ran").read_text() == "0.0\n"
    assert main(["run", "s.yaml", "wd=0.5", "--plain"]) == 0  # kept for good: nothing changed since
    assert main(["run", "s.yaml", "wd=0.7", "--accept-changes", "--plain"]) == 0
    assert (in_tmp / "r" / "lr-0.1," / "ran").read_text() == "0.0\n0.7\n"
