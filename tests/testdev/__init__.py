"""testdev: a PrivateUse1 test device whose tensors live in host memory.

    import tests.testdev as testdev      # with the repo root on sys.path
    testdev.load()                        # builds if needed, loads, names it "testdev"
    x = torch.randn(3, device="testdev")
    testdev.set_fault("aten::gelu=scale:1.01")
    ...
    testdev.fault_counts()                # {"aten::gelu": 1}
    testdev.host_waits(), testdev.launches(), testdev.memory_allocated()

See README.md in this folder. Test-only: never part of libopdump.so.
"""

from __future__ import annotations

import contextlib
import threading
import types
from collections.abc import Iterator
from pathlib import Path

import torch

NAME = "testdev"

_lock = threading.Lock()
_loaded = False


def library_path() -> Path:
    """Where build.py puts the library."""
    from . import build as _build

    return _build.LIBRARY


def _device_module() -> types.ModuleType:
    """torch.testdev: what torch asks of a PrivateUse1 backend module."""
    mod = types.ModuleType("torch." + NAME)
    mod.__doc__ = "The testdev test device (tests/testdev)."

    def _check(device=None) -> None:
        if device is None:
            return
        d = torch.device(NAME, device) if isinstance(device, int) else torch.device(device)
        if d.type != NAME or (d.index or 0) != 0:
            raise ValueError(f"testdev has a single device, {NAME}:0; got {device!r}")

    def set_device(device) -> None:
        _check(device)

    def synchronize(device=None) -> None:  # work is synchronous, but this is a host wait
        _check(device)
        torch.ops.testdev.synchronize()

    def memory_allocated(device=None) -> int:
        _check(device)
        return torch.ops.testdev.memory_stats()[0]

    def max_memory_allocated(device=None) -> int:
        _check(device)
        return torch.ops.testdev.memory_stats()[1]

    def reset_peak_memory_stats(device=None) -> None:
        _check(device)
        torch.ops.testdev.reset_peak_memory()

    # Random ops on testdev run in the CPU fallback with the CPU default
    # generator, so the device's RNG state is the CPU's.
    def manual_seed(seed: int) -> None:
        torch.default_generator.manual_seed(int(seed))

    def get_rng_state(device=NAME) -> torch.Tensor:
        _check(device)
        return torch.get_rng_state()

    def set_rng_state(new_state: torch.Tensor, device=NAME) -> None:
        _check(device)
        torch.set_rng_state(new_state)

    class device:  # torch.cuda.device's shape; one device: nothing to switch
        def __init__(self, device) -> None:
            _check(device)

        def __enter__(self):
            return self

        def __exit__(self, *exc) -> None:
            return None

    mod.device = device
    mod.is_available = lambda: True
    mod.is_initialized = lambda: True
    mod._is_in_bad_fork = lambda: False
    mod._lazy_init = lambda: None
    mod.device_count = lambda: 1
    mod.current_device = lambda: 0
    mod.set_device = set_device
    mod.synchronize = synchronize
    mod.memory_allocated = memory_allocated
    mod.max_memory_allocated = max_memory_allocated
    mod.reset_peak_memory_stats = reset_peak_memory_stats
    mod.manual_seed = manual_seed
    mod.manual_seed_all = manual_seed
    mod.seed = mod.seed_all = lambda: torch.seed()
    mod.initial_seed = lambda: torch.initial_seed()
    mod.get_rng_state = get_rng_state
    mod.set_rng_state = set_rng_state
    # torch.autocast(device_type="testdev") asks the device module which
    # dtypes it may autocast to; the casts themselves are registered in C++
    # (autocast.cpp). The CPU kernels compute both.
    mod.get_amp_supported_dtype = lambda: [torch.float16, torch.bfloat16]
    mod.is_bf16_supported = lambda including_emulation=True: True
    return mod


