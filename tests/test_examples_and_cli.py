"""The README's promises: the demo sweep, lazy imports, the gts command."""

import json
import os
import subprocess
import sys

import pytest
from helpers import ledger_rows

from gpu_task_scheduler import lazy_import
from gpu_task_scheduler.cli.main import main as gts_main

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_quick_start_demo_runs_and_resumes(in_tmp):
    command = [sys.executable, os.path.join(REPO, "examples", "demo.py")]
    first = subprocess.run(command, cwd=str(in_tmp), capture_output=True, text=True, timeout=120)
    assert first.returncode == 0, first.stderr
    assert "Sweep summary: 6 succeeded, 1 failed, 0 skipped" in first.stderr
    assert "FloatingPointError: diverged" in first.stderr
    assert "results/demo/lr-0.1,momentum-0.9,        succeeded" in first.stdout
    assert (in_tmp / "results" / "demo" / "lr-0.01,momentum-0.0," / "metrics.json").exists()
    second = subprocess.run(command, cwd=str(in_tmp), capture_output=True, text=True, timeout=120)
    assert "Sweep summary: 0 succeeded, 1 failed, 6 skipped" in second.stderr
    assert (in_tmp / "results" / "demo" / "lr-1.2,momentum-0.0," / ".gts" / "logs" / "attempt-1-worker.log").exists()
    assert second.returncode == 0 and "lr-1.2,momentum-0.0, failed on purpose (lr 1.2 diverges)" in second.stdout
    # The runs it skipped are listed with the results they had, as the first start's were.
    first_loss = next(line for line in first.stdout.splitlines() if "lr-0.1,momentum-0.9," in line).split()[2]
    skipped = next(line for line in second.stdout.splitlines() if "lr-0.1,momentum-0.9," in line)
    assert skipped.split()[1:4] == ["succeeded", first_loss, "skipped"], second.stdout
    # Any other failure is one: the demo exits as gts run would.
    (in_tmp / "steps.yaml").write_text(
        open(os.path.join(REPO, "configs", "demo.yaml")).read().replace("steps: 300", "steps: -1")
    )
    third = subprocess.run([*command, "steps.yaml"], cwd=str(in_tmp), capture_output=True, text=True, timeout=120)
    assert third.returncode == 1 and "failed on purpose" not in third.stdout, third.stdout


def _documents():
    """The README and the documentation site's pages (the changelog aside), as text."""
    paths = [os.path.join(REPO, "README.md")]
    docs = os.path.join(REPO, "docs")
    paths += sorted(
        os.path.join(docs, name)
        for name in os.listdir(docs)
        if name.endswith(".md") and not os.path.islink(os.path.join(docs, name))
    )
    return {os.path.relpath(path, REPO): open(path, encoding="utf-8").read() for path in paths}


def _gts_run_lines(text):
    """The ``gts run`` commands the README shows (in code blocks, with or without a prompt)."""
    lines = []
    for block in text.split("```")[1::2]:
        for line in block.splitlines():
            line = line.removeprefix("$ ").split("  #", 1)[0].strip()
            if line.startswith("gts run "):
                lines.append(line)
    return lines


def test_every_shipped_config_and_readme_run_command_is_valid_as_written(in_tmp, capsys):
    """A dry run of each (read-only: it checks the config, the task, the slots and what would
    run), from a copy of the repository's layout, as a new user would type them."""
    import shlex
    import shutil

    for folder in ("configs", "examples"):
        shutil.copytree(os.path.join(REPO, folder), in_tmp / folder)
    (in_tmp / "sweep.yaml").write_text(_readme_block("<!-- shell-sweep: sweep.yaml -->"))
    commands = [f"gts run configs/{name}" for name in sorted(os.listdir(in_tmp / "configs"))]
    for text in _documents().values():  # the README's and the site's
        commands += _gts_run_lines(text)
    assert len(commands) >= 9 and "gts run configs/demo.yaml" in commands
    for command in commands:
        argv = shlex.split(command)[1:]  # a Ray cluster's (--address): its dry run reaches no cluster
        assert gts_main([*argv, "--dry-run"] if "--dry-run" not in argv else argv) == 0, (command, capsys.readouterr())
        out = capsys.readouterr().out
        assert " runs: " in out or "no run asked yet" in out, (command, out)  # a search: none asked yet
    assert not (in_tmp / "results").exists() and not (in_tmp / "runs").exists()  # a dry run writes nothing


