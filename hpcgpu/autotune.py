"""Kernel variants chosen by measuring them on the machine that runs them.

Some CPU kernels have alternatives whose order depends on the
microarchitecture: in float64 the N-body sweep's ``1/sqrt(r2)`` is either a
bit-trick estimate refined by multiply-adds or ``sqrt`` plus a division
(1.5x faster one way on one x86 core, 1.6x the other way on another). A
kernel that has such alternatives asks :func:`choose` which to run; the
first time on a machine, :func:`choose` times every variant on a tiny input
(well under a second in all), keeps the fastest, and writes it to
``autotune.json`` beside the compiled-kernel cache
(:func:`hpcgpu._jit_cache.cache_dir`), so later processes on the same
machine read it instead of timing again.

The file is keyed by :func:`machine_key`: the CPU's model name, LLVM's name
for its microarchitecture and its feature flags, and the Numba version.
Another CPU (a cluster node of another kind sharing a home directory) or
another Numba gets its own entry and is timed afresh.

``HPCGPU_AUTOTUNE=0`` (or ``off`` / ``false`` / ``no``) skips all of it and
runs every kernel's default variant, so results are bitwise the same on
every machine with the same instruction set. :func:`use` pins one kernel's
variant inside a ``with`` block (tests, benchmarks of each variant).
``hpcgpu info`` prints :func:`choices`.

Examples
--------
>>> from hpcgpu import autotune
>>> with autotune.use("example.kernel", "b"):
...     autotune.choose("example.kernel", {"a": lambda: None, "b": lambda: None}, default="a")
'b'
"""

import contextlib
import hashlib
import json
import os
import platform
import threading
import time

from hpcgpu.errors import ConfigError

__all__ = ["AUTOTUNE_ENV", "FILE_NAME", "ROUNDS", "TUNING_S", "choices", "choose", "enabled", "forget", "machine_key", "store_path",
           "use"]

AUTOTUNE_ENV = "HPCGPU_AUTOTUNE"
"""Environment variable: ``0`` runs every kernel's default variant (no timing, no file)."""

FILE_NAME = "autotune.json"
"""The file of choices inside the compiled-kernel cache folder."""

ROUNDS = 7
"""Timed calls per variant at least; the variants take turns, and each one's fastest call
counts (the least disturbed by other processes on a shared machine)."""

TUNING_S = (0.1, 0.5)
"""Seconds of timed calls per kernel: the turns go on until the first has passed (a
thread pool's first calls, waking threads and placing them, took 20 ms where later
ones took 0.13), and stop at the second whatever the count."""

_lock = threading.RLock()
_memo = {}  # kernel -> chosen variant, this process
_pinned = {}  # kernel -> variant, set by use()
_machine = None


def enabled():
    """False when ``HPCGPU_AUTOTUNE`` is ``0``, ``off``, ``false`` or ``no`` (defaults only)."""
    return os.environ.get(AUTOTUNE_ENV, "1").strip().lower() not in ("0", "off", "false", "no")


def _cpu_model():
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as cpuinfo:
            for line in cpuinfo:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _describe_machine():
    import llvmlite.binding as llvm
    import numba

    features = llvm.get_host_cpu_features().flatten()
    return {"cpu": _cpu_model(), "llvm_cpu": llvm.get_host_cpu_name(),
            "features_sha256": hashlib.sha256(features.encode()).hexdigest()[:16], "numba": numba.__version__}


def machine_key():
    """A short hash of the CPU model, LLVM's CPU name and feature flags, and the Numba version."""
    global _machine
    if _machine is None:
        description = _describe_machine()
        text = json.dumps(description, sort_keys=True)
        _machine = (hashlib.sha256(text.encode()).hexdigest()[:20], description)
    return _machine[0]


def store_path():
    """The JSON file of choices: ``autotune.json`` in the compiled-kernel cache folder."""
    from hpcgpu._jit_cache import cache_dir

    return os.path.join(cache_dir(), FILE_NAME)


def _read_store():
    try:
        with open(store_path(), encoding="utf-8") as file:
            store = json.load(file)
    except (OSError, ValueError):
        return {}
    return store if isinstance(store, dict) else {}


def _write_choice(kernel, record):
    """Add one kernel's record to the file (read, update, atomic replace); a failure only costs a retune."""
    path = store_path()
    store = _read_store()
    key = machine_key()
    entry = store.get(key)
    if not isinstance(entry, dict) or not isinstance(entry.get("kernels"), dict):
        entry = dict(_machine[1], kernels={})
    entry["kernels"][kernel] = record
    store[key] = entry
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        temporary = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
        with open(temporary, "w", encoding="utf-8") as file:
            json.dump(store, file, indent=1, sort_keys=True)
        os.replace(temporary, path)
    except OSError:
        pass


