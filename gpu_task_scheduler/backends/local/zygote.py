"""Warm starts of a sweep's Python runs: the scheduler's side (the warm process and the run it
forks: ``forkserver.py``).

A ``GPUTask`` run, and a ``command:`` run whose program is this Python (the ``python`` its
``PATH`` finds is the interpreter running the scheduler, in the same folder: the same virtual
environment) and whose first argument is a script, ``-m module`` or ``-c code``, is forked from
the sweep's warm process instead of being started cold. (This replaced the pre-started runner per
slot, which paid the same imports, only earlier: no faster on 2 cores.) A GPUTask run's own
module is imported by the run, with its environment, never by the warm process.

Anything else starts cold, and the scheduler's log says why, once per reason: another
interpreter, an interpreter option (``python -u``), a run environment that differs from the warm
process's in what the scheduler inherited (not the run's own variables), a warm process that
refused to be forked from (a thread, a GPU driver), or one that is not ready yet.

What the warm process imports:

* what ``prewarm: {imports: [...]}`` names, from the start;
* what the run's script (``-m`` module, ``-c`` code, GPUTask module) imports whenever it runs, read
  from its source without running it (``sourceimports.py``), at its first start: the first warm
  process has the libraries the first run trains with, and the first run waits for it (a cold
  start would import the same, no sooner);
* what the sweep's forked runs imported of the standard library and installed packages, learned at each one's first
  ``report()`` and at its end (its ``.gts/imports.json``). When a run imported modules the warm process lacks, a new
  warm process with all of them is started beside it; it replaces the old one once it is ready
  (until then the old one forks). The list is kept in memory for the sweep, and each run's file
  stays in its folder: a sweep started again (after a kill, a Ctrl-C, to resume paused runs)
  recalls what a run imported before as it starts it again, so its first warm process already
  has the modules of the runs it resumes. New runs of a sweep that grew are learned from again.

Only the standard library's and installed packages' modules are learned: the user's own code (the
working folder, the script's, a library checkout on ``PYTHONPATH``, an editable install) is never
imported by it, so a script, or a module it imports, edited during a sweep runs as edited.

Why a fork is made the scheduler's child: the engine's guarantees about a run (its process group
signalled, never a reused pid, its end heard on a pidfd, what it left behind found by its session)
rest on the run being the scheduler's child, unreaped until the scheduler has stopped the rest of
it. The warm process forks a helper, which forks the run and exits; while the scheduler waits for
the run's pid it is a child subreaper (``PR_SET_CHILD_SUBREAPER``), so the run is re-parented to it.
It is one only for those milliseconds: a process of another run orphaned then would be adopted
too (and killed with its run by the token scans, as ever; its exit status is then the scheduler's
to read, and is left).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

from ...proctree import TOKEN_ENV, WARM_ENV, become_subreaper, parent_of
from ...records.paths import RunPaths, open_regular
from . import importcache, isolation
from .forkserver import IMPORTS_FILE
from .prepare import Launch, runner_argv_for
from .process import ADOPTED_WORD, Child, open_log
from .reaper import Reaper

logger = logging.getLogger("gpu_task_scheduler")

# Seconds the first start waits for the first warm process, at most. It imports what the runs
# import (their scripts' own imports, read from their source, those learned before, prewarm's), which
# a cold start would import as well, and no slower: waiting is sooner than starting cold (measured,
# torch and Lightning took 17 s to import on a busy machine, past the 15 s this was, and the first
# runs then started cold and imported them again, beside it).
READY_WAIT = 120.0
FORK_WAIT = 10.0  # seconds a start waits for the warm process's answer (two forks)


def script_argv(argv: Sequence[str], env: dict[str, str], cwd: str) -> tuple[list[str] | None, str]:
    """What a forked run runs for the command ``argv``: its script's ``sys.argv``, or ``['-m',
    module, ...]``, ``['-c', code, ...]``; or None and why it starts cold."""
    if len(argv) < 2:
        return None, "it is not a Python script with arguments"
    program = argv[0]
    found = program if os.sep in program else shutil.which(program, path=env.get("PATH", os.defpath))
    if found is None:
        return None, f"{program!r} is not found on its PATH"
    here = os.path.abspath(sys.executable)
    found = os.path.abspath(os.path.join(cwd, found))
    try:
        same = os.path.samefile(found, here) and os.path.dirname(found) == os.path.dirname(here)
    except OSError:
        same = False
    if not same:
        return None, f"its program {program!r} ({found}) is not the Python that runs gts ({here})"
    first = argv[1]
    if first in ("-m", "-c") and len(argv) >= 3:
        return [first, *argv[2:]], ""
    if first.startswith("-"):
        return None, f"it gives the interpreter an option ({first})"
    if not os.path.isfile(os.path.join(cwd, first)):
        return None, f"its script {first!r} is not a file"
    return list(argv[1:]), ""


# Read by Python as it starts (PYTHONPATH, PYTHONHASHSEED, PYTHONWARNINGS, PYTHONMALLOC, the
# locale), or by the libraries a warm process imports as they load (thread pools, allocators,
# backends, their folders): a fork keeps what its warm process started with, so a fork cannot take
# a run's own value of any of them. These are part of a warm process's identity, whoever set them
# (a task's required_env(), a pool agent's thread counts): the warm process is started with the
# first run's values, and a run whose values differ starts cold, said in the log.
READ_AT_START = (
    "PYTHON", "LC_", "LANG", "TZ", "LD_", "MALLOC_", "GLIBC_TUNABLES",
    "OMP_", "MKL_", "OPENBLAS_", "GOTO_", "BLIS_", "VECLIB_", "NUMEXPR_", "KMP_",
    "TORCH", "PYTORCH_", "KERAS_", "TF_", "JAX_", "XLA_", "HF_", "TRANSFORMERS_", "MPL",
)  # fmt: skip


# Set for each run by the scheduler (or by the machine's supervisor: a Ray worker's own environment
# holds the GPUs of the task it runs now), whatever the scheduler's own environment holds: never
# part of a warm process's identity. A forked run sets it before its script starts; a warm process
# never touches a GPU (isolation.py), so nothing read it before. Counted as shared, a Ray worker's
# second run on other GPUs started cold ("its environment differs ... in CUDA_VISIBLE_DEVICES": a
# fresh-clone CI run, 1 in 8 of the Ray test's runs under load).
PER_RUN = ("CUDA_VISIBLE_DEVICES",)


def shared_env(env: dict[str, str]) -> dict[str, str]:
    """What of a run's environment is the scheduler's own (every cold start inherits it), and what
    Python and the libraries read as they start (``READ_AT_START``): what the warm process is
    started with, and what a run must share with it to be forked from it. What the scheduler adds
    per run (its identity, its files, its GPUs: ``PER_RUN``, its command's values) is not in it: a
    forked run sets it before its script starts."""
    return {
        key: value
        for key, value in env.items()
        if key not in PER_RUN and (os.environ.get(key) == value or key.startswith(READ_AT_START))
    }


class WarmProcess:
    """One warm process (a child of ours, like a run: its own session, dies with the scheduler)."""

    def __init__(self, env: dict[str, str], cwd: str, imports: list[str], reaper: Reaper, stated: Sequence[str] = ()):
        self.env, self.imports, self.cwd, self.stated = env, imports, cwd, list(stated)
        self.refused: str | None = None
        self.reaped = False
        self._reaper = reaper
        self.effects: dict[str, list[str]] = {}  # what each import changed that every fork would inherit
        self.ready = False
        self.dead = False
        self._buffer = b""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            with tempfile.TemporaryFile() as output:  # what its imports print: each run's log starts with it
                self.child = Child(
                    # Room in its command line for a fork's (isolation.set_command_line: what ps shows)
                    runner_argv_for("--fork-server", json.dumps({"room": " " * isolation.COMMAND_ROOM})),
                    env={**env, WARM_ENV: "1"},  # what finds its forks in /proc (their token is not there)
                    cwd=cwd,
                    log_path=None,
                    on_exit=self._exited,
                    output=output.fileno(),  # the root's lock it does not hold: each fork is handed it
                    control=theirs.fileno(),
                    reaper=reaper,
                    marked=False,  # its forks carry its first environment in /proc: no token there
                )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self._control = ours
        self._started = time.monotonic()
        # What to import goes on the socket, not in its arguments (thousands of names pass one
        # argument's limit, 128 KiB on Linux).
        try:
            ours.sendall(json.dumps({"imports": imports, "stated": self.stated}).encode("utf-8") + b"\n")
        except OSError:
            self.dead = True

    def _exited(self) -> None:
        self.dead = True
        if self._reaper.driven and not self.reaped:
            # Heard on the loop's own thread: reaped now, not left a zombie until the next start
            # drops it (a warm process killed with SIGKILL stayed one for the rest of a sweep that
            # started nothing more). A threaded reaper's thread leaves that to discard().
            self.reaped = True
            self.child.reap()

    def _line(self, timeout: float, interrupt: int | None = None) -> dict[str, Any] | None:
        """Its next message (None: none within ``timeout`` seconds, or ``interrupt`` became
        readable first, or it is gone)."""
        deadline = time.monotonic() + timeout
        control = self._control.fileno()
        watched = [control] if interrupt is None else [control, interrupt]
        while b"\n" not in self._buffer:
            left = max(0.0, deadline - time.monotonic())
            if control not in select.select(watched, [], [], left)[0]:
                return None
            try:
                chunk = self._control.recv(1 << 16)
            except OSError:
                chunk = b""
            if not chunk:
                self.dead = True
                return None
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        try:
            message = json.loads(line)
        except ValueError:
            return None
        return message if isinstance(message, dict) else None

    def check(self, wait: float = 0.0, interrupt: int | None = None) -> bool:
        """Whether it is ready to fork (its imports done, and forking from it allowed), waiting up
        to ``wait`` seconds for it (or until ``interrupt`` is readable)."""
        if not self.ready and not self.dead and not self.refused:
            told = self._line(wait, interrupt if wait else None)
            if told is not None:
                self.ready = True
                self.refused = told.get("refused") or None
                effects = told.get("effects")
                self.effects = effects if isinstance(effects, dict) else {}
                threads = told.get("native_threads") or 0
                logger.info(
                    "warm starts: a warm process imported %d module(s) in %.1f s%s%s%s",
                    len(told.get("imported") or ()),
                    time.monotonic() - self._started,
                    f"; {len(told['failed'])} could not be imported ({', '.join(told['failed'][:5])})"
                    if told.get("failed")
                    else "",
                    f"; {threads} thread(s) of native libraries (their pools restart after a fork)" if threads else "",
                    f"; it is not forked from: {self.refused}" if self.refused else "",
                )
        return self.ready and not self.refused and not self.dead

    def fork(self, request: dict[str, Any], fds: list[int]) -> int | None:
        """The forked run's pid (now our child), or None (the warm process failed: start cold)."""
        data = json.dumps(request).encode("utf-8", "surrogateescape") + b"\n"  # read to its newline
        become_subreaper()  # the run, orphaned by the helper, becomes our child
        try:
            try:
                socket.send_fds(self._control, [data], fds)
            except OSError:
                self.dead = True
                return None
            answer = self._line(FORK_WAIT)
        finally:
            become_subreaper(False)
        pid = answer.get("pid") if answer else None
        if not isinstance(pid, int) or pid <= 0:
            if answer is None:
                self.dead = True
            return None
        if parent_of(pid) != os.getpid():  # not ours after all (no subreaper here): it must not run
            try:
                os.killpg(pid, 9)
            except OSError:
                pass
            return None
        return pid

    def discard(self) -> None:
        self._control.close()
        if not self.reaped:
            self.reaped = True
            self.child.kill()
            self.child.reap()


def _imports_of(paths: RunPaths) -> list[str] | None:
    """The modules a forked run of ``paths`` said it imported (its ``.gts/imports.json``); None where
    there is no such file, or it lies behind a link the run planted (never read through one), or it
    is damaged. The run writes this file itself, so it is read as any file a run could have written:
    a file that is no list of names (200,000 ``[`` raised RecursionError through the JSON reader,
    and every start of the sweep died on it) is ignored, said in the log, and removed."""
    if os.path.islink(paths.meta) or os.path.islink(paths.work_dir):
        return None
    where = os.path.join(paths.meta, IMPORTS_FILE)
    try:
        fd = open_regular(where)
    except OSError:
        return None
    try:
        with os.fdopen(fd, "rb") as handle:
            names = json.loads(handle.read(1 << 22) or b"[]")
        if not isinstance(names, list):
            raise ValueError("it is no list of module names")
    except (OSError, ValueError, RecursionError) as error:
        problem = "its nesting is too deep" if isinstance(error, RecursionError) else str(error)[:200]
        logger.warning("warm starts: %s is damaged and ignored (%s)", where, problem)
        with contextlib.suppress(OSError):
            os.unlink(where)  # not behind a link (checked above): the run writes a new one
        return None
    return [name for name in names if isinstance(name, str) and importcache.module_name(name)]


class WarmStarts:
    """The sweep's warm processes, and the forks of its Python commands (the local launcher's)."""

    def __init__(
        self,
        reaper: Reaper,
        inherit: Sequence[int],
        imports: Sequence[str] = (),
        *,
        ready_wait: float = READY_WAIT,
        interrupt: int | None = None,
    ) -> None:
        """``ready_wait``: how long the first start waits for the first warm process (then cold);
        ``interrupt``: a descriptor that ends that wait when readable (the loop's signal wake-up:
        a Ctrl-C during the first warm process's imports is acted on at once; the run starts cold)."""
        self._reaper, self._inherit, self._ready_wait = reaper, tuple(inherit), ready_wait
        self._interrupt = interrupt
        self._imports: list[str] = list(imports)
        self._stated = tuple(imports)  # prewarm: {imports: [...]}: what they print begins each run's log
        self._unwanted: set[str] = set()  # packages whose import changes what every fork inherits
        self._current: WarmProcess | None = None
        self._next: WarmProcess | None = None
        self._said: set[str] = set()
        self._first = True
        self._learning = True  # what the runs import is added (read from their source, learned from them)
        self._gave_up = False  # a warm process with prewarm's imports only died as it imported them
        self._running: dict[str, RunPaths] = {}  # forked runs not heard from yet: their imports file
        self._read: set[str] = set()  # the scripts (with their mtime) and -c codes whose imports were read
        self._kept: WarmProcess | None = None  # the last ready warm process whose imports were kept (importcache)

    def _say(self, why: str) -> None:
        if why not in self._said:
            self._said.add(why)
            logger.info("warm starts: a run starts cold: %s", why)

    def start(
        self,
        launch: Launch,
        paths: RunPaths,
        token: str,
        on_exit: Callable[[], None],
        reaper: Reaper,
        cpus: Sequence[int] = (),
    ) -> Child | None:
        """``launch`` forked warm (a child of ours), or None: it starts cold (said why). A command:
        its script (or ``-m``, ``-c``) runs as ``__main__``; a GPUTask run: our runner runs its
        start record, as a cold runner would. ``cpus``: the CPUs it may use (a pool's agent gives
        each run its own; a cold start inherits them from the thread that starts it, a fork from
        the warm process, so the fork binds itself to them before anything of the run starts)."""
        if launch.command is not None:
            argv, why = script_argv(launch.command, launch.env, launch.cwd)
            if argv is None:
                self._say(why)
                return None
            kind: dict[str, Any] = {
                "argv": argv,
                # As a cold start's wrapper shell leaves them when it changes into the run's folder
                "shell": {"PWD": launch.cwd, "OLDPWD": launch.cwd},
                "outcome": {
                    "file": launch.env["GTS_OUTCOME_FILE"],
                    "token": token,
                    "config_hash": launch.env.get("GTS_CONFIG_HASH", ""),
                },
            }
        else:
            assert launch.spec_file is not None
            # The task's own module is never the warm process's: it is imported with the run's
            # environment (its required_env), as a cold runner imports it.
            module = launch.preload.module if launch.preload is not None else None
            kind = {"runner": launch.spec_file, "exclude": [module] if module else []}
        self._read_source(launch, kind.get("argv"))
        self._recall(paths)
        warm = self._warm(shared_env(launch.env), launch.cwd)
        if warm is None:
            return None
        log = open_log(paths.log)
        read_end, write_end = os.pipe()
        lifeline = min(set(range(3, 4 + len(self._inherit))) - set(self._inherit))  # beside the root's lock
        try:
            request = {
                **kind,
                "env": {**launch.env, **kind.pop("shell", {}), TOKEN_ENV: token},
                "cwd": launch.cwd,
                "command": list(launch.command if launch.command is not None else launch.argv),
                "places": [1, lifeline, *self._inherit],
                "lifeline": lifeline,
                "imports_file": os.path.join(paths.meta, IMPORTS_FILE),
                "cpus": list(cpus),
            }
            pid = warm.fork(request, [log, read_end, *self._inherit])
        finally:
            os.close(log)
            os.close(read_end)
        if pid is None:
            os.close(write_end)
            self._say("the warm process failed to fork (a new one is started)")
            self._drop(warm)
            return None
        os.write(write_end, ADOPTED_WORD)  # it runs from here on (a new pipe: the write cannot block)
        self._running[paths.meta] = paths
        child = Child.adopted(pid, lifeline=write_end, token=token, on_exit=on_exit, reaper=reaper)
        child.stop_word = launch.command is not None  # a runner handles its stop signals itself
        return child

    def _warm(self, env: dict[str, str], cwd: str) -> WarmProcess | None:
        """The warm process to fork from now (started, or swapped for a readier one, here)."""
        for paths in list(self._running.values()):  # what runs said they import at their first report
            self.learned(paths, ended=False)
        if self._next is not None and self._next.check():
            self._drop(self._current)
            self._current, self._next = self._next, None
            self._refresh()  # modules learned while it warmed
        elif self._next is not None and (self._next.dead or self._next.refused):
            excluded = self._exclude(self._next)
            if not excluded:
                self._say(f"a warm process with more imports was refused ({self._next.refused or 'it died'})")
            self._drop(self._next)
            self._next = None
            if excluded:  # one without what changed the process (not again one that died: it would again)
                self._refresh()
        if self._current is not None and self._current.dead and not self._current.ready:
            self._died_importing(self._current)
        if self._gave_up:
            self._say("a warm process died as it imported what prewarm names")
            return None
        if self._current is None or self._current.dead:
            self._drop(self._current)
            self._current = None
            try:
                self._current = self._started(env, cwd)
            except OSError as error:
                self._say(f"no warm process could be started ({error})")
                return None
        current = self._current
        if current.env != env:
            name = sorted(set(current.env.items()) ^ set(env.items()))[0][0]
            read = " (read as Python or a library starts: a fork keeps the warm process's)"
            said = read if name.startswith(READ_AT_START) else ""
            self._say(f"its environment differs from the warm process's in {name}{said}")
            return None
        wait, self._first = (self._ready_wait if self._first else 0.0), False
        if wait and not current.check():
            logger.info(
                "warm starts: the first run waits for the warm process, which imports %d module(s) it would import "
                "itself if it started cold",
                len(current.imports),
            )
        if not current.check(wait, self._interrupt):
            if current.dead and not current.ready:  # its imports took it down: the next has prewarm's only
                self._say("the warm process died as it imported")
                self._died_importing(current)
                self._drop(current)
                self._current = None
                if not self._gave_up:  # the next one warms while this run starts cold
                    with contextlib.suppress(OSError):
                        self._current = self._started(env, cwd)
                return None
            self._say(current.refused or "the warm process is not ready yet")
            if self._exclude(current):  # one without what changed the process is started now
                self._drop(current)
                self._current = None
                with contextlib.suppress(OSError):
                    self._current = self._started(env, cwd)
            return None
        self._keep(current)
        return current

    def _died_importing(self, warm: WarmProcess) -> None:
        """A warm process that died before it was ready: what it imported took it down (a module that
        exits or crashes as it is imported, in a process of ours). From now on the sweep's warm
        processes import prewarm's modules only, and the runs import the rest themselves; one that
        dies with prewarm's only is not started again (each would die too): the runs start cold."""
        if set(warm.imports) <= set(self._stated):
            self._gave_up = True
            return
        importcache.forget(self._read)  # what was kept may be what took it down: learned again, from the runs
        if self._learning:
            self._learning = False
            logger.info(
                "warm starts: a warm process died as it imported the %d module(s) the runs import; from now on it "
                "imports what prewarm names only, and the runs import the rest themselves",
                len(warm.imports),
            )
        self._imports = [name for name in self._imports if name in self._stated]

    def _started(self, env: dict[str, str], cwd: str) -> WarmProcess:
        return WarmProcess(env, cwd, list(self._imports), self._reaper, self._stated)

    def _exclude(self, warm: WarmProcess) -> bool:
        """A warm process refused for what an import changed (``warm.effects``): those modules'
        packages are never imported by a warm process of this sweep again (each run imports them
        itself, with their effects, as a cold start does). Whether there were any."""
        if not warm.effects:
            return False
        for name, what in warm.effects.items():
            package = name.split(".")[0]
            if package not in self._unwanted:
                self._unwanted.add(package)
                logger.info(
                    "warm starts: importing %s changes %s, which every run forked would inherit: the runs import "
                    "%s themselves",
                    name,
                    ", ".join(what),
                    package,
                )
        self._imports = [name for name in self._imports if self._wanted(name)]
        return True

    def _wanted(self, name: str) -> bool:
        return name.split(".")[0] not in self._unwanted

    def learned(self, paths: RunPaths, *, ended: bool = True) -> None:
        """A forked run said what it imported (at its first report, or as it ended): the modules the
        warm process lacks start a new one with them."""
        if ended:
            self._running.pop(paths.meta, None)
        names = _imports_of(paths)
        if names is None:
            return
        self._running.pop(paths.meta, None)
        known = set(self._imports)
        new = [name for name in names if name not in known and self._wanted(name)]
        if not new or self._current is None or not self._learning:
            return
        self._imports.extend(new)
        self._refresh()

    def _read_source(self, launch: Launch, argv: list[str] | None) -> None:
        """What the run's script (a GPUTask's module) imports, read from its source without running
        it (``sourceimports.py``), once per file: the warm process imports it before any run has
        ended, so that the first runs are forked warm too (they started cold, or imported their
        libraries themselves, while the warm process learned them from their ends)."""
        if not self._learning:
            return
        from . import sourceimports

        # The run's sys.path, less its first: its PYTHONPATH, then the interpreter's own folders
        given = [folder for folder in launch.env.get("PYTHONPATH", "").split(os.pathsep) if folder]
        base = [*given, *(folder for folder in sys.path[1:] if folder and folder not in given)]
        if argv is not None:
            source = sourceimports.command_source(argv, launch.cwd, base)
        elif launch.preload is not None:  # a GPUTask: its module, on the sys.path it is imported on
            search = tuple(folder or launch.cwd for folder in launch.preload.sys_path) or (launch.cwd, *base)
            module = launch.preload.module
            file = launch.preload.main_file or (sourceimports.module_file(module, search) if module else None)
            source = sourceimports.Source(file, None, search)
        else:
            return
        key = source.key
        if key is None or key in self._read:
            return
        self._read.add(key)
        found, what = source.imports(), source.what
        cached, unwanted = importcache.recall(key)  # what warm processes of earlier sweeps of it imported
        self._unwanted.update(unwanted)
        known = set(self._imports)
        new = [name for name in found if name not in known and self._wanted(name)]
        recalled = [
            name
            for name in importcache.installed(cached, source.search)
            if name not in known and name not in new and self._wanted(name)
        ]
        if new:
            libraries = sorted(new, key=lambda name: name.split(".")[0] in sys.stdlib_module_names)  # libraries first
            shown = ", ".join(libraries[:8]) + (f" and {len(new) - 8} more" if len(new) > 8 else "")
            logger.info(
                "warm starts: %s imports %s (read from its source): the warm process imports them too", what, shown
            )
        if recalled:
            logger.info(
                "warm starts: %d more module(s) that warm processes of earlier sweeps of %s imported are imported too",
                len(recalled),
                what,
            )
        if new or recalled:
            self._imports.extend(new + recalled)
            self._refresh()

    def _keep(self, warm: WarmProcess) -> None:
        """``warm`` is ready: it imported every name and changed nothing a fork inherits, so what it
        imported (beyond prewarm's) is kept on this machine for later sweeps of the same scripts."""
        if warm is self._kept or not self._learning or not self._read:
            return
        self._kept = warm
        importcache.remember(self._read, [name for name in warm.imports if name not in self._stated], self._unwanted)

    def _recall(self, paths: RunPaths) -> None:
        """What a run about to start imported in an earlier start (its file stays in its folder): a
        sweep started again forks it, and the runs after it, from a warm process that has those
        modules, instead of learning them again from its first runs. The file is then removed: the
        fork writes what it imports this time (at its first report, which the loop looks for)."""
        names = _imports_of(paths)
        if names is None:
            return
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(paths.meta, IMPORTS_FILE))  # not behind a link: _imports_of checked
        known = set(self._imports)
        new = [name for name in names if name not in known and self._wanted(name)]
        if new and self._learning:
            if self._current is None:
                logger.info("warm starts: %d module(s) the runs imported before are imported ahead", len(new))
            self._imports.extend(new)
            self._refresh()

    def _refresh(self) -> None:
        """A new warm process with every module learned, unless one is warming already (it is not
        started again for each run that adds a module: it would never get ready)."""
        current = self._current
        if self._next is not None or current is None or set(current.imports) >= set(self._imports):
            return
        logger.info("warm starts: a warm process with the %d module(s) the runs import is started", len(self._imports))
        try:
            self._next = self._started(current.env, current.cwd)
        except OSError as error:
            self._say(f"no warm process with more imports could be started ({error})")

    def _drop(self, warm: WarmProcess | None) -> None:
        if warm is not None:
            warm.discard()

    def close(self) -> None:
        for warm in (self._current, self._next):
            self._drop(warm)
        self._current = self._next = None
