"""The course's lab: what the notebooks use to show the engine at work.

The engine (``queue_core``) holds the protocol and its public API. The lab
sits above it and adds what a course needs and a worker does not; none of
it is protocol. It is grouped the way the course is read, and each part's
``__init__`` names what the chapters import from it:

- ``story``: the reference scenario, a worker in a real OS process that
  crashes on purpose, the broken protocols kept as contrasts, injected
  faults (00 to 07, 10, the exercises);
- ``plots``: the pictures, and notebook 00's summary card (every chapter);
- ``sweeps``: the crash sweep, the stress run, the power-loss sweep, the
  schedule explorer (07, 08, 11);
- ``speed``: commits, the flush curve, a slow disk, throughput against
  worker processes (08, 10);
- ``broker``: Redis Streams beside the queue, its consumers and their
  stories (12, exercise 7);
- ``servers``: private PostgreSQL and Redis servers (10, 12, the tests);
- ``lifetime``: the brokers' dedupe windows, a file's size over a steady
  load with and without prune, a migration killed at every step, the
  engine of an earlier release from git history (13, ``make reliability``);
- ``exercises``: ``start_N`` and ``check_N`` (09).

Layers: ``plots`` and ``servers`` use only the engine; ``story`` uses the
engine; ``sweeps``, ``speed``, ``broker`` and ``lifetime`` use those below them (and
``sweeps`` and ``speed`` one module of each other: the power-loss recording, the slow-disk
shim); the
exercises use any of them. Importing a part imports neither pandas,
matplotlib, psycopg nor redis: a plot loads the first two when it is drawn,
``DatabaseClock`` the third when it is first named, a broker the fourth
when it first talks to its server.

    from queue_core.lab.story import run_child
    from queue_core.lab.plots import plot_timeline, transitions_frame
"""