def load(build: bool = True) -> None:
    """Loads the testdev backend into this process (once) and names it "testdev".

    build: build (or rebuild a stale) library first, as build.py does.
    Raises ValueError when TESTDEV_FAULT, TESTDEV_SYNC_US, TESTDEV_LAUNCH_US,
    TESTDEV_DIRECT, TESTDEV_FUSED_STATS, TESTDEV_FUSED_BATCH, TESTDEV_FOREACH or
    TESTDEV_HIDE_FALLBACK (read as the library loads) is malformed,
    RuntimeError when PrivateUse1 is already taken by another backend.
    """
    global _loaded
    with _lock:
        if not _loaded:
            from . import build as _build

            with _build.locked():
                if build:
                    path = _build.build(lock=False)
                else:
                    path = library_path()
                    if not path.exists():
                        raise FileNotFoundError(
                            f"{path} is missing; build it with: python tests/testdev/build.py"
                        )
                torch.ops.load_library(str(path))
            err = torch.ops.testdev.init_error()
            if err:
                raise RuntimeError(f"testdev: {err}")
            current = torch._C._get_privateuse1_backend_name()
            if current == "privateuseone":
                torch.utils.rename_privateuse1_backend(NAME)
            elif current != NAME:
                raise RuntimeError(f"PrivateUse1 is already named {current!r} in this process")
            if not hasattr(torch, NAME):
                torch._register_device_module(NAME, _device_module())
            if not hasattr(torch.Tensor, NAME):  # Tensor.testdev(), Module.testdev(), is_testdev
                torch.utils.generate_methods_for_privateuse1_backend(
                    for_tensor=True, for_module=True, for_packed_sequence=True, for_storage=False
                )
            _loaded = True
    env_error = torch.ops.testdev.env_fault_error()
    if env_error:
        raise ValueError(f"testdev: bad TESTDEV_FAULT, no fault is active: {env_error}")
    env_error = torch.ops.testdev.env_error()
    if env_error:
        raise ValueError(f"testdev: bad environment: {env_error}")


def _ops():
    if not _loaded:
        load()
    return torch.ops.testdev


def set_fault(spec: str | None) -> None:
    """Replaces the active faults by `spec` (TESTDEV_FAULT grammar; None or "" clears).

    Counts restart at 0. A malformed spec raises ValueError and changes nothing.
    """
    _ops().set_fault(spec or "")


def fault_spec() -> str:
    """The active faults, normalised ("aten::gelu=scale:1.01"); "" when none."""
    return _ops().fault_spec()


def fault_counts() -> dict[str, int]:
    """{op: calls the fault changed} for every active fault, e.g. {"aten::gelu": 3}.

    A fault whose op never reaches the device (a composite op such as linear
    or softmax, or an op whose outputs are not floating) stays at 0.
    """
    names, counts = _ops().fault_counts()
    return dict(zip(names, counts))


def reset_fault_counts() -> None:
    """Sets every fault's count to 0 (noise/permute streams restart too)."""
    _ops().reset_fault_counts()


@contextlib.contextmanager
def fault(spec: str | None) -> Iterator[None]:
    """Activates `spec` for a block, then restores the faults active before."""
    previous = fault_spec()
    set_fault(spec)
    try:
        yield
    finally:
        set_fault(previous)


def trace(enabled: bool = True) -> None:
    """Starts (clearing them) or stops recording which ops reach the CPU
    fallback (traced_ops) and which are served by direct kernels
    (traced_direct_ops)."""
    _ops().set_trace(bool(enabled))


def traced_ops() -> dict[str, int]:
    """{"aten::gelu.out": calls, ...}: ops that reached the fallback while tracing."""
    names, counts = _ops().traced_ops()
    return dict(zip(names, counts))


def traced_direct_ops() -> dict[str, int]:
    """{"aten::sum": calls, ...}: ops served by direct kernels while tracing
    (trace() starts and clears both traces)."""
    names, counts = _ops().traced_direct_ops()
    return dict(zip(names, counts))


def direct_enabled() -> bool:
    """Whether the direct kernels are on (TESTDEV_DIRECT=0 at load turns them off)."""
    return _ops().direct_enabled()


def fused_stats_enabled() -> bool:
    """Whether testdev implements opdump::fused_stats, an observer's statistics
    in one kernel (TESTDEV_FUSED_STATS=0 at load turns it off)."""
    return _ops().fused_stats_enabled()


