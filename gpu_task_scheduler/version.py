"""The version of gpu_task_scheduler: the one place it is written (setup.py reads it; the package and
the ledger's messages import it from here, so that no module imports the package that imports it)."""

__version__ = "0.2.0"
