"""The collective algorithms of the communicator: O(log P) rounds for any number of ranks P.

Each algorithm is written once, on one rank, against a single primitive,
``step(sends, sources)``: one *round*, in which the rank posts a receive
from every rank of ``sources`` and sends each ``(dest, obj)`` of ``sends``,
then waits for the receives and returns what they brought, in the order of
``sources``. :class:`~hpcgpu.partition.communicator.Communicator` provides
it over its point-to-point messages (one tag per collective call, one
deadline per call); the tests drive the same functions over an in-process
group of threads. In every algorithm here, no two messages of one call go
from one rank to the same other rank, so a call's messages need no round
number to be told apart.

The algorithms, and the rounds a rank takes part in:

- :func:`allreduce_recursive_doubling`: fold into the largest power of
  two ``P2 <= P``, recursive doubling, unfold. ``log2 P`` rounds when P is
  a power of two, else at most ``floor(log2 P) + 2`` (the fold and the
  unfold); at most ``ceil(log2 P)`` messages sent per rank;
- :func:`allgather_bruck`: Bruck's concatenation, ``ceil(log2 P)`` rounds;
- :func:`barrier_dissemination`: ``ceil(log2 P)`` rounds;
- :func:`bcast_binomial`: a binomial tree from any root; a rank receives
  once and sends to at most ``ceil(log2 P)`` children;
- :func:`gather_binomial`: a binomial tree to any root; a rank receives
  from its children at once and sends once.

The allreduce gives every rank the same result bitwise: in each round the
two partners combine *(the lower ranks' partial, the higher ranks'
partial)* in that order, so both compute the same value from the same
operands. The result is the values in rank order, bracketed as a fixed
tree: :func:`tree_reduce` computes it from the list of values (what a
transport that gathers the values first must use to agree bitwise).

:func:`payload_nbytes` is what the communicator's counters add per message.

Examples
--------
>>> tree_reduce(["a", "b", "c", "d", "e"], lambda x, y: f"({x}{y})")
'(((ab)c)(de))'
>>> def alone(sends, sources):  # a group of one never communicates
...     raise AssertionError
>>> allgather_bruck(0, 1, "x", alone), allreduce_recursive_doubling(0, 1, 2.5, max, alone)
(['x'], 2.5)
"""

import dataclasses

import numpy as np

__all__ = ["allgather_bruck", "allreduce_recursive_doubling", "barrier_dissemination", "bcast_binomial",
           "gather_binomial", "payload_nbytes", "tree_reduce"]

_NO_PAYLOAD = (type(None), bool, int, float, complex, str)
_FIELD_NAMES = {}  # type -> the names of its dataclass fields (empty: not a dataclass)


def _fold(size):
    """``(P2, extra)``: the largest power of two ``P2 <= size`` and ``extra = size - P2``."""
    p2 = 1 << (size.bit_length() - 1)
    return p2, size - p2


