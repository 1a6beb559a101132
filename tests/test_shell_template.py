"""shell: true templates: no value is ever executed, in any quoting context, and each arrives intact."""

import os
import shutil
import subprocess

import pytest

from gpu_task_scheduler import ConfigError, GPUTaskScheduler
from gpu_task_scheduler.sweep.commands import render_shell
from gpu_task_scheduler.sweep.shell_template import compile_shell_template

PWNED = "pwned"
VALUES = [
    "; touch pwned",
    "$(touch pwned)",
    "`touch pwned`",
    "&& touch pwned",
    "| touch pwned",
    '"$(touch pwned)"',
    "'$(touch pwned)'",
    "'; touch pwned; '",
    '"; touch pwned; "',
    "a' b \"c",
    "\\'$(touch pwned)",
    "${IFS}touch${IFS}pwned",
    "*",
    "-n",
    "",
    "line1\nEOF\ntouch pwned\n",
    "$((1+1))",
    "x\\",
    "tab\there",
    "ünïcödé ☃",
]

# (template, expected output for a value v): each puts the placeholder in another context.
TEMPLATES = [
    ("printf '%s' {v}", lambda v: v),
    ("printf '%s' \"{v}\"", lambda v: v),
    ("printf '%s' '{v}'", lambda v: v),
    ("printf '%s' \"pre-{v}-post\"", lambda v: f"pre-{v}-post"),
    ("printf '%s' 'pre-{v}-post'", lambda v: f"pre-{v}-post"),
    ("printf '%s' pre-{v}-post", lambda v: f"pre-{v}-post"),
    ("printf '%s' \"$(printf '%s' {v})\"", lambda v: v.rstrip("\n")),
    ("printf '%s' \"$(printf '%s' \"{v}\")\"", lambda v: v.rstrip("\n")),
    ("printf '%s' \"`printf '%s' {v}`\"", lambda v: v.rstrip("\n")),
    ("x={v}; printf '%s' \"$x\"", lambda v: v),
    ("printf '%s' \"{v}\" '{v}' {v}", lambda v: v * 3),
    ("# a comment with {v}\nprintf '%s' {v}", lambda v: v),
    ("printf '%s' {v!r}", repr),
    ("printf '%s' {v:>3}", lambda v: f"{v:>3}"),
    ("cat <<EOF\n{v}\nEOF", lambda v: v + "\n"),
    ("cat <<-EOF\n\tpre {v}\n\tEOF\nprintf '%s' {v}", lambda v: f"pre {v}\n{v}"),
    ("( printf '%s' {v} )", lambda v: v),
    ("if true; then printf '%s' {v}; fi", lambda v: v),
]


def _run(script, env, cwd):
    return subprocess.run(
        ["/bin/sh", "-c", script], env={**os.environ, **env}, cwd=cwd, capture_output=True, timeout=30
    )


@pytest.mark.parametrize("template,expected", TEMPLATES, ids=[t for t, _ in TEMPLATES])
def test_every_value_arrives_intact_and_none_runs(tmp_path, template, expected):
    for value in VALUES:
        script, env = render_shell(template, {"v": value})
        assert value not in script or value in ("*", "", "-n", "x\\") or value in template
        done = _run(script, env, tmp_path)
        assert done.returncode == 0, (template, value, done.stderr)
        assert done.stdout.decode() == expected(value), (template, value)
        assert not (tmp_path / PWNED).exists(), (template, value)


@pytest.mark.skipif(shutil.which("bash") is None, reason="$'...' quoting needs bash")
def test_ansi_c_quotes(tmp_path):
    for value in VALUES:
        script, env = render_shell("printf '%s' $'a\\t{v}'", {"v": value})
        done = subprocess.run(
            ["bash", "-c", script], env={**os.environ, **env}, cwd=tmp_path, stdout=subprocess.PIPE, timeout=30
        )
        assert done.stdout.decode() == "a\t" + value
    assert not (tmp_path / PWNED).exists()


@pytest.mark.parametrize(
    "template,where",
    [
        ("echo $(( {n} + 1 ))", "arithmetic"),
        ("echo $(( ({n}) * 2 ))", "arithmetic"),
        ("echo ${{x:-{n}}}", "parameter expansion"),
        ("cat <<'EOF'\n{n}\nEOF", "quoted delimiter"),
        ('cat <<"EOF"\n{n}\nEOF', "quoted delimiter"),
        ("echo \\{n}", "backslash"),
        ('echo "\\{n}"', "backslash"),
        ("cat <<{n}", "delimiter"),
        ("echo {v:{n}}", "nested"),
    ],
)
def test_contexts_that_would_evaluate_or_hide_a_value_are_refused(template, where):
    with pytest.raises(ConfigError, match=where):
        compile_shell_template(template)


def test_placeholders_after_quoted_contexts_close_are_plain_again():
    script = compile_shell_template("echo \"a\" 'b' $(echo c) `d` ${{HOME}} $((1+2)) {v}").script
    assert script.endswith(' "${GTS_ARG_0}"')


def test_a_refused_template_fails_before_anything_is_written(in_tmp):
    config = {
        "scheduler_config": {"gpu": ["cpu"]},
        "test_config": [{"n": [1]}],
        "command": "echo $(( {n} + 1 ))",
        "shell": True,
    }
    with pytest.raises(ConfigError, match="arithmetic"):
        GPUTaskScheduler(config).start()
    assert os.listdir(in_tmp) == []


def test_hostile_values_in_a_shell_sweep_end_to_end(in_tmp):
    command = "printf '%s' \"{v}\" > \"{work_dir}/a.txt\"; printf '%s' '{v}' > '{work_dir}'/b.txt"
    config = {
        "scheduler_config": {"gpu": ["cpu", "cpu"], "scheduler_log_file_path": None},
        "test_config": [{"v": VALUES[:12]}],
        "command": command,
        "shell": True,
    }
    summary = GPUTaskScheduler(config).start()
    assert summary.ok and len(summary.succeeded) == 12
    for outcome in summary.succeeded:
        folder = in_tmp / "results" / outcome.name
        assert (folder / "a.txt").read_text() == (folder / "b.txt").read_text()
    written = sorted((in_tmp / "results" / o.name / "a.txt").read_text() for o in summary.succeeded)
    assert written == sorted(VALUES[:12])
    assert not (in_tmp / PWNED).exists()
