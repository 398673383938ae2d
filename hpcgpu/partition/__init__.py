"""Partitioned execution: the state split over dask workers, the time loop run by the workers themselves.

The modules, each importing only those listed before it (no circles, tested):

- ``protocols``: what a model provides to be stepped and partitioned;
  ``layout``: rows split by weight;
- ``collectives``: the collective algorithms (O(log P) rounds), written
  against one round primitive;
- ``communicator``: the interface (and a loopback); ``mailbox``: what a
  rank waits on; ``direct_comm``, ``comm_extension`` (a worker's side) and
  ``dask_communicator`` (a rank's side): the transport on dask's comm layer;
  ``dask_session``: its sessions, opened and closed from the client, and
  their plugins; ``nccl_messages``, ``nccl_device``, ``nccl_sessions`` and
  ``nccl_communicator``: the NCCL one for device buffers;
  ``communicator_choice``: the choice between them;
- ``decomposition``: the base class of a decomposition; ``grid``,
  ``all_pairs``, ``bricks``, ``spectral``: one per kind (``process_grid``: the
  layout of ranks over axes, ``brick_geometry``: a box in bricks); ``decompositions``: them by kind;
  ``slowdown``: an emulated slow device for benchmarks of mixed clusters;
- ``epochs``: one epoch of a worker's ranks (the worker side); ``rank_state``:
  where a run's initial blocks come from (built by the ranks, or split on the
  client); ``engine``:
  :class:`~hpcgpu.partition.engine.PartitionedExecutor` (the client side);
  ``local``: the executor for one process.
"""
