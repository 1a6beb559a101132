"""ConfigManager compatibility, config files, laziness and validation."""

import copy
import json
import os
import sys
import tracemalloc

import pytest
from helpers import make_config

from gpu_task_scheduler import ConfigError, ConfigManager, GPUTaskScheduler, Sweep, TaskClassError
from gpu_task_scheduler.gpu_task import GPUTask

README_CONFIG = {
    "scheduler_config": {"gpu": ["0", "1", "2"]},
    "global_config": {"num_run": 5, "num_epoch": 200},
    "test_config": [
        {"method": ["GAN", "ALI"], "num_packing": [1], "num_zmode": [1]},
        {"method": ["WGAN"], "num_packing": [3], "num_zmode": [1, 2]},
    ],
}


def test_runs_in_the_original_order_with_merged_configs(in_tmp):
    manager = ConfigManager(README_CONFIG)
    assert manager.get_num_left_config() == 4
    runs = []
    while True:
        run = manager.get_next_config()
        if run["config"] is None:
            assert run == {"config": None}
            break
        assert set(run) == {"config", "test_config_string", "test_config_string_filtered", "work_dir"}
        runs.append(run)
    assert manager.get_num_left_config() == 0
    assert [r["config"] for r in runs] == [
        {"num_run": 5, "num_epoch": 200, "method": "GAN", "num_packing": 1, "num_zmode": 1},
        {"num_run": 5, "num_epoch": 200, "method": "ALI", "num_packing": 1, "num_zmode": 1},
        {"num_run": 5, "num_epoch": 200, "method": "WGAN", "num_packing": 3, "num_zmode": 1},
        {"num_run": 5, "num_epoch": 200, "method": "WGAN", "num_packing": 3, "num_zmode": 2},
    ]
    assert list(runs[0]["config"]) == ["num_run", "num_epoch", "method", "num_packing", "num_zmode"]
    assert runs[2]["work_dir"] == os.path.join(os.path.abspath("results/"), "method-WGAN,num_packing-3,num_zmode-1,")


def test_first_key_varies_slowest():
    manager = ConfigManager({"scheduler_config": {"gpu": ["0"]}, "test_config": [{"b": [1, 2], "a": ["x", "y"]}]})
    assert manager.get_all_test_config() == [
        {"b": 1, "a": "x"},
        {"b": 1, "a": "y"},
        {"b": 2, "a": "x"},
        {"b": 2, "a": "y"},
    ]


def test_scheduler_defaults_match_the_original(in_tmp):
    config = {"scheduler_config": {"gpu": ["0", ["1", "2"], 3]}}
    assert ConfigManager(config).get_all_scheduler_config() == {
        "gpu": ["0", "1,2", "3"],
        "force_rerun": False,
        "result_root_folder": os.path.join(str(in_tmp), "results"),
        "temp_folder": os.path.join(str(in_tmp), "temp"),
        "test_config_string_indicator": "-",
        "test_config_string_separator": ",",
        "test_config_string_inst_separator": "+",
        "log_file": "worker.log",
        "scheduler_log_file_path": "scheduler.log",
        "config_string_value_maxlen": 30,
        "ignored_keys_for_folder_name": [],
        "ignored_characters_for_folder_name": [" ", "[", "]"],
        "skip_existing_folders": False,
        "max_retries": 0,
        "timeout": None,
        "grace_period": 10.0,
        "prewarm": True,
        "on_config_change": "stop",
        "max_runs_per_gpu": 1,
        "gpu_memory": None,
        "gpu_memory_key": "gpu_memory",
        "learn_gpu_memory": "max",
        "memory_margin": "512MiB",
        "min_free_gpu_memory": None,
        "placement": "first_fit",
        "busy_memory_fraction": None,
        "busy_utilization": None,
        "max_oom_retries": 2,
        "gpu_poll_interval": 2.0,
        "share_gpu_reservations": True,
        "idle_holder_after": 600.0,
        "cpu_fallback": 0,
        "max_host_cpu_percent": None,
        "min_host_free_memory": None,
        "budget": None,
        "checkpoints": None,
        "backend": "local",
        "ray_address": None,
        "ray_cpus_per_run": 0,
        "ray_local_gpus": None,
        "node_failure_retries": 3,
        "lease_interval": 1.0,
        "slurm": None,
        "notify_command": None,
        "notify_email": None,
    }


