"""Device and software fingerprints.

The device fingerprint is part of every tuning key: a winner measured on one chip says nothing about
another. The software fingerprint is stored with each row; a row whose fingerprint does not match the
running software is *stale* (ignored per row, listed by ``attntune doctor``).
"""

from __future__ import annotations

import functools
import os
import platform
from typing import Any, Dict, Optional

import torch
from pydantic import BaseModel, ConfigDict

from attntune._version import __version__


class DeviceFingerprint(BaseModel):
    """What the hardware is: ``arch`` (``sm_90``, ``gfx942``, ``cpu-avx512``…), name and unit count.

    ``units`` is the multiprocessor count on CUDA, the compute-unit count on ROCm and the number of
    threads torch uses on the CPU.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    backend: str  # "cuda" | "rocm" | "cpu"
    arch: str
    name: str
    units: int

    @property
    def device_type(self) -> str:
        """The torch device type (ROCm devices are ``cuda`` to torch)."""
        return "cpu" if self.backend == "cpu" else "cuda"

    def label(self) -> str:
        return f"{self.arch} {self.name} ({self.units} units)"

    def same_arch(self, other: "DeviceFingerprint") -> bool:
        """Whether ``other`` is this device or a *sibling* of it (same backend and architecture, any name or
        unit count): the devices whose rows dispatch here may read (``TuneKey.arch_family``)."""
        return (self.backend, self.arch) == (other.backend, other.arch)


class SoftwareFingerprint(BaseModel):
    """Versions that a measured speed depends on. ``variant_hash`` is the source hash of the winner."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    torch: str
    triton: Optional[str] = None
    cuda: Optional[str] = None
    hip: Optional[str] = None
    cudnn: Optional[str] = None
    attntune: str = __version__
    variant_hash: str = ""

    def stale_reasons(self, current: "SoftwareFingerprint") -> list[str]:
        """Why a row measured under ``self`` should not be trusted under ``current`` (empty = fresh).

        Patch releases of torch/triton/CUDA keep rows; a different major.minor or a changed variant
        source does not. The attntune version alone never invalidates a row.
        """
        reasons = []
        for field in ("torch", "triton", "cuda", "hip"):
            a, b = getattr(self, field), getattr(current, field)
            if _major_minor(a) != _major_minor(b):
                reasons.append(f"{field} {a} != {b}")
        if self.variant_hash != current.variant_hash:
            reasons.append("variant source changed")
        return reasons

    def same_source(self, current: "SoftwareFingerprint") -> bool:
        """True when the winner's variant source is the one running now: a row stale only by versions
        (torch, triton, CUDA) still names a correct implementation and is a useful *hint*."""
        return self.variant_hash == current.variant_hash


def _major_minor(v: Optional[str]) -> Optional[str]:
    if v is None:
        return None
    parts = v.split("+")[0].split(".")
    return ".".join(parts[:2])


# ---- device query (split out so tests can fake CUDA and ROCm devices) --------------------------------

def _query_gpu(index: int) -> Dict[str, Any]:
    props = torch.cuda.get_device_properties(index)
    return {
        "name": props.name,
        "major": props.major,
        "minor": props.minor,
        "multi_processor_count": props.multi_processor_count,
        "gcnArchName": getattr(props, "gcnArchName", ""),
        "hip": torch.version.hip,
    }


def _query_cpu() -> Dict[str, Any]:
    try:
        cap = torch.backends.cpu.get_cpu_capability()
    except Exception:  # very old torch
        cap = "default"
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    name = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {"capability": cap, "name": name, "threads": torch.get_num_threads()}


def fingerprint_from_gpu_props(p: Dict[str, Any]) -> DeviceFingerprint:
    if p.get("hip"):
        # gcnArchName looks like "gfx942:sramecc+:xnack-": the first field is the ISA.
        arch = (p.get("gcnArchName") or "gfx-unknown").split(":")[0]
        return DeviceFingerprint(backend="rocm", arch=arch, name=p["name"], units=p["multi_processor_count"])
    return DeviceFingerprint(backend="cuda", arch=f"sm_{p['major']}{p['minor']}", name=p["name"],
                             units=p["multi_processor_count"])


def fingerprint_from_cpu_info(p: Dict[str, Any]) -> DeviceFingerprint:
    cap = str(p["capability"]).lower().replace(" ", "")
    return DeviceFingerprint(backend="cpu", arch=f"cpu-{cap}", name=p["name"], units=int(p["threads"]))


@functools.lru_cache(maxsize=None)
def _device_fingerprint_cached(device_type: str, index: int) -> DeviceFingerprint:
    if device_type == "cuda":
        return fingerprint_from_gpu_props(_query_gpu(index))
    return fingerprint_from_cpu_info(_query_cpu())


def device_fingerprint(device: Optional[torch.device | str] = None) -> DeviceFingerprint:
    """Fingerprint of ``device`` (default: the current CUDA/ROCm device if any, else the CPU)."""
    if device is None:
        device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else "cpu"
    device = torch.device(device)
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return _device_fingerprint_cached("cuda", index)
    return _device_fingerprint_cached("cpu", 0)


def default_device() -> torch.device:
    """The device attntune tunes and benchmarks on when none is named (``ATTNTUNE_DEVICE`` overrides)."""
    env = os.environ.get("ATTNTUNE_DEVICE")
    if env:
        return torch.device(env)
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


@functools.lru_cache(maxsize=None)
def _base_software() -> Dict[str, Optional[str]]:
    try:
        import triton  # noqa: F401

        triton_v = triton.__version__
    except Exception:
        triton_v = None
    cudnn = None
    try:
        if torch.backends.cudnn.is_available():
            cudnn = str(torch.backends.cudnn.version())
    except Exception:
        pass
    return {
        "torch": torch.__version__.split("+")[0],
        "triton": triton_v,
        "cuda": torch.version.cuda,
        "hip": torch.version.hip,
        "cudnn": cudnn,
    }


def software_fingerprint(variant_hash: str = "", device_type: str = "cuda") -> SoftwareFingerprint:
    """The running software's fingerprint. On the CPU the GPU runtimes do not matter and are omitted."""
    base = dict(_base_software())
    if device_type == "cpu":
        # CPU variants are torch kernels: GPU runtimes and Triton (interpreter only) do not move them.
        base.update(triton=None, cuda=None, hip=None, cudnn=None)
    return SoftwareFingerprint(variant_hash=variant_hash, **base)
