"""How events reach the loop: the inbox waiting on descriptors, the loop-driven reaper, the queue's reader."""

import io
import os
import queue
import sys
import threading
import time

import pytest

from gpu_task_scheduler.backends.local.reaper import Reaper
from gpu_task_scheduler.engine.hooks import Inbox
from gpu_task_scheduler.sweep.spec import NOT_READY
from gpu_task_scheduler.sweep.stream import StreamSweep

needs_pidfd = pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="no pidfds here")


class PollSpy:
    """Wraps the inbox's poll object: sets ``entered`` as the loop goes to sleep in it."""

    def __init__(self, poller):
        self._poller = poller
        self.entered = threading.Event()

    def __getattr__(self, name):
        return getattr(self._poller, name)

    def poll(self, *args):
        self.entered.set()
        return self._poller.poll(*args)


@pytest.fixture
def watched_inbox():
    inbox = Inbox()
    read_end, write_end = os.pipe()
    assert inbox.watch(read_end, lambda: inbox.put("ready", os.read(read_end, 100)))
    yield inbox, write_end
    inbox.close()
    os.close(read_end)
    os.close(write_end)


def test_a_watched_descriptor_is_handled_on_the_loops_thread_and_its_event_returned(watched_inbox):
    inbox, write_end = watched_inbox
    with pytest.raises(queue.Empty):
        inbox.get(0)  # nothing readable, nothing posted
    os.write(write_end, b"x")
    assert inbox.get(30) == ("ready", b"x")
    inbox.put("exit", 7)
    assert inbox.get(None) == ("exit", 7)  # what is already posted comes first, without a poll


def test_a_post_from_another_thread_wakes_a_loop_asleep_on_its_descriptors(watched_inbox):
    inbox, _ = watched_inbox
    spy = inbox._poller = PollSpy(inbox._poller)
    poster = threading.Thread(target=lambda: (spy.entered.wait(30), inbox.put("wake")))
    poster.start()
    started = time.monotonic()
    try:
        assert inbox.get(30) == ("wake", None)
        assert time.monotonic() - started < 20  # woken by the post, not found when the 30 s had passed
    finally:
        poster.join()


def test_a_signal_another_thread_receives_wakes_a_loop_asleep_with_no_deadline(watched_inbox):
    """The OS hands a process signal to any of its threads. One that lands on another thread does
    not interrupt the main thread's poll, and Python runs the handler only once that poll returns:
    the inbox's wake-up fd makes it return (``gts run`` once ignored a SIGHUP for 30 s)."""
    import signal

    inbox, _ = watched_inbox
    spy = inbox._poller = PollSpy(inbox._poller)
    previous = signal.signal(signal.SIGUSR1, lambda signum, frame: inbox.put("signal", signum))
    late = threading.Event()

    def elsewhere():
        spy.entered.wait(30)
        signal.pthread_kill(threading.get_ident(), signal.SIGUSR1)  # to this thread, not the loop's
        if not late.wait(10):
            inbox.put("never woken")  # what the loop would have slept past, forever with no deadline

    sender = threading.Thread(target=elsewhere)
    sender.start()
    try:
        assert inbox.get(None) == ("signal", signal.SIGUSR1)
    finally:
        late.set()
        sender.join()
        signal.signal(signal.SIGUSR1, previous)


def test_a_watching_inbox_times_out_like_a_plain_one(watched_inbox):
    inbox, _ = watched_inbox
    with pytest.raises(queue.Empty):
        inbox.get(0.05)
    inbox.unwatch(inbox._wake[0] + 1000)  # not watched: nothing happens


@needs_pidfd
def test_a_driven_reaper_reports_ends_through_the_inbox_without_a_thread():
    inbox, reaper = Inbox(), Reaper(driven=True)
    assert inbox.watch(reaper.fileno(), reaper.dispatch)
    threads = set(threading.enumerate())
    pids = [os.posix_spawn(sys.executable, [sys.executable, "-c", f"raise SystemExit({n})"], {}) for n in range(3)]
    try:
        for pid in pids:
            assert reaper.watch(pid, lambda pid=pid: inbox.put("exit", pid))
        heard = {inbox.get(30) for _ in pids}
        assert heard == {("exit", pid) for pid in pids}
        assert set(threading.enumerate()) == threads  # the loop's thread heard them
        # Heard, not reaped: each is still a zombie, its pid not yet free for another process.
        assert all(os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None for pid in pids)
    finally:
        codes = sorted(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in pids)
        inbox.unwatch(reaper.fileno())
        reaper.close()
        inbox.close()
    assert codes == [0, 1, 2]


@needs_pidfd
def test_closing_a_driven_reaper_releases_the_pidfds_of_children_not_heard_of():
    reaper = Reaper(driven=True)
    pid = os.posix_spawn(sys.executable, [sys.executable, "-c", "pass"], {})
    before = set(os.listdir("/proc/self/fd"))
    assert reaper.watch(pid, lambda: None)
    os.waitpid(pid, 0)  # reaped by someone else (the loop's last-resort kill): never dispatched
    reaper.close()
    assert set(os.listdir("/proc/self/fd")) <= before


@pytest.mark.parametrize("buffer", [1, 2, 3, 64])
def test_the_queues_reader_hands_over_every_line_in_order_whatever_its_buffer(tmp_path, buffer):
    lines = [f"echo {i}" for i in range(200)]
    text = "\n".join(lines[:100] + ["", "# a comment"] + lines[100:]) + "\n"
    sweep = StreamSweep(
        {"scheduler_config": {"gpu": ["cpu"], "result_root_folder": str(tmp_path)}}, io.StringIO(text), buffer=buffer
    )
    woken, wakes, waits = threading.Event(), [], 0
    sweep.follow(lambda: (wakes.append(1), woken.set()))
    commands = []
    for spec in sweep.runs():  # as the engine takes them: on NOT_READY it sleeps until woken
        if spec is NOT_READY:
            waits += 1
            assert woken.wait(30), "the reader never woke the engine that found no line"
            woken.clear()
            continue
        commands.append(spec.config["command"])
    assert commands == lines
    assert len(wakes) <= waits + 1  # only an engine that found no line is woken (and once at the end)
