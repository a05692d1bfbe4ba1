"""On an engine: the software and hardware facts the cluster doctor compares across hosts.

Gathered in the same round trip as the engine's start-up facts (``boot.timed_engine_info``)
so the check costs the start nothing but this function: package versions come from the
installed metadata (no import), CUDA facts only where torch has CUDA and a device is
visible, the GPUs from NVML (``nvidia-ml-py``) and never from CUDA: initialising CUDA in a
forked engine would break every later fork, and the start has not chosen devices yet.
"""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Sequence
from importlib import metadata
from typing import Any

__all__ = ["ENV_PREFIXES", "PACKAGES", "environment_facts"]

# Always reported; the user adds more with check_packages=.
PACKAGES = ("ipyparallel", "workbench", "numpy", "transformers")
# Variables that change how collectives or threads behave.
ENV_PREFIXES = ("NCCL_", "GLOO_", "OMP_")
ENV_NAMES = ("CUDA_VISIBLE_DEVICES",)
# import name -> distribution name, where the two differ
DISTRIBUTIONS = {"workbench": "distributed-workbench"}


def _version(package: str) -> str | None:
    try:
        return metadata.version(DISTRIBUTIONS.get(package, package))
    except metadata.PackageNotFoundError:
        return None


def _torch_facts() -> dict[str, Any]:
    import torch

    facts: dict[str, Any] = {
        # str(): torch.__version__ is a TorchVersion, which the kernel could only unpickle
        # by importing torch (~1 s of its start's critical path on a 2-core machine)
        "torch": str(torch.__version__),
        "torch_git": getattr(torch.version, "git_version", None),
        "cuda": torch.version.cuda,
        "cudnn": None,
        "nccl": None,
    }
    # Only where CUDA is really there; is_available() asks NVML and does not create a context
    if torch.version.cuda is not None and torch.cuda.is_available():
        try:
            facts["cudnn"] = torch.backends.cudnn.version()
            version = torch.cuda.nccl.version()
            facts["nccl"] = ".".join(str(v) for v in version) if version else None
        except Exception as exc:  # a broken CUDA install is itself worth reporting
            facts["nccl"] = f"error: {type(exc).__name__}"
    return facts


def _gpus() -> list[dict[str, Any]]:
    """Name, memory and driver of each GPU NVML sees; [] without NVML or a driver."""
    try:
        import pynvml  # type: ignore[import-not-found]
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
    except Exception:  # no driver on this host
        return []
    try:
        driver = pynvml.nvmlSystemGetDriverVersion()
        gpus = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            name = pynvml.nvmlDeviceGetName(handle)
            gpus.append(
                {
                    "name": name.decode() if isinstance(name, bytes) else str(name),
                    "memory": int(pynvml.nvmlDeviceGetMemoryInfo(handle).total),
                    "driver": driver.decode() if isinstance(driver, bytes) else str(driver),
                }
            )
        return gpus
    except Exception:  # a partial NVML: report what the host could not tell as nothing
        return []
    finally:
        pynvml.nvmlShutdown()


def environment_facts(check_packages: Sequence[str] = ()) -> dict[str, Any]:
    """This engine's Python, torch/CUDA/NCCL, package versions, GPUs, CPUs and the
    collective-related environment variables, as plain JSON-able values."""
    names = list(dict.fromkeys([*PACKAGES, *check_packages]))
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    return {
        "python": platform.python_version(),
        "executable": sys.executable,
        **_torch_facts(),
        "packages": {name: _version(name) for name in names},
        "gpus": _gpus(),
        "cpus": cpus,
        "env": {
            k: v
            for k, v in sorted(os.environ.items())
            if k.startswith(ENV_PREFIXES) or k in ENV_NAMES
        },
    }
