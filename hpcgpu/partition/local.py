"""The local executor: the whole state in this process (on the model's backend, GPU memory included).

The :class:`~hpcgpu.simulation.Simulation` driver is the same for every
model and every machine; an executor owns the state and knows how to advance
it, check it and reduce diagnostics. :class:`LocalExecutor` keeps the state
here; :class:`hpcgpu.partition.engine.PartitionedExecutor` keeps partitions
resident on dask workers.

An executor provides ``advance(steps)`` (which may return before the work is
done), ``synchronize()``, ``request_health(step)`` and
``request_diagnostics(step)`` whose results come back from ``collect()``
when ready (so checks never stall a pipeline of supersteps),
``reduce_on_ranks(function, *args)`` (a sum over the ranks' blocks),
``global_state()``, ``granularity`` (steps per task) and ``close()``.
"""

__all__ = ["LocalExecutor"]


class LocalExecutor:
    """Advance a model's state in this process, reusing work buffers.

    Parameters
    ----------
    model
        A model following :class:`hpcgpu.partition.protocols.SteppedModel`.
    state
        Initial state on the model's backend.
    dt : float
        Time step.
    """

    granularity = 1
    usable = True

    def __init__(self, model, state, dt):
        self.model = model
        self.dt = dt
        self._state = state
        self._stepper = model.stepper(dt)
        self._ready = []

    def advance(self, steps):
        """Advance ``steps`` time steps (the state is replaced, buffers reused)."""
        self._state = self._stepper.advance(self._state, steps)

    def synchronize(self):
        self.model.backend.synchronize()

    def health(self):
        """``(bad_fields, cfl)`` of the current state (``[]`` when all finite)."""
        cfl = self.model.cfl(self._state, self.dt)
        bad = [] if cfl == cfl else self.model.bad_fields(self._state)
        return bad, cfl

    def diagnostics(self):
        """The model's global diagnostics (dict of floats)."""
        return self.model.diagnostics(self._state, self.dt)

    def request_health(self, step):
        self._ready.append(("health", step, self.health()))

    def request_diagnostics(self, step):
        self._ready.append(("diagnostics", step, self.diagnostics()))

    def collect(self, block=False):
        """Results of the requests so far, in order: ``(kind, step, value)``."""
        ready, self._ready = self._ready, []
        return ready

    def reduce_on_ranks(self, function, *args):
        """``function(rank, state, *args)`` on the whole state, as one rank (see
        :mod:`hpcgpu.partition.rank_reductions`): the same diagnostic as on a partitioned run."""
        from hpcgpu.partition.communicator import LoopbackCommunicator
        from hpcgpu.partition.rank_reductions import RankView, combine_parts

        return combine_parts([function(RankView(self.model, LoopbackCommunicator()), self._state, *args)])

    def global_state(self):
        """The whole current state (live: it changes on the next advance)."""
        return self._state

    def describe(self):
        return {"executor": "local", "backend": self.model.backend.name}

    def close(self):
        self._stepper = None
