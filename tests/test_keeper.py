"""The keeper: one process per sweep that ends its command runs when the scheduler is gone, and
spares a run whose command had already ended, so that its success is recorded (keeper.py)."""

import json
import os
import signal
import subprocess
import sys

import pytest
from conftest import wait_until
from test_escapes import alive

from gpu_task_scheduler.backends.local.keeper import Keeper, available
from gpu_task_scheduler.backends.local.prepare import command_argv
from gpu_task_scheduler.backends.local.process import Child

pytestmark = pytest.mark.skipif(not available(), reason="the keeper needs Linux /proc")


def children(pid):
    with open(f"/proc/{pid}/task/{pid}/children") as handle:
        return [int(child) for child in handle.read().split()]


def state(pid):
    with open(f"/proc/{pid}/stat", "rb") as handle:
        return handle.read().rsplit(b")", 1)[1].split()[0].decode()


def start(tmp_path, keeper, argv, token="t0ken"):
    """A command run's wrapper, as the local launcher starts it (its log and outcome in tmp_path)."""
    env = dict(os.environ, GTS_OUTCOME_FILE=str(tmp_path / "outcome.json"), GTS_CONFIG_HASH="h")
    return Child(
        command_argv(argv),
        env=env,
        cwd=os.getcwd(),
        log_path=str(tmp_path / "log"),
        on_exit=lambda: None,
        token=token,
        keeper=keeper,
    )


def test_a_running_command_and_what_it_started_die_when_the_keeper_hears_eof(tmp_path, no_leaked_processes):
    keeper = Keeper()
    # The line starts a daemon that leaves the session (setsid) but keeps the run's token.
    line = f"setsid sleep 60 & echo $! > {tmp_path}/daemon; sleep 60"
    child = start(tmp_path, keeper, ["/bin/sh", "-c", line])
    wait_until(lambda: (tmp_path / "daemon").exists() and (tmp_path / "daemon").read_text().strip())
    daemon = int((tmp_path / "daemon").read_text())
    keeper.close()  # as a scheduler killed with SIGKILL: the pipe's other end closes
    wait_until(lambda: child.has_exited(), message="the wrapper to be killed")
    assert child.reap() == -signal.SIGKILL
    wait_until(lambda: not alive(daemon), message="the run's daemon to be killed")
    assert not (tmp_path / "outcome.json").exists()


def test_a_command_that_has_ended_is_spared_so_its_success_is_recorded(tmp_path, no_leaked_processes):
    keeper = Keeper()
    os.mkfifo(tmp_path / "go")
    child = start(tmp_path, keeper, ["/bin/sh", "-c", "read -r _ < " + str(tmp_path / "go")])
    wait_until(lambda: children(child.pid), message="the command to start")
    (command,) = children(child.pid)
    os.kill(child.pid, signal.SIGSTOP)  # the wrapper cannot reap its command, nor record it, yet
    with open(tmp_path / "go", "w") as fifo:
        fifo.write("\n")
    wait_until(lambda: state(command) == "Z", message="the command to end")
    keeper.close()  # the scheduler is gone just as the command ended
    wait_until(lambda: child.has_exited(), message="the wrapper to go on and end")
    assert child.reap() == 0
    outcome = json.loads((tmp_path / "outcome.json").read_text())
    assert (outcome["status"], outcome["token"]) == ("succeeded", "t0ken")


def log_text(folder):
    path = folder / "log"
    return path.read_text(errors="replace")[-2000:] if path.exists() else None


def cmdline(pid):
    with open(f"/proc/{pid}/cmdline", "rb") as handle:
        return handle.read().decode().split("\0")


def wrapper_at(tmp_path, keeper, script):
    """A process the keeper takes for a wrapper (``$0`` gts-command, its session's leader, the
    keeper's mark and descriptors) that runs ``script`` in the shell itself: it blocks in ``read``
    on the fifo ``go``, with no child, at the point of a wrapper's life that ``script`` sets up."""
    os.mkfifo(tmp_path / "go")
    argv = ["/bin/sh", "-c", f"{script}; read -r _ < {tmp_path}/go", "gts-command"]
    return Child(argv, env=dict(os.environ), cwd=os.getcwd(), log_path=None, on_exit=lambda: None, keeper=keeper)