def fused_batch_enabled() -> bool:
    """Whether testdev implements opdump::fused_stats_batch, the statistics
    (and fingerprints and sketches) of several tensors in one kernel
    (TESTDEV_FUSED_BATCH=0 or TESTDEV_FUSED_STATS=0 at load turns it off)."""
    return _ops().fused_batch_enabled()


def fallback_hidden() -> bool:
    """Whether the fallback hides its own dispatcher calls (its copies, the CPU
    kernel's parts) from an observer (TESTDEV_HIDE_FALLBACK=1 at load)."""
    return _ops().fallback_hidden()


# ---- what the device counts (README.md, "What the device counts") -------------


def memory_allocated() -> int:
    """Bytes the device holds now: its allocations and the adopted outputs of
    direct kernels that are alive."""
    return _ops().memory_stats()[0]


def max_memory_allocated() -> int:
    """The most bytes the device held since load or reset_peak_memory_stats()."""
    return _ops().memory_stats()[1]


def reset_peak_memory_stats() -> None:
    """Sets the peak to the bytes held now."""
    _ops().reset_peak_memory()


def set_job_thread() -> None:
    """Marks the calling thread as the job's thread (for host_waits, launches)."""
    _ops().set_job_thread()


def host_waits() -> dict[str, int]:
    """Host waits for the device, by the job's thread and by the others:
    {"job": n, "other": m}."""
    job, other = _ops().host_waits()
    return {"job": job, "other": other}


def launches() -> dict[str, int]:
    """Kernel launches, by the job's thread and by the others, and (counted
    again) those an observer made: {"job": n, "other": m, "observer": k}."""
    job, other, observer = _ops().launches()
    return {"job": job, "other": other, "observer": observer}


def reset_counters() -> None:
    """Zeroes host waits, launches and capture counts (not memory)."""
    _ops().reset_counters()


def set_costs(sync_us: float | None = None, launch_us: float | None = None) -> None:
    """Microseconds of busy-waiting per host wait and per launch; None keeps
    the current value. A negative or non-finite value raises ValueError and
    changes nothing."""
    _ops().set_costs(
        None if sync_us is None else float(sync_us), None if launch_us is None else float(launch_us)
    )


def costs() -> dict[str, float]:
    """{"sync_us": ..., "launch_us": ...}."""
    sync_us, launch_us = _ops().costs()
    return {"sync_us": sync_us, "launch_us": launch_us}


@contextlib.contextmanager
def capture() -> Iterator[None]:
    """Marks a graph capture on the device's stream for a block. Inside it a
    host wait raises RuntimeError, and observer launches are counted
    (capture_counts())."""
    _ops().capture_begin()
    try:
        yield
    finally:
        _ops().capture_end()


def capturing() -> bool:
    """Whether a capture is marked."""
    return _ops().capturing()


def capture_counts() -> dict[str, int]:
    """During captures: launches by an observer, and host waits (refused):
    {"observer_launches": n, "waits": m}."""
    observer_launches, waits = _ops().capture_counts()
    return {"observer_launches": observer_launches, "waits": waits}


def call_unobserved(op: str, x: torch.Tensor) -> torch.Tensor:
    """Runs a one-tensor op ("aten::gelu") as an observer's bookkeeping would
    (TESTING_ONLY_GenericMode excluded): faults do not fire there."""
    return _ops()._call_unobserved(op, x)


__all__ = [
    "NAME",
    "call_unobserved",
    "capture",
    "capture_counts",
    "capturing",
    "costs",
    "direct_enabled",
    "fault",
    "fault_counts",
    "fault_spec",
    "fused_batch_enabled",
    "fused_stats_enabled",
    "host_waits",
    "launches",
    "library_path",
    "load",
    "max_memory_allocated",
    "memory_allocated",
    "reset_counters",
    "reset_fault_counts",
    "reset_peak_memory_stats",
    "set_costs",
    "set_fault",
    "set_job_thread",
    "trace",
    "traced_direct_ops",
    "traced_ops",
]