def _time_variants(variants):
    """Fastest call of each variant, on one Numba thread: the variants differ in what one core
    does, and one thread is not held up waiting for others that lost their core."""
    import numba

    threads = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        return _time_turns(variants)
    finally:
        numba.set_num_threads(threads)


def _time_turns(variants):
    seconds = {name: float("inf") for name in variants}
    for name, run in variants.items():  # the first call of each: compiled code loaded, caches warm
        run()
    started = time.perf_counter()
    rounds = 0
    while True:
        elapsed = time.perf_counter() - started
        if elapsed > TUNING_S[1] or (rounds >= ROUNDS and elapsed > TUNING_S[0]):
            break
        rounds += 1
        for name, run in variants.items():
            start = time.perf_counter()
            run()
            seconds[name] = min(seconds[name], time.perf_counter() - start)
    return seconds


def choose(kernel, variants, *, default):
    """The variant of ``kernel`` to run on this machine: pinned, remembered, or measured now.

    Parameters
    ----------
    kernel : str
        A name that says which kernel and which case (``"nbody.direct.inverse_sqrt.float64"``).
    variants : dict of str to callable
        Each variant's name and a function running it once on a tiny input
        (milliseconds): they are timed :data:`ROUNDS` times in turns.
    default : str
        The variant run when tuning is off (``HPCGPU_AUTOTUNE=0``).

    Returns
    -------
    str
        The pinned variant (:func:`use`), else ``default`` when tuning is off,
        else the choice remembered for this machine (:func:`machine_key`),
        else the fastest variant now (then remembered in :func:`store_path`).

    Raises
    ------
    ConfigError
        ``default`` or a pinned variant is not among ``variants``.
    """
    if not _pinned:  # the common case, every kernel call: no lock
        choice = _memo.get(kernel)
        if choice is not None and enabled():
            return choice
    with _lock:
        if default not in variants:
            raise ConfigError(f"default must be one of {sorted(variants)} for {kernel}; got {default!r}")
        pinned = _pinned.get(kernel)
        if pinned is not None:
            if pinned not in variants:
                raise ConfigError(f"variant must be one of {sorted(variants)} for {kernel}; got {pinned!r}")
            return pinned
        if not enabled():
            return default
        if kernel in _memo:
            return _memo[kernel]
        # One process measures, the others wait and read its choice: workers that timed at once could
        # pick different variants, and ranks on different variants would differ in the last bits.
        with _machine_lock():
            stored = _read_store().get(machine_key(), {}).get("kernels", {}).get(kernel, {})
            choice = stored.get("choice") if isinstance(stored, dict) else None
            if choice not in variants:
                seconds = _time_variants(variants)
                choice = min(seconds, key=seconds.get)
                _write_choice(kernel, {"choice": choice, "default": default, "seconds": seconds,
                                       "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
        _memo[kernel] = choice
        return choice


@contextlib.contextmanager
def _machine_lock():
    """An exclusive lock (``flock``) on ``autotune.json.lock`` beside the file: one tuner at a time on this
    machine. Where the folder cannot be written or locked, no lock (a retune costs only time)."""
    try:
        import fcntl

        path = store_path() + ".lock"
        os.makedirs(os.path.dirname(path), exist_ok=True)
        handle = open(path, "a")  # noqa: SIM115 - closed below
    except (ImportError, OSError):
        yield
        return
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX)
        except OSError:
            pass
        yield
    finally:
        handle.close()  # closing releases the lock


def choices():
    """This machine's choices: ``{kernel: record}`` from the file and this process, plus the key.

    Returns
    -------
    dict
        ``{"enabled": bool, "machine_key": str, "machine": {...}, "file": path,
        "kernels": {kernel: {"choice", "default", "seconds", ...}}}``.
    """
    with _lock:
        key = machine_key()
        kernels = dict(_read_store().get(key, {}).get("kernels", {}))
        for kernel, choice in _memo.items():
            kernels.setdefault(kernel, {"choice": choice})
        for kernel, variant in _pinned.items():
            kernels[kernel] = dict(kernels.get(kernel, {}), choice=variant, pinned=True)
        return {"enabled": enabled(), "machine_key": key, "machine": dict(_machine[1]), "file": store_path(),
                "kernels": kernels}


@contextlib.contextmanager
def use(kernel, variant):
    """Run ``kernel``'s ``variant`` inside the ``with`` block, whatever was measured (then restore)."""
    with _lock:
        previous = _pinned.get(kernel)
        _pinned[kernel] = variant
    try:
        yield variant
    finally:
        with _lock:
            if previous is None:
                _pinned.pop(kernel, None)
            else:
                _pinned[kernel] = previous


def forget():
    """Drop this process's remembered choices (the file stays): the next :func:`choose` reads it again."""
    global _machine
    with _lock:
        _memo.clear()
        _machine = None
