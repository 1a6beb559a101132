"""Pre-warmed runners (backends/local/warm.py): a slot's next process imports the task while the
slot's run works; the next run starts in it, with the slot's GPUs, and its log holds everything."""

import gts_warm_dying_tasks
import gts_warm_tasks as tasks
import pytest
from helpers import make_config

from gpu_task_scheduler import GPUTaskScheduler

SECONDS = 1.0  # each run's main(); a warm runner imports the module well within it


def sweep(root, task, *, prewarm=None, runs=3):
    options = {} if prewarm is None else {"prewarm": prewarm}
    config = make_config(root, [{"i": list(range(runs)), "seconds": [SECONDS]}], **options)
    summary = GPUTaskScheduler(config, task).start()
    assert summary.ok
    return [summary.outcomes[f"i-{i},seconds-{SECONDS!r},"] for i in range(runs)], root


def test_the_next_run_starts_in_a_process_that_imported_the_task_while_the_last_one_ran(in_tmp):
    outcomes, root = sweep(in_tmp / "r", tasks.WarmProbe)
    # The first run starts cold; each later one in a process that imported the module about a run earlier.
    waited = [o.result["waited"] for o in outcomes]
    assert waited[0] < SECONDS / 2 and all(w > SECONDS / 2 for w in waited[1:]), waited
    assert len({o.result["pid"] for o in outcomes}) == 3 and {o.result["gpus"] for o in outcomes} == {""}
    for i, outcome in enumerate(outcomes):  # what the process printed while warming up heads its run's log
        pid = outcome.result["pid"]
        log = (root / outcome.name / "worker.log").read_text()
        assert log.startswith(f"imported by {pid}\n") and log.count("imported by") == 1
        assert f"main of {i} in {pid}\n" in log


@pytest.mark.parametrize("task, prewarm", [(tasks.WarmProbe, False), (tasks.WarmProbeWithEnv, None)])
def test_runs_start_fresh_without_prewarm_or_when_their_environment_differs(in_tmp, task, prewarm):
    outcomes, _ = sweep(in_tmp / "r", task, prewarm=prewarm)
    assert all(o.result["waited"] < SECONDS / 2 for o in outcomes), [o.result for o in outcomes]


def test_a_runner_that_died_while_warming_up_is_not_used(in_tmp):
    """Its death may not have been heard yet when its slot frees: it is looked at before the hand-over."""
    outcomes, _ = sweep(in_tmp / "r", gts_warm_dying_tasks.DiesWarm)
    assert [o.attempts for o in outcomes] == [1, 1, 1]
    assert all(o.result["waited"] < SECONDS / 2 for o in outcomes), [o.result for o in outcomes]  # each fresh
