"""Matrix blocks that fail or crawl on purpose, for the distributed CG's fault tests.

The workers unpickle them, so they live in an importable module (tests/ is
on the workers' path). A test swaps one partition's block for a
:class:`FaultyMatrix` by patching ``hpcgpu.linalg.cg_ranks.split`` on the
client with :func:`faulty_split`.
"""

import os
import time
from dataclasses import replace

from hpcgpu.kernels.matrix import CSRMatrix


class FaultyMatrix(CSRMatrix):
    """A CSRMatrix that sleeps ``pause`` seconds per use and raises after ``fail_after`` uses.

    ``spmv`` moves its matrix to the backend first, so every product passes
    through :meth:`to_backend` once (and the rank once more when it starts).
    Counted per copy: the copy a rank unpickled is that rank's own.
    """

    def to_backend(self, backend):
        uses = self.__dict__.get("uses", 0) + 1
        object.__setattr__(self, "uses", uses)  # a frozen dataclass: the count is private state
        time.sleep(self.__dict__["pause"])
        if uses == self.__dict__.get("stuck_at"):  # an endless kernel, until the test releases it
            until = time.monotonic() + 120
            while not os.path.exists(self.__dict__["release"]) and time.monotonic() < until:
                time.sleep(0.02)
        after = self.__dict__["fail_after"]
        if after is not None and uses > after:
            raise ValueError(f"injected failure in a CG partition after {after} uses of its matrix "
                             f"(pid {os.getpid()})")
        return super().to_backend(backend)


def faulty_split(split, partition, fail_after=None, pause=0.0, stuck_at=None, release=""):
    """``split`` (``cg_ranks.split``) with partition ``partition``'s block made a :class:`FaultyMatrix`.

    With ``stuck_at``, its ``stuck_at``-th use hangs until the file ``release`` exists.
    """

    def patched(matrix, bounds, jacobi=True):
        parts = split(matrix, bounds, jacobi)
        block = parts[partition].matrix
        faulty = FaultyMatrix(block.data, block.indices, block.indptr, block.shape)
        object.__setattr__(faulty, "fail_after", fail_after)
        object.__setattr__(faulty, "pause", pause)
        object.__setattr__(faulty, "stuck_at", stuck_at)
        object.__setattr__(faulty, "release", release)
        parts[partition] = replace(parts[partition], matrix=faulty)
        return parts

    return patched
