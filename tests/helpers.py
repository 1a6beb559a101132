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
