"""The Ray backend: the same sweep over the GPUs of several machines (``backend: ray``).

The engine is the same; only the launcher differs. Each attempt of a run is a
Ray task that asks for the run's GPUs and supervises the run's process on
whichever machine Ray chose, started exactly as the local backend starts it
(``backends/local/process.py``). The scheduler (the driver) keeps the ledger,
alone, and prepares each run's folder, which must be on a filesystem every
machine sees. ``launcher.py`` is the driver's side, ``remote.py`` what runs
in Ray's workers.
"""