def test_other_getters(in_tmp):
    manager = ConfigManager(README_CONFIG)
    assert manager.get_all_global_config() == {"num_run": 5, "num_epoch": 200}
    assert manager.get_num_gpu() == 3
    assert manager.get_gpu_envs() == [
        {"name": "gpu0", "env": {"CUDA_VISIBLE_DEVICES": "0"}},
        {"name": "gpu1", "env": {"CUDA_VISIBLE_DEVICES": "1"}},
        {"name": "gpu2", "env": {"CUDA_VISIBLE_DEVICES": "2"}},
    ]
    assert manager.get_all_test_config_in_string() == (
        "method-['GAN', 'ALI'],num_packing-[1],num_zmode-[1],+method-['WGAN'],num_packing-[3],num_zmode-[1, 2],+"
    )


def test_group_and_cpu_slots():
    manager = ConfigManager({"scheduler_config": {"gpu": [["1", "2"], "cpu", "cpu", "1,2"]}})
    assert manager.get_gpu_envs() == [
        {"name": "gpu1,2", "env": {"CUDA_VISIBLE_DEVICES": "1,2"}},
        {"name": "cpu0", "env": {"CUDA_VISIBLE_DEVICES": ""}},
        {"name": "cpu1", "env": {"CUDA_VISIBLE_DEVICES": ""}},
        {"name": "gpu1,2", "env": {"CUDA_VISIBLE_DEVICES": "1,2"}},
    ]


def test_range_prints_like_the_original():
    manager = ConfigManager(
        {
            "scheduler_config": {"gpu": ["0"], "test_config_string_inst_separator": "|"},
            "test_config": [{"seed": range(3)}],
        }
    )
    assert manager.get_all_test_config_in_string() == "seed-range(0, 3),|"
    assert [c["seed"] for c in manager.get_all_test_config()] == [0, 1, 2]


def test_relative_result_root_stays_relative():
    manager = ConfigManager(
        {"scheduler_config": {"gpu": ["0"], "result_root_folder": "out"}, "test_config": [{"a": [1]}]}
    )
    assert manager.get_next_config()["work_dir"] == os.path.join("out", "a-1,")


def test_no_test_config_gives_one_run_in_a_folder_of_its_own():
    """The original ran it in the result root itself, where a task that cleans its folder would delete
    every other run and the root's records (see sweep/naming.py)."""
    manager = ConfigManager(
        {"scheduler_config": {"gpu": ["0"], "result_root_folder": "out"}, "global_config": {"x": 1}}
    )
    assert manager.get_next_config() == {
        "config": {"x": 1},
        "test_config_string": "",
        "test_config_string_filtered": "run",
        "work_dir": os.path.join("out", "run"),
    }
    assert manager.get_next_config() == {"config": None}


def test_the_callers_dict_is_never_changed_and_nothing_is_written(in_tmp):
    config = copy.deepcopy(README_CONFIG)
    config["scheduler_config"]["gpu"].append(["3", "4"])
    before = copy.deepcopy(config)
    manager = ConfigManager(config)
    run = manager.get_next_config()
    run["config"]["num_run"] = 99
    manager.get_all_scheduler_config()["gpu"].append("9")
    manager.get_all_global_config()["num_run"] = 7

    class Task(GPUTask):
        def main(self):
            return None

    GPUTaskScheduler(config, Task)
    assert config == before
    assert ConfigManager(config).get_next_config()["config"]["num_run"] == 5
    assert os.listdir(in_tmp) == []


