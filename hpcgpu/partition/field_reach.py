"""How far each field of a grid model is read beyond a block: per-field frame widths, from per-stage stencils.

A block's frame (:mod:`hpcgpu.partition.grid`) is as wide as the model's
``reach(K)`` on every field. On a staggered grid the fields are not read
alike: in the C-grid shallow-water model one tendency reads ``u`` two
columns west for the vortex force on ``v``... but only one column west of
``u`` itself, and ``h`` reads ``u`` one column east and none west. Chained
over the 3 K Runge-Kutta stages of K steps, what the owned cells depend on
is about half the frame on the west and south sides. A model may say so
with an optional ``field_reach(steps)``: ``{field name: (west, east, south,
north)}``, each at most its ``reach(steps)``, and covering what
``block_sums`` reads beyond the owned cells; the exchange then sends only
those cells of each field. The rest of a field's frame holds values the
step must take without failing (its results there are not used): on a CPU
the outermost cells sent, repeated (:func:`extend_edges`), on a GPU
whatever the arrays held.

:func:`compose_reach` derives the widths from what one stage reads: for
each ``(output, input)`` pair, the cells of ``input`` beyond an ``output``
cell that a stage reads, per side.

Examples
--------
>>> reads = {("u", "u"): 1, ("u", "h"): (2, 1, 1, 1), ("h", "u"): (0, 1, 0, 0), ("h", "h"): 1}
>>> compose_reach(reads, 3)
{'u': (3, 3, 3, 3), 'h': (4, 3, 3, 3)}
"""

import numpy as np

from hpcgpu.errors import ConfigError

__all__ = ["compose_reach", "extend_edges", "field_frames", "sides_of"]


def sides_of(value, what):
    """``value`` (one int, ``(x, y)`` or ``(west, east, south, north)``) as four sides; ``what`` names it in errors.

    Examples
    --------
    >>> sides_of(3, "reach"), sides_of((2, 1), "reach")
    ((3, 3, 3, 3), (2, 2, 1, 1))
    """
    if isinstance(value, (int, np.integer)):
        sides = (int(value),) * 4
    else:
        try:
            sides = tuple(int(r) for r in value)
        except (TypeError, ValueError):
            sides = ()
        if len(sides) == 2:
            sides = (sides[0], sides[0], sides[1], sides[1])
    if len(sides) != 4 or any(r < 0 for r in sides):
        raise ConfigError(f"{what} must be an int >= 0, (x, y) or (west, east, south, north); got {value!r}")
    return sides


def compose_reach(stage_reads, stages):
    """``{field: (west, east, south, north)}``: cells of each field beyond a block that ``stages`` stages read.

    ``stage_reads`` maps ``(output, input)`` to the cells of field ``input``
    beyond a cell of ``output`` that one stage reads (int, ``(x, y)`` or
    four sides); a pair that is absent is not read. A stage that keeps a
    field's own value (``x0 + b (x - x0) + c f(x)``) reads it at its own
    cell: give ``(name, name)`` at least 0. The result bounds the dependency
    cone of the owned cells along each side: the widest chain of reads
    from an owned cell back through the stages, summed side by side.

    Examples
    --------
    >>> compose_reach({("q", "q"): (1, 0, 0, 0)}, 4)
    {'q': (4, 0, 0, 0)}
    """
    reads = {pair: sides_of(value, f"stage_reads[{pair!r}]") for pair, value in stage_reads.items()}
    names = list(dict.fromkeys(name for pair in reads for name in pair))
    need = {name: (0, 0, 0, 0) for name in names}  # the owned cells, zero stages back
    for _ in range(int(stages)):
        wider = {}
        for (output, source), reach in reads.items():
            cells = tuple(a + b for a, b in zip(need[output], reach))
            wider[source] = cells if source not in wider else tuple(map(max, wider[source], cells))
        need = {name: wider.get(name, (0, 0, 0, 0)) for name in names}
    return need


def field_frames(model, steps, frame):
    """``((name, (west, east, south, north)), ...)``: the fields whose ``steps`` steps read less than ``frame``.

    From the model's optional ``field_reach(steps)``; an empty tuple
    (every field framed by ``frame``, the model's ``reach(steps)``) when it
    has none.

    Raises
    ------
    ConfigError
        A field's widths are not four ints >= 0, or wider than ``frame`` on
        some side (the arrays hold only ``frame``).
    """
    field_reach = getattr(model, "field_reach", None)
    if not callable(field_reach):
        return ()
    narrower = []
    for name, value in field_reach(steps).items():
        sides = sides_of(value, f"{type(model).__name__}.field_reach({steps})[{name!r}]")
        if any(s > f for s, f in zip(sides, frame)):
            raise ConfigError(f"{type(model).__name__}.field_reach({steps})[{name!r}] = {sides} is wider than "
                              f"reach({steps}) = {tuple(frame)} on some side; a field's frame must fit in the block's")
        if sides != tuple(frame):
            narrower.append((str(name), sides))
    return tuple(narrower)


def extend_edges(array, rows, cols):
    """Fill ``array`` outside ``array[rows, cols]`` by repeating that rectangle's edge cells (in place).

    What a frame holds beyond the cells a field's reach asks for: values
    like its neighbours', never read into an owned cell.

    Examples
    --------
    >>> a = np.zeros((4, 5)); a[1:3, 1:3] = [[1, 2], [3, 4]]
    >>> extend_edges(a, slice(1, 3), slice(1, 3))
    >>> a
    array([[1., 1., 2., 2., 2.],
           [1., 1., 2., 2., 2.],
           [3., 3., 4., 4., 4.],
           [3., 3., 4., 4., 4.]])
    """
    r0, r1 = rows.start, rows.stop
    c0, c1 = cols.start, cols.stop
    if c0 > 0:
        array[r0:r1, :c0] = array[r0:r1, c0:c0 + 1]
    if c1 < array.shape[1]:
        array[r0:r1, c1:] = array[r0:r1, c1 - 1:c1]
    if r0 > 0:
        array[:r0] = array[r0:r0 + 1]
    if r1 < array.shape[0]:
        array[r1:] = array[r1 - 1:r1]
