"""The all-to-all transpose of a 2-D array between row blocks and column blocks of the same ranks.

A pencil (here: slab) FFT transforms along x on the rows a rank owns,
then needs whole columns to transform along y. :func:`rows_to_columns`
sends every rank the piece of its rows that falls in that rank's columns
and stacks the pieces it receives in rank order (the row blocks are in
rank order): each rank then holds every row of its columns.
:func:`columns_to_rows` is the way back. Both are one all-to-all
(:func:`alltoall`): ``P - 1`` messages out and in per rank, all posted
before any wait, so no rank waits on another's order. A piece is copied
before it is sent, so it moves as one contiguous buffer on every
transport (dask's comm, NCCL).

Built from the communicator's tagged ``isend`` / ``irecv``: messages of one
tag between two ranks arrive in the order sent, so the same tag serves
every transpose of a run.

Examples
--------
>>> import numpy as np
>>> from hpcgpu.partition.communicator import LoopbackCommunicator
>>> comm = LoopbackCommunicator()
>>> even_bounds(10, 3)
((0, 3), (3, 6), (6, 10))
>>> a = np.arange(12.0).reshape(3, 4)
>>> bool((rows_to_columns(comm, a, [(0, 4)], "t", np) == a).all())
True
"""

__all__ = ["alltoall", "columns_to_rows", "even_bounds", "rows_to_columns"]


def even_bounds(count, parts):
    """``(start, stop)`` of ``parts`` contiguous blocks of ``count`` items, sizes differing by at most one."""
    return tuple((p * count // parts, (p + 1) * count // parts) for p in range(parts))


def alltoall(comm, pieces, tag):
    """Send ``pieces[q]`` to every rank ``q``; the pieces every rank sent this one, in rank order.

    ``pieces[comm.rank]`` stays here (not copied). Every rank must call it
    with the same ``tag``.
    """
    rank, size = comm.rank, comm.size
    if len(pieces) != size:
        raise ValueError(f"alltoall needs one piece per rank ({size}); got {len(pieces)}")
    receives = {q: comm.irecv(q, tag) for q in range(size) if q != rank}
    sends = [comm.isend(pieces[q], q, tag) for q in range(size) if q != rank]
    out = [None] * size
    out[rank] = pieces[rank]
    for q, value in zip(receives, comm.waitall(list(receives.values()))):
        out[q] = value
    comm.waitall(sends)
    return out


def rows_to_columns(comm, rows, column_bounds, tag, xp):
    """This rank's columns (every row) from every rank's rows: ``column_bounds[q]`` are rank ``q``'s columns.

    ``rows`` is this rank's row block ``(rows, columns)``; the result is
    ``(all rows, this rank's columns)``, rows stacked in rank order.
    ``xp`` is the array module of the arrays (NumPy or CuPy).
    """
    pieces = [xp.ascontiguousarray(rows[:, c0:c1]) for c0, c1 in column_bounds]
    received = alltoall(comm, pieces, tag)
    return received[0] if len(received) == 1 else xp.concatenate([xp.asarray(p) for p in received], axis=0)


def columns_to_rows(comm, columns, row_bounds, tag, xp):
    """This rank's rows (every column) from every rank's columns: ``row_bounds[q]`` are rank ``q``'s rows.

    The inverse of :func:`rows_to_columns`: columns joined in rank order.
    """
    pieces = [xp.ascontiguousarray(columns[r0:r1]) for r0, r1 in row_bounds]
    received = alltoall(comm, pieces, tag)
    return received[0] if len(received) == 1 else xp.concatenate([xp.asarray(p) for p in received], axis=1)

