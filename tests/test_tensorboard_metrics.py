"""TensorBoard event files as a run's metric stream (sweep/metrics_source.py, records/tensorboard.py,
engine/feeds.py): both forms of a scalar are read with TensorBoard's own loader, a look is bounded,
an earlier attempt's files, links and FIFOs are left alone, steps never go back, the config is
checked, and an unmodified Lightning script that logs to TensorBoard is stopped early by ASHA."""

import json
import os
import subprocess
import sys
import threading

import pytest
from helpers import ledger_rows
from run_side import ONE_THREAD

pytest.importorskip("tensorboard", reason="the tensorboard extra: pip install -e '.[tensorboard]'")

import numpy as np  # noqa: E402

from gpu_task_scheduler.errors import ConfigError  # noqa: E402
from gpu_task_scheduler.records.tensorboard import EventFeed  # noqa: E402
from gpu_task_scheduler.sweep.expand import Sweep  # noqa: E402
from gpu_task_scheduler.sweep.metrics_source import TensorBoardSource, parse_metrics  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def lines(path):
    with open(path) as handle:
        return [json.loads(line) for line in handle]


@pytest.fixture(scope="module")
def torch_tb():
    """PyTorch's SummaryWriter writes the test's files (imported when first needed: PyTorch takes seconds)."""
    return pytest.importorskip("torch.utils.tensorboard", reason="PyTorch's SummaryWriter writes the test's files")


def feed(folder, metrics, tags=None, **kwargs):
    return EventFeed(str(folder), TensorBoardSource(str(folder), tags).wants, str(metrics), **kwargs)


def test_both_forms_of_a_scalar_are_fed_as_the_run_writes_them(torch_tb, tmp_path):
    fed = feed(tmp_path / "tb", tmp_path / "metrics.jsonl")
    assert fed.look() == 0  # no folder yet
    writer = torch_tb.SummaryWriter(str(tmp_path / "tb" / "version_0"))
    writer.add_scalar("val_loss", 0.5, 1)  # simple_value, as Lightning and tensorboardX write it
    writer.add_scalar("train/loss", 0.75, 1, new_style=True)  # a scalar tensor, as TensorFlow 2 writes it
    writer.add_histogram("weights", np.array([1.0, 2.0, 3.0]), 1)  # no scalar: left out
    writer.add_text("note", "hello", 1)
    writer.flush()
    assert fed.look() == 1  # seen as soon as it is on disk
    writer.add_scalar("val_loss", 0.25, 2)
    writer.flush()
    assert fed.look() == 1
    writer.close()
    assert lines(tmp_path / "metrics.jsonl") == [
        {"step": 1, "val_loss": 0.5, "train/loss": 0.75},
        {"step": 2, "val_loss": 0.25},
    ]


def test_tags_an_earlier_attempts_files_and_steps_that_go_back(torch_tb, tmp_path):
    old = torch_tb.SummaryWriter(str(tmp_path / "tb" / "old"))
    old.add_scalar("val_loss", 9.0, 50)
    old.close()
    os.utime(next((tmp_path / "tb" / "old").iterdir()), (1, 1))  # last written long before the attempt
    fed = feed(tmp_path / "tb", tmp_path / "metrics.jsonl", tags=("val_*",))
    writer = torch_tb.SummaryWriter(str(tmp_path / "tb" / "new"))
    for step, value in ((4, 0.25), (3, 0.375)):  # out of order within a look: fed in order
        writer.add_scalar("val_loss", value, step)
        writer.add_scalar("lr", 0.1, step)  # not a tag kept
    writer.flush()
    assert fed.look() == 2
    writer.add_scalar("val_loss", 0.875, 2)  # behind what was fed: left out, counted
    writer.add_scalar("val_loss", 0.125, 5)
    writer.close()
    assert fed.look() == 1 and fed.left_out == 1
    assert lines(tmp_path / "metrics.jsonl") == [
        {"step": 3, "val_loss": 0.375},
        {"step": 4, "val_loss": 0.25},
        {"step": 5, "val_loss": 0.125},
    ]  # nothing of the earlier attempt's file


