"""Options shared by the ``hpcgpu run`` commands: the cluster to run on, and checkpoints.

Cluster: ``--workers N`` starts a local dask cluster, ``--scheduler ADDRESS``
joins a running one, ``--partitions P`` splits the state; without them the
model runs in this process.

Checkpoints (batch jobs with wall-time limits):

A batch job runs ``hpcgpu run weather --wall-time 3500 --checkpoint ckpt``;
it stops cleanly before the scheduler kills it, with a checkpoint; the next
job runs ``hpcgpu run weather --resume ckpt --wall-time 3500`` and continues
exactly where it stopped (writing further checkpoints to the same place),
appending to the same output store, with the same output steps as the
uninterrupted run. ``--steps N`` with ``--resume`` extends the run to step N.
"""

import math
from dataclasses import dataclass

from hpcgpu.schedules import Schedule
from hpcgpu.validation import check_int

__all__ = ["add_cluster_arguments", "open_client", "add_checkpoint_arguments", "start", "run_options",
           "check_run_arguments", "parse_weights", "EveryAndLast", "output_schedule"]

# (option, bound, strict): the numbers a ``hpcgpu run`` command takes, checked
# before any is used (a zero dt or K would otherwise fail deep inside as a
# division by zero)
_NUMBER_OPTIONS = (("dt", 0.0, True), ("stop_time", 0.0, True), ("cfl", 0.0, True), ("steps", 1, False),
                   ("snapshots", 0, False), ("steps_per_task", 1, False), ("partitions", 1, False),
                   ("workers", 1, False))


def check_run_arguments(args):
    """Raise ConfigError naming the first numeric option of ``args`` out of its range.

    Examples
    --------
    >>> from argparse import Namespace
    >>> check_run_arguments(Namespace(dt=0.5, steps=None))
    >>> check_run_arguments(Namespace(dt=0.0))
    Traceback (most recent call last):
    ...
    hpcgpu.errors.ConfigError: dt must be > 0.0, got 0.0
    """
    from hpcgpu.validation import check_float, check_int

    for name, bound, strict in _NUMBER_OPTIONS:
        value = getattr(args, name, None)
        if value is None:
            continue
        if isinstance(bound, float):
            check_float(name, value, minimum=bound, strict_min=strict)
        else:
            check_int(name, value, minimum=bound)


def add_cluster_arguments(parser, partitions_help):
    """Add ``--workers``, ``--scheduler`` and ``--partitions``; returns the group (for more options)."""
    group = parser.add_argument_group("cluster (default: in-process, no dask)")
    group.add_argument("--workers", type=int, help="start a local dask cluster with N workers")
    group.add_argument("--scheduler", metavar="ADDRESS", help="use the dask scheduler at ADDRESS (tcp://host:8786)")
    group.add_argument("--partitions", type=int, help=partitions_help)
    group.add_argument("--grid", metavar="PXxPY[xPZ]", type=_grid_option,
                       help="the process grid: ranks along x and y (4x2), or x, y and z for MD bricks (2x2x2); "
                            "default: the one of least halo surface for the partitions")
    return group


def _grid_option(text):
    """``--grid 4x2`` as ``(4, 2)``; argparse reports a bad one with the option's name."""
    import argparse

    from hpcgpu.errors import ConfigError
    from hpcgpu.partition.process_grid import parse_grid

    try:
        return parse_grid(text)
    except ConfigError as error:
        raise argparse.ArgumentTypeError(str(error).replace("grid must", "must")) from None


def open_client(args):
    """A dask client as ``--workers``/``--scheduler`` ask (None: run in this process).

    Close it with :func:`hpcgpu.cluster.close_client`.
    """
    if args.workers is None and args.scheduler is None:
        # these options shape a cluster run; without one they would change nothing
        given = [f"--{name.replace('_', '-')}" for name in ("partitions", "steps_per_task", "weights", "grid")
                 if getattr(args, name, None) is not None]
        if given:
            from hpcgpu.errors import ConfigError

            raise ConfigError(f"{', '.join(given)} {'needs' if len(given) == 1 else 'need'} a cluster: add "
                              f"--workers N (a local one) or --scheduler ADDRESS")
        return None
    from hpcgpu.cluster import start_cluster

    one_cluster(args)
    return start_cluster(args.scheduler, workers=args.workers)


def one_cluster(args):
    """ConfigError when both ``--workers`` (start a local cluster) and ``--scheduler`` (join one) are given."""
    if args.workers is not None and args.scheduler is not None:
        from hpcgpu.errors import ConfigError

        raise ConfigError("--workers starts a local cluster and --scheduler joins a running one: give one of them")


def add_checkpoint_arguments(parser):
    """Add ``--checkpoint``, ``--checkpoint-every``, ``--wall-time`` and ``--resume``."""
    group = parser.add_argument_group("checkpoints (batch jobs)")
    group.add_argument("--checkpoint", metavar="DIR", help="write checkpoints of the global state to DIR "
                                                            "(at the end, at --wall-time, and --checkpoint-every)")
    group.add_argument("--checkpoint-every", type=int, metavar="N", help="also checkpoint every N steps")
    group.add_argument("--wall-time", type=float, metavar="SECONDS",
                       help="stop cleanly after SECONDS of stepping (with a checkpoint when --checkpoint "
                            "or --resume is given)")
    group.add_argument("--resume", metavar="DIR", help="continue the run checkpointed in DIR (the model options "
                                                       "are taken from the checkpoint)")


