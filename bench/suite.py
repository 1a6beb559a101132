"""The benchmark suite: gts against its peers on the same workloads, in the same invocation.

    python bench/suite.py                 # every workload, medians of 3 (a few minutes)
    python bench/suite.py --repeat 1 --only W1 W2
    python bench/suite.py --before v0.2.0 # gts at that git revision too, side by side ("@v0.2.0")

Every job is ``bench/probe.sh``: it appends its id, start, end and CUDA_VISIBLE_DEVICES
to a log, so each tool is measured the same way, from what its jobs saw:

* jobs/s (jobs / makespan), makespan (launch of the tool to the last job's end),
  running (jobs / the time from the first job's start to the last one's end: the
  dispatch rate with the start-up left out), time to the first job's start, idle
  gap per slot between one job's end and the next one's start (mean and p95), and
  CPU per job beyond the floor's (the tool's process tree, as wait4 reports it,
  minus the floor's on the same jobs);
* correctness: every job ran once, and no slot ran two jobs at once.

The tools take turns: round by round, each runs once (in a rotated order), so that a machine
that is slower for a while weighs on all of them alike.

Peers (installed by the suite into ``bench/.peers`` when missing): simple-gpu-scheduler,
GNU parallel (its slot number picks the GPU id; installed with apt where we may), Ray
(``ray.remote(num_gpus=1)``, workers reused; skipped where it does not install), and a
minimal waitpid loop, the floor. Ratios are ours / peer (above 1: we are faster for jobs/s,
we are slower for makespan and gaps).

gts runs from this checkout (``--before REV``: also from REV, exported with ``git archive``), its
modules compiled to bytecode first, as an installed package has them: an interpreter that may
not write ``__pycache__`` (``PYTHONDONTWRITEBYTECODE``) would otherwise compile every module at
each start, which no installed gts does.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass

HERE = os.path.dirname(os.path.abspath(__file__))
CHECKOUT = os.path.dirname(HERE)
PROBE = os.path.join(HERE, "probe.sh")
PEERS = os.path.join(HERE, ".peers")
GPUS4 = ["0", "1", "2", "3"]


@dataclass(frozen=True)
class Workload:
    name: str
    what: str
    seconds: list[float]  # one per job
    slots: list[str]  # one GPU id per slot; "cpu" slots for gts run sweeps
    tools: tuple[str, ...]


def workloads() -> list[Workload]:
    rng = random.Random(20261122)
    mix = [round(rng.choice([0.02, 0.05, 0.1, 0.2, 0.5, 1.0]) * rng.uniform(0.5, 1.5), 3) for _ in range(120)]
    queue_tools = ("gts queue", "simple-gpu-scheduler", "GNU parallel", "Ray", "waitpid floor")
    return [
        Workload("W1", "200 x 0 s on 4 GPU ids (dispatch)", [0.0] * 200, GPUS4, queue_tools),
        Workload("W2", "64 x 0.5 s on 4 GPU ids", [0.5] * 64, GPUS4, queue_tools),
        Workload("W3", "120 jobs of 0.01-1.5 s (seeded mix) on 4 GPU ids", mix, GPUS4, queue_tools),
        Workload(
            "W4",
            "160 x 0.5 s on 16 slots (gts run: a command sweep)",
            [0.5] * 160,
            [str(i) for i in range(16)],
            ("gts run", "gts queue", "simple-gpu-scheduler", "GNU parallel", "waitpid floor"),
        ),
        Workload(
            "W5",
            "60 Python runs (GPUTask.main) x 0.2 s on 2 GPU ids",
            [0.2] * 60,
            ["0", "1"],
            ("gts run", "gts run, prewarm off"),
        ),
    ]


# --- peers -------------------------------------------------------------------------------


def pip_peer(package: str, module: str) -> str | None:
    """``package`` importable from bench/.peers/<package> (installed there when missing)."""
    target = os.path.join(PEERS, package)
    probe = [sys.executable, "-c", f"import {module}"]
    env = {**os.environ, "PYTHONPATH": target}
    if subprocess.run(probe, env=env, capture_output=True).returncode != 0:
        print(f"installing {package} into {target} ...", file=sys.stderr)
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--target", target, package],
            capture_output=True,
        )
        if subprocess.run(probe, env=env, capture_output=True).returncode != 0:
            return None
    return target


def gts_tree(revision: str | None, into: str) -> str:
    """The folder holding the gpu_task_scheduler package of ``revision`` (None: this checkout; a
    folder that holds such a package: that one, e.g. where no git history travels), its modules
    compiled."""
    tree = CHECKOUT
    if revision is not None and os.path.isdir(os.path.join(revision, "gpu_task_scheduler")):
        tree = revision
    elif revision is not None:
        tree = os.path.join(into, revision.replace("/", "_"))
        os.makedirs(tree)
        archive = subprocess.run(
            ["git", "-C", CHECKOUT, "archive", revision, "gpu_task_scheduler"], capture_output=True, check=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", tree], input=archive, check=True)
    package = os.path.join(tree, "gpu_task_scheduler")
    subprocess.run([sys.executable, "-m", "compileall", "-q", package], stdout=subprocess.DEVNULL, check=True)
    return tree


def gnu_parallel() -> str | None:
    found = shutil.which("parallel")
    if found is None and os.geteuid() == 0 and shutil.which("apt-get"):
        print("installing GNU parallel with apt-get ...", file=sys.stderr)
        subprocess.run(["apt-get", "install", "-y", "-qq", "parallel"], capture_output=True)
        found = shutil.which("parallel")
    if found is not None:
        version = subprocess.run([found, "--version"], capture_output=True, text=True).stdout
        if "GNU parallel" not in version:
            return None  # moreutils' parallel has another interface
    return found


FLOOR = textwrap.dedent(
    """
    import os, sys
    slots, lines = sys.argv[1].split(","), sys.stdin.read().splitlines()
    free, running = list(reversed(slots)), {}
    for line in lines:
        if not free:
            pid, _ = os.wait()
            free.append(running.pop(pid))
        slot = free.pop()
        env = dict(os.environ, CUDA_VISIBLE_DEVICES=slot)
        running[os.posix_spawn("/bin/sh", ["/bin/sh", "-c", line], env)] = slot
    while running:
        pid, _ = os.wait()
        running.pop(pid)
    """
)

RAY = textwrap.dedent(
    """
    import os, subprocess, sys
    import ray
    slots, lines = sys.argv[1].split(","), sys.stdin.read().splitlines()
    ray.init(address="local", num_cpus=len(slots), num_gpus=len(slots), include_dashboard=False, log_to_driver=False)

    @ray.remote(num_gpus=1, max_calls=0)  # GPU tasks default to a new worker per task; reuse them
    def job(line):
        return subprocess.run(line, shell=True).returncode

    assert ray.get([job.remote(line) for line in lines]) == [0] * len(lines)
    """
)


# --- one measurement -----------------------------------------------------------------------


def command_lines(log: str, seconds: list[float]) -> list[str]:
    return [f"{PROBE} {log} {index} {s:g}" for index, s in enumerate(seconds)]


def tool_argv(tool: str, work: Workload, folder: str, lines: list[str], peers: dict) -> tuple[list[str], dict]:
    """The command line that runs the workload with ``tool``, and its environment."""
    env = dict(os.environ)
    gts = [sys.executable, "-m", "gpu_task_scheduler"]
    if tool.startswith("gts"):  # "gts queue" runs this checkout, "gts queue @REV" the tree of REV
        tool, _, revision = tool.partition(" @")
        tree = peers["trees"][revision or None]
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [tree, env.get("PYTHONPATH")]))
    if tool == "gts queue":
        return gts + ["queue", "--gpus", *work.slots, "--log-dir", os.path.join(folder, "q")], env
    if tool.startswith("gts run") and work.name == "W5":
        config = {
            "scheduler_config": {
                "gpu": work.slots,
                "result_root_folder": os.path.join(folder, "r"),
                "scheduler_log_file_path": None,
                **({"prewarm": False} if "prewarm off" in tool else {}),  # on by default
            },
            "global_config": {"log": os.path.join(folder, "jobs.log")},
            "test_config": [{"job": list(range(len(work.seconds))), "seconds": [work.seconds[0]]}],
            "task": "probe_task:ProbeTask",
        }
        path = os.path.join(folder, "sweep.json")
        with open(path, "w") as handle:
            json.dump(config, handle)
        env["PYTHONPATH"] = os.pathsep.join([env["PYTHONPATH"], HERE])
        return gts + ["run", path, "--plain"], env
    if tool == "gts run":
        config = {
            "scheduler_config": {
                "gpu": work.slots,  # without NVML: one run per id, unchecked
                "result_root_folder": os.path.join(folder, "r"),
                "scheduler_log_file_path": None,
                "log_file": None,
            },
            "test_config": [{"job": list(range(len(work.seconds))), "seconds": sorted(set(work.seconds))}],
            "command": [PROBE, os.path.join(folder, "jobs.log"), "{job}", "{seconds}"],
        }
        assert len(set(work.seconds)) == 1, "a gts run workload has one duration"
        path = os.path.join(folder, "sweep.json")
        with open(path, "w") as handle:
            json.dump(config, handle)
        return gts + ["run", path, "--plain"], env
    if tool == "simple-gpu-scheduler":
        env["PYTHONPATH"] = peers["simple-gpu-scheduler"]
        return [sys.executable, "-m", "simple_gpu_scheduler.scheduler", "--gpus", *work.slots], env
    if tool == "GNU parallel":
        # The slot number {%} (1, 2, ...) picks the GPU id; {=uq=} is the line, unquoted.
        assert work.slots == [str(i) for i in range(len(work.slots))]
        script = "export CUDA_VISIBLE_DEVICES=$(({%} - 1)); {=uq=}"
        return [peers["GNU parallel"], "--will-cite", "-j", str(len(work.slots)), script], env
    if tool == "Ray":
        env["PYTHONPATH"] = peers["Ray"]
        return [sys.executable, "-c", RAY, ",".join(work.slots)], env
    if tool == "waitpid floor":
        return [sys.executable, "-c", FLOOR, ",".join(work.slots)], env
    raise ValueError(tool)


def run_once(tool: str, work: Workload, peers: dict) -> dict | None:
    # Each measurement's folder is kept until the suite ends (main), not deleted after it.
    folder = tempfile.mkdtemp(dir=peers["scratch"])
    log = os.path.join(folder, "jobs.log")
    lines = command_lines(log, work.seconds)
    argv, env = tool_argv(tool, work, folder, lines, peers)
    feed = "" if tool.startswith("gts run") else "\n".join(lines) + "\n"
    launched = time.time()
    with tempfile.TemporaryFile() as stderr:  # a file, not a pipe: nothing blocks on a full pipe
        process = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=stderr, cwd=folder, env=env
        )
        process.stdin.write(feed.encode())  # small enough for the pipe and the tools' readers
        process.stdin.close()
        _, status, usage = os.wait4(process.pid, 0)
        process.returncode = os.waitstatus_to_exitcode(status)
        stderr.seek(0)
        errors = stderr.read().decode(errors="replace")
    if process.returncode != 0:
        print(f"{tool} on {work.name} failed ({process.returncode}): {errors[-500:]}", file=sys.stderr)
        return None
    with open(log) as handle:
        jobs = [line.split() for line in handle]
    return summarize(work, jobs, launched, usage.ru_utime + usage.ru_stime)


def summarize(work: Workload, jobs: list[list[str]], launched: float, cpu: float) -> dict:
    ids = [int(j[0]) for j in jobs]
    problems = []
    if sorted(ids) != list(range(len(work.seconds))):
        missing = len(set(range(len(work.seconds))) - set(ids))
        problems.append(f"{missing} missing, {len(ids) - len(set(ids))} duplicated")
    by_slot: dict[str, list[tuple[float, float]]] = {}
    for _, start, end, slot in jobs:
        by_slot.setdefault(slot, []).append((float(start), float(end)))
    gaps = []
    for slot, spans in by_slot.items():
        spans.sort()
        for (_, end), (start, _) in zip(spans, spans[1:], strict=False):
            if start < end - 1e-6:
                problems.append(f"slot {slot} ran two jobs at once")
                break
            gaps.append(start - end)
    if set(by_slot) - set(work.slots):
        problems.append(f"jobs saw CUDA_VISIBLE_DEVICES {sorted(set(by_slot) - set(work.slots))}")
    makespan = max(float(j[2]) for j in jobs) - launched
    first = min(float(j[1]) for j in jobs) - launched
    gaps.sort()
    return {
        "jobs/s": len(jobs) / makespan,
        "running": len(jobs) / (makespan - first),  # jobs/s with the start-up left out
        "makespan": makespan,
        "first": first,
        "gap": statistics.mean(gaps) * 1000 if gaps else 0.0,
        "gap p95": gaps[int(0.95 * (len(gaps) - 1))] * 1000 if gaps else 0.0,
        "gap median": statistics.median(gaps) * 1000 if gaps else 0.0,
        "cpu": cpu,
        "problems": problems,
    }


def relaunch_seconds() -> float:
    """What starting a fresh process for a Python run costs at least: the interpreter and the task's imports."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [HERE, os.environ.get("PYTHONPATH")]))}
    times = []
    for _ in range(5):
        started = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import probe_task"], env=env, check=True)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


