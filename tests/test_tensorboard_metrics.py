"""TensorBoard event files as a run's metric stream (sweep/metrics_source.py, records/tensorboard.py,
engine/feeds.py): both forms of a scalar are read as TensorBoard's Event records, a look is bounded,
an earlier attempt's files, links and FIFOs are left alone, steps never go back, the config is
checked, and an unmodified Lightning script that logs to TensorBoard is stopped early by ASHA."""

import errno
import json
import os
import subprocess
import sys
import threading
import time

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


def lines(path, *, times=None):
    """The fed lines, without their time (``@time``: the step's event time; into ``times`` if given)."""
    found = []
    with open(path) as handle:
        for line in handle:
            record = json.loads(line)
            at = record.pop("@time", None)
            if times is not None:
                times.append(at)
            found.append(record)
    return found


@pytest.fixture(scope="module")
def torch_tb():
    """PyTorch's SummaryWriter writes the test's files (imported when first needed: PyTorch takes seconds)."""
    return pytest.importorskip("torch.utils.tensorboard", reason="PyTorch's SummaryWriter writes the test's files")


def feed(folder, metrics, tags=None, **kwargs):
    return EventFeed(str(folder), TensorBoardSource(str(folder), tags).wants, str(metrics), **kwargs)


def test_both_forms_of_a_scalar_are_fed_as_the_run_writes_them(torch_tb, tmp_path):
    """Each form of a scalar is fed, with the time its event was written (exports give the trackers
    that time for the step)."""
    began = time.time()
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
    times = []
    assert lines(tmp_path / "metrics.jsonl", times=times) == [
        {"step": 1, "val_loss": 0.5, "train/loss": 0.75},
        {"step": 2, "val_loss": 0.25},
    ]
    assert began <= times[0] <= times[1] <= time.time(), times


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
    writer.add_scalar("secret", 1.0, 1000)  # ahead of the run's own steps: not read all the same
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


def _event_file(path, events):
    """An event file of ``(step, {tag: value})`` events, written as TFRecords (no writer holds it)."""
    from tensorboard.compat.proto import event_pb2, summary_pb2

    from gpu_task_scheduler.records.tensorboard import masked_crc32c

    with open(path, "wb") as handle:
        for step, values in events:
            summary = summary_pb2.Summary(
                value=[summary_pb2.Summary.Value(tag=tag, simple_value=value) for tag, value in values.items()]
            )
            body = event_pb2.Event(wall_time=1.0, step=step, summary=summary).SerializeToString()
            header = len(body).to_bytes(8, "little")
            handle.write(header + masked_crc32c(header).to_bytes(4, "little"))
            handle.write(body + masked_crc32c(body).to_bytes(4, "little"))


def _open_descriptors():
    return len(os.listdir("/proc/self/fd"))


def test_a_run_with_1500_event_files_holds_no_descriptor_between_looks_and_loses_nothing(tmp_path, monkeypatch):
    """A run that wrote 1,500 event files (more than the usual limit of 1,024 descriptors) is fed
    whole, and the feed holds no descriptor between looks; a look that finds no descriptor left
    says so and the next one feeds what it could not read."""
    from gpu_task_scheduler.records import tensorboard

    folder = tmp_path / "tb"
    folder.mkdir()
    began = time.time()  # the attempt's start: its files are written after it (on a loaded machine
    # writing them took over a second, and a feed made after them took the first for an earlier
    # attempt's, 204 of 1,500 in a CI run)
    for index in range(1500):
        _event_file(folder / f"events.out.tfevents.{index:05d}", [(index, {"loss": index / 1000})])
    fed = feed(folder, tmp_path / "metrics.jsonl", started=began)
    real_open, opened = tensorboard.open_regular, []

    def open_regular(path):  # the scheduler out of descriptors at the 50th file the feed opens
        opened.append(path)
        if len(opened) == 50:
            raise OSError(errno.EMFILE, "Too many open files", path)
        return real_open(path)

    monkeypatch.setattr(tensorboard, "open_regular", open_regular)
    before = _open_descriptors()
    assert fed.look() == 0  # undone: feeding the others now would leave the refused files' steps behind
    assert _open_descriptors() == before
    said = fed.said()
    assert len(opened) == 50 and len(said) == 1 and "no descriptor left" in said[0]
    assert fed.look() == 1500
    assert _open_descriptors() == before and fed.said() == [] and fed.left_out == 0
    assert [line["step"] for line in lines(tmp_path / "metrics.jsonl")] == list(range(1500))


