"""Folder names: the original algorithm byte for byte, plus safety and uniqueness."""

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_task_scheduler import ConfigManager, Sweep
from gpu_task_scheduler.sweep.naming import MAX_NAME_BYTES, NameRegistry, config_string, folder_name, safe_folder_name
from gpu_task_scheduler.sweep.spec import config_hash, params_text


def original_name(
    test_config, indicator="-", separator=",", maxlen=30, ignored_keys=(), ignored_characters=(" ", "[", "]")
):
    """The original GPUTaskScheduler's _get_test_config_string, restated from its documentation."""
    text = ""
    for key in sorted(test_config.keys()):
        if key in ignored_keys:
            continue
        text += f"{key}{indicator}{str(test_config[key])[0:maxlen]}{separator}"
    for character in ignored_characters:
        text = text.replace(character, "")
    return text


CASES = [
    ({"wd": [0.0], "lr": [0.001]}, {}, "lr-0.001,wd-0.0,"),
    ({"run": [0], "packing_num": [1]}, {}, "packing_num-1,run-0,"),
    ({"layers": [[64, 64]]}, {}, "layers-64,64,"),
    ({"layers": [[64, 64]]}, {"ignored_characters_for_folder_name": [" "]}, "layers-[64,64],"),
    (
        {"method": ["GAN"], "num_zmode": [1]},
        {"test_config_string_indicator": "=", "test_config_string_separator": "_"},
        "method=GAN_num_zmode=1_",
    ),
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
    config = {"scheduler_config": {"gpu": ["0"], "result_root_folder": "res", **options}, "test_config": [block]}
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
    manager = ConfigManager(
        {
            "scheduler_config": {"gpu": ["0"], "ignored_keys_for_folder_name": ["seed"]},
            "test_config": [{"seed": [1], "lr": [0.1]}],
        }
    )
    run = manager.get_next_config()
    assert run["test_config_string"] == "lr-0.1,seed-1,"
    assert run["test_config_string_filtered"] == "lr-0.1,"
    assert run["work_dir"].endswith(os.sep + "lr-0.1,")


@pytest.mark.parametrize(
    "value",
    [
        "../../etc",
        "/../../../../tmp/x",
        "..",
        "a/../../b",
        "x\0y",
        "line\nbreak",
        "tab\there",
        "\x7f",
    ],
)
def test_hostile_values_stay_one_component_inside_the_root(value):
    config = {"scheduler_config": {"gpu": ["0"], "result_root_folder": "/srv/results"}, "test_config": [{"p": [value]}]}
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
    config = {"scheduler_config": {"gpu": ["0"]}, "test_config": [{"s": [prefix + "A", prefix + "B", prefix + "A"]}]}
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


# --- a folder never changes hands -------------------------------------------------------------------

PREFIX = "p" * 30  # values that agree in their first 30 characters share a folder name
A, B, C = PREFIX + "-a", PREFIX + "-b", PREFIX + "-c"


def _sweep(root, values, on_config_change="stop", **global_config):
    command = ["sh", "-c", 'printf "%s" "$1" > "$2/value.txt"', "sh", "{v}", "{work_dir}"]
    scheduler = {"gpu": ["cpu"], "result_root_folder": str(root), "scheduler_log_file_path": None}
    scheduler["on_config_change"] = on_config_change
    return {
        "scheduler_config": scheduler,
        "global_config": global_config,
        "test_config": [{"v": values}],
        "command": command,
    }


def _run(root, values, on_config_change="stop", **global_config):
    from gpu_task_scheduler import GPUTaskScheduler

    summary = GPUTaskScheduler(_sweep(root, values, on_config_change, **global_config)).start()
    assert summary.ok, summary
    return summary


def _folders(root):
    """Each value's folder, as written by the run that used it."""
    found = {}
    for name in os.listdir(root):
        path = os.path.join(root, name, "value.txt")
        if os.path.exists(path):
            with open(path) as handle:
                found[handle.read()] = name
    return found


@pytest.mark.parametrize("later", [[C, A], [A, C], [C, B, A], [B], [C]])
def test_a_folder_never_changes_hands_when_the_sweep_grows_shrinks_or_is_reordered(tmp_path, later):
    root = tmp_path / "r"
    _run(root, [A, B])
    before = _folders(root)
    assert before[A] == "v-" + PREFIX + "," and before[B].startswith("v-" + PREFIX + ",~")
    summary = _run(root, later, "rerun")  # [C] alone looks like A changed: see the tests below
    after = _folders(root)
    for value in (A, B):
        assert after[value] == before[value]  # never rewritten by another value's run
    ran = {os.path.basename(o.work_dir) for o in summary.succeeded}
    assert ran == ({after[C]} if C in later else set())  # only the new value ran
    assert sorted(summary.skipped) == sorted(before[v] for v in later if v != C)
    if C in later:
        assert after[C] not in before.values()
    manager = ConfigManager(_sweep(root, later, "rerun"))
    assert [os.path.basename(s.work_dir) for s in manager.iter_runs()] == [after[v] for v in later]


def test_folder_names_depend_only_on_the_config_not_on_order(tmp_path):
    names = {}
    for order in ([A, B, C], [C, B, A], [B, C, A]):
        for spec in Sweep(_sweep(tmp_path / "fresh", order)):
            names.setdefault(spec.config["v"], set()).add(spec.name)
    suffixed = [n for ns in names.values() for n in ns if "~" in n]
    for value in (A, B, C):  # a suffixed name is always the same one for the same value
        assert len({n for n in names[value] if "~" in n}) <= 1
    assert len(set(suffixed)) == len({v for v in names if any("~" in n for n in names[v])})


def test_a_folder_recorded_only_on_disk_is_not_taken_over(tmp_path):
    root = tmp_path / "r"
    _run(root, [A])
    os.remove(root / ".gts" / "ledger.sqlite3")
    _run(root, [C])
    assert _folders(root)[A] == "v-" + PREFIX + ","
    assert _folders(root)[C].startswith("v-" + PREFIX + ",~")


def test_a_run_whose_config_changed_since_it_succeeded_stops_the_start_or_runs_again_or_is_kept(tmp_path):
    from gpu_task_scheduler import ConfigError

    root = tmp_path / "r"
    _run(root, ["x", "y"], epochs=1)
    assert len(_run(root, ["x", "y"], epochs=1).skipped) == 2
    with pytest.raises(ConfigError) as raised:
        _run(root, ["x", "y"], epochs=2)
    message = str(raised.value)
    assert message.startswith("2 run(s) of this root succeeded with another config")
    assert f"{root / 'v-x,'}: config changed (epochs: 1 -> 2)" in message and "--accept-changes" in message
    kept = _run(root, ["x", "y"], "keep", epochs=2)
    assert sorted(kept.skipped) == ["v-x,", "v-y,"] and not kept.outcomes
    assert sorted(_run(root, ["x", "y"], epochs=2).skipped) == ["v-x,", "v-y,"]  # kept for good
    rerun = _run(root, ["x"], "rerun", epochs=3)
    assert [o.name for o in rerun.succeeded] == ["v-x,"] and not rerun.skipped


def test_a_run_whose_left_out_value_changed_is_not_taken_for_done(tmp_path):
    """A value cut short by the folder name (or a key left out of it) changed: the folder the root
    records for the old value looks like this run's, but its result is not."""
    from gpu_task_scheduler import ConfigError

    root = tmp_path / "r"
    _run(root, [A])
    with pytest.raises(ConfigError, match="swept values changed"):
        _run(root, [C])
    assert _folders(root) == {A: "v-" + PREFIX + ","}  # nothing ran
    kept = _run(root, [C], "keep")
    assert kept.skipped == ["v-" + PREFIX + ","] and not kept.outcomes
    assert _run(root, [C]).skipped == ["v-" + PREFIX + ","]  # kept for good
    assert _folders(root) == {A: "v-" + PREFIX + ","}
    other = tmp_path / "other"
    _run(other, [A])
    rerun = _run(other, [C], "rerun")
    renamed = _folders(other)[C]
    assert [o.name for o in rerun.succeeded] == [renamed] and renamed.startswith("v-" + PREFIX + ",~")
    assert _folders(other)[A] == "v-" + PREFIX + ","  # never another value's folder


def test_test_config_string_is_the_originals_raw_string():
    config = {"scheduler_config": {"gpu": ["0"]}, "test_config": [{"data_path": ["/data/set-1"], "seed": [1]}]}
    manager = ConfigManager(config)
    run = manager.get_next_config()
    assert run["test_config_string"] == original_name({"data_path": "/data/set-1", "seed": 1})
    assert run["test_config_string"] == "data_path-/data/set-1,seed-1,"
    assert run["test_config_string_filtered"] == "data_path-%2Fdata%2Fset-1,seed-1,"  # a folder name: escaped


# --- every run's strings are rendered from its values' pieces, equal to rendering it whole --------

_value = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=6)),
    lambda inner: st.lists(inner, max_size=2) | st.dictionaries(st.text(max_size=3), inner, max_size=2),
    max_leaves=4,
)
_key = st.text(min_size=1, max_size=4)