def test_a_wrapper_frozen_before_it_said_its_command_started_is_spared_once_the_command_ended(
    tmp_path, no_leaked_processes
):
    """The keeper may freeze a wrapper between starting its command and closing GTS_FORKED_FD: its
    command, already ended (a zombie), must not be run again, so the wrapper is spared to record it.
    (Under load this window made test_a_command_that_has_ended_is_spared... fail, 4 runs in 7.)"""
    keeper = Keeper()
    os.mkfifo(tmp_path / "end")
    # The command (a background job) waits for "end". The shell then becomes a Python that never
    # reaps it (the shell itself reaps an ended job when it next looks, so its zombie would not
    # stay), keeping the wrapper's $0 as argv[3] and its descriptors: GTS_FORKED_FD still open.
    code = "import sys; open(sys.argv[2]).read()"
    python = f"exec {sys.executable} -c '{code}' gts-command {tmp_path}/go"
    child = wrapper_at(tmp_path, keeper, f"read -r _ < {tmp_path}/end & {python}")
    wait_until(lambda: [state(pid) for pid in children(child.pid)] == ["S"], message="the command to start")
    wait_until(lambda: cmdline(child.pid)[0] == sys.executable, message="the wrapper to become Python")
    with open(tmp_path / "end", "w") as fifo:
        fifo.write("\n")
    wait_until(lambda: [state(pid) for pid in children(child.pid)] == ["Z"], message="the command to end")
    keeper.close()
    assert not child.has_exited()  # spared, and let go on
    with open(tmp_path / "go", "w") as fifo:
        fifo.write("\n")
    wait_until(lambda: child.has_exited(), message="the wrapper to end")
    assert child.reap() == 0


def test_a_wrapper_frozen_before_it_said_its_command_started_is_killed_while_the_command_runs(
    tmp_path, no_leaked_processes
):
    keeper = Keeper()
    child = wrapper_at(tmp_path, keeper, "sleep 600 & :")
    wait_until(lambda: [state(pid) for pid in children(child.pid)] == ["S"], message="the command to start")
    (command,) = children(child.pid)
    keeper.close()
    wait_until(lambda: child.has_exited(), message="the wrapper to be killed")
    assert child.reap() == -signal.SIGKILL
    wait_until(lambda: not alive(command), message="its command to be killed")


def test_a_wrapper_that_has_not_started_its_command_yet_is_killed(tmp_path, no_leaked_processes):
    keeper = Keeper()
    child = wrapper_at(tmp_path, keeper, "true")  # both descriptors open: nothing started yet
    wait_until(lambda: state(child.pid) == "S", message="the wrapper to block")
    keeper.close()
    wait_until(lambda: child.has_exited(), message="the wrapper to be killed")
    assert child.reap() == -signal.SIGKILL


def test_a_wrapper_that_has_reaped_its_command_is_left_to_record_it(tmp_path, no_leaked_processes):
    keeper = Keeper()
    # Started and reaped (no child), not yet past its wait: the command has ended.
    child = wrapper_at(tmp_path, keeper, 'eval "exec $GTS_FORKED_FD<&-"')
    wait_until(lambda: state(child.pid) == "S", message="the wrapper to block")
    keeper.close()  # waits for the keeper to exit: it has decided
    assert not child.has_exited()  # spared, and let go on (SIGCONT): blocked where it was
    wait_until(lambda: state(child.pid) == "S", message="the wrapper to go on")
    with open(tmp_path / "go", "w") as fifo:
        fifo.write("\n")
    wait_until(lambda: child.has_exited(), message="the wrapper to end")
    assert child.reap() == 0


def test_a_keeper_that_was_killed_is_started_again_for_the_next_run(tmp_path, no_leaked_processes):
    keeper = Keeper()
    first = start(tmp_path, keeper, ["/bin/sh", "-c", "sleep 60"], token="first")
    killed = keeper._pid
    os.kill(killed, signal.SIGKILL)
    wait_until(lambda: state(killed) == "Z", message="the keeper to die")
    second = start(tmp_path, keeper, ["/bin/sh", "-c", "sleep 60"], token="second")
    assert keeper._pid not in (None, killed)
    keeper.close()  # the new keeper has the same mark: it ends the first run too
    for child in (first, second):
        wait_until(lambda child=child: child.has_exited(), message="the runs to be killed")
        assert child.reap() == -signal.SIGKILL


def test_a_wrapper_runs_its_command_in_the_runs_directory_wherever_the_scheduler_is(tmp_path, no_leaked_processes):
    # A supervisor on a cluster node starts runs in the driver's directory, not its own: the
    # wrapper changes there itself, so it is still started with its descriptors at low numbers.
    keeper = Keeper()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = dict(os.environ, GTS_OUTCOME_FILE=str(tmp_path / "outcome.json"), GTS_CONFIG_HASH="h")
    child = Child(
        command_argv(["/bin/sh", "-c", 'pwd > here; echo "$GTS_LIFELINE_FD $GTS_FORKED_FD" > fds']),
        env=env,
        cwd=str(elsewhere),
        log_path=str(tmp_path / "log"),
        on_exit=lambda: None,
        keeper=keeper,
    )
    wait_until(child.has_exited, message="the run to end")
    assert child.reap() == 0, (tmp_path / "log").read_text()
    keeper.close()
    assert (elsewhere / "here").read_text().strip() == str(elsewhere)
    assert all(len(fd) == 1 for fd in (elsewhere / "fds").read_text().split())
    assert json.loads((tmp_path / "outcome.json").read_text())["status"] == "succeeded"