def test_lazy_import_defers_the_import(in_tmp, monkeypatch):
    (in_tmp / "heavy_module_for_test.py").write_text("VALUE = 42\n")
    monkeypatch.syspath_prepend(str(in_tmp))
    heavy = lazy_import("heavy_module_for_test")
    assert "heavy_module_for_test" not in sys.modules
    assert heavy.VALUE == 42
    assert "heavy_module_for_test" in sys.modules
    missing = lazy_import("no_such_module_for_gts")
    with pytest.raises(ImportError):
        _ = missing.anything
    with pytest.raises(TypeError):
        lazy_import("")


def test_the_pytorch_example_imports_without_importing_torch():
    code = (
        "import sys; sys.path.insert(0, 'examples'); import pytorch_task; "
        "assert 'torch' not in sys.modules; print('ok')"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "ok", result.stderr


# What a command sweep without search, early_stop or prewarm never needs before its first run starts
# (each a few ms of every start; see docs/performance.md, "Dispatch").
NOT_AT_START = (
    "gpu_task_scheduler.tuning.search",
    "gpu_task_scheduler.tuning.stopping",
    "gpu_task_scheduler.tuning.space",  # a search's distributions
    "gpu_task_scheduler.sweep.slurm",  # backend slurm's options
    "gpu_task_scheduler.engine.stopper",
    "gpu_task_scheduler.cli.progress",
    "gpu_task_scheduler.backends.local.warm",
    "pickle",
    "statistics",
    "yaml",  # a .json config
    "lazy_object_proxy",
    "socket",
    "difflib",  # only a misspelt key's suggestion
    "subprocess",  # runs start with posix_spawn
    "tempfile",
    "pathlib",
    "urllib.parse",
    "hashlib",  # OpenSSL: the digests come from CPython's own modules (digest.py)
    "shutil",  # argparse's default help width
    "random",  # only the random placement draws
    "dataclasses",  # records derive from recordclass.Record
    "inspect",
    "ctypes",  # a look for NVIDIA's library needs only _ctypes' dlopen
)


def _command_sweep(test_config, **extra):
    """A one-slot command sweep of ``true`` runs, results in ./results, no scheduler log."""
    return {
        "scheduler_config": {"gpu": ["0"], "result_root_folder": "results", "scheduler_log_file_path": None},
        "test_config": [test_config],
        "command": ["true"],
        **extra,
    }


def _gts_run_in_a_fresh_interpreter(folder, config, *, setup="", at_end):
    """``gts run sweep.json --plain`` in a new interpreter in ``folder``: ``setup`` runs first,
    ``at_end`` (one line) once the run ends, however it ends."""
    (folder / "sweep.json").write_text(json.dumps(config))
    code = (
        f"import sys, runpy\n{setup}"
        "sys.argv = ['gts', 'run', 'sweep.json', '--plain']\n"
        "try:\n"
        "    runpy.run_module('gpu_task_scheduler', run_name='__main__', alter_sys=True)\n"
        f"finally:\n    {at_end}\n"
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)


def test_a_command_sweeps_start_imports_only_what_its_first_run_needs(in_tmp):
    """The modules loaded when gts run spawns its first process (the sweep's keeper, just before
    the first run): none of those only a search, early stopping, the status line or prewarm use."""
    setup = (
        "before, seen = set(sys.modules), []  # what site's .pth hooks loaded is not gts's\n"
        "def hook(event, args):\n"
        "    if event in ('os.posix_spawn', 'subprocess.Popen') and not seen:\n"
        "        seen.append(sorted(set(sys.modules) - before))\n"
        "sys.addaudithook(hook)\n"
    )
    at_end = "open('modules.json', 'w').write(__import__('json').dumps(seen[0]))"
    result = _gts_run_in_a_fresh_interpreter(in_tmp, _command_sweep({"i": [0, 1]}), setup=setup, at_end=at_end)
    assert result.returncode == 0, result.stderr
    loaded = set(json.loads((in_tmp / "modules.json").read_text()))
    assert "gpu_task_scheduler.engine.loop" in loaded  # the hook saw the start, not something before it
    assert sorted(loaded.intersection(NOT_AT_START)) == []
    assert {row["status"] for row in ledger_rows(in_tmp / "results").values()} == {"succeeded"}


@pytest.mark.parametrize(
    "extra",
    [
        {"early_stop": {"method": "asha", "metric": "loss", "mode": "min", "min_step": 1, "max_step": 9}},
        {"search": {"sampler": "random", "n_runs": 3, "metric": "loss", "mode": "min"}},
    ],
    ids=["early_stop", "search"],
)
def test_a_sweep_with_early_stopping_or_a_search_never_imports_dataclasses(in_tmp, extra):
    """Every record of the package is a recordclass.Record: not even these features' own records
    (rules, verdicts, trials, a search's space) import dataclasses, from the start to the summary."""
    test_config = {"lr": {"uniform": [0.0, 1.0]}} if "search" in extra else {"i": [0, 1]}
    at_end = "print(sorted({'dataclasses', 'inspect'} & set(sys.modules)))"
    result = _gts_run_in_a_fresh_interpreter(in_tmp, _command_sweep(test_config, **extra), at_end=at_end)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[]"
    rows = ledger_rows(in_tmp / "results")
    assert len(rows) == (3 if "search" in extra else 2) and {row["status"] for row in rows.values()} == {"succeeded"}


def test_gts_version_and_usage(capsys):
    with pytest.raises(SystemExit) as raised:
        gts_main(["--version"])
    from gpu_task_scheduler import __version__

    assert raised.value.code == 0 and capsys.readouterr().out == f"gts {__version__}\n"
    setup_py = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "setup.py")
    if os.path.exists(setup_py):  # the version is written once, in the package; setup.py reads it from there
        assert "version=version" in open(setup_py).read() and __version__ not in open(setup_py).read()
    assert gts_main([]) == 2
    assert "status" in capsys.readouterr().out


