"""The Numba MD force kernel's fast paths: interior atoms without the minimum image, masked row tails.

``tests/kernels/test_md.py`` checks every backend against numpy on
configurations with atoms outside the box, which take the general path.
Here the atoms are wrapped into the box, as a simulation keeps them, so the
interior atoms take the loop without the minimum image, and the rows are
cut to every length around the vector block.
"""

import numpy as np
import pytest
from _support import tolerance

from hpcgpu.kernels.md import _numba, _numpy, neighbors_numba

DENSITY = 0.8442
CUTOFF = 2.5
RADIUS = 2.8


def wrapped_liquid(rng, cells, dtype):
    """A jittered fcc lattice at liquid density, every atom in [0, L); returns (positions, box)."""
    side = (4 / DENSITY) ** (1 / 3)
    basis = np.array([[0, 0, 0], [0.5, 0.5, 0], [0.5, 0, 0.5], [0, 0.5, 0.5]])
    grid = np.stack(np.meshgrid(*(np.arange(cells),) * 3, indexing="ij"), axis=-1).reshape(-1, 1, 3)
    x = ((grid + basis) * side).reshape(-1, 3).T + rng.normal(0.0, 0.08, (3, 4 * cells**3))
    length = cells * side
    x = np.mod(x, length).astype(dtype)
    x[x >= dtype.type(length)] = 0  # mod of a tiny negative number can round up to L
    x[:, 0] = 0  # atoms on the faces
    x[0, 1] = np.nextafter(dtype.type(length), dtype.type(0))
    return x, (length,) * 3


def neighbor_list(x, box, capacity=160):
    n = x.shape[1]
    neighbors = np.empty((n, capacity), np.int32)
    counts = np.empty(n, np.int32)
    assert _numba.build_neighbors(x, box, RADIUS, neighbors, counts) <= capacity
    return neighbors, counts


def per_atom(kernels, x, box, neighbors, counts):
    n, dtype = x.shape[1], x.dtype
    out = [np.empty((3, n), dtype), np.empty(n, dtype), np.empty(n, dtype), np.empty(n, np.int32)]
    kernels.forces(x, box, neighbors, counts, CUTOFF**2, 1.0, 1.0, -0.0163169, *out)
    return out


def relative(result, reference):
    reference = reference.astype(np.float64)
    return float(np.abs(result.astype(np.float64) - reference).max() / np.abs(reference).max())


def interior_atoms(x, box):
    return int(((x >= CUTOFF) & (x <= box[0] - CUTOFF)).all(axis=0).sum())


def test_interior_atoms_give_bitwise_the_general_loop(dtype, rng, monkeypatch):
    x, box = wrapped_liquid(rng, 7, dtype)
    assert 0 < interior_atoms(x, box) < x.shape[1]
    neighbors, counts = neighbor_list(x, box)
    fast = per_atom(_numba, x, box, neighbors, counts)
    monkeypatch.setattr(_numba, "_inside_box", lambda *args: False)
    general = per_atom(_numba, x, box, neighbors, counts)
    for got, expected in zip(fast, general):
        np.testing.assert_array_equal(got, expected)


def test_wrapped_atoms_match_numpy(dtype, rng):
    x, box = wrapped_liquid(rng, 7, dtype)
    assert bool(_numba._inside_box(*x, *(dtype.type(b) for b in box)))
    neighbors, counts = neighbor_list(x, box)
    for got, expected in zip(per_atom(_numba, x, box, neighbors, counts),
                             per_atom(_numpy, x, box, neighbors, counts)):
        assert relative(got, expected) <= tolerance("numba", dtype)


@pytest.mark.parametrize("wrapped", [True, False], ids=["interior-path", "general-path"])
def test_rows_of_every_length_around_the_vector_block(dtype, rng, wrapped):
    x, box = wrapped_liquid(rng, 6, dtype)
    if not wrapped:
        x[:, 2] += dtype.type(box[0])  # one atom outside the box: every atom takes the general loop
    neighbors, counts = neighbor_list(x, box)
    lanes = _numba.VECTOR_BYTES // dtype.itemsize
    assert counts.min() > 2 * lanes + 2
    # Counts 0 .. 2 lanes + 2: empty rows, rows shorter than a block, whole blocks, a block and a tail.
    counts = (np.arange(x.shape[1]) % (2 * lanes + 3)).astype(np.int32)
    fast = per_atom(_numba, x, box, neighbors, counts)
    reference = per_atom(_numpy, x, box, neighbors, counts)
    assert (fast[1][counts == 0] == 0).all() and (fast[0][:, counts == 0] == 0).all()
    for got, expected in zip(fast, reference):
        assert relative(got, expected) <= tolerance("numba", dtype)


@pytest.mark.skipif(not neighbors_numba.VECTOR_COMPRESS, reason="no AVX-512VL (or LLVM < 19): the build uses the flag loop")
def test_vector_compress_scan_matches_the_flag_loop(dtype, rng):
    n = 200
    pad = neighbors_numba.BLOCK
    xs, ys, zs = (rng.uniform(0.0, 4.0, n + pad).astype(dtype) for _ in range(3))
    order = rng.permutation(n + pad).astype(np.int32)
    centre = [dtype.type(2.0), dtype.type(1.5), dtype.type(2.5)]
    for j0, j1, self_k in ((0, 0, -1), (3, 4, 3), (5, 12, 9), (7, 64, 100), (0, n, 17), (150, n, 199)):
        rows = []
        for scan in (neighbors_numba._scan_shifted_flags, neighbors_numba._scan_shifted_compress):
            flags = np.zeros(n + pad, np.uint64)
            row = np.full(n + pad + 1, -1, np.int32)
            count = scan(xs, ys, zs, j0, j1, self_k, *centre, dtype.type(2.0), order, flags, row, 3)
            rows.append(row[3:count].tolist())
        r2 = sum((c[j0:j1].astype(np.float64) - float(v)) ** 2 for c, v in zip((xs, ys, zs), centre))
        expected = [int(order[j0 + q]) for q in np.flatnonzero(r2 < 2.0) if j0 + q != self_k]
        assert rows[0] == rows[1] == expected, (j0, j1, self_k)
