"""Which run each output writer serves: one writer, one run (and the runs resumed from its checkpoints).

A :class:`~hpcgpu.simulation.Simulation` claims its writers when it runs;
another simulation that is given one of them is refused (it would append its
records to the first run's store), unless it continues the same history
(:meth:`~hpcgpu.simulation.Simulation.resume` keeps the history id).

Examples
--------
>>> from hpcgpu.writer_runs import WriterRuns
>>> class Writer:
...     pass
>>> runs, writer = WriterRuns(), Writer()
>>> runs.claim(writer, "history-1", "first run")
>>> runs.get(writer)
('history-1', 'first run')
>>> runs.check(writer, "history-1", "resumed run")  # the same history: allowed
>>> runs.check(writer, "history-2", "other run")
Traceback (most recent call last):
...
hpcgpu.errors.ConfigError: writer: ... holds the output of another run ('first run'); ...
"""

import os
import weakref

from hpcgpu.errors import ConfigError

__all__ = ["WRITER_RUNS", "WriterRuns"]


class WriterRuns:
    """The run each output writer has run for: ``(history id, simulation name)``, by the writer's identity.

    Writers are the user's objects: they may be unhashable (a dataclass) or
    take no attributes (``__slots__``), so they are looked up by ``id()``,
    with a weak reference that tells a new object at the id of a collected
    one apart and drops the entry with the writer.
    """

    def __init__(self):
        self._runs = {}

    def get(self, writer):
        """``(history id, simulation name)`` of the run ``writer`` serves, or None."""
        entry = self._runs.get(id(writer))
        if entry is None or entry[0]() is not writer:
            return None
        return entry[1]

    def claim(self, writer, history, name):
        """Record that ``writer`` serves the run ``history`` (named ``name``)."""
        key = id(writer)
        try:
            ref = weakref.ref(writer, lambda _, key=key: self._runs.pop(key, None))
        except TypeError:  # not weak-referenceable (__slots__ without __weakref__): kept alive instead
            def ref(writer=writer):
                return writer
        self._runs[key] = (ref, (history, name))

    def check(self, writer, history, name):
        """Raise ConfigError when ``writer`` has run for a simulation outside the history ``history``.

        Parameters
        ----------
        writer : object
            An output writer (e.g. :class:`hpcgpu.io.ZarrWriter`).
        history : str
            The history id of the simulation that wants to use it.
        name : str
            That simulation's name (for the message).
        """
        owner = self.get(writer)
        if owner is None or owner[0] == history:
            return
        path = getattr(writer, "path", None)
        what = f"{type(writer).__name__} writing to {os.fspath(path)!r}" if path is not None else repr(writer)
        raise ConfigError(
            f"writer: {what} holds the output of another run ({owner[1]!r}); used by {name!r} it would "
            "append this run's records to that run's store. Give this run a new writer (another path, or "
            "overwrite=True to replace that store); only a run resumed from that run's checkpoint "
            "(Simulation.resume) may continue its writer")


WRITER_RUNS = WriterRuns()
"""The one table of every process: writers are shared between simulations of one process only."""
