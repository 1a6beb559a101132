"""A two-machine Ray cluster on this machine that loses a machine, or is cut off from the scheduler,
in the middle of a sweep; several such sweeps, one after another, on one cluster. Run as a script
(its own process, as `gts run` would be):

    python ray_cluster.py CASES_JSON

``CASES_JSON``: a list of ``[CONFIG, WHEN]``, each a sweep and its disruption. The first machine
(the head) has 4 GPUs; each sweep gets a second machine of its own, with 2, added before it starts
(the one before, if it was not lost, is removed first). Two of the head's GPUs are held by
placeholder tasks while the sweep's 4 slots fill the other four, and freed just before the
disruption: a run whose machine is lost can then start again at once, the case where an attempt
that outlives its machine's loss would overlap its retry. (One cluster for every case: starting
one takes 10 to 20 s on 2 cores, more than a case itself.)

``WHEN``: ``busy`` (the second machine goes away once two runs run on it), ``at:F`` (once a run on
it is F of its ``sleep`` through: 0.75, or 0.95 for just before it ends), or ``partition`` (every
run's supervisor loses its channel to the scheduler for a while: the scheduler's stop channel is
suspended with SIGSTOP, then resumed). (A machine whose raylet freezes is declared dead by the
cluster, but Ray still takes its running tasks' results from their workers, which live on: for
the scheduler that machine is not lost, so there is no such case here.) For each case it prints
``CASE WHEN`` before the sweep's own output, then ``LOST <json>`` (the runs that were on the lost
machine, or running when the channel was cut) and ``EXIT <code>`` (the sweep's exit code).
"""

import json
import os
import signal
import sqlite3
import sys
import threading
import time

TESTS = os.path.dirname(os.path.abspath(__file__))


def main() -> int:
    sys.path.insert(0, TESTS)
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    from ray.cluster_utils import Cluster

    cases = json.loads(sys.argv[1])
    # A lost machine is known once the cluster's health checks of it fail: by default 5 checks 3 s
    # apart (20 s and more a case); a check each 0.5 s, 3 failed, as a cluster tuned for fast
    # failover is. What the scheduler does once Ray says so is the same.
    health = {"health_check_period_ms": 500, "health_check_failure_threshold": 3, "health_check_timeout_ms": 1000}
    head = dict(num_cpus=1, num_gpus=4, include_dashboard=False, _system_config=health)
    cluster = Cluster(initialize_head=True, head_node_args=head)
    import ray

    ray.init(address=cluster.address, log_to_driver=False)  # the sweeps use this connection
    doomed = None
    try:
        for config, when in cases:
            if doomed is not None and doomed in cluster.worker_nodes:
                cluster.remove_node(doomed)  # the last case's, not lost (a partition): one machine to lose
            doomed = cluster.add_node(num_cpus=1, num_gpus=2)
            cluster.wait_for_nodes()
            print(f"CASE {when}", flush=True)
            exit_code, lost = one_case(ray, cluster, doomed, config, when)
            print("LOST " + json.dumps(lost), flush=True)
            print(f"EXIT {exit_code}", flush=True)
    finally:
        ray.shutdown()
        cluster.shutdown()
    return 0


def one_case(ray, cluster, doomed, config, when):
    """Run one sweep on the cluster, disrupted as ``when`` says: its exit code, and the runs hit."""
    import gts_test_tasks as tasks
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from gpu_task_scheduler import GPUTaskScheduler

    config["scheduler_config"]["ray_address"] = cluster.address
    root = config["scheduler_config"]["result_root_folder"]
    release = os.path.join(root + "-release")
    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    placeholders = [
        ray.remote(hold).options(num_gpus=1, num_cpus=0, scheduling_strategy=here).remote(release) for _ in range(2)
    ]
    seconds = config["global_config"]["sleep"]
    seen = {}

    def running(node_suffix=""):
        try:
            db = sqlite3.connect(f"file:{os.path.join(root, '.gts', 'ledger.sqlite3')}?mode=ro", uri=True)
            rows = db.execute(
                "SELECT name FROM runs WHERE status = 'running' AND node LIKE ?", ("%" + node_suffix,)
            ).fetchall()
            db.close()
        except sqlite3.Error:
            return []
        return sorted(name for (name,) in rows if os.path.exists(os.path.join(root, name, "started")))

    def disrupt():
        suffix = "" if when == "partition" else "/" + doomed.node_id[:8]
        while len(running(suffix)) < 2:
            time.sleep(0.02)  # polling the ledger: the runs starting on that machine post no event here
        names = running(suffix)
        if when.startswith("at:"):
            began = max(os.path.getmtime(os.path.join(root, name, "started")) for name in names)
            time.sleep(max(0.0, began + float(when[3:]) * seconds - time.time()))
        seen["lost"] = names
        open(release, "w").close()
        ray.wait(placeholders, num_returns=2, timeout=10)
        if when == "partition":
            cut_off(seconds_cut=3.5)  # past the supervisors' 1.5 s without a word (lease_interval 0.5)
        else:
            cluster.remove_node(doomed)

    disruption = threading.Thread(target=disrupt, daemon=True)
    disruption.start()
    summary = GPUTaskScheduler(config, tasks.BlockTask).start()
    disruption.join(timeout=10)
    open(release, "a").close()  # whatever happened, the placeholders end before the next case
    ray.wait(placeholders, num_returns=2, timeout=10)
    return summary.exit_code, seen.get("lost")


def hold(release):
    """A placeholder that holds its GPU until the file ``release`` exists."""
    while not os.path.exists(release):
        time.sleep(0.01)


def cut_off(seconds_cut):
    """Suspend the scheduler's stop channel (its Control actor, one of our descendants) for a while:
    every supervisor's renewals go unanswered, while the supervisors, the runs and Ray live on."""
    (actor,) = [pid for pid in descendants(os.getpid()) if command_line(pid).startswith(b"ray::Control")]
    os.kill(actor, signal.SIGSTOP)
    try:
        time.sleep(seconds_cut)
    finally:
        os.kill(actor, signal.SIGCONT)


def command_line(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read()
    except OSError:
        return b""


def descendants(ancestor):
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as handle:
                    parents[int(entry)] = int(handle.read().rsplit(b")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    found, frontier = set(), {ancestor}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


if __name__ == "__main__":
    sys.exit(main())