def test_a_file_read_at_an_offset_goes_on_with_the_records_written_since(tmp_path):
    """A record half written at a look is read whole at the next; a record that fails its checksum
    ends what is read of that file, said once, and what came before it is fed."""
    folder = tmp_path / "tb"
    folder.mkdir()
    path = folder / "events.out.tfevents.1"
    _event_file(path, [(1, {"loss": 0.5}), (2, {"loss": 0.25})])
    whole = path.read_bytes()
    path.write_bytes(whole[:-7])  # the second record not yet all written
    fed = feed(folder, tmp_path / "metrics.jsonl")
    assert fed.look() == 1
    path.write_bytes(whole)
    assert fed.look() == 1
    _event_file(tmp_path / "more", [(3, {"loss": 0.125}), (4, {"loss": 0.0625})])
    more = bytearray((tmp_path / "more").read_bytes())
    more[-6] ^= 0xFF  # the fourth record's body damaged
    path.write_bytes(whole + bytes(more))
    assert fed.look() == 1
    assert any("fails its checksum" in said for said in fed.said())
    _event_file(tmp_path / "later", [(5, {"loss": 0.03})])
    path.write_bytes(whole + bytes(more) + (tmp_path / "later").read_bytes())
    assert fed.look() == 0  # nothing more of a broken file
    assert [line["step"] for line in lines(tmp_path / "metrics.jsonl")] == [1, 2, 3]


def test_the_events_step_is_the_step_and_steps_that_are_none_are_left_out(tmp_path):
    """A scalar tagged ``step`` is fed as ``step_tag`` (the line's step stays the event's), one tagged
    ``@time`` as ``time_tag``; an event
    whose step is below 0 or above 2**53 is left out; each said once."""
    folder = tmp_path / "tb"
    folder.mkdir()
    events = [(step, {"step": 100 - step, "loss": 1 / (step + 1), "@time": 7.0}) for step in range(4)]
    events += [(-1, {"loss": 9.0}), (2**62, {"loss": 9.0}), (4, {"loss": 0.2})]
    _event_file(folder / "events.out.tfevents.1", events)
    fed = feed(folder, tmp_path / "metrics.jsonl")
    assert fed.look() == 5
    fed_lines = lines(tmp_path / "metrics.jsonl")
    assert [line["step"] for line in fed_lines] == [0, 1, 2, 3, 4]
    assert [line.get("step_tag") for line in fed_lines] == [100, 99, 98, 97, None]
    assert [line.get("time_tag") for line in fed_lines] == [7.0] * 4 + [None]  # the line's own time: the event's
    said = fed.said()
    assert len(said) == 3 and fed.bad_steps == 2
    assert any("'step' is fed as 'step_tag'" in words for words in said)
    assert any("is left out: it is below 0" in words for words in said)


def test_an_attempt_followed_again_is_fed_from_its_start_and_never_twice(tmp_path):
    """A cluster's attempt that a restarted scheduler follows again: its files last written before
    the feed was made are its own once its start is known (they were left alone as an earlier
    attempt's), and what its metrics file holds already is not fed again."""
    import time

    (tmp_path / "tb").mkdir()
    old = tmp_path / "tb" / "events.out.tfevents.1"
    _event_file(old, [(1, {"loss": 1.0}), (2, {"loss": 0.5})])
    os.utime(old, (time.time() - 30, time.time() - 30))  # not written in the 30 s before the restart
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text(json.dumps({"step": 1, "loss": 1.0}) + "\n")  # fed by the scheduler that died
    fed = feed(tmp_path / "tb", metrics)
    fed.resume_after(1)
    assert fed.look() == 0  # taken for an earlier attempt's: its start is not known yet
    fed.started_at(time.time() - 60)  # placed: it started on its node a minute ago
    assert fed.look() == 1
    assert lines(metrics) == [{"step": 1, "loss": 1.0}, {"step": 2, "loss": 0.5}]


def test_scalars_logged_just_before_a_run_ended_reach_its_metrics_file(tmp_path, monkeypatch):
    """The feed's last look comes with the run's end, not at the thread's next look."""
    from gpu_task_scheduler.engine import feeds as feeds_module
    from gpu_task_scheduler.records.paths import RunPaths

    monkeypatch.setattr(feeds_module, "INTERVAL", 3600.0)  # the thread's looks never come in this test
    run_dir = tmp_path / "run"
    (run_dir / ".gts").mkdir(parents=True)
    source = TensorBoardSource("{work_dir}/tb", None)
    feeds = feeds_module.Feeds(source, lambda name: None)
    spec = type("Spec", (), {"config": {}, "work_dir": str(run_dir), "name": "run", "index": 0})()
    paths = RunPaths(str(run_dir), None)
    feeds.watch(spec, paths)
    (run_dir / "tb").mkdir()
    _event_file(run_dir / "tb" / "events.out.tfevents.1", [(7, {"loss": 0.5})])
    feeds.finish("run")
    assert lines(paths.metrics) == [{"step": 7, "loss": 0.5}]


