"""Warm starts of GPUTask runs (backends/local/zygote.py): each run is forked from the sweep's warm
process and runs our runner there, as a cold start would; the task's own module is imported by the
run itself, with the run's environment, never by the warm process."""

import gts_warm_tasks as tasks
import pytest
from helpers import make_config

from gpu_task_scheduler import GPUTaskScheduler

SECONDS = 0.3  # each run's main()


def sweep(root, task, *, prewarm=None, runs=3):
    options = {} if prewarm is None else {"prewarm": prewarm}
    config = make_config(root, [{"i": list(range(runs)), "seconds": [SECONDS]}], **options)
    summary = GPUTaskScheduler(config, task).start()
    assert summary.ok
    return [summary.outcomes[f"i-{i},seconds-{SECONDS!r},"] for i in range(runs)], root


@pytest.mark.parametrize("task", [tasks.WarmProbe, tasks.WarmProbeWithEnv])
def test_each_run_is_forked_and_imports_its_task_itself(in_tmp, task):
    outcomes, root = sweep(in_tmp / "r", task)
    assert all(o.result["forked"] for o in outcomes), [o.result for o in outcomes]
    assert all(o.result["waited"] < SECONDS for o in outcomes), [o.result for o in outcomes]  # imported just now
    assert len({o.result["pid"] for o in outcomes}) == 3 and {o.result["gpus"] for o in outcomes} == {""}
    if task is tasks.WarmProbeWithEnv:  # its required_env, there when its module was imported
        assert [o.result["seen"] for o in outcomes] == ["0", "1", "2"]
    for i, outcome in enumerate(outcomes):  # the run's log: its own import, then its main()
        pid = outcome.result["pid"]
        log = (root / outcome.name / "worker.log").read_text()
        assert log.count("imported by") == 1 and f"imported by {pid}\n" in log
        assert f"main of {i} in {pid}\n" in log
    assert "warm starts: a warm process imported" in (root / "scheduler.log").read_text()


def test_runs_start_fresh_without_prewarm(in_tmp):
    outcomes, _ = sweep(in_tmp / "r", tasks.WarmProbe, prewarm=False)
    assert not any(o.result["forked"] for o in outcomes), [o.result for o in outcomes]