def test_config_files(in_tmp):
    (in_tmp / "c.yaml").write_text("scheduler_config:\n  gpu: [cpu]\ntest_config:\n  - lr: [0.1, 0.2]\n")
    (in_tmp / "c.json").write_text(
        json.dumps({"scheduler_config": {"gpu": ["cpu"]}, "test_config": [{"lr": [0.1, 0.2]}]})
    )
    (in_tmp / "c.py").write_text(
        "config = {'scheduler_config': {'gpu': ['cpu']}, 'test_config': [{'lr': [0.1, 0.2]}]}\n"
        "if __name__ == '__main__':\n    raise SystemExit('the main block must not run')\n"
    )
    for name in ("c.yaml", "c.json", "c.py"):
        assert [r.name for r in Sweep(str(in_tmp / name))] == ["lr-0.1,", "lr-0.2,"]
    assert ConfigManager(in_tmp / "c.yaml").get_num_left_config() == 2


@pytest.mark.parametrize(
    "content, suffix, message",
    [
        ("scheduler_config: [", ".yaml", "could not read config file"),
        ("- 1\n- 2\n", ".yml", "must hold a mapping"),
        ("x = 1\n", ".py", "no variable named 'config'"),
        ("{}", ".toml", "unknown suffix"),
    ],
)
def test_bad_config_files(in_tmp, content, suffix, message):
    path = in_tmp / f"bad{suffix}"
    path.write_text(content)
    with pytest.raises(ConfigError, match=message):
        Sweep(str(path))


def test_missing_config_file(in_tmp):
    with pytest.raises(ConfigError, match="does not exist"):
        Sweep("nope.yaml")


def test_a_million_runs_are_not_materialised():
    config = {
        "scheduler_config": {"gpu": ["0"]},
        "test_config": [{"a": list(range(100)), "b": list(range(100)), "c": list(range(100))}],
    }
    tracemalloc.start()
    manager = ConfigManager(config)
    first = manager.get_next_config()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert first["config"] == {"a": 0, "b": 0, "c": 0}
    assert manager.get_num_left_config() == 999_999
    assert len(manager.sweep) == 1_000_000
    assert peak < 5_000_000  # a materialised million runs would take hundreds of megabytes


BASE = {"scheduler_config": {"gpu": ["0"]}}


def with_scheduler(**values):
    return {"scheduler_config": {"gpu": ["0"], **values}}


