import json
import os
import sqlite3


def make_config(root, test_config, *, slots=("cpu",), global_config=None, **options):
    scheduler = {
        "gpu": list(slots),
        "result_root_folder": str(root),
        "scheduler_log_file_path": os.path.join(str(root), "scheduler.log"),
        **options,
    }
    config = {"scheduler_config": scheduler, "test_config": test_config}
    if global_config is not None:
        config["global_config"] = global_config
    return config


def journal_lines(path):
    try:
        with open(path) as handle:
            return handle.read().split("\n")[:-1]
    except FileNotFoundError:
        return []


def ledger_rows(root):
    """The ledger's rows read directly with sqlite3, independent of the Ledger class. A ledger
    whose scheduler was killed after SQLite created the file, before it created the tables,
    has no rows."""
    db = sqlite3.connect(os.path.join(str(root), ".gts", "ledger.sqlite3"))
    db.row_factory = sqlite3.Row
    try:
        if not db.execute("SELECT 1 FROM sqlite_master WHERE name = 'runs'").fetchall():
            return {}
        return {row["name"]: dict(row) for row in db.execute("SELECT * FROM runs")}
    finally:
        db.close()


def record_started(ledger, root, index, name, params):
    """Record run ``name`` (the ``index``-th, with ``params``) as running in ``ledger``, as the scheduler
    does before its process starts: for tests that plant a root's ledger directly."""
    ledger.mark_running(
        name=name,
        run_index=index,
        config_hash="h",
        slot="cpu0",
        token="t",
        work_dir=os.path.join(str(root), name),
        params=json.dumps(params),
    )


def report_to_free(root):
    """Seconds from each paused attempt's last report (its metrics line's time, written as it
    reports) to its end (its span in the ledger: its slot free then)."""
    found = []
    db = sqlite3.connect(os.path.join(str(root), ".gts", "ledger.sqlite3"))
    try:
        rows = db.execute("SELECT status, work_dir, spans FROM runs").fetchall()
    finally:
        db.close()
    for status, work_dir, spans in rows:
        times = []
        for folder, _, files in os.walk(os.path.join(work_dir, ".gts")):
            for name in files:
                if name.endswith("metrics.jsonl"):
                    with open(os.path.join(folder, name)) as handle:
                        times += [json.loads(line)["@time"] for line in handle if line.strip()]
        spans = json.loads(spans)
        for index, (_, start, end) in enumerate(spans):
            if index < len(spans) - 1 or status == "paused":
                found.append(end - max(at for at in times if start <= at <= end + 0.01))
    return sorted(found)
