"""What one thread block may use on the GPUs hpcgpu runs on, and the check every launch chooser makes.

A launch that asks for more than a block may have fails only when it runs
(``CUDA_ERROR_INVALID_VALUE``, "too many resources requested for launch",
or ptxas's "uses too much shared data" at the first compile), which on a
rarely lent GPU loses the run. So every chooser of a launch configuration in
the ``cuda`` and ``cupy`` backends asks :func:`check` first, with the static
shared memory its kernel declares for that configuration, and refuses with a
:class:`~hpcgpu.errors.ConfigError` instead.

The limits are those of every GPU since compute capability 7.0 (V100, A100,
H100, H200): 1024 threads per block; 48 KiB of *static* shared memory per
block (``cuda.shared.array`` / ``__shared__``; more needs dynamic shared
memory and an opt-in attribute, which no hpcgpu kernel uses); 65536 32-bit
registers per block, allocated per warp in units of 256. A chooser knows
its kernel's shared memory but not its register count, which only the
compiler knows: ``scripts/compile_table.py`` (run in CI by
``tests/kernels/test_compile_sm90.py``) compiles every configuration the
choosers can pick for sm_90 and checks the real register counts and shared
bytes against these limits. ptxas gives a thread at most 255 registers, so
a block of at most 256 threads fits the register file whatever the kernel
compiles to.
"""

from hpcgpu.errors import ConfigError

__all__ = ["MAX_THREADS_PER_BLOCK", "MAX_STATIC_SHARED_BYTES", "REGISTERS_PER_BLOCK",
           "MAX_REGISTERS_PER_THREAD", "block_registers", "problems", "check"]

MAX_THREADS_PER_BLOCK = 1024
"""Threads per block (compute capability >= 2.0)."""

MAX_STATIC_SHARED_BYTES = 48 * 1024
"""Static shared memory per block: 0xc000 bytes, ptxas's limit."""

REGISTERS_PER_BLOCK = 64 * 1024
"""32-bit registers one block may hold (compute capability >= 7.0; the whole register file of an SM)."""

MAX_REGISTERS_PER_THREAD = 255
"""The most registers ptxas gives one thread."""

WARP = 32
"""Threads per warp."""

REGISTER_ALLOCATION_UNIT = 256
"""Registers are handed to a warp in multiples of this."""


def block_registers(threads, registers):
    """Registers a block of ``threads`` threads of ``registers`` each takes from the register file.

    Examples
    --------
    >>> block_registers(256, 255), block_registers(128, 40)
    (65536, 5120)
    """
    warps = -(-threads // WARP)
    per_warp = -(-registers * WARP // REGISTER_ALLOCATION_UNIT) * REGISTER_ALLOCATION_UNIT
    return warps * per_warp


def problems(threads, shared_bytes=0, registers=None):
    """What a block of ``threads`` threads with ``shared_bytes`` of static shared memory
    and ``registers`` per thread (None: unknown, not checked) exceeds; empty if nothing.

    Examples
    --------
    >>> problems(256, 9 * 3 * 256 * 8)
    ['55296 B of static shared memory (at most 49152)']
    >>> problems(512, registers=128), problems(512, registers=129)[0][:35]
    ([], '512 threads x 129 registers = 69632')
    """
    found = []
    if not 1 <= threads <= MAX_THREADS_PER_BLOCK:
        found.append(f"{threads} threads per block (1 to {MAX_THREADS_PER_BLOCK})")
    if shared_bytes > MAX_STATIC_SHARED_BYTES:
        found.append(f"{shared_bytes} B of static shared memory (at most {MAX_STATIC_SHARED_BYTES})")
    if registers is not None and threads >= 1 and block_registers(threads, registers) > REGISTERS_PER_BLOCK:
        found.append(f"{threads} threads x {registers} registers = {block_registers(threads, registers)} "
                     f"registers per block (at most {REGISTERS_PER_BLOCK}; at most 256 threads fit "
                     "whatever the register count)")
    return found


def check(kernel, launch, threads, shared_bytes=0, registers=None):
    """Raise :class:`ConfigError` naming ``kernel`` and ``launch`` if the block does not fit.

    Raises
    ------
    ConfigError
        ``threads`` outside 1..1024, more than 48 KiB of static shared memory,
        or (with ``registers`` known) more registers than a block may hold.
    """
    found = problems(threads, shared_bytes, registers)
    if found:
        raise ConfigError(f"{kernel}: launch={launch!r} does not fit a thread block: needs "
                          f"{'; '.join(found)}. Choose fewer threads, rows or steps per block")
