"""Tiny tasks the scheduler tests run in real child processes.

Each task appends ``start <name>`` / ``end <name>`` lines to the file named by
the config key ``journal`` (O_APPEND, one write per line), so tests can count
exactly how often each run's main() started and completed.
"""

import contextlib
import json
import os
import signal
import subprocess
import sys
import time

from gpu_task_scheduler import GPUTask


def checked_resume(task, saved_step):
    """The step a resumed attempt's checkpoint is of, checked as the checkpoint protocol (save, then
    report) allows: the resume step (the last one reported), or the one after it when the attempt
    was killed between its save and its report (that report is then made by the caller). Anything
    else is a broken or mismatched checkpoint: an error, never a silent restart."""
    assert saved_step in (task.resume_step, task.resume_step + 1), (
        f"the checkpoint is of step {saved_step}, not of the resume step {task.resume_step} or the one after it"
    )
    return saved_step


def journal(config, event, work_dir):
    path = config.get("journal")
    if path:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, f"{event} {os.path.basename(work_dir)}\n".encode())
        finally:
            os.close(fd)


def wait_for_line(config, name, timeout=120.0):
    """A run named in ``config["after"]`` ({run name: journal line}) reports nothing until another
    run wrote that line to the journal: the order two runs' reports reach the scheduler in, set by
    the test rather than by how soon each was placed."""
    line = (config.get("after") or {}).get(name)
    deadline = time.monotonic() + timeout
    while line is not None:
        with contextlib.suppress(FileNotFoundError), open(config["journal"]) as handle:
            if line in handle.read().splitlines():
                return
        if time.monotonic() > deadline:
            raise RuntimeError(f"no {line!r} in the journal after {timeout:.0f} s")
        time.sleep(0.02)


def announce(work_dir):
    """Writes this process's pid to ``<work_dir>/started`` in one step (a rename), so a test
    that sees the file can read the pid from it."""
    path = os.path.join(work_dir, "started")
    with open(path + ".tmp", "w") as handle:
        handle.write(str(os.getpid()))
    os.replace(path + ".tmp", path)


class RecordTask(GPUTask):
    """Succeeds unless a file ``fail_if`` exists; sleeps ``sleep`` seconds first."""

    def required_env(self):
        self.from_required_env = "kept"
        self.folder_existed = os.path.isdir(self._work_dir)
        return {"OMP_NUM_THREADS": "4", "GTS_TEST_NUMBER": 7}

    def main(self):
        journal(self._config, "start", self._work_dir)
        print(f"hello from {self._work_dir}")
        time.sleep(self._config.get("sleep", 0))
        fail_if = self._config.get("fail_if")
        if fail_if and os.path.exists(fail_if):
            raise RuntimeError(f"asked to fail by {fail_if}")
        result = {
            "config": self._config,
            "cwd": os.getcwd(),
            "pid": os.getpid(),
            "attribute": getattr(self, "from_required_env", None),
            "folder_existed_in_required_env": self.folder_existed,
            "env": {
                key: os.environ.get(key)
                for key in (
                    "CUDA_VISIBLE_DEVICES",
                    "CUDA_DEVICE_ORDER",
                    "MPLBACKEND",
                    "OMP_NUM_THREADS",
                    "GTS_TEST_NUMBER",
                )
            },
        }
        journal(self._config, "end", self._work_dir)  # last, so "end" means main() returned
        return result


class FailTask(GPUTask):
    """Ends in the way named by config['mode']."""

    def main(self):
        mode = self._config["mode"]
        print(f"about to {mode}", flush=True)
        if mode == "raise":
            raise ValueError("boom")
        if mode == "exit2":
            sys.exit(2)
        if mode == "exit0":
            sys.exit(0)
        if mode == "os_exit3":
            os._exit(3)
        if mode == "segv":
            os.kill(os.getpid(), signal.SIGSEGV)
        if mode == "hang":
            time.sleep(600)
        return {"mode": mode}


class FlakyTask(GPUTask):
    """Fails on its first attempt, succeeds afterwards (counts attempts in a file)."""

    def main(self):
        counter = os.path.join(self._work_dir, "attempts.txt")
        attempts = int(open(counter).read()) + 1 if os.path.exists(counter) else 1
        with open(counter, "w") as handle:
            handle.write(str(attempts))
        if attempts < self._config["succeed_on"]:
            raise RuntimeError(f"flaky failure on attempt {attempts}")
        return {"attempts": attempts}