@settings(max_examples=150, deadline=None)
@given(
    global_config=st.dictionaries(_key, _value, max_size=3),
    blocks=st.lists(
        st.dictionaries(_key, st.lists(_value, min_size=1, max_size=3), max_size=3), min_size=1, max_size=2
    ),
    ignored_keys=st.lists(_key, max_size=2),
    ignored_characters=st.lists(st.text(min_size=1, max_size=2), max_size=3),
    maxlen=st.one_of(st.none(), st.integers(1, 8)),
)
def test_a_runs_names_params_and_hash_equal_rendering_the_run_whole(
    global_config, blocks, ignored_keys, ignored_characters, maxlen
):
    options = {
        "gpu": ["cpu"],
        "ignored_keys_for_folder_name": ignored_keys,
        "ignored_characters_for_folder_name": ignored_characters,
        "config_string_value_maxlen": maxlen,
    }
    sweep = Sweep({"scheduler_config": options, "global_config": global_config, "test_config": blocks})
    configs = list(sweep.test_configs())
    runs = list(sweep.runs())
    assert len(runs) == len(configs)
    for spec, (block, test_config) in zip(runs, configs, strict=True):
        whole = dict(global_config, **test_config)
        shown = config_string(
            test_config,
            indicator="-",
            separator=",",
            maxlen=maxlen,
            ignored_characters=ignored_characters,
        )
        assert (spec.block, spec.test_config) == (block, test_config)
        assert spec.config == whole and spec.config_hash == config_hash(whole)
        assert spec.params == params_text(test_config)
        assert spec.test_config_string == shown
        if spec.renamed_from is None and not spec.duplicate:
            assert spec.name == folder_name(
                config_string(
                    test_config,
                    indicator="-",
                    separator=",",
                    maxlen=maxlen,
                    ignored_keys=ignored_keys,
                    ignored_characters=ignored_characters,
                )
            )


def test_runs_own_their_mutable_global_values():
    sweep = Sweep(
        {"scheduler_config": {"gpu": ["cpu"]}, "global_config": {"layers": [1]}, "test_config": [{"a": [1, 2]}]}
    )
    first, second = sweep.runs()
    first.config["layers"].append(2)
    assert second.config["layers"] == [1] and sweep.global_config["layers"] == [1]