INVALID = [
    (["scheduler_config"], ["list"], "must be a dict or the path"),
    ("config-without-suffix", ["config-without-suffix", ".yaml"], "unknown suffix"),
    ({}, ["scheduler_config"], "could not find scheduler_config"),
    ({"scheduler_config": {}}, ["gpu"], "could not find gpu"),
    ({"scheduler_config": {"gpu": []}}, ["gpu"], "is empty"),
    ({"scheduler_config": {"gpu": "0"}}, ["gpu"], 'must be "all" or a list of slots'),
    ({"scheduler_config": {"gpu": ["zero"]}}, ["gpu", "'zero'"], "not a GPU id"),
    ({"scheduler_config": {"gpu": [-1]}}, ["gpu", "-1"], "not a GPU id"),
    ({"scheduler_config": {"gpu": [1.5]}}, ["gpu", "1.5"], "expected"),
    ({"scheduler_config": {"gpu": [["0", "0"]]}}, ["gpu"], "same GPU twice"),
    ({"scheduler_config": {"gpu": [[]]}}, ["gpu"], "empty GPU group"),
    ({"scheduler_config": "gpu0"}, ["scheduler_config"], "must be a dict"),
    (with_scheduler(force_rerunn=True), ["force_rerunn", "did you mean 'force_rerun'"], "unknown key"),
    (with_scheduler(force_rerun="yes"), ["force_rerun", "'yes'"], "must be a bool"),
    (with_scheduler(config_string_value_maxlen="30"), ["config_string_value_maxlen", "'30'"], "integer >= 1"),
    (with_scheduler(config_string_value_maxlen=0), ["config_string_value_maxlen"], "integer >= 1"),
    (with_scheduler(config_string_value_maxlen=True), ["config_string_value_maxlen"], "integer >= 1"),
    (with_scheduler(ignored_keys_for_folder_name="seed"), ["ignored_keys_for_folder_name", "'seed'"], "list"),
    (with_scheduler(ignored_characters_for_folder_name=[" ", 1]), ["ignored_characters_for_folder_name"], "list"),
    (with_scheduler(max_retries=-1), ["max_retries"], "integer >= 0"),
    (with_scheduler(timeout=0), ["timeout"], "seconds > 0"),
    (with_scheduler(timeout=float("nan")), ["timeout"], "seconds > 0"),
    (with_scheduler(grace_period="10"), ["grace_period"], "seconds >= 0"),
    (with_scheduler(log_file="../escape.log"), ["log_file"], "relative to the run folder"),
    (with_scheduler(log_file="/abs.log"), ["log_file"], "relative to the run folder"),
    (with_scheduler(result_root_folder=""), ["result_root_folder"], "non-empty path"),
    ({**BASE, "global_config": [1, 2]}, ["global_config"], "must be a dict"),
    ({**BASE, "global_config": {1: "a"}}, ["global_config", "1"], "keys must be strings"),
    ({**BASE, "test_config": {"lr": [1]}}, ["test_config"], "wrap the dict in a list"),
    ({**BASE, "test_config": "lr"}, ["test_config"], "list of blocks"),
    ({**BASE, "test_config": [["lr", [1]]]}, ["test_config[0]"], "must be a dict"),
    ({**BASE, "test_config": [{"lr": 0.1}]}, ["test_config[0]['lr']", "0.1"], "not a list of values"),
    ({**BASE, "test_config": [{"lr": "0.1"}]}, ["test_config[0]['lr']", "'0.1'", "['0.1']"], "string"),
    ({**BASE, "test_config": [{"lr": [1]}, {"lr": []}]}, ["test_config[1]['lr']"], "empty list"),
    ({**BASE, "test_config": [{"lr": {0.1, 0.2}}]}, ["test_config[0]['lr']"], "is a set"),
    ({**BASE, "test_config": [{"lr": (x for x in [1])}]}, ["test_config[0]['lr']"], "one-shot iterator"),
    ({**BASE, "test_config": [{"lr": {"a": 1}}]}, ["test_config[0]['lr']"], "is a dict"),
    ({**BASE, "test_config": [{("a",): [1]}]}, ["test_config[0]", "('a',)"], "keys must be strings"),
    ({**BASE, "test_config": [{"": [1]}]}, ["test_config[0]"], "empty key"),
    ({**BASE, "tests_config": []}, ["tests_config", "did you mean 'test_config'"], "unknown key"),
]


@pytest.mark.parametrize("config, mentions, message", INVALID)
def test_invalid_configs_are_reported_clearly(in_tmp, config, mentions, message):
    with pytest.raises(ConfigError, match=message) as raised:
        ConfigManager(config)
    for text in mentions:
        assert text in str(raised.value)
    assert isinstance(raised.value, ValueError)  # the original raised ValueError
    assert os.listdir(in_tmp) == []


def test_result_root_that_is_a_file(in_tmp):
    (in_tmp / "results").write_text("")
    with pytest.raises(ConfigError, match="not a folder"):
        GPUTaskScheduler({"scheduler_config": {"gpu": ["0"], "result_root_folder": "results"}}, GPUTask)


@pytest.mark.parametrize("task_class", [object, GPUTask({}, "w"), "my.Task"])
def test_task_class_must_be_a_gpu_task(task_class):
    with pytest.raises(TaskClassError, match="subclass of gpu_task_scheduler.gpu_task.GPUTask"):
        GPUTaskScheduler({"scheduler_config": {"gpu": ["0"]}}, task_class)


