"""Run a CuPy backend's CUDA C++ source on the CPU, for tests without a GPU.

The source text is compiled with g++ behind an emulation header:
``__global__`` and ``__device__`` become plain functions, ``__shared__``
becomes ``static`` (one copy per kernel instance, which one block at a time
uses), ``threadIdx``, ``blockIdx``, ``blockDim`` and ``gridDim`` become
thread-local globals, and ``rsqrtf`` / ``rsqrt`` become ``1/sqrt``.

Blocks run one after another. The threads of a block are real threads, but
only one runs at a time: thread 0 runs up to its first ``__syncthreads()``
(or its end), then thread 1, and so on; when every thread has arrived, the
barrier opens and the next phase starts again from thread 0. That order
makes the races a missing barrier would allow happen every time: without the
barrier after a tile is loaded, thread 0 reads entries that the threads
after it have not stored yet; without the one before the next load, thread 0
overwrites entries that the threads after it have not read yet. A barrier
that some threads of a block reach after others have returned (undefined in
CUDA) is reported as divergence and fails the launch.

:class:`CpuKernel` stands in for a ``cupy.RawKernel``: it packs arguments the
way CuPy does (arrays as pointers, NumPy scalars by their dtype, Python ints
as 64-bit ints, Python floats as doubles) and checks them against the
kernel's C++ parameter types. Arrays are handed over inside NaN-filled guard
zones, so a read outside an array shows up as a NaN in the result and a
write outside it as a changed guard; ``const`` arrays must come back
unchanged. Integer arrays (``int*``: int32) are guarded the same way with
:data:`INT_GUARD` (an index read outside an array is then far out of range).
"""

import ctypes
import re
import shutil
import subprocess

import numpy as np
import pytest

EMULATION_HEADER = r"""
#include <cmath>
#include <condition_variable>
#include <cstddef>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static

struct hg_dim3 { unsigned x, y, z; };
static thread_local hg_dim3 threadIdx, blockIdx;
static thread_local hg_dim3 blockDim, gridDim;

inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline double rsqrt(double x) { return 1.0 / std::sqrt(x); }

// ---- one block, its threads run phase by phase ------------------------------
enum { HG_READY, HG_WAITING, HG_DONE };

struct hg_block {
    std::mutex mutex;
    std::vector<std::condition_variable> wake;
    std::vector<int> state;
    unsigned turn = 0;      // the thread allowed to run
    bool diverged = false;  // a barrier opened while some threads had returned
};

inline hg_block* hg_running_block = nullptr;
static thread_local unsigned hg_rank;  // this thread's rank in its block

// The running thread stopped (at a barrier or at its end), lock held: pass
// the turn to the next thread of this phase, or open the barrier.
inline void hg_pass_turn(hg_block& b)
{
    const unsigned n = (unsigned)b.state.size();
    for (unsigned k = b.turn + 1; k < n; ++k) {
        if (b.state[k] == HG_READY) { b.turn = k; b.wake[k].notify_one(); return; }
    }
    bool waiting = false;
    for (unsigned k = 0; k < n; ++k) waiting = waiting || b.state[k] == HG_WAITING;
    if (!waiting) { b.turn = n; return; }
    for (unsigned k = 0; k < n; ++k) {
        if (b.state[k] == HG_DONE) b.diverged = true;
        else b.state[k] = HG_READY;
    }
    for (unsigned k = 0; k < n; ++k) {
        if (b.state[k] == HG_READY) { b.turn = k; b.wake[k].notify_one(); return; }
    }
}

inline void __syncthreads()
{
    hg_block& b = *hg_running_block;
    std::unique_lock<std::mutex> lock(b.mutex);
    b.state[hg_rank] = HG_WAITING;
    hg_pass_turn(b);
    const unsigned me = hg_rank;
    b.wake[me].wait(lock, [&] { return b.turn == me && b.state[me] == HG_READY; });
}

template<typename F>
bool hg_run_block(hg_dim3 block_index, hg_dim3 block, hg_dim3 grid, const F& body)
{
    const unsigned n = block.x * block.y * block.z;
    hg_block b;
    b.wake = std::vector<std::condition_variable>(n);
    b.state.assign(n, HG_READY);
    hg_running_block = &b;
    std::vector<std::thread> threads;
    threads.reserve(n);
    for (unsigned r = 0; r < n; ++r) {
        threads.emplace_back([&, r] {
            hg_rank = r;
            blockIdx = block_index;
            blockDim = block;
            gridDim = grid;
            threadIdx = hg_dim3{r % block.x, (r / block.x) % block.y, r / (block.x * block.y)};
            {
                std::unique_lock<std::mutex> lock(b.mutex);
                b.wake[r].wait(lock, [&] { return b.turn == r; });
            }
            body();
            std::unique_lock<std::mutex> lock(b.mutex);
            b.state[r] = HG_DONE;
            hg_pass_turn(b);
        });
    }
    for (auto& t : threads) t.join();
    hg_running_block = nullptr;
    return b.diverged;
}
"""