IDENTITY = ("GTS_RUN_NAME", "GTS_RUN_DIR", "GTS_SWEEP_ROOT", "GTS_RUN_INDEX", "GTS_ATTEMPT")


class IdentityTask(FlakyTask):
    """Fails on attempts before ``succeed_on``; returns the run's identity variables."""

    def main(self):
        super().main()
        return {name: os.environ.get(name) for name in IDENTITY}


class BadInitTask(GPUTask):
    def __init__(self, config, work_dir):
        super().__init__(config, work_dir)
        if config.get("bad"):
            raise KeyError("missing dataset")

    def main(self):
        return "ok"


class UnpicklableTask(GPUTask):
    def __init__(self, config, work_dir):
        super().__init__(config, work_dir)
        self.callback = lambda: None

    def main(self):
        return "unreachable"


class BadEnvTask(GPUTask):
    def required_env(self):
        return {"GOOD": "1", "BAD": ["not", "a", "string"]}

    def main(self):
        return "unreachable"


class GrandchildTask(GPUTask):
    """Starts a long-lived grandchild, records its pid, then ends or hangs."""

    def main(self):
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        path = os.path.join(self._work_dir, "grandchild.pid")
        with open(path + ".tmp", "w") as handle:  # whole when it appears: the test reads it at once
            handle.write(str(child.pid))
        os.replace(path + ".tmp", path)
        if self._config.get("hang"):
            time.sleep(600)
        return {"grandchild": child.pid}