def test_numpy_like_sequences_are_accepted():
    class Values:  # stands in for a numpy array: sized and indexable, not a list
        def __init__(self, items):
            self._items = items

        def __len__(self):
            return len(self._items)

        def __getitem__(self, index):
            return self._items[index]

    runs = list(Sweep({"scheduler_config": {"gpu": ["0"]}, "test_config": [{"lr": Values([0.1, 0.2])}]}))
    assert [r.config["lr"] for r in runs] == [0.1, 0.2]


def test_public_import_paths():
    import gpu_task_scheduler
    from gpu_task_scheduler.config_manager import ConfigManager as A
    from gpu_task_scheduler.gpu_task import GPUTask as B
    from gpu_task_scheduler.gpu_task_scheduler import GPUTaskScheduler as C

    assert (gpu_task_scheduler.ConfigManager, gpu_task_scheduler.GPUTask, gpu_task_scheduler.GPUTaskScheduler) == (
        A,
        B,
        C,
    )
    assert "gpu_task_scheduler" in sys.modules


YAML_FORMS = [
    ("1e-3", 0.001),
    ("5E-4", 0.0005),
    ("1e5", 100000.0),
    ("-1E+3", -1000.0),
    ("+.5", 0.5),
    (".5", 0.5),
    ("1.0", 1.0),
    ("3.", 3.0),
    ("1_000", 1000),
    ("0x10", 16),
    ("017", 15),
    ("12", 12),
    (".inf", float("inf")),
    ("inf", "inf"),
    ("yes", True),
    ("no", False),
    ("on", True),
    ("off", False),
    ("true", True),
    ("null", None),
    ("1e", "1e"),
    ("e3", "e3"),
    ("1.2.3", "1.2.3"),
    ("'1e-3'", "1e-3"),
]


@pytest.mark.parametrize("text,value", YAML_FORMS, ids=[t for t, _ in YAML_FORMS])
def test_yaml_numbers_load_as_a_user_means_them(tmp_path, text, value):
    (tmp_path / "c.yaml").write_text(f"scheduler_config: {{gpu: [cpu]}}\ntest_config: [{{lr: [{text}]}}]\n")
    (loaded,) = [spec.config["lr"] for spec in Sweep(str(tmp_path / "c.yaml"))]
    assert loaded == value and type(loaded) is type(value)