LAUNCHER = r"""
template<typename P> struct hg_type_name;
template<> struct hg_type_name<int> { static constexpr const char* value = "int"; };
template<> struct hg_type_name<float> { static constexpr const char* value = "float"; };
template<> struct hg_type_name<double> { static constexpr const char* value = "double"; };
template<> struct hg_type_name<float*> { static constexpr const char* value = "float*"; };
template<> struct hg_type_name<double*> { static constexpr const char* value = "double*"; };
template<> struct hg_type_name<const float*> { static constexpr const char* value = "const float*"; };
template<> struct hg_type_name<const double*> { static constexpr const char* value = "const double*"; };
template<> struct hg_type_name<int*> { static constexpr const char* value = "int*"; };
template<> struct hg_type_name<const int*> { static constexpr const char* value = "const int*"; };

// Comma-separated C++ types of a kernel's parameters.
template<typename... P>
static std::string hg_signature(void (*)(P...))
{
    std::string s;
    ((s += (s.empty() ? "" : ","), s += hg_type_name<std::remove_cv_t<P>>::value), ...);
    return s;
}

// Call a kernel with arguments packed like cuLaunchKernel's kernelParams:
// args[k] points at the value of parameter k.
template<typename... P, std::size_t... I>
static void hg_invoke(void (*kernel)(P...), void** args, std::index_sequence<I...>)
{
    kernel(*static_cast<std::remove_cv_t<P>*>(args[I])...);
}

// Runs every block; returns 1 if any block's barriers diverged.
template<typename... P>
static int hg_launch(void (*kernel)(P...), hg_dim3 grid, hg_dim3 block, void** args)
{
    bool diverged = false;
    for (unsigned bz = 0; bz < grid.z; ++bz)
    for (unsigned by = 0; by < grid.y; ++by)
    for (unsigned bx = 0; bx < grid.x; ++bx) {
        diverged = hg_run_block(hg_dim3{bx, by, bz}, block, grid,
                                [&] { hg_invoke(kernel, args, std::index_sequence_for<P...>{}); })
                   || diverged;
    }
    return diverged ? 1 : 0;
}
"""

WRAPPER = r"""
extern "C" const char* signature_{c_name}()
{{
    static const std::string s = hg_signature(&{expression});
    return s.c_str();
}}

extern "C" int launch_{c_name}(unsigned gx, unsigned gy, unsigned gz,
                               unsigned bx, unsigned by, unsigned bz, void** args)
{{
    return hg_launch(&{expression}, hg_dim3{{gx, gy, gz}}, hg_dim3{{bx, by, bz}}, args);
}}
"""

# How CuPy packs a kernel argument, as the C++ type it arrives as.
_SCALAR_TYPES = {
    np.int32: ("int", ctypes.c_int32),
    np.int64: ("long long", ctypes.c_int64),
    np.float32: ("float", ctypes.c_float),
    np.float64: ("double", ctypes.c_double),
    int: ("long long", ctypes.c_int64),
    float: ("double", ctypes.c_double),
}

_FLOAT_TYPES = {"float": np.dtype("float32"), "double": np.dtype("float64")}

INT_GUARD = np.iinfo(np.int32).min
"""What surrounds an int32 array argument (floats get NaN)."""


def _is_guard(values):
    if values.dtype.kind == "f":
        return np.isnan(values)
    return values == INT_GUARD


def c_name(expression):
    """A C identifier for a template instance: ``k<float, 4>`` -> ``k_float_4``."""
    return re.sub(r"\W+", "_", expression).strip("_")


def template_arguments(expression):
    """``"k<float, 4, true>"`` -> ``["float", "4", "true"]``."""
    return [a.strip() for a in expression[expression.index("<") + 1:-1].split(",")]