def test_an_attempt_that_ended_while_no_scheduler_watched_is_fed_whole_at_its_end(tmp_path, monkeypatch):
    """A pool's attempt that ran to its end while its driver was down: the restarted driver follows
    it and reads its end before any word of its start. Its files (last written before the restart)
    are its own, as the ledger's record of its hand-over says, so the last look feeds them."""
    import time

    from gpu_task_scheduler.engine import feeds as feeds_module
    from gpu_task_scheduler.records.ledger import Ledger
    from gpu_task_scheduler.records.paths import RootPaths, RunPaths

    monkeypatch.setattr(feeds_module, "INTERVAL", 3600.0)  # only the end's last look
    run_dir = tmp_path / "run"
    (run_dir / ".gts").mkdir(parents=True)
    (run_dir / "tb").mkdir()
    clock = [time.time() - 120]  # handed over two minutes ago, by the driver that died
    with Ledger(RootPaths(str(tmp_path)), clock=lambda: clock[0]) as ledger:
        ledger.mark_running(name="run", run_index=0, config_hash="h", slot="pool0", token="t1", work_dir=str(run_dir))
        events = run_dir / "tb" / "events.out.tfevents.1"
        _event_file(events, [(step, {"loss": 1.0 / step}) for step in range(1, 7)])
        os.utime(events, (time.time() - 60, time.time() - 60))  # written while no driver watched
        paths = RunPaths(str(run_dir), None)
        paths_metrics = paths.metrics
        with open(paths_metrics, "w", encoding="utf-8") as handle:
            handle.write(json.dumps({"step": 1, "loss": 1.0}) + "\n")  # fed before the driver died
        clock[0] = time.time()
        ledger.mark_running(name="run", run_index=0, config_hash="h", slot="pool0", token="t1", work_dir=str(run_dir))
        assert ledger.get("run").started_at < time.time() - 100  # the same attempt keeps its hand-over
        feeds = feeds_module.Feeds(TensorBoardSource("{work_dir}/tb", None), lambda name: ledger.get(name).started_at)
        spec = type("Spec", (), {"config": {}, "work_dir": str(run_dir), "name": "run", "index": 0})()
        feeds.watch(spec, paths)
        feeds.finish("run")
    assert [line["step"] for line in lines(paths_metrics)] == [1, 2, 3, 4, 5, 6]


def test_an_attempt_that_ended_unwatched_and_is_settled_at_the_start_is_fed_before_its_end_is_recorded(tmp_path):
    """A pool's attempt that ran to its end after its driver was killed, whose end the next start
    reads before it runs anything (settle_running: the run is not followed, it is over): what it
    logged after the dead driver's last look is fed before its end and summary are recorded. Seen
    in a loaded run of the suite: every run of a pool sweep was recorded succeeded at step 1 of 6,
    and its later scalars were never fed, since it ran no more."""
    from gpu_task_scheduler.engine.loop import unwatched_ends_fed
    from gpu_task_scheduler.records.ledger import Ledger
    from gpu_task_scheduler.records.paths import RootPaths, RunPaths
    from gpu_task_scheduler.records.prior import settle_running
    from gpu_task_scheduler.records.protocol import Outcome

    run_dir = tmp_path / "i-0,"
    (run_dir / ".gts").mkdir(parents=True)
    (run_dir / "tb" / "a").mkdir(parents=True)
    paths = RunPaths(str(run_dir), None)
    (run_dir / ".gts" / "config.json").write_text(json.dumps({"i": 0, "tb": "a"}))
    with Ledger(RootPaths(str(tmp_path))) as ledger:
        ledger.mark_running(name="i-0,", run_index=0, config_hash="h", slot="pool0", token="t1", work_dir=str(run_dir))
        events = [(step, {"loss": 1 / step}) for step in range(1, 7)]
        _event_file(run_dir / "tb" / "a" / "events.out.tfevents.1", events)
        with open(paths.metrics, "w", encoding="utf-8") as handle:
            handle.write(json.dumps({"step": 1, "loss": 1.0}) + "\n")  # fed before the driver died
        Outcome("succeeded", token="t1", config_hash="h").write(paths.outcome)
        config = {
            "scheduler_config": {"gpu": ["cpu"], "result_root_folder": str(tmp_path)},
            "global_config": {"tb": "a"},  # the folder's template fills from the run's folder's config
            "metrics": {"tensorboard": "{work_dir}/tb/{tb}"},
            "command": ["true"],
            "test_config": [{"i": [0]}],
        }
        settle_running(ledger, None, None, unwatched_ends_fed(Sweep(config)))
        record = ledger.get("i-0,")
        assert record.status.value == "succeeded"
        assert json.loads(record.metrics)["loss"]["step"] == 6
    assert [line["step"] for line in lines(paths.metrics)] == [1, 2, 3, 4, 5, 6]


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