class BlockTask(GPUTask):
    """Announces that it runs, then sleeps (``GTS_TEST_SLEEP`` overrides); may ignore SIGTERM.

    While it runs it holds an flock on ``<work_dir>/exclusive``; an attempt that finds it held (an
    earlier attempt of the same run still alive) writes ``overlap`` to the journal."""

    def main(self):
        import fcntl

        if self._config.get("ignore_term"):
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        self._exclusive = open(os.path.join(self._work_dir, "exclusive"), "a")  # held until the process ends
        try:
            fcntl.flock(self._exclusive, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            journal(self._config, "overlap", self._work_dir)
        journal(self._config, "start", self._work_dir)
        announce(self._work_dir)
        seconds = float(os.environ.get("GTS_TEST_SLEEP", self._config.get("sleep", 600)))
        time.sleep(seconds)
        journal(self._config, "end", self._work_dir)
        return {"slept": seconds}


class WaitForFileTask(GPUTask):
    """Announces that it runs, then waits until the file ``wait_for`` exists (at most 60 s)."""

    def main(self):
        announce(self._work_dir)
        deadline = time.monotonic() + 60
        while not os.path.exists(self._config["wait_for"]) and time.monotonic() < deadline:
            time.sleep(0.02)
        return "done"


class NoisyTask(GPUTask):
    """Returns values that JSON cannot hold as they are."""

    def main(self):
        return {"tuple": (1, 2), "set": {3}, "nan": float("nan"), "object": object}


class RendezvousTask(GPUTask):
    """Succeeds only if ``expect`` runs of the sweep are running at the same time."""

    def main(self):
        root = os.path.dirname(self._work_dir)
        open(os.path.join(self._work_dir, "here"), "w").close()
        deadline = time.monotonic() + 30
        while sum(os.path.exists(os.path.join(root, d, "here")) for d in os.listdir(root)) < self._config["expect"]:
            if time.monotonic() > deadline:
                raise TimeoutError("the other runs never ran at the same time")
            time.sleep(0.01)
        return {"slot": os.environ["CUDA_VISIBLE_DEVICES"]}


class HugeOutputTask(GPUTask):
    """Prints 100 MB, then succeeds."""

    def main(self):
        line = b"x" * 1023 + b"\n"
        for _ in range(100 * 1024):
            sys.stdout.buffer.write(line)
        print("done printing", flush=True)
        return {"bytes": 100 * 1024 * 1024}


class SelfDeletingTask(GPUTask):
    def main(self):
        import shutil

        shutil.rmtree(self._work_dir)
        return "deleted my own folder"


class UnpicklableStateTask(GPUTask):
    """Pickles fine in the scheduler, but cannot be restored in the run's process."""

    def __setstate__(self, state):
        raise RuntimeError("cannot restore this task")

    def main(self):
        return "unreachable"


class FullDiskTask(GPUTask):
    """The run's log hits a file-size limit, as on a full disk: writes fail with an error."""

    def main(self):
        import resource

        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
        for _ in range(4096):
            sys.stdout.write("y" * 1023 + "\n")
            sys.stdout.flush()
        return "unreachable"


class FakeGpuTask(GPUTask):
    """Allocates ``alloc_gb`` on its (fake) GPU, notes how many of the sweep's runs share it, waits, ends.

    ``clear_foreign`` / ``add_foreign`` change another user's process on a GPU, as if it ended or appeared.
    """

    def main(self):
        import fake_nvml

        gpu = os.environ["CUDA_VISIBLE_DEVICES"].split(",")[0]
        fake_nvml.allocate(gpu, int(self._config["alloc_gb"] * 1e9))
        with fake_nvml._locked() as state:
            sharing = sum(
                1 for p in fake_nvml._find(state, gpu)["processes"] if p["pid"] > 1 and fake_nvml._alive(p["pid"])
            )
        said = self._config.get("clear_when_said")
        if said:  # the scheduler has said the GPU is busy (a run waits for it): only then does it leave
            log = os.path.join(os.path.dirname(self._work_dir.rstrip(os.sep)), "scheduler.log")
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not _says(log, said):
                time.sleep(0.01)  # the scheduler's log is a file: nothing to wait on but its content
        if self._config.get("clear_foreign") is not None:
            fake_nvml.set_gpu(self._config["clear_foreign"], processes=[])
        if self._config.get("add_foreign") is not None:
            fake_nvml.set_gpu(self._config["add_foreign"], processes=[{"pid": 1, "used": int(75e9)}])
        barrier = self._config.get("barrier")
        if barrier:  # hold the memory until the test has seen the runs it expects side by side
            deadline = time.monotonic() + 60
            while not os.path.exists(barrier) and time.monotonic() < deadline:
                time.sleep(0.01)
        time.sleep(self._config.get("hold", 0.5))
        if self._config.get("oom_until", 0) >= self._attempt():
            print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", flush=True)
            sys.exit(1)
        return {"gpu": gpu, "sharing": sharing}

    def _attempt(self):
        counter = os.path.join(self._work_dir, "attempts.txt")
        attempts = int(open(counter).read()) + 1 if os.path.exists(counter) else 1
        with open(counter, "w") as handle:
            handle.write(str(attempts))
        return attempts


class DelayedAllocTask(GPUTask):
    """Loads for ``delay`` seconds (after the file ``barrier`` exists, if given), then allocates
    ``alloc_gb`` on its fake GPU, as a training script does. Where the GPU lacks the room the
    allocation fails as CUDA's does (the run exits with PyTorch's message), and the run is noted
    in the file ``ooms``."""

    def main(self):
        import fake_nvml

        open(os.path.join(self._work_dir, "started"), "w").close()
        barrier = self._config.get("barrier")
        deadline = time.monotonic() + 60
        while barrier and not os.path.exists(barrier) and time.monotonic() < deadline:
            time.sleep(0.01)  # loads until the test says (instead of for ``delay`` seconds)
        time.sleep(self._config["delay"])
        gpu = os.environ["CUDA_VISIBLE_DEVICES"].split(",")[0]
        if not fake_nvml.allocate(gpu, int(self._config["alloc_gb"] * 1e9), strict=True):
            with open(self._config["ooms"], "a") as handle:
                handle.write(self._work_dir + "\n")
            print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB", flush=True)
            sys.exit(1)
        time.sleep(self._config["hold"])
        return {"gpu": gpu}


class PlantTask(GPUTask):
    """Plants what config['plant'] names in its own folder, then returns: a FIFO where its log,
    or its result.json, goes, or a symbolic link from result.json to a forged one."""

    def main(self):
        plant = self._config["plant"]
        if plant == "fifo-log":
            log = os.path.join(self._work_dir, "worker.log")
            os.remove(log)
            os.mkfifo(log)
        elif plant == "fifo-result":
            os.mkfifo(os.path.join(self._work_dir, "result.json"))
        elif plant == "link-result":
            os.symlink(self._config["forged"], os.path.join(self._work_dir, "result.json"))
        elif plant == "link-meta":
            meta = os.path.join(self._work_dir, ".gts")
            os.rename(meta, meta + "-moved")
            os.symlink(self._config["outside"], meta)
        return None


ESCAPE_CODE = r"""
import os, sys, time
how, pid_file = sys.argv[1], sys.argv[2]
if how == "setpgrp":
    os.setpgrp()
else:  # a daemon: double fork and setsid, optionally with an empty environment
    if os.fork():
        os._exit(0)
    os.setsid()
    if os.fork():
        os._exit(0)
    if how == "daemon-noenv":
        os.execve(sys.executable, [sys.executable, "-c",
                  "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(600)",
                  pid_file], {})
with open(pid_file, "w") as handle:
    handle.write(str(os.getpid()))
time.sleep(600)
"""


class EscapeTask(GPUTask):
    """Starts a process that leaves the run's process group (config['how']), waits until it
    runs, then returns, or hangs if config['hang']."""

    def main(self):
        pid_file = os.path.join(self._work_dir, "escapee.pid")
        subprocess.Popen([sys.executable, "-c", ESCAPE_CODE, self._config["how"], pid_file])
        deadline = time.monotonic() + 30
        while not os.path.exists(pid_file) or not open(pid_file).read():
            if time.monotonic() > deadline:
                raise TimeoutError("the escapee never started")
            time.sleep(0.01)
        announce(self._work_dir)
        if self._config.get("hang"):
            time.sleep(600)
        return {"escapee": int(open(pid_file).read())}


class SignalledWhileRecordedTask(GPUTask):
    """main() returns a value whose conversion for the record sends this process SIGTERM
    and then takes a moment: the signal arrives while the outcome is being recorded."""

    class Slow:
        def __repr__(self):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.2)
            return "slow"

    def main(self):
        return {"value": self.Slow()}


