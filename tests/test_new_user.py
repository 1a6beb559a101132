"""What a new user trips on (the command line, shipped files, messages): each habit the tools
our users know have set, as ``gts`` meets it."""

import json
import os
import subprocess
import sys

import pytest

from gpu_task_scheduler.cli.main import main as gts

TESTS = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(TESTS)
WRITER = """import json, sys
table = json.load(open(sys.argv[1]))
json.dump(table[int(sys.argv[2])], open(sys.argv[3] + "/result.json", "w"))
"""


def write_sweep(folder, results, *, name="sweep.yaml", **more):
    """A command sweep over ``i`` whose run i writes ``results[i]`` as its result.json (YAML
    holds JSON); ``more``: top-level keys to add."""
    (folder / "table.json").write_text(json.dumps(results))
    (folder / "writer.py").write_text(WRITER)
    config = {
        "scheduler_config": {"gpu": ["cpu", "cpu"], "result_root_folder": "results"},
        "command": [sys.executable, str(folder / "writer.py"), str(folder / "table.json"), "{i}", "{work_dir}"],
        "test_config": [{"i": list(range(len(results)))}],
        **more,
    }
    path = folder / name
    path.write_text(json.dumps(config, indent=1))
    return str(path)


def _gts(*argv, cwd, **kwargs):
    return subprocess.run(
        [sys.executable, "-m", "gpu_task_scheduler", *argv], cwd=cwd, capture_output=True, text=True, timeout=120, **kwargs
    )


# --- the command line ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "sweep.yaml", "--dry-run", "i=5"],
        ["run", "sweep.yaml", "--dry-run", "--task", "gts_test_tasks:RecordTask", "i=5"],
        ["run", "sweep.yaml", "i=5", "--dry-run"],
        ["run", "--dry-run", "sweep.yaml", "--plain", "+seed=7", "i=5"],
    ],
)
def test_overrides_are_accepted_anywhere_after_the_subcommand(in_tmp, capsys, argv):
    write_sweep(in_tmp, [{}])
    assert gts(argv) == 0
    out = capsys.readouterr().out
    assert "i = 5" in out and "i-5," in out and "i-0," not in out
    assert ("global_config.seed = 7" in out) == ("+seed=7" in argv)


def test_what_is_not_an_override_is_still_refused(in_tmp, capsys):
    write_sweep(in_tmp, [{}])
    with pytest.raises(SystemExit) as exit:
        gts(["run", "sweep.yaml", "--dry-run", "--bogus", "i=5"])
    assert exit.value.code == 2 and "unrecognized arguments: --bogus" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit:
        gts(["status", "results", "i=5"])
    assert exit.value.code == 2 and "unrecognized arguments: i=5" in capsys.readouterr().err