# Every scheduler_config key with values it must refuse and the words the message must hold. A key
# added without a row here fails test_every_scheduler_key_has_rows_of_bad_values.
BAD_VALUES = {
    "force_rerun": [("yes", "must be a bool"), (1, "must be a bool")],
    "result_root_folder": [(3, "must be a non-empty path"), ("", "must be a non-empty path"), ("a\0b", "without NUL")],
    "temp_folder": [(3, "must be a non-empty path"), ("", "must be a non-empty path")],
    "test_config_string_indicator": [(3, "must be a string"), (None, "must be a string")],
    "test_config_string_separator": [(3, "must be a string"), (["-"], "must be a string")],
    "test_config_string_inst_separator": [(3, "must be a string"), (b"+", "must be a string")],
    "log_file": [
        ("/abs.log", "relative to the run folder"),
        ("../x.log", "without '..'"),
        (3, "file name"),
        (".gts/x.log", "outside .gts/"),
    ],
    "scheduler_log_file_path": [("", "must be a non-empty path"), (3, "must be a non-empty path")],
    "config_string_value_maxlen": [(0, "1"), ("30", "integer"), (True, "integer")],
    "ignored_keys_for_folder_name": [("seed", "a list of non-empty strings"), ([""], "non-empty strings")],
    "ignored_characters_for_folder_name": [(" ", "a list of non-empty strings"), ([1], "non-empty strings")],
    "skip_existing_folders": [("no", "must be a bool"), (0, "must be a bool")],
    "max_retries": [(-1, "0"), (1.5, "integer"), ("2", "integer")],
    "timeout": [(0, "seconds > 0"), (-5, "seconds > 0"), ("60", "seconds"), (float("inf"), "seconds")],
    "grace_period": [(-1, "seconds >= 0"), (None, "seconds"), (float("nan"), "seconds")],
    "prewarm": [("yes", "bool"), (1, "bool")],
    "on_config_change": [("ask", "one of"), (None, "one of")],
    "max_runs_per_gpu": [(0, "1"), (2.5, "integer"), (None, "integer")],
    "gpu_memory": [("lots", "memory size"), (-1, "memory size"), ("10 parsecs", "memory size")],
    "gpu_memory_key": [("", "non-empty string"), (3, "non-empty string")],
    "learn_gpu_memory": [("min", "one of 'max', 'mean', None"), (True, "one of")],
    "memory_margin": [("lots", "memory size"), (None, "memory size")],
    "min_free_gpu_memory": [("some", "memory size"), (-1, "memory size")],
    "placement": [("best", "one of 'first_fit'"), (None, "one of")],
    "busy_memory_fraction": [(1.5, "fraction"), (0, "fraction"), ("half", "fraction")],
    "busy_utilization": [(150, "percentage"), (0, "percentage"), ("50%", "percentage")],
    "max_oom_retries": [(-1, "0"), ("2", "integer")],
    "gpu_poll_interval": [(0, "seconds > 0"), ("2", "seconds")],
    "share_gpu_reservations": [("no", "bool"), (0, "bool")],
    "idle_holder_after": [(-1, "seconds"), ("soon", "seconds")],
    "cpu_fallback": [(-1, "0"), (1.0, "integer")],
    "max_host_cpu_percent": [(-1, "percentage"), (101, "percentage")],
    "min_host_free_memory": [("plenty", "memory size")],
    "budget": [
        (50, "a dict of limits"),
        ({}, "a dict of limits"),
        ({"gpu_hour": 5}, "did you mean 'gpu_hours'"),
        ({"gpu_hours": 0}, "is a number > 0"),
        ({"gpu_hours": float("nan")}, "is a number > 0"),
        ({"gpu_hours": True}, "is a number > 0"),
    ],
    "checkpoints": [
        ("200GB", "a dict such as {max_disk"),
        ({}, "a dict such as {max_disk"),
        ({"max_dsk": "1GB"}, "did you mean 'max_disk'"),
        ({"max_disk": 0}, "a size above 0"),
        ({"max_disk": "lots"}, "a size above 0"),
        ({"max_disk": float("nan")}, "a size above 0"),
        ({"max_disk": True}, "a size above 0"),
    ],
    "backend": [("kubernetes", "one of 'local', 'ray', 'slurm'"), (None, "one of")],
    "ray_address": [(6379, "a string or null")],
    "ray_cpus_per_run": [(-1, "a number >= 0"), ("1", "a number >= 0"), (float("inf"), ">= 0")],
    "ray_local_gpus": [(-1, "integer >= 0"), (1.5, "integer")],
    "node_failure_retries": [(-1, "integer >= 0"), (True, "integer")],
    "lease_interval": [(0, "seconds > 0"), ("1", "seconds"), (float("inf"), "seconds")],
    "slurm": [("gpu", "a dict of Slurm options"), ([1], "a dict of Slurm options")],
    "notify_command": [(5, "a command"), ("  ", "a command"), ([1, 2], "a command")],
    "notify_email": [
        ({"host": "h"}, "a dict with host, sender, recipients"),
        ({"host": "h", "sender": "s", "recipients": "r"}, "recipients"),
        ({"host": "h", "sender": "s", "recipients": ["r"], "starttls": True, "ssl": True}, "choose one"),
        ({"host": "h", "sender": "s", "recipients": ["r"], "port": "25"}, "port"),
    ],
}


