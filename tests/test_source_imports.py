"""What a script imports, read from its source (backends/local/sourceimports.py): the warm process's
imports before any run has ended. Nothing is imported to read it."""

import os
import subprocess
import sys

import pytest

from gpu_task_scheduler.backends.local import sourceimports

BASE = [folder for folder in sys.path[1:] if folder]


def _write(folder, name, text):
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize(
    "source, expected",
    [
        ("import fractions\nimport csv as table\n", ["fractions", "csv"]),
        ("from email import message\n", ["email", "email.message"]),  # a submodule named by `from`
        ("from typing import Any, List\n", ["typing"]),  # names that are no modules
        ("from os import *\n", ["os"]),
        ("try:\n    import graphlib\nexcept ImportError:\n    graphlib = None\n", ["graphlib"]),
        ('if __name__ == "__main__":\n    import difflib\n', ["difflib"]),
        ('if "__main__" == __name__:\n    import difflib\n', ["difflib"]),
        ("import os\nif os.environ.get('X'):\n    import wave\n", ["os"]),  # another condition: maybe never
        ("def main():\n    import colorsys\nclass A:\n    import sched\n", []),  # in a function or class
        ("from . import sibling\nfrom .. import cousin\n", []),  # relative: the user's own package
        ("import no_such_module_anywhere\n", []),
        ("import sys\n", []),  # built in: always there
        ("def broken(:\n", []),  # does not parse: nothing read
    ],
)
def test_the_imports_a_script_always_runs_are_read(tmp_path, source, expected):
    script = _write(tmp_path, "train.py", source)
    assert sourceimports.script_imports(script, BASE) == expected


def test_the_users_own_modules_are_read_for_theirs_and_never_listed(tmp_path):
    """A module beside the script (or in a package of the user's) is the user's: its imports are read
    in turn (a cycle of them read once each), it is never one to import ahead."""
    script = _write(tmp_path, "train.py", "from model import Net\nimport mypackage.layers\nimport fractions\n")
    _write(tmp_path, "model.py", "import csv\nimport mypackage.layers\nfrom train import x\n")
    _write(tmp_path, "mypackage/__init__.py", "import difflib\n")
    _write(tmp_path, "mypackage/layers.py", "import graphlib\nimport model\n")
    found = sourceimports.script_imports(script, BASE)
    assert sorted(found) == ["csv", "difflib", "fractions", "graphlib"], found
    assert not {"model", "mypackage", "mypackage.layers", "train"} & set(found)


def test_a_users_module_named_like_a_library_shadows_it_as_python_would(tmp_path):
    script = _write(tmp_path, "train.py", "import csv\n")
    _write(tmp_path, "csv.py", "import difflib\n")  # the script's folder comes first on sys.path
    assert sourceimports.script_imports(script, BASE) == ["difflib"]


def test_a_module_of_a_namespace_package_is_found_without_importing_its_parents(tmp_path):
    _write(tmp_path, "examples/integrations/task.py", "import fractions\n")  # no __init__.py anywhere
    found = sourceimports.module_file("examples.integrations.task", [str(tmp_path), *BASE])
    assert found == str(tmp_path / "examples" / "integrations" / "task.py")
    assert sourceimports.imports_of(found, [str(tmp_path), *BASE]) == ["fractions"]
    assert sourceimports.module_file("examples.integrations.missing", [str(tmp_path), *BASE]) is None


def test_code_given_with_dash_c_is_read(tmp_path):
    _write(tmp_path, "helper.py", "import graphlib\n")
    assert sourceimports.code_imports("import fractions; import helper", [str(tmp_path), *BASE]) == [
        "fractions",
        "graphlib",
    ]


def test_reading_is_bounded(tmp_path, monkeypatch):
    """A source file too large is not read; a chain of the user's modules is read up to MOST_FILES."""
    huge = _write(tmp_path, "huge.py", "import fractions\n" + "x = 1\n" * 10)
    monkeypatch.setattr(sourceimports, "MOST_BYTES", 50)
    assert sourceimports.script_imports(huge, BASE) == []
    monkeypatch.undo()
    for index in range(sourceimports.MOST_FILES + 5):
        _write(
            tmp_path,
            f"chain{index}.py",
            f"import chain{index + 1}\nimport fractions\n" if index == 40 else f"import chain{index + 1}\n",
        )
    assert sourceimports.script_imports(str(tmp_path / "chain0.py"), BASE) == []  # chain40 is never reached


def test_reading_imports_nothing(tmp_path):
    """Run in a fresh interpreter: the modules read are not in sys.modules afterwards, and the
    user's package's __init__ never ran."""
    _write(tmp_path, "mypackage/__init__.py", "import difflib\nraise SystemExit('ran')\n")
    script = _write(tmp_path, "train.py", "import fractions\nimport mypackage\nfrom email import message\n")
    code = (
        "import sys\n"
        "from gpu_task_scheduler.backends.local import sourceimports as s\n"
        f"found = s.script_imports({script!r}, [p for p in sys.path[1:] if p])\n"
        "loaded = [m for m in ('fractions', 'difflib', 'mypackage', 'email.message') if m in sys.modules]\n"
        "print(found, loaded)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=os.getcwd())
    assert done.stdout.strip() == "['fractions', 'email', 'email.message', 'difflib'] []", done.stderr