class BigResultTask(GPUTask):
    """Returns config['mib'] MiB of JSON."""

    def main(self):
        return {"blob": "x" * (self._config["mib"] << 20), "small": 1}


class LifelineLossTask(GPUTask):
    """Writes its pid, then closes every descriptor above stderr (config['how'] == 'close')
    or replaces itself with another program ('exec'), and runs on."""

    def main(self):
        announce(self._work_dir)
        if self._config["how"] == "exec":
            os.execv("/bin/sleep", ["sleep", "600"])
        os.closerange(3, 65536)
        time.sleep(600)


class ContractTask(GPUTask):
    """Behaves as its config says, the same way the fake launcher's runs do (see fake_launcher.py)."""

    def main(self):
        config = self._config
        if config.get("trap_term") or config.get("term_takes"):
            takes = config.get("term_takes", 0)

            def on_term(signum, frame):
                if not config.get("trap_term"):
                    time.sleep(takes)
                    sys.exit(143)

            signal.signal(signal.SIGTERM, on_term)
        open(os.path.join(self._work_dir, "ready"), "w").close()
        first = 1 if self.resume_step is None else int(self.resume_step) + 1  # paused: its checkpoint is its step
        saved = os.path.join(self.checkpoint_dir, "step")
        if config.get("checkpoint") and self.resume_step is not None:  # a copied one too (PBT): of that step
            with open(saved) as handle:
                first = int(checked_resume(self, float(handle.read()))) + 1
            journal(config, f"resume{int(self.resume_step)}", self._work_dir)
            if first - 1 > self.resume_step:  # the report a kill cut off
                self.report(first - 1, loss=config.get("loss", 1 / (first - 1)))
        wait_for_line(config, os.path.basename(self._work_dir))
        for step in range(first, config.get("report", 0) + 1):  # a run that reports as it trains
            journal(config, f"step{step}", self._work_dir)
            if config.get("checkpoint"):  # saved, then reported: the checkpoint protocol
                with open(saved + ".new", "w") as handle:
                    handle.write(str(step))
                os.replace(saved + ".new", saved)
            self.report(step, loss=config.get("loss", 1 / step))  # raises Pruned (Paused) when early_stop says so
            time.sleep(config.get("pause", 0))
        time.sleep(config.get("seconds", 1.0))
        if config.get("oom"):
            print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", flush=True)
            sys.exit(1)
        if config.get("exit", 0):
            sys.exit(config["exit"])
        return {"name": os.path.basename(self._work_dir)}