# --- the table -----------------------------------------------------------------------------

COLUMNS = [("jobs/s", "{:>8.1f}"), ("running", "{:>8.1f}"), ("makespan", "{:>9.2f}"), ("first", "{:>7.3f}")]
COLUMNS += [("gap", "{:>8.1f}"), ("gap p95", "{:>8.1f}"), ("cpu/job", "{:>8.1f}")]


def median_of(results: list[dict]) -> dict:
    merged = {key: statistics.median(r[key] for r in results) for key in results[0] if key != "problems"}
    merged["problems"] = sorted({p for r in results for p in r["problems"]})
    return merged


def measure(work: Workload, args: argparse.Namespace, peers: dict) -> None:
    """Run ``work`` with each tool, round by round, and print its table."""
    tools = [t for t in work.tools if peers.get(t, True) and (not args.tools or t in args.tools)]
    if args.before:  # each gts tool as it was, beside it
        tools = [v for t in tools for v in ([t, f"{t} @{args.before}"] if t.startswith("gts") else [t])]
    if "waitpid floor" not in tools:
        tools.append("waitpid floor")
    # Round by round, each tool once per round and in a rotated order: a machine that gets
    # slower or faster for a while (a neighbour on the same host) then weighs on every tool
    # alike, not on whichever tool ran all its repeats meanwhile.
    measured: dict[str, list[dict]] = {tool: [] for tool in tools}
    for round_ in range(args.repeat):
        for tool in tools[round_ % len(tools) :] + tools[: round_ % len(tools)]:
            result = run_once(tool, work, peers)
            if result is not None:
                measured[tool].append(result)
    rows = {tool: median_of(results) for tool, results in measured.items() if results}
    floor_cpu = rows["waitpid floor"]["cpu"] if "waitpid floor" in rows else 0.0
    jobs = len(work.seconds)
    print(f"{work.name}: {work.what}")
    print(f"  {'tool':<30}" + "".join(f"{name:>{len(fmt.format(0))}}" for name, fmt in COLUMNS))
    for tool, row in rows.items():
        row["cpu/job"] = (row["cpu"] - floor_cpu) / jobs * 1000 if tool != "Ray" else float("nan")
        cells = "".join(fmt.format(row[name]) for name, fmt in COLUMNS)
        note = "  " + "; ".join(row["problems"]) if row["problems"] else ""
        print(f"  {tool:<30}{cells}{note}")
    if work.name == "W5":
        relaunch = relaunch_seconds() * 1000
        print(f"  a bare relaunch (the interpreter and the task's imports) takes {relaunch:.0f} ms")
        for tool in (t for t in rows if t.startswith("gts")):
            median = rows[tool]["gap median"]
            print(f"  {tool}: median gap {median:.1f} ms = {median / relaunch:.2f} x a bare relaunch")
    ours = [t for t in rows if t.startswith("gts")]
    for mine in (t for t in ours if args.before and " @" not in t):
        ratios = [
            f"{name} {rows[f'{mine} @{args.before}'][name] / rows[mine][name]:.2f}x"
            for name in ("makespan", "first", "gap", "cpu")
            if f"{mine} @{args.before}" in rows and rows[mine][name] > 0
        ]
        print(f"  {mine}: before / now: " + ", ".join(ratios))
    for mine in ours:
        for column, what in (("jobs/s", "jobs/s"), ("running", "jobs/s from the first job's start")):
            ratios = [f"{peer} {rows[mine][column] / rows[peer][column]:.2f}" for peer in rows if peer not in ours]
            print(f"  {mine} {what} / peer's: " + ", ".join(ratios))
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=3, help="runs per tool and workload (the median is shown)")
    parser.add_argument("--only", nargs="+", metavar="W", help="workloads to run (W1 ... W4)")
    parser.add_argument("--tools", nargs="+", metavar="TOOL", help="tools to run (default: all that install)")
    parser.add_argument(
        "--before", metavar="REV", help="also measure gts as it was at this git revision (or in this folder)"
    )
    parser.add_argument(
        "--scratch",
        metavar="DIR",
        help="where the measurements' folders go (default: the system's temporary folder); e.g. a tmpfs "
        "such as /dev/shm, to see what the tools cost with the disk's file system left out",
    )
    args = parser.parse_args()
    sys.stdout.reconfigure(line_buffering=True)  # each table as it is measured, also into a file
    peers = {
        "simple-gpu-scheduler": pip_peer("simple-gpu-scheduler", "simple_gpu_scheduler"),
        "GNU parallel": gnu_parallel(),
        "Ray": pip_peer("ray", "ray"),
    }
    trees_dir = tempfile.mkdtemp(prefix="gts-bench-trees-")
    # Every measurement's files stay until the end: deleting a gts round's few thousand files makes
    # each file the next rounds create cost more on some file systems, which would charge the
    # harness's clean-up to whichever tool writes files next. An ext4 without a journal (this VM's
    # root) skips, at each new inode, every free inode of its group freed in the last 60 s, or
    # 360 s while that inode's table block is not yet written back (recently_deleted() in the
    # kernel's profile). Minutes after a suite's clean-up, a new folder or file in /tmp cost
    # 105-137 us of CPU there, 47-53 us elsewhere on the same disk, 6-7 us on a tmpfs; a tool that
    # makes files per job (gts: a run's folder, its .gts folder, log, config and outcome) is slower
    # for it, the peers that make none are not. So figures measured within minutes of a large
    # deletion (a test suite, an earlier invocation) compare only with each other; --scratch on a
    # tmpfs leaves the disk out.
    peers["scratch"] = tempfile.mkdtemp(prefix="gts-bench-runs-", dir=args.scratch)
    try:
        peers["trees"] = {None: gts_tree(None, trees_dir)}
        if args.before:
            peers["trees"][args.before] = gts_tree(args.before, trees_dir)
        for name, found in peers.items():
            if found is None:
                print(f"({name} is not available: left out)", file=sys.stderr)
        print(f"{os.cpu_count()} CPU cores, Python {sys.version.split()[0]}, medians of {args.repeat}")
        print("running: jobs/s from the first job's start to the last one's end (the start-up left out);")
        print("gap: a slot's idle time between two jobs (ms); first: seconds to the first job's start;")
        print("cpu/job: ms of CPU per job beyond the waitpid floor's (tool and shells included)\n")
        for work in workloads():
            if not args.only or work.name in args.only:
                measure(work, args, peers)
    finally:
        shutil.rmtree(trees_dir, ignore_errors=True)
        shutil.rmtree(peers["scratch"], ignore_errors=True)


if __name__ == "__main__":
    main()