def test_gts_as_a_module():
    result = subprocess.run(
        [sys.executable, "-m", "gpu_task_scheduler", "status"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2 and "the following arguments are required: root" in result.stderr


def _readme_block(marker, text=None):
    """The code block after ``marker`` in the README or a page of the site (or in ``text``)."""
    if text is None:
        (text,) = [text for text in _documents().values() if marker in text]
    after = text.split(marker, 1)[1]
    return after.split("```", 2)[1].split("\n", 1)[1]


def test_the_readme_shell_sweep_runs_and_gives_the_tree_shown(in_tmp):
    (in_tmp / "sweep.yaml").write_text(_readme_block("<!-- shell-sweep: sweep.yaml -->"))
    (in_tmp / "examples").mkdir()
    (in_tmp / "examples" / "train.py").write_text(open(os.path.join(REPO, "examples", "train.py")).read())
    run = subprocess.run(
        [sys.executable, "-m", "gpu_task_scheduler", "run", "sweep.yaml"],
        cwd=str(in_tmp),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    tree = sorted(str(p.relative_to(in_tmp)) for p in (in_tmp / "runs").rglob("*") if ".gts" not in p.parts)
    assert ["runs"] + tree == _readme_block("<!-- shell-sweep-tree -->").split()
    results = subprocess.run(
        [sys.executable, "-m", "gpu_task_scheduler", "results", "runs"],
        cwd=str(in_tmp),
        capture_output=True,
        text=True,
        timeout=60,
    )
    lines = results.stdout.splitlines()
    assert lines[0].split()[:5] == ["name", "layers", "lr", "status", "duration"] and len(lines) == 5
    again = subprocess.run(
        [sys.executable, "-m", "gpu_task_scheduler", "run", "sweep.yaml"],
        cwd=str(in_tmp),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "0 succeeded, 0 failed, 4 skipped" in again.stderr


def test_the_public_names_are_exported_and_listed_statically():
    import ast

    import gpu_task_scheduler

    tree = ast.parse(open(gpu_task_scheduler.__file__).read())
    (listed,) = [
        node.value
        for node in tree.body
        if isinstance(node, ast.Assign) and any(getattr(target, "id", None) == "__all__" for target in node.targets)
    ]
    assert isinstance(listed, ast.List)  # a literal list: type checkers read it without running code
    names = [element.value for element in listed.elts]
    assert names == sorted(gpu_task_scheduler._EXPORTS)
    assert all(getattr(gpu_task_scheduler, name) is not None for name in names)


def test_the_readme_stages_example_is_the_config_file_and_runs(in_tmp):
    config = open(os.path.join(REPO, "configs", "stages.yaml"), encoding="utf-8").read()
    body = "".join(line for line in config.splitlines(keepends=True) if not line.startswith("#"))
    assert _readme_block("<!-- stages: configs/stages.yaml -->") == body.lstrip("\n")
    (in_tmp / "configs").mkdir()
    (in_tmp / "configs" / "stages.yaml").write_text(config)
    (in_tmp / "examples").mkdir()
    for script in ("train.py", "evaluate.py"):
        (in_tmp / "examples" / script).write_text(open(os.path.join(REPO, "examples", script)).read())
    gts = [sys.executable, "-m", "gpu_task_scheduler"]
    run = subprocess.run(
        gts + ["run", "configs/stages.yaml"], cwd=str(in_tmp), capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    assert "12 succeeded, 0 failed, 0 skipped" in run.stderr
    table = subprocess.run(
        gts + ["results", "results/stages", "--stage", "eval", "--format", "json"],
        cwd=str(in_tmp),
        capture_output=True,
        text=True,
        timeout=60,
    )
    rows = json.loads(table.stdout)
    assert len(rows) == 8 and all(row["stage"] == "eval" and 0 < row["result.accuracy"] < 1 for row in rows)


def test_the_early_stop_example_prunes_saves_and_runs_nothing_again(in_tmp):
    (in_tmp / "configs").mkdir()
    (in_tmp / "examples").mkdir()
    for path in ("configs/early_stop.yaml", "examples/curve_train.py"):
        (in_tmp / path).write_text(open(os.path.join(REPO, path), encoding="utf-8").read())
    argv = [sys.executable, "-m", "gpu_task_scheduler", "run", "configs/early_stop.yaml", "--plain"]

    def start():
        return subprocess.run(argv, cwd=str(in_tmp), capture_output=True, text=True, timeout=120)

    run = start()
    assert run.returncode == 0, run.stderr
    assert "stopped early, 0 skipped" in run.stderr
    rows = ledger_rows(in_tmp / "results" / "early_stop")
    pruned = [name for name, row in rows.items() if row["status"] == "pruned"]
    assert pruned and len(pruned) < 15 and {row["status"] for row in rows.values()} == {"pruned", "succeeded"}
    for name in pruned:  # SIGTERM reached the script, which saved before it ended
        assert (in_tmp / "results" / "early_stop" / name / "checkpoint.json").exists()
    again = start()
    assert again.returncode == 0 and "0 succeeded, 0 failed, 15 skipped" in again.stderr


def test_the_early_stop_example_pauses_with_hyperband_and_resumes_where_it_paused(in_tmp):
    (in_tmp / "configs").mkdir()
    (in_tmp / "examples").mkdir()
    for path in ("configs/early_stop.yaml", "examples/curve_train.py"):
        (in_tmp / path).write_text(open(os.path.join(REPO, path), encoding="utf-8").read())
    argv = [sys.executable, "-m", "gpu_task_scheduler", "run", "configs/early_stop.yaml", "early_stop.method=hyperband"]
    run = subprocess.run([*argv, "--plain"], cwd=str(in_tmp), capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    root = in_tmp / "results" / "early_stop"
    rows = ledger_rows(root)
    assert {row["status"] for row in rows.values()} == {"paused", "succeeded"}
    resumed = [name for name, row in rows.items() if row["attempts"] > 1]
    assert resumed  # promoted from a rung: the next attempt went on from the state it saved
    for name in resumed:
        assert "resumes after epoch " in (root / name / "worker.log").read_text()


def test_the_search_example_runs_its_budget_and_its_best_is_found(in_tmp):
    pytest.importorskip("optuna")
    (in_tmp / "configs").mkdir()
    (in_tmp / "examples").mkdir()
    for path in ("configs/search.yaml", "examples/curve_train.py"):
        (in_tmp / path).write_text(open(os.path.join(REPO, path), encoding="utf-8").read())
    gts = [sys.executable, "-m", "gpu_task_scheduler"]
    run = subprocess.run(
        gts + ["run", "configs/search.yaml", "--plain"], cwd=str(in_tmp), capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr
    assert "20 succeeded, 0 failed, 0 skipped" in run.stderr
    top = subprocess.run(
        gts + ["results", "results/search", "--sort", "result.loss", "--top", "3", "--format", "json"],
        cwd=str(in_tmp),
        capture_output=True,
        text=True,
    )
    rows = json.loads(top.stdout)
    assert len(rows) == 3 and rows[0]["result.loss"] <= rows[1]["result.loss"] <= rows[2]["result.loss"]
    assert 1e-3 <= rows[0]["lr"] <= 0.3 and 64 <= rows[0]["width"] <= 4096


# --- the README and the documentation site --------------------------------------------------


def _examples(text):
    """``{file name: code}`` of the blocks marked ``<!-- example: NAME -->``."""
    names = [part.split("-->", 1)[0].strip() for part in text.split("<!-- example: ")[1:]]
    return {name: _readme_block(f"<!-- example: {name} -->", text) for name in names}


@pytest.mark.parametrize("page", ["README.md", "docs/getting-started.md"])
def test_the_python_example_runs_as_written(in_tmp, page):
    """my_task.py and sweep.py, as a new user copies them; only the slots are CPU slots here."""
    files = _examples(_documents()[page])
    assert sorted(files) == ["my_task.py", "sweep.py"]
    for name, code in files.items():
        if name == "sweep.py":
            assert '"gpu": ["0", "1"]' in code
            code = code.replace('"gpu": ["0", "1"]', '"gpu": ["cpu", "cpu"]')
        (in_tmp / name).write_text(code)
    run = subprocess.run([sys.executable, "sweep.py"], cwd=in_tmp, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "5 succeeded, 0 failed, 0 skipped" in run.stderr
    shown = [
        "lr-0.1,wd-0.0,",
        "lr-0.1,wd-0.0001,",
        "lr-0.01,wd-0.0,",
        "lr-0.01,wd-0.0001,",
        "lr-0.001,optimizer-sgd,wd-0.0,",
    ]
    assert all(f"`{name}`" in _documents()[page].replace("\n", " ") for name in shown)
    rows = ledger_rows(in_tmp / "results")
    assert sorted(rows, key=lambda name: rows[name]["run_index"]) == shown
    assert all(json.loads(row["result"])["loss"] >= 0 for row in rows.values())


def test_the_readme_reading_commands_run_on_the_shell_sweeps_root(in_tmp, capsys):
    import shlex

    (in_tmp / "sweep.yaml").write_text(_readme_block("<!-- shell-sweep: sweep.yaml -->"))
    shutil_copy = open(os.path.join(REPO, "examples", "train.py")).read()
    (in_tmp / "examples").mkdir()
    (in_tmp / "examples" / "train.py").write_text(shutil_copy)
    os.chdir(in_tmp)
    assert gts_main(["run", "sweep.yaml", "--plain"]) == 0
    readme = _documents()["README.md"]
    block = readme.split("## Reading results", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    lines = [line.split("  #", 1)[0].split(" > ", 1)[0].strip() for line in block.strip().splitlines()]
    assert len(lines) >= 5
    for line in lines:
        argv = shlex.split(line)[1:]
        if argv[0] == "serve":
            continue  # serves until stopped: tests/test_web.py serves a root
        argv = [part if part != "loss.png" else str(in_tmp / "loss.png") for part in argv]
        assert gts_main(argv) == 0, (line, capsys.readouterr())
    assert (in_tmp / "loss.png").exists()


def test_the_readme_is_short_and_leads_with_what_a_newcomer_needs():
    readme = _documents()["README.md"]
    lines = readme.splitlines()
    assert len(lines) <= 350
    where = {line: index for index, line in enumerate(lines) if line.startswith("## ")}
    assert where["## Quick start"] < where["## Contents"] < where["## Requirements"] < where["## A sweep from Python"]
    assert where["## A sweep from Python"] < 150 and readme.index("GPUTaskScheduler(config=config") < len(
        "\n".join(lines[:150])
    )
    import re

    for target in re.findall(r"\]\(([^)#]+?)(?:#[^)]*)?\)", readme):  # every link to a file resolves
        assert target.startswith("http") or os.path.exists(os.path.join(REPO, target)), target


def test_every_gts_subcommand_is_in_the_documentation():
    from gpu_task_scheduler.cli.commands import COMMANDS

    cli = _documents()["docs/cli.md"]
    for name in COMMANDS:
        assert f"`gts {name}" in cli, name


def test_the_documentation_site_builds_strictly(tmp_path):
    """What .ci/run builds: a broken link or anchor, or a page left out of mkdocs.yml, fails."""
    pytest.importorskip("mkdocs")
    pytest.importorskip("material")
    build = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir", str(tmp_path / "site")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert build.returncode == 0, build.stderr
    assert (tmp_path / "site" / "cli" / "index.html").exists()


def test_the_documentation_spells_the_tasks_attributes_one_way():
    """self.config and self.work_dir in every example (the original's self._config and
    self._work_dir are named once, as names that work too)."""
    for page, text in _documents().items():
        for block in text.split("```")[1::2]:
            assert "self._config" not in block and "self._work_dir" not in block, page


def test_every_file_of_the_quick_subset_exists():
    """README: pytest -m quick. A file renamed away would leave the subset silently smaller."""
    from conftest import QUICK

    tests = os.path.join(REPO, "tests")
    assert all(os.path.exists(os.path.join(tests, name)) for name in QUICK) and len(QUICK) >= 20