_LOW_DESCRIPTORS = r"""
import os, socket, sys, time
from gpu_task_scheduler.backends.local.process import Child
out = os.dup(1)
os.close(0)  # standard input closed (a daemon's, or a test runner's worker's)
control, other = socket.socketpair()  # descriptor 0, then 1's replacement below
os.close(1)
script = 'for fd in $GTS_LIFELINE_FD $GTS_CONTROL_FD; do readlink /proc/$$/fd/$fd; done'
child = Child(["/bin/sh", "-c", script], env=dict(os.environ), cwd=os.getcwd(), log_path=sys.argv[1],
              on_exit=lambda: None, control=control.fileno())
while not child.has_exited():
    time.sleep(0.01)
os.write(out, f"{control.fileno()} {child.reap()}".encode())
"""


def test_a_child_gets_its_lifeline_and_control_socket_whatever_descriptors_they_have_here(tmp_path):
    """Where standard input is closed, the lifeline's pipe (or a control socket) gets descriptor 0
    here; the child's /dev/null took its place before it was moved, and every run read its
    lifeline's end at once and died (the watched wrapper's test failed so in a CI worker)."""
    log = tmp_path / "log"
    done = subprocess.run(
        [sys.executable, "-c", _LOW_DESCRIPTORS, str(log)], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout == "0 0", done.stderr  # the socket was descriptor 0 here; the child ended well
    lifeline, control = log.read_text().split()
    assert lifeline.startswith("pipe:") and control.startswith("socket:")


# The watched wrapper's test runs its scheduler side in a fresh interpreter: nothing of the tests
# that ran before it in this worker (their threads, their descriptors) can touch its lifeline.
# Twice in CI, a Python 3.13 worker's wrapper died by SIGKILL at its start (its watcher had read
# its lifeline's end); no run of it alone, nor of the quick subset (10 runs, one with every
# close of a descriptor not open logged: none), did so. It now says what it saw if it does again.
_WATCHED = r"""
import json, os, sys, time
from gpu_task_scheduler.backends.local.prepare import command_argv
from gpu_task_scheduler.backends.local.process import Child

folder, line = sys.argv[1], sys.argv[2]
env = dict(os.environ, GTS_OUTCOME_FILE=os.path.join(folder, "outcome.json"), GTS_CONFIG_HASH="h")
child = Child(command_argv(["/bin/sh", "-c", line], kept=False), env=env, cwd=os.getcwd(),
              log_path=os.path.join(folder, "log"), on_exit=lambda: None, token="w")
pipe = os.fstat(child._lifeline).st_ino
seen = {}

def children():
    try:
        with open(f"/proc/{child.pid}/task/{child.pid}/children") as handle:
            return handle.read().split()
    except OSError:
        return None

deadline = time.monotonic() + 20
if line != "true":
    while time.monotonic() < deadline and children() is not None and len(children()) != 2:
        time.sleep(0.01)
    seen["children"] = children()
    if seen["children"] is not None and len(seen["children"]) == 2:
        os.close(child._lifeline)  # as the scheduler's death closes it
        child._lifeline = -1
while time.monotonic() < deadline and not child.has_exited():
    time.sleep(0.01)
seen["exited"] = child.has_exited()
seen["same_lifeline"] = child._lifeline < 0 or os.fstat(child._lifeline).st_ino == pipe
seen["returncode"] = child.reap() if seen["exited"] else None
print(json.dumps(seen))
"""


@pytest.mark.parametrize("line", ["true", "sleep 60"])
def test_without_a_keeper_each_wrapper_watches_the_lifeline_itself(tmp_path, no_leaked_processes, line):
    """Where there is no /proc for a keeper, the wrapper forks a watcher, as before the keeper: a
    run whose command ended records its success, one still running dies with its scheduler (and
    its log says why)."""
    done = subprocess.run(
        [sys.executable, "-c", _WATCHED, str(tmp_path), line], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    said = f"{seen}, log {log_text(tmp_path)!r}"
    if line == "true":
        assert seen["returncode"] == 0 and seen["same_lifeline"], said
        assert json.loads((tmp_path / "outcome.json").read_text())["token"] == "w"
        return
    assert seen["children"] is not None and len(seen["children"]) == 2, said  # the command and the watcher
    assert seen["returncode"] == -signal.SIGKILL and not (tmp_path / "outcome.json").exists(), said
    assert "the scheduler is gone" in log_text(tmp_path)