def test_every_scheduler_key_has_rows_of_bad_values():
    from gpu_task_scheduler.sweep.options import SCHEDULER_KEYS

    assert sorted(BAD_VALUES) == sorted(SCHEDULER_KEYS)


def test_options_are_typed_fields_parsed_once(tmp_path):
    """Every key is a field of the frozen options; sizes are bytes and seconds floats from then on."""
    import dataclasses

    from gpu_task_scheduler.sweep.options import SCHEDULER_KEYS, SchedulerOptions

    derived = {"slots", "given", "warm_imports"}  # warm_imports: prewarm's {imports: [...]}
    assert {f.name for f in dataclasses.fields(SchedulerOptions)} == {*SCHEDULER_KEYS, *derived}
    sweep = Sweep(
        make_config(
            tmp_path, [{"x": [1]}], gpu_memory="1.5GiB", memory_margin="1GB", min_host_free_memory=2048, timeout=3
        )
    )
    options = sweep.options
    assert (options.gpu_memory, options.memory_margin, options.min_host_free_memory) == (1610612736, 10**9, 2048)
    assert isinstance(options.timeout, float) and options.timeout == 3.0 and options.grace_period == 10.0
    assert options.memory_need({"x": 1}) == 1610612736
    assert options.memory_need({"gpu_memory": "2GiB"}) == 2 * 2**30
    assert sweep.options.as_dict()["gpu_memory"] == "1.5GiB"  # what the user wrote, for get_all_scheduler_config
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.timeout = 5  # type: ignore[misc]


@pytest.mark.parametrize(
    "key,value,words",
    [(k, v, w) for k, rows in BAD_VALUES.items() for v, w in rows],
    ids=[f"{k}={v!r}" for k, rows in BAD_VALUES.items() for v, _ in rows],
)
def test_every_scheduler_key_refuses_bad_values_by_name(tmp_path, key, value, words):
    config = {
        "scheduler_config": {"gpu": ["cpu"], "result_root_folder": str(tmp_path / "r"), key: value},
        "test_config": [{"a": [1]}],
    }
    with pytest.raises(ConfigError) as raised:
        Sweep(config)
    message = str(raised.value)
    assert f"scheduler_config[{key!r}]" in message and words in message, message
    assert repr(value)[:20] in message or key == "notify_email"  # the bad value is repeated
    assert not (tmp_path / "r").exists()


def test_a_slurm_sweep_without_gpu_gets_one_gpu_per_run_and_others_are_told_what_to_write():
    """On a cluster, "gpu": ["0", "1"] (this machine's GPUs) means nothing: "all" is the default."""
    sweep = Sweep(
        {"scheduler_config": {"backend": "slurm", "slurm": {"partition": "gpu"}}, "test_config": [{"a": [1]}]}
    )
    assert sweep.options.slots is None and sweep.options.given["gpu"] == "all"
    with pytest.raises(ConfigError, match='"gpu": "all" \\(every GPU here; on a cluster: one GPU per run\\)'):
        Sweep({"scheduler_config": {"backend": "ray"}, "test_config": [{"a": [1]}]})


def test_iter_runs_left_unfinished_may_be_closed_by_another_thread(tmp_path):
    """A generator of ConfigManager.iter_runs() holds the root's ledger open until it ends; one
    dropped half-way is closed by whichever thread collects it, and that closes the ledger too,
    without an error."""
    import threading

    import gts_test_tasks as tasks

    config = make_config(tmp_path / "r", [{"i": [0, 1, 2]}], global_config={"seconds": 0})
    assert GPUTaskScheduler(config, tasks.ContractTask).start().ok  # a ledger to read
    runs = ConfigManager(config).iter_runs()
    assert next(runs).name == "i-0,"  # the ledger is open now
    errors = []

    def close():
        try:
            runs.close()
        except Exception as error:  # what a collector's thread would print as "ignored"
            errors.append(error)

    closer = threading.Thread(target=close)
    closer.start()
    closer.join()
    assert errors == [] and list(runs) == []
