"""Options shared by the ``hpcgpu run`` commands: the cluster to run on, and checkpoints.

Cluster: ``--workers N`` starts a local dask cluster, ``--scheduler ADDRESS``
joins a running one, ``--partitions P`` splits the state; without them the
model runs in this process.

Checkpoints (batch jobs with wall-time limits):

A batch job runs ``hpcgpu run weather --wall-time 3500 --checkpoint ckpt``;
it stops cleanly before the scheduler kills it, with a checkpoint; the next
job runs ``hpcgpu run weather --resume ckpt --wall-time 3500`` and continues
exactly where it stopped (writing further checkpoints to the same place),
appending to the same output store.
"""

__all__ = ["add_cluster_arguments", "open_client", "add_checkpoint_arguments", "start", "run_options",
           "check_run_arguments"]

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
    return group


def open_client(args):
    """A dask client as ``--workers``/``--scheduler`` ask (None: run in this process).

    Close it with :func:`hpcgpu.cluster.close_client`.
    """
    if args.workers is None and args.scheduler is None:
        return None
    from hpcgpu.cluster import start_cluster

    return start_cluster(args.scheduler, workers=args.workers)


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


def start(args, make, client, **kwargs):
    """The Simulation to run: resumed from ``args.resume``, or ``make()``."""
    from hpcgpu.errors import ConfigError
    from hpcgpu.simulation import Simulation

    if args.checkpoint_every is not None and args.checkpoint_every < 1:
        raise ConfigError(f"--checkpoint-every must be >= 1; got {args.checkpoint_every}")
    if args.checkpoint_every is not None and not (args.checkpoint or args.resume):
        raise ConfigError("--checkpoint-every needs --checkpoint DIR (or --resume DIR)")
    if args.wall_time is not None and not args.wall_time > 0:
        raise ConfigError(f"--wall-time must be > 0 seconds; got {args.wall_time}")
    if args.resume:
        return Simulation.resume(args.resume, client=client, progress=False if args.no_progress else None,
                                 partitions=getattr(args, "partitions", None), **kwargs)
    return make()


def run_options(args):
    """Keyword arguments of ``Simulation.run`` for the checkpoint options."""
    return dict(checkpoint=args.checkpoint or args.resume, checkpoint_every=args.checkpoint_every,
                wall_time_limit=args.wall_time)