def test_a_look_is_bounded_and_links_and_fifos_are_left_alone(torch_tb, tmp_path):
    outside = tmp_path / "outside"
    writer = torch_tb.SummaryWriter(str(outside))
    writer.add_scalar("secret", 1.0, 1)
    writer.close()
    (tmp_path / "tb").mkdir()
    os.symlink(outside, tmp_path / "tb" / "linked")  # a folder link: not walked
    os.symlink(next(outside.iterdir()), tmp_path / "tb" / "events.out.tfevents.link")  # a file link: not read
    os.mkfifo(tmp_path / "tb" / "events.out.tfevents.fifo")  # never opened (it would block)
    writer = torch_tb.SummaryWriter(str(tmp_path / "tb" / "run"))
    for step in range(1, 101):
        writer.add_scalar("loss", 1.0 / step, step)
    writer.close()
    fed = feed(tmp_path / "tb", tmp_path / "metrics.jsonl")
    done = threading.Event()
    counts = []
    threading.Thread(target=lambda: (counts.append(fed.look(budget=30)), done.set()), daemon=True).start()
    assert done.wait(30), "a look blocked"
    assert counts == [29]  # the file's first event is its version record
    while fed.look(budget=30):
        pass
    steps = [line["step"] for line in lines(tmp_path / "metrics.jsonl")]
    assert steps == list(range(1, 101)) and all("secret" not in line for line in lines(tmp_path / "metrics.jsonl"))


@pytest.mark.parametrize(
    ("metrics", "error"),
    [
        ("logs", "metrics must be a mapping"),
        ({"tensorboard": "{work_dir}/tb", "tag": ["x"]}, "unknown key"),
        ({"tensorboard": ""}, "must name each run's TensorBoard folder"),
        ({"tensorboard": "{nope}/tb"}, "placeholder {nope}"),
        ({"tensorboard": "{work_dir}/tb", "tags": [1]}, "tags must be a list"),
    ],
)
def test_the_metrics_section_is_checked(metrics, error):
    with pytest.raises(ConfigError, match=error):
        parse_metrics(metrics, {"lr"})


def test_a_pausing_method_is_refused_with_tensorboard_metrics(tmp_path):
    config = {
        "scheduler_config": {"gpu": ["cpu"], "result_root_folder": str(tmp_path)},
        "command": ["true"],
        "metrics": {"tensorboard": "{work_dir}/tb"},
        "test_config": [{"lr": [0.1, 0.2]}],
        "early_stop": {"method": "asha", "promotion": True, "metric": "loss", "mode": "min", "max_step": 9},
    }
    with pytest.raises(ConfigError, match="can be stopped early but not paused"):
        Sweep(config)
    config["early_stop"] = {"method": "asha", "metric": "loss", "mode": "min", "max_step": 9}
    assert Sweep(config).tensorboard.folder == "{work_dir}/tb"


@pytest.mark.xdist_group("frameworks")  # a sweep of Lightning runs: one at a time with the others
def test_an_unmodified_lightning_script_is_stopped_early_from_its_event_files(tmp_path):
    pytest.importorskip("lightning", reason="the integrations extra: pip install -e '.[integrations]'")
    config_file = os.path.join("examples", "integrations", "tensorboard_lightning.yaml")
    with open(os.path.join(REPO, "examples", "integrations", "tensorboard_lightning.py")) as handle:
        assert "gpu_task_scheduler" not in handle.read()  # not a line of gts in the script
    root = str(tmp_path / "root")
    subprocess.run(
        [sys.executable, "-m", "gpu_task_scheduler", "run", config_file, f"scheduler_config.result_root_folder={root}"]
        + ["lr=0.1,0.003", "--plain"],  # half the example's grid: the two slow ones are judged against the fast
        cwd=REPO,
        check=True,
        capture_output=True,
        timeout=300,
        env={**os.environ, **ONE_THREAD},
    )
    rows = ledger_rows(root)
    pruned = [row for row in rows.values() if row["status"] == "pruned"]
    assert len(rows) == 4 and len(pruned) >= 2
    for row in rows.values():
        summary = json.loads(row["metrics"])
        assert set(summary) == {"val_loss", "train_loss"}  # the tags kept
        last = summary["val_loss"]["step"]
        assert last < 1535 if row["status"] == "pruned" else last == 1535  # a pruned run stopped before its end