def tree_reduce(values, combine):
    """``values`` combined in the order :func:`allreduce_recursive_doubling` uses: bitwise its result.

    The first ``2 * extra`` values (``extra = P - P2``, ``P2`` the largest
    power of two ``<= P``) are first combined in pairs ``(v0, v1), (v2,
    v3), ...``; the ``P2`` partials that result, and the remaining values,
    are then combined as a balanced binary tree, neighbours first.

    Parameters
    ----------
    values : sequence
        One value per rank, in rank order (at least one).
    combine : callable
        ``combine(lower, higher)``, e.g. one of
        :data:`hpcgpu.partition.communicator.REDUCTIONS`.

    Examples
    --------
    >>> tree_reduce([1, 2, 3], lambda a, b: (a, b))
    ((1, 2), 3)
    """
    values = list(values)
    p2, extra = _fold(len(values))
    blocks = [combine(values[2 * j], values[2 * j + 1]) for j in range(extra)] + values[2 * extra:]
    while len(blocks) > 1:
        blocks = [combine(blocks[2 * i], blocks[2 * i + 1]) for i in range(len(blocks) // 2)]
    return blocks[0]


def allreduce_recursive_doubling(rank, size, value, combine, step):
    """``value`` of every rank combined as :func:`tree_reduce` does, on every rank.

    With ``extra = size - P2`` ranks beyond the largest power of two, the
    ranks ``0 .. 2 * extra - 1`` first fold in pairs: each even rank sends its
    value to the odd rank after it, which carries ``combine(even, odd)``
    into the ``P2`` ranks of the recursive doubling and sends the result
    back at the end. In round ``k`` of the doubling the partners ``j`` and
    ``j ^ 2**k`` (ranks renumbered ``0 .. P2 - 1``) exchange partials and
    both combine (lower, higher).

    Parameters
    ----------
    rank, size : int
    value : object
        This rank's value (combine() must not change its operands).
    combine : callable
        ``combine(lower, higher)``.
    step : callable
        The round primitive (module doc).

    Examples
    --------
    >>> allreduce_recursive_doubling(0, 1, 4, lambda a, b: a + b, None)
    4
    """
    p2, extra = _fold(size)
    if rank < 2 * extra:
        if rank % 2 == 0:
            # its value goes to the odd rank after it; the result comes back from there at the end
            (result,) = step([(rank + 1, value)], [rank + 1])
            return result
        (lower,) = step([], [rank - 1])
        partial = combine(lower, value)
        renumbered = rank // 2
    else:
        partial = value
        renumbered = rank - extra
    mask = 1
    while mask < p2:
        other = renumbered ^ mask
        partner = 2 * other + 1 if other < extra else other + extra
        (received,) = step([(partner, partial)], [partner])
        partial = combine(partial, received) if renumbered < other else combine(received, partial)
        mask <<= 1
    if rank < 2 * extra:
        step([(rank - 1, partial)], [])
    return partial


def allgather_bruck(rank, size, value, step):
    """Every rank's ``value`` in rank order, in ``ceil(log2 size)`` rounds (Bruck et al., 1997).

    In round ``k`` (``d = 2**k``) a rank sends the first ``min(d, size - d)``
    values it holds, its own first, to rank ``rank - d`` and receives as
    many from rank ``rank + d`` (modulo ``size``): after the last round it
    holds the values of ranks ``rank, rank + 1, ...``, which are rotated
    into rank order. Each rank sends ``size - 1`` values in all.

    Examples
    --------
    >>> allgather_bruck(0, 1, "x", None)
    ['x']
    """
    held = [value]  # held[i] is the value of rank (rank + i) % size
    distance = 1
    while distance < size:
        count = min(distance, size - distance)
        (received,) = step([((rank - distance) % size, held[:count])], [(rank + distance) % size])
        held.extend(received)
        distance *= 2
    return [held[(r - rank) % size] for r in range(size)]


def barrier_dissemination(rank, size, step):
    """Return once every rank has called it: ``ceil(log2 size)`` rounds (Hensgen, Finkel and Manber, 1988).

    In round ``k`` a rank signals rank ``rank + 2**k`` and waits for rank
    ``rank - 2**k``: after the last round, every rank has heard from every
    other one, directly or through others.
    """
    distance = 1
    while distance < size:
        step([((rank + distance) % size, None)], [(rank - distance) % size])
        distance *= 2


def bcast_binomial(rank, size, value, root, step):
    """``root``'s ``value`` on every rank, down a binomial tree rooted at ``root``.

    Renumbered ``r = (rank - root) % size``, a rank receives from ``r``
    minus its lowest set bit and sends to ``r + 2**j`` for the powers of
    two below that bit (the largest subtree first): ``ceil(log2 size)``
    levels, ``size - 1`` messages in all.

    Examples
    --------
    >>> bcast_binomial(0, 1, "v", 0, None)
    'v'
    """
    relative = (rank - root) % size
    mask = 1
    while mask < size:
        if relative & mask:
            (value,) = step([], [(rank - mask) % size])
            break
        mask <<= 1
    mask >>= 1
    children = []
    while mask > 0:
        if relative + mask < size:
            children.append(((rank + mask) % size, value))
        mask >>= 1
    if children:
        step(children, [])
    return value


def gather_binomial(rank, size, value, root, step):
    """Every rank's ``value`` in rank order on ``root`` (None elsewhere), up a binomial tree.

    A rank (renumbered ``r = (rank - root) % size``) receives the values
    of its subtrees, ranks ``r + 1 ..`` in order, and sends them with its own
    to its parent in one message: every rank but the root sends once.

    Examples
    --------
    >>> gather_binomial(0, 1, "v", 0, None)
    ['v']
    """
    relative = (rank - root) % size
    held = [value]  # the values of ranks relative, relative + 1, ... (renumbered)
    children, parent = [], None
    mask = 1
    while mask < size:
        if relative & mask:
            parent = (rank - mask) % size
            break
        if relative + mask < size:
            children.append((rank + mask) % size)
        mask <<= 1
    if children:
        for part in step([], children):
            held.extend(part)
    if parent is not None:
        step([(parent, held)], [])
        return None
    return [held[(r - root) % size] for r in range(size)]


def payload_nbytes(obj):
    """The bytes of the arrays in ``obj``: what a message's counters add, without pickling it.

    Sums ``nbytes`` of the NumPy and CuPy arrays, NumPy scalars and
    memoryviews (anything with an integer ``nbytes``), and the length of
    ``bytes``, found in ``obj`` and, recursively, in the items of its
    tuples and lists, the values of its dicts and the fields of its
    dataclasses. Python numbers, strings and other objects count 0.

    Examples
    --------
    >>> payload_nbytes(("halo", np.zeros(4), {"u": np.zeros((2, 2), np.float32)}, 1.5))
    48
    """
    if isinstance(obj, np.ndarray):
        return obj.nbytes
    if isinstance(obj, _NO_PAYLOAD):
        return 0
    if isinstance(obj, (tuple, list)):
        return sum(payload_nbytes(item) for item in obj)
    if isinstance(obj, dict):
        return sum(payload_nbytes(item) for item in obj.values())
    if isinstance(obj, (bytes, bytearray)):
        return len(obj)
    nbytes = getattr(obj, "nbytes", None)
    if isinstance(nbytes, (int, np.integer)) and not isinstance(nbytes, bool):
        return int(nbytes)
    kind = type(obj)
    names = _FIELD_NAMES.get(kind)
    if names is None:  # once per type: dataclasses.fields() is the slow part of a walk
        names = _FIELD_NAMES[kind] = tuple(f.name for f in dataclasses.fields(obj)) \
            if dataclasses.is_dataclass(obj) and not isinstance(obj, type) else ()
    return sum(payload_nbytes(getattr(obj, name)) for name in names)