def compile_library(source, expressions, folder, name):
    """``source`` (CUDA C++) compiled for the CPU with launchers for ``expressions``."""
    compiler = shutil.which("g++")
    if compiler is None:
        pytest.skip("g++ not found: the CUDA C++ source of the cupy backend is compiled on the "
                    "CPU with g++ for this test; install g++ (e.g. apt-get install g++)")
    wrappers = "".join(WRAPPER.format(c_name=c_name(e), expression=e) for e in expressions)
    path = folder / f"{name}.cpp"
    target = folder / f"lib{name}.so"
    path.write_text(EMULATION_HEADER + source + LAUNCHER + wrappers)
    command = [compiler, "-O1", "-shared", "-fPIC", "-std=c++17", "-pthread", "-Wall", "-Werror",
               "-Wno-unknown-pragmas", "-o", str(target), str(path)]
    result = subprocess.run(command, capture_output=True, text=True)
    assert result.returncode == 0, f"g++ failed:\n{' '.join(command)}\n{result.stderr}"
    return ctypes.CDLL(str(target))


def _guarded(arg):
    """A NaN buffer three times ``arg``'s size with ``arg`` in the middle third,
    at the same address modulo 256 as ``arg``."""
    n, item = arg.size, arg.itemsize
    raw = np.empty((3 * n + 512 // item,), arg.dtype)
    shift = (arg.ctypes.data % 256 - (raw.ctypes.data + arg.nbytes) % 256) % 256
    assert shift % item == 0
    buffer = raw[shift // item:shift // item + 3 * n]
    buffer[...] = np.nan if arg.dtype.kind == "f" else INT_GUARD
    buffer[n:2 * n] = arg.ravel()
    return buffer


class CpuKernel:
    """Stands in for a ``cupy.RawKernel``: ``kernel(grid, block, args)`` on the CPU.

    The first template argument of ``expression`` is the float type every
    floating-point array argument must have; ``int*`` parameters take int32
    arrays.
    """

    def __init__(self, library, expression):
        self.expression = expression
        self.dtype = _FLOAT_TYPES[template_arguments(expression)[0]]
        name = c_name(expression)
        signature = getattr(library, f"signature_{name}")
        signature.restype = ctypes.c_char_p
        self.parameters = signature().decode().split(",")
        self.launch = getattr(library, f"launch_{name}")
        self.launch.restype = ctypes.c_int
        self.launch.argtypes = [ctypes.c_uint] * 6 + [ctypes.POINTER(ctypes.c_void_p)]
        self.launches = []

    def __call__(self, grid, block, args):
        assert len(grid) == 3 and len(block) == 3
        assert all(isinstance(n, int) and n >= 1 for n in (*grid, *block))
        assert block[0] * block[1] * block[2] <= 1024, f"block {block} has over 1024 threads"
        assert grid[0] < 2**31 and grid[1] <= 65535 and grid[2] <= 65535, f"grid {grid} too large"
        assert len(args) == len(self.parameters), (
            f"{self.expression} takes {len(self.parameters)} arguments, got {len(args)}")
        values, guarded = [], []
        for k, (arg, parameter) in enumerate(zip(args, self.parameters)):
            if isinstance(arg, np.ndarray):
                assert parameter.endswith("*"), f"argument {k}: array passed for {parameter}"
                expected = np.dtype(np.int32) if parameter in ("int*", "const int*") else self.dtype
                assert arg.dtype == expected, (
                    f"argument {k}: {arg.dtype} array for {parameter} in {self.expression}")
                assert arg.flags.c_contiguous, f"argument {k}: array is not C-contiguous"
                assert arg.size > 0, f"argument {k}: empty array (a null pointer on the GPU)"
                buffer = _guarded(arg)
                guarded.append((arg, buffer, parameter.startswith("const")))
                values.append(ctypes.c_void_p(buffer.ctypes.data + arg.nbytes))
            else:
                assert type(arg) in _SCALAR_TYPES, f"argument {k}: CuPy cannot pass {type(arg)}"
                c_type, ctype = _SCALAR_TYPES[type(arg)]
                assert c_type == parameter, (
                    f"argument {k} of {self.expression}: CuPy would pass {arg!r} as {c_type}, "
                    f"the kernel expects {parameter}")
                values.append(ctype(arg))
        pointers = (ctypes.c_void_p * len(values))(
            *(ctypes.cast(ctypes.pointer(v), ctypes.c_void_p) for v in values))
        diverged = self.launch(*grid, *block, pointers)
        assert diverged == 0, f"{self.expression}: threads of a block met different barriers"
        self.launches.append((tuple(grid), tuple(block)))
        for arg, buffer, read_only in guarded:
            n = arg.size
            assert _is_guard(buffer[:n]).all() and _is_guard(buffer[2 * n:]).all(), (
                f"{self.expression} wrote outside an array")
            if read_only:
                assert np.array_equal(buffer[n:2 * n], arg.ravel(), equal_nan=True), (
                    f"{self.expression} wrote to a const array")
            else:
                arg.ravel()[...] = buffer[n:2 * n]