class TrainStageTask(GPUTask):
    """A train stage: writes its model, unless config["fail_lr"] names its lr and the file
    config["fixed"] does not exist."""

    def main(self):
        if self.config["lr"] == self.config.get("fail_lr") and not os.path.exists(self.config.get("fixed", "")):
            raise RuntimeError(f"training diverged at lr={self.config['lr']}")
        with open(os.path.join(self.work_dir, "model.json"), "w") as handle:
            json.dump({"lr": self.config["lr"], "seed": self.config["seed"]}, handle)
        return {"loss": self.config["lr"] * 10 + self.config["seed"]}


class EvalStageTask(GPUTask):
    """An eval stage: reads the model of each run it depends on (self.dependencies)."""

    def main(self):
        models = []
        for folder in self.dependencies:
            with open(os.path.join(folder, "model.json")) as handle:
                models.append(json.load(handle))
        return {"models": models, "dirs": self.dependencies, "env": os.environ.get("GTS_DEP_DIRS")}


class ReportingTask(GPUTask):
    """Reports a falling loss for ``steps`` steps (``lr`` sets how fast), then returns the last; fails
    on its first attempt when ``fail_first`` is set (after reporting)."""

    def main(self):
        loss = 1.0
        for step in range(1, self._config.get("steps", 3) + 1):
            loss *= 1 - self._config.get("lr", 0.5)
            self.report(step, loss=loss, acc=1 - loss)
        if self._config.get("fail_first") and os.environ.get("GTS_ATTEMPT") == "1":
            raise RuntimeError("first attempt fails")
        return {"final": loss}


def curve_value(config, step):
    """A learning curve that crosses others: ``fast`` learners drop early to a high floor."""
    return config["floor"] + (config["start"] - config["floor"]) * (config["decay"] ** step)


class CurveTask(GPUTask):
    """Reports ``loss`` = curve_value(config, step) for steps 1..config['steps'] (``pause`` seconds
    apart); journals each step and, when stopped early, ``pruned``, then lets Pruned end it
    (``catch``: returns instead, as a task that saves a checkpoint would)."""

    def main(self):
        from gpu_task_scheduler import Pruned

        journal(self._config, "start", self._work_dir)
        try:
            for step in range(1, self._config["steps"] + 1):
                time.sleep(self._config.get("pause", 0))
                journal(self._config, f"step{step}", self._work_dir)
                try:
                    self.report(step, loss=curve_value(self._config, step))
                except Exception:  # what user code often has: it must not swallow Pruned
                    journal(self._config, "swallowed", self._work_dir)
                    raise
        except Pruned:
            journal(self._config, "pruned", self._work_dir)
            if self._config.get("catch"):
                return {"saved_at": step}
            raise
        journal(self._config, "end", self._work_dir)
        return {"loss": curve_value(self._config, self._config["steps"])}


