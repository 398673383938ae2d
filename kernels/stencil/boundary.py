"""Boundary codes shared by every backend of the stencil family.

A 2D field on an ``(ny, nx)`` grid has one boundary kind along x and one for
each of its south (row 0) and north (row ny-1) edges:

``PERIODIC``
    wrap around (must hold on both edges of an axis);
``WALL``
    a free-slip wall: scalars and tangential velocity have zero normal
    gradient, normal velocity is zero on the wall and beyond it;
``OPEN``
    the edge of a partition with a halo: values beyond it are clamped to the
    edge; results within the stencil reach of that edge are not valid and are
    cut away by the caller. Along x it holds for both edges (the west and east
    ends of a column window whose frame continues on both sides);
``DIRICHLET``
    a fixed value (scalar kernels only: ``laplacian`` and ``diffuse``): the
    points just beyond the edge hold the boundary value. The array is then
    the interior of a node-centred grid whose boundary nodes are fixed, as
    the textbook heat equation sets it up: on ``ny`` rows the fixed nodes are
    rows -1 and ny, a spacing ``dy`` beyond the first and last row. One value
    serves every Dirichlet edge of a call (``boundary_value``).

Staggering (Arakawa C-grid, index ``[j, i]``): ``h[j, i]`` at the centre of
cell ``(i, j)``; ``u[j, i]`` on its west face; ``v[j, i]`` on its south face;
vorticity ``q[j, i]`` at its south-west corner. With a wall along x,
``u[:, 0]`` is the west wall and stays zero (the east wall is implied); with a
wall in the south, ``v[0, :]`` is the wall and stays zero.
"""

PERIODIC = 0
WALL = 1
OPEN = 2
DIRICHLET = 3

CODES = {"periodic": PERIODIC, "wall": WALL, "open": OPEN, "dirichlet": DIRICHLET}
NAMES = {code: name for name, code in CODES.items()}
