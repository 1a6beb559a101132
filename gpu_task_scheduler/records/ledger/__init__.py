"""The record of every run, in SQLite under the result root.

Only the scheduler process writes it, in transactions (WAL journal), so a
scheduler killed at any moment leaves a consistent ledger. A run is recorded
as ``running`` *before* its child starts (that write is committed before the
child exists); on the next start, a run still marked ``running`` is settled
from the outcome file its child writes (``succeeded``) or marked
``interrupted`` and run again.

Durability: ``synchronous=NORMAL``. A commit is in the operating system's
hands the moment it returns, which is what survives a killed scheduler (the
kill -9 battery); only a power loss or kernel crash can take back the last
commits before a WAL checkpoint. What that costs is bounded: a run whose
success was lost is found again from the outcome file its process wrote
(and fsynced) into its folder, and adopted; anything else runs again. In
return a state change costs microseconds instead of an fsync (milliseconds),
and :meth:`Ledger.batch` lets the changes of one turn of the loop share one
transaction.

A new ledger is created with ``synchronous=OFF`` (then NORMAL): its creation
(the switch to WAL, the schema) synced six times, 3 to 40 ms before a new
root's first run could start. What those syncs kept safe from a power loss
is an empty ledger: until the first checkpoint the database file holds only
its header, and everything else is in the WAL, whose recovery keeps a
consistent prefix of the commits whatever reached the disk (NORMAL already
gives up the commits since the last checkpoint, here all of them); a ledger
lost altogether is started again, and its successes adopted from the runs'
outcome files as above.

A :class:`SweepLock` (an ``flock`` on ``.gts/lock``) stops two schedulers
from working on the same result root; the kernel drops it when its holder
dies, so a killed scheduler never leaves a stale lock behind.

The ledger is a package of one concern per module, all on one connection:

- ``schema.py``: the tables, their versions and migrations; ``record.py``: a run's row as readers get it;
- ``store.py``: the connection, transactions (``commit``, ``batch``), meta and notes;
- ``runs.py``: a run's lifecycle writes, and what deciding about a run reads back;
- ``reads.py``: the queries of status, results, importance and the page;
- ``trials.py``: the trial schedulers' verdicts and events; ``cost.py``: cost and provenance;
- ``lock.py``: the sweep lock and the scheduler-process probes.

:class:`Ledger` only joins the concerns: they share one connection and one transaction (a turn of
the loop writes a run's end, its verdicts and its cost in one ``batch()``), so they are one object;
each is a class of its own module that a reader can open alone, and callers import the names they
use (``RunRecord`` from ``record``, ``TrialEvent`` from ``trials``, ``SweepLock`` from ``lock``)
from the module that defines them.
"""

from __future__ import annotations

from .cost import Cost
from .reads import Reads
from .runs import Runs
from .trials import Trials


class Ledger(Runs, Reads, Trials, Cost):
    """A result root's ledger: every concern's methods on one connection (see the module's notes)."""
