"""The CUDA devices a local cluster's engines will see, counted before any process starts.

NCCL needs one GPU per rank: two ranks on one GPU fail inside the first collective with
NCCL's "Duplicate GPU detected", long after the engines started. A local cluster's engines
inherit this process's environment, so the count here is theirs, and ``Cluster`` decides
at construction what more engines than GPUs means: an error for ``backend="nccl"``, gloo on
CPU (said in a warning) for ``backend="auto"``.

The count asks NVML (libnvidia-ml, which ``torch.cuda.device_count()`` also asks first) and
never the CUDA runtime: this process imports no torch, and a process that initialised CUDA
must not fork ranks that use it ("Cannot re-initialize CUDA in forked subprocess").
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Mapping

from workbench import validate

__all__ = ["gpu_choice", "visible_gpu_count"]


def _nvml_device_count() -> int:
    """Physical NVIDIA GPUs by NVML; 0 where there is no NVIDIA driver."""
    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return 0
    if nvml.nvmlInit_v2() != 0:
        return 0
    count = ctypes.c_uint(0)
    try:
        ok = nvml.nvmlDeviceGetCount_v2(ctypes.byref(count)) == 0
    finally:
        nvml.nvmlShutdown()
    return int(count.value) if ok else 0


def _visible(spec: str | None, physical: int) -> int:
    """How many of ``physical`` GPUs ``CUDA_VISIBLE_DEVICES=spec`` leaves, as CUDA reads
    it: the list ends at its first entry that names no device (empty, negative, out of
    range, a repeat), so ``""`` and ``"-1"`` hide every GPU and ``"0,-1,1"`` leaves one."""
    if spec is None:
        return physical
    seen: list[str] = []
    for entry in (e.strip() for e in spec.split(",")):
        is_uuid = entry.startswith(("GPU-", "MIG-"))
        if not is_uuid and not (entry.isdigit() and int(entry) < physical):
            break
        if entry in seen:
            break
        seen.append(entry)
    return min(len(seen), physical)


def visible_gpu_count(env: Mapping[str, str] | None = None, *, physical: int | None = None) -> int:
    """The CUDA devices an engine started from this process sees (``physical``: the host's
    count, asked of NVML when not given)."""
    env = os.environ if env is None else env
    have = _nvml_device_count() if physical is None else physical
    return _visible(env.get("CUDA_VISIBLE_DEVICES"), have)


def _devices(gpus: int) -> str:
    return "no CUDA device" if gpus == 0 else f"{gpus} CUDA device" + ("s" if gpus > 1 else "")


def gpu_choice(n: int, backend: str, gpus: int) -> str | None:
    """What ``n`` local engines with ``backend`` mean on a host with ``gpus`` visible GPUs.

    Raises for ``backend="nccl"`` with fewer GPUs than engines (naming both counts); returns
    the notice to show when ``backend="auto"`` falls back to gloo on CPU although GPUs are
    there; None when nothing needs saying."""
    if gpus >= n:
        return None
    if backend == "nccl":
        raise validate.invalid(
            "backend",
            backend,
            f"n={n} local engines, but this host has {_devices(gpus)} "
            f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>')}) and "
            "NCCL needs one GPU per engine (it refuses two ranks on one GPU)",
            (f"use n <= {gpus} for NCCL, or " if gpus else "use ")
            + "backend='gloo' (CPU tensors) or backend='auto' (gloo when GPUs are too few)",
        )
    if backend == "auto" and gpus > 0:
        return (
            f"backend='auto' chose gloo on CPU: n={n} local engines, but this host has "
            f"{_devices(gpus)} and NCCL needs one GPU per engine (it refuses two ranks on one "
            f"GPU). Every rank's device is 'cpu'; n <= {gpus} gives NCCL on cuda:LOCAL_RANK"
        )
    return None
