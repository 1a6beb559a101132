"""Folder names: the original algorithm byte for byte, plus safety and uniqueness."""
import os

import pytest

from gpu_task_scheduler import ConfigManager, Sweep
from gpu_task_scheduler.naming import MAX_NAME_BYTES, NameRegistry, safe_folder_name


def original_name(test_config, indicator="-", separator=",", maxlen=30, ignored_keys=(),
                  ignored_characters=(" ", "[", "]")):
    """The original GPUTaskScheduler's _get_test_config_string, restated from its documentation."""
    text = ""
    for key in sorted(test_config.keys()):
        if key in ignored_keys:
            continue
        text += "{}{}{}{}".format(key, indicator, str(test_config[key])[0:maxlen], separator)
    for character in ignored_characters:
        text = text.replace(character, "")
    return text


CASES = [
    ({"wd": [0.0], "lr": [0.001]}, {}, "lr-0.001,wd-0.0,"),
    ({"run": [0], "packing_num": [1]}, {}, "packing_num-1,run-0,"),
    ({"layers": [[64, 64]]}, {}, "layers-64,64,"),
    ({"layers": [[64, 64]]}, {"ignored_characters_for_folder_name": [" "]}, "layers-[64,64],"),
    ({"method": ["GAN"], "num_zmode": [1]}, {"test_config_string_indicator": "=",
                                             "test_config_string_separator": "_"}, "method=GAN_num_zmode=1_"),
    ({"s": ["x" * 50]}, {}, "s-" + "x" * 30 + ","),
    ({"s": ["abcdef"]}, {"config_string_value_maxlen": 3}, "s-abc,"),
    ({"s": ["abcdef"]}, {"config_string_value_maxlen": None}, "s-abcdef,"),
    ({"seed": [3], "lr": [0.1]}, {"ignored_keys_for_folder_name": ["seed"]}, "lr-0.1,"),
    ({"flag": [True], "none": [None]}, {}, "flag-True,none-None,"),
    ({"opt": [{"b": 1}]}, {}, "opt-{'b':1},"),
    ({"name": ["a b c"]}, {}, "name-abc,"),
    ({"r": [range(3)]}, {}, "r-range(0,3),"),
    ({"lr": [1e-05]}, {}, "lr-1e-05,"),
    ({"模型": ["变换器"]}, {}, "模型-变换器,"),
    ({"B": [1], "a": [2], "_": [3]}, {}, "B-1,_-3,a-2,"),
    ({"x": ["a,b"]}, {"ignored_characters_for_folder_name": [","]}, "x-ab"),
    ({"path": ["a%2Fb"]}, {}, "path-a%2Fb,"),
]


@pytest.mark.parametrize("block, options, expected", CASES)
def test_folder_names_match_the_original(block, options, expected):
    config = {"scheduler_config": {"gpu": ["0"], "result_root_folder": "res", **options},
              "test_config": [block]}
    run = next(iter(Sweep(config)))
    reference = original_name(
        run.test_config,
        indicator=options.get("test_config_string_indicator", "-"),
        separator=options.get("test_config_string_separator", ","),
        maxlen=options.get("config_string_value_maxlen", 30),
        ignored_keys=options.get("ignored_keys_for_folder_name", ()),
        ignored_characters=options.get("ignored_characters_for_folder_name", (" ", "[", "]")),
    )
    assert run.name == reference == expected
    assert run.work_dir == os.path.join("res", expected)


def test_unfiltered_string_keeps_ignored_keys():
    manager = ConfigManager({"scheduler_config": {"gpu": ["0"], "ignored_keys_for_folder_name": ["seed"]},
                             "test_config": [{"seed": [1], "lr": [0.1]}]})
    run = manager.get_next_config()
    assert run["test_config_string"] == "lr-0.1,seed-1,"
    assert run["test_config_string_filtered"] == "lr-0.1,"
    assert run["work_dir"].endswith(os.sep + "lr-0.1,")


@pytest.mark.parametrize("value", [
    "../../etc", "/../../../../tmp/x", "..", "a/../../b", "x\0y", "line\nbreak", "tab\there", "\x7f",
])
def test_hostile_values_stay_one_component_inside_the_root(value):
    config = {"scheduler_config": {"gpu": ["0"], "result_root_folder": "/srv/results"},
              "test_config": [{"p": [value]}]}
    run = next(iter(Sweep(config)))
    assert os.sep not in run.name and "\0" not in run.name and "\n" not in run.name
    assert os.path.dirname(os.path.normpath(run.work_dir)) == "/srv/results"


@pytest.mark.parametrize("name", [".", ".."])
def test_dot_names_are_escaped(name):
    assert safe_folder_name(name) not in (".", "..")
    assert "/" not in safe_folder_name(name)


def test_over_long_names_are_cut_and_stay_distinct():
    block = {f"key{i:02d}": ["v" * 30] for i in range(12)}
    config = {"scheduler_config": {"gpu": ["0"]}, "test_config": [block, {**block, "key00": ["w" * 30]}]}
    names = [run.name for run in Sweep(config)]
    assert all(len(name.encode()) <= MAX_NAME_BYTES for name in names)
    assert len(set(names)) == 2


def test_unicode_names_are_cut_on_character_boundaries():
    name = safe_folder_name("é" * 300)
    assert len(name.encode("utf-8")) <= MAX_NAME_BYTES
    name.encode("utf-8")  # valid UTF-8, no half character
    assert name.startswith("é" * 100)


def test_truncation_collisions_are_disambiguated_stably():
    prefix = "x" * 30
    config = {"scheduler_config": {"gpu": ["0"]},
              "test_config": [{"s": [prefix + "A", prefix + "B", prefix + "A"]}]}
    first = [(run.name, run.duplicate, run.renamed_from) for run in Sweep(config)]
    second = [(run.name, run.duplicate, run.renamed_from) for run in Sweep(config)]
    assert first == second
    (name_a, dup_a, _), (name_b, dup_b, renamed_b), (name_a2, dup_a2, _) = first
    assert name_a == f"s-{prefix},"
    assert name_b != name_a and name_b.startswith(name_a + "~") and renamed_b == name_a
    assert (name_a2, dup_a2) == (name_a, True)
    assert not dup_a and not dup_b


def test_stripped_character_collisions_are_disambiguated():
    config = {"scheduler_config": {"gpu": ["0"]}, "test_config": [{"s": ["a b", "ab"]}]}
    names = [run.name for run in Sweep(config)]
    assert names[0] == "s-ab," and names[1].startswith("s-ab,~") and len(set(names)) == 2


def test_identical_configs_in_two_blocks_share_a_name_and_are_marked_duplicate():
    config = {"scheduler_config": {"gpu": ["0"]}, "test_config": [{"lr": [0.1, 0.2]}, {"lr": [0.1]}]}
    runs = list(Sweep(config))
    assert [r.name for r in runs] == ["lr-0.1,", "lr-0.2,", "lr-0.1,"]
    assert [r.duplicate for r in runs] == [False, False, True]


def test_registry_extends_the_suffix_if_it_collides_too():
    registry = NameRegistry()
    assert registry.assign("n", "a" * 64) == ("n", False)
    # Occupy the 8-character suffix name with some third config.
    assert registry.assign("n~bbbbbbbb", "c" * 64) == ("n~bbbbbbbb", False)
    name, duplicate = registry.assign("n", "b" * 64)
    assert name == "n~bbbbbbbbbbbb" and not duplicate