def parse_weights(text):
    """The ``--weights`` option: None, ``"calibrate"`` or a list of positive numbers.

    Parsed before a cluster is started, so that a typo is a one-line error, not a traceback.

    Examples
    --------
    >>> parse_weights("2,1.5"), parse_weights("calibrate"), parse_weights(None)
    ([2.0, 1.5], 'calibrate', None)
    >>> parse_weights("1,x")
    Traceback (most recent call last):
    ...
    hpcgpu.errors.ConfigError: --weights must be 'calibrate' or comma-separated positive numbers; got '1,x'
    """
    from hpcgpu.errors import ConfigError

    if text is None or text == "calibrate":
        return text
    try:
        weights = [float(w) for w in text.split(",")]
    except ValueError:
        weights = None
    if not weights or not all(math.isfinite(w) and w > 0 for w in weights):
        raise ConfigError(f"--weights must be 'calibrate' or comma-separated positive numbers; got {text!r}")
    return weights


@dataclass(frozen=True)
class EveryAndLast(Schedule):
    """Fire every ``steps`` time steps and at step ``last`` (the run's final step).

    The interval is in plain steps, never rounded to the steps per task of a
    cluster: which steps are written must not depend on the worker count (the
    driver splits a task at any step).

    Examples
    --------
    >>> schedule = EveryAndLast(5, 21)
    >>> [n for n in range(25) if schedule.fires(n, n * 0.1, 0.1)]
    [0, 5, 10, 15, 20, 21]
    """

    steps: int
    last: int

    def __post_init__(self):
        object.__setattr__(self, "steps", check_int("steps", self.steps, minimum=1))
        object.__setattr__(self, "last", check_int("last", self.last, minimum=0))

    def steps_until(self, step, time, dt):
        until = (-step) % self.steps
        if step <= self.last:
            until = min(until, self.last - step)
        return until


def output_schedule(planned, count, last, align=1):
    """About ``count`` outputs over a run planned for ``planned`` steps, plus the one at step ``last``.

    ``planned`` is the stop step of the run as first started (on resume, the
    checkpoint's), so that a resumed run writes at the same steps as the
    uninterrupted one; ``last`` is where this run stops (later when ``--steps``
    extends it). An interval of at least ``align`` steps is rounded to a
    multiple of it: a fixed number (never the worker count's K), so that the
    steps written stay the same on any cluster.

    Examples
    --------
    >>> output_schedule(7417, 200, 7417, align=16)
    EveryAndLast(steps=32, last=7417)
    """
    every = max(1, planned // max(1, count))
    if every >= align:
        every = align * round(every / align)
    return EveryAndLast(every, last)


def start(args, make, client, **kwargs):
    """The Simulation to run, and the stop step its output cadence is planned for.

    Returns ``(simulation, planned)``: ``make()`` and its ``stop_steps``, or the
    run resumed from ``args.resume`` and the stop step saved in its checkpoint.
    On resume an explicit ``--steps`` (or ``--stop-time``) moves the stop
    (extends the run); ``planned`` stays the checkpoint's, so the output
    steps stay those of the uninterrupted run.
    """
    from hpcgpu.errors import ConfigError
    from hpcgpu.simulation import Simulation

    if args.checkpoint_every is not None and args.checkpoint_every < 1:
        raise ConfigError(f"--checkpoint-every must be >= 1; got {args.checkpoint_every}")
    if args.checkpoint_every is not None and not (args.checkpoint or args.resume):
        raise ConfigError("--checkpoint-every needs --checkpoint DIR (or --resume DIR)")
    if args.wall_time is not None and not args.wall_time > 0:
        raise ConfigError(f"--wall-time must be > 0 seconds; got {args.wall_time}")
    if not args.resume:
        sim = make()
        return sim, sim.stop_steps
    sim = Simulation.resume(args.resume, client=client, progress=False if args.no_progress else None,
                            partitions=getattr(args, "partitions", None), grid=getattr(args, "grid", None),
                            **kwargs)
    planned = sim.stop_steps
    # None unless given on this command line (the CLIs fill in their defaults for new runs only)
    steps, stop_time = getattr(args, "steps", None), getattr(args, "stop_time", None)
    if steps is not None:
        option, stop = f"--steps {steps}", steps
    elif stop_time is not None:
        option, stop = f"--stop-time {stop_time:g}", max(1, math.ceil(stop_time / sim.dt - 1e-9))
    else:
        option, stop = None, None
    if stop is not None:
        if stop < sim.step:
            raise ConfigError(f"{option} stops before step {sim.step} of the checkpoint in {args.resume!r}; "
                              f"give a stop at or after it (--steps >= {sim.step})")
        sim.stop_steps, sim.stop_time = stop, None  # the stop asked for, not the earlier of it and a saved one
    elif sim.stop_steps is None:  # a run started with a stop time only (or a wall time only)
        if sim.stop_time is None:
            raise ConfigError(f"the run checkpointed in {args.resume!r} has no stop step; give --steps")
        sim.stop_steps = max(1, math.ceil(sim.stop_time / sim.dt - 1e-9))
    return sim, sim.stop_steps if planned is None else planned


def run_options(args):
    """Keyword arguments of ``Simulation.run`` for the checkpoint options."""
    return dict(checkpoint=args.checkpoint or args.resume, checkpoint_every=args.checkpoint_every,
                wall_time_limit=args.wall_time)