class ResumingCurveTask(GPUTask):
    """CurveTask's curve, trained as the checkpoint protocol asks: each step saves a checkpoint (the
    step, in ``step`` of its checkpoint folder), then reports; a resumed attempt goes on from
    ``self.resume_step``, after checking its checkpoint holds it. Journals ``start``/``resume N``,
    each ``stepN``, ``paused`` (then lets Paused end it) and ``end``. With ``config["latency"]``, it
    reports a second objective too: ``latency`` ``1 / decay`` (a fast learner is a slow model)."""

    def metrics(self, step):
        config = self._config
        return {
            "loss": curve_value(config, step),
            **({"latency": 1 / config["decay"]} if config.get("latency") else {}),
        }

    def main(self):
        from gpu_task_scheduler import Paused

        saved = os.path.join(self.checkpoint_dir, "step")
        first = 1
        if self.resume_step is not None:
            with open(saved) as handle:
                first = int(checked_resume(self, float(handle.read()))) + 1
            journal(self._config, f"resume {int(self.resume_step)}", self._work_dir)
        else:
            journal(self._config, "start", self._work_dir)
        try:
            if self.resume_step is not None and first - 1 > self.resume_step:
                self.report(first - 1, **self.metrics(first - 1))  # the report the kill cut off
            for step in range(first, self._config["steps"] + 1):
                time.sleep(self._config.get("pause", 0))
                journal(self._config, f"step{step}", self._work_dir)
                with open(saved + ".new", "w") as handle:
                    handle.write(str(step))
                os.replace(saved + ".new", saved)
                self._freeze_the_scheduler(step)
                self.report(step, **self.metrics(step))
        except Paused:
            journal(self._config, "paused", self._work_dir)
            raise
        journal(self._config, "end", self._work_dir)
        return {"loss": curve_value(self._config, self._config["steps"])}

    def _freeze_the_scheduler(self, step):
        """``config["freeze_at"]``: the sweep's first run to reach that step (on its first attempt)
        stops the scheduler (SIGSTOP; its pid in the file ``config["scheduler_pid"]``, waited for)
        before it reports there, and names itself in ``<that file>.frozen``: a test kills the
        scheduler between a report at a rung and its decision."""
        if self._config.get("freeze_at") != step or self.resume_step is not None:
            return
        pid_file = self._config["scheduler_pid"]
        try:
            fd = os.open(pid_file + ".frozen", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return  # another run (or an earlier start) did
        os.write(fd, os.path.basename(self._work_dir).encode())
        os.close(fd)
        while not os.path.exists(pid_file):
            time.sleep(0.01)
        with open(pid_file) as handle:
            os.kill(int(handle.read()), signal.SIGSTOP)


class CatchPausedTask(GPUTask):
    """Reports ``loss`` (the config's) at steps 1..3; catches Paused and returns, as a task that saves
    a checkpoint of its own might."""

    def main(self):
        from gpu_task_scheduler import Paused

        for step in range(1, 4):
            try:
                self.report(step, loss=self._config["loss"])
            except Paused:
                return {"saved_at": step}
        return {"loss": self._config["loss"]}


def branin(x1, x2):
    """The Branin function: minimum 0.397887 at (-pi, 12.275), (pi, 2.275) and (9.42478, 2.475)."""
    import math

    b, c, t = 5.1 / (4 * math.pi**2), 5 / math.pi, 1 / (8 * math.pi)
    return (x2 - b * x1**2 + c * x1 - 6) ** 2 + 10 * (1 - t) * math.cos(x1) + 10


class BraninTask(GPUTask):
    """Returns {"value": branin(x1, x2)}; fails when x1 is below config["fail_below"]; sleeps
    config["sleep"]; journals its start and end; with config["report"], only reports the value (at
    steps 1 and 2, config["hold"] seconds apart)."""

    def main(self):
        journal(self._config, "start", self._work_dir)
        time.sleep(self._config.get("sleep", 0))
        x1, x2 = self._config["x1"], self._config["x2"]
        if x1 < self._config.get("fail_below", float("-inf")):
            raise ValueError(f"x1={x1} is below fail_below")
        value = branin(x1, x2)
        journal(self._config, "end", self._work_dir)
        if self._config.get("report"):  # two steps of the same value, "hold" seconds apart
            self.report(1, value=value)
            time.sleep(self._config.get("hold", 0))
            self.report(2, value=value)
            return None
        return {"value": value}


class StuckAfterReportTask(GPUTask):
    """Reports ``loss`` at step 1; ``stuck``: then computes for ever without reporting again (a
    long epoch), journaling ``sigterm`` when SIGTERM comes and going on regardless."""

    def main(self):
        import signal

        def on_term(signum, frame):
            journal(self._config, "sigterm", self._work_dir)

        signal.signal(signal.SIGTERM, on_term)
        if not self._config.get("stuck"):
            self.report(1, loss=self._config["loss"])
            return {"loss": self._config["loss"]}
        # Written to the file as report() would, without waiting at the rung for the verdict.
        with open(os.environ["GTS_METRICS_FILE"], "a") as metrics:
            metrics.write(json.dumps({"step": 1, "loss": self._config["loss"]}) + "\n")
        while True:
            time.sleep(0.05)


class SavesOnTermTask(GPUTask):
    """Its first attempt waits (up to a minute) for SIGTERM, then saves and returns, as a run that
    checkpoints when its job is preempted does; a later attempt runs to its end. Journals
    ``start``, ``saved`` and ``end``."""

    def main(self):
        import signal

        journal(self._config, "start", self._work_dir)
        marker = os.path.join(self._work_dir, "attempted")
        if os.path.exists(marker):
            time.sleep(0.2)
            journal(self._config, "end", self._work_dir)
            return {"done": True}
        open(marker, "w").close()
        terminated = []
        signal.signal(signal.SIGTERM, lambda signum, frame: terminated.append(signum))
        deadline = time.monotonic() + 60
        while not terminated and time.monotonic() < deadline:
            time.sleep(0.05)
        journal(self._config, "saved", self._work_dir)
        return {"saved": True}


class CheckpointTask(GPUTask):
    """Trains ``steps`` steps as the checkpoint protocol asks: loads its state from
    ``checkpoint_dir`` at ``resume_step``, and after each step saves it, then reports that step.
    Journals ``resume <step>`` and ``step<k>`` per step executed; raises at step ``fail_at`` on its
    first attempt; sleeps ``pause`` a step; ``hold`` (a file): waits for it after step ``hold_at``."""

    def main(self):
        state_file = os.path.join(self.checkpoint_dir, "state.json")
        done, total = 0, 0.0
        if self.resume_step is not None:
            with open(state_file) as handle:
                state = json.load(handle)
            assert state["step"] == self.resume_step, (state, self.resume_step)
            done, total = state["step"], state["total"]
            journal(self.config, f"resume{done}", self.work_dir)
        for step in range(done + 1, self.config["steps"] + 1):
            if step == self.config.get("fail_at") and os.environ["GTS_ATTEMPT"] == "1":
                raise RuntimeError(f"failed at step {step}")
            time.sleep(self.config.get("pause", 0))
            total += step
            journal(self.config, f"step{step}", self.work_dir)
            with open(state_file + ".tmp", "w") as handle:
                json.dump({"step": step, "total": total}, handle)
            os.replace(state_file + ".tmp", state_file)  # saved, then reported
            self.report(step, loss=1 / step)
            if step == self.config.get("hold_at"):
                while not os.path.exists(self.config["hold"]):
                    time.sleep(0.02)
        return {"total": total}


class ScheduleTask(GPUTask):
    """examples/pbt_schedule.py as a GPUTask, for population-based training: each step adds a gain
    that is largest when ``lr`` is the best one for that step (which falls as it trains); saves its
    state, then reports ``score``; a resumed attempt checks its checkpoint is of the resume step.
    Journals ``start LR`` or ``resume N LR`` (the lr this attempt trains with, from self._config).
    With ``config["cost"]``, it reports a second objective too: ``cost``, its lr (a larger one costs
    more)."""

    def main(self):
        import json
        import math

        def report(step, score):
            self.report(step, score=score, **({"cost": lr} if self._config.get("cost") else {}))

        lr, saved = self._config["lr"], os.path.join(self.checkpoint_dir, "state.json")
        done, score = 0, 0.0
        if self.resume_step is not None:
            with open(saved) as handle:
                state = json.load(handle)
            done, score = int(checked_resume(self, state["step"])), state["score"]
            journal(self._config, f"resume {done} {lr!r}", self._work_dir)
            if done > self.resume_step:  # the report a kill cut off
                report(done, score)
        else:
            journal(self._config, f"start {lr!r}", self._work_dir)
        for step in range(done + 1, self._config["steps"] + 1):
            time.sleep(self._config.get("pause", 0))
            distance = math.log10(lr / 10 ** (-1.5 * step / self._config["steps"]))
            score += math.exp(-distance * distance / (2 * 0.25 * 0.25))
            with open(saved + ".new", "w") as handle:
                json.dump({"step": step, "score": score}, handle)
            os.replace(saved + ".new", saved)
            report(step, score)
        return {"score": score, "lr": lr}


class ReportThenSaveTask(GPUTask):
    """The checkpoint protocol reversed, as scripts get it wrong: each step reports, then saves. A
    run paused at a report never saved that step, so resumed it trains that step again."""

    def main(self):
        saved = os.path.join(self.checkpoint_dir, "step")
        first = 1
        if self.resume_step is not None and os.path.exists(saved):
            with open(saved) as handle:
                first = int(handle.read()) + 1
        for step in range(first, self._config["steps"] + 1):
            time.sleep(self._config.get("pause", 0))
            self.report(step, loss=curve_value(self._config, step))
            with open(saved, "w") as handle:
                handle.write(str(step))
        return {"loss": curve_value(self._config, self._config["steps"])}


def _says(path, words):
    """Whether the file ``path`` exists and holds ``words``."""
    try:
        with open(path) as handle:
            return words in handle.read()
    except FileNotFoundError:
        return False
