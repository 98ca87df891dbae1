"""The environment recorded with every benchmark result (GPU, driver, library versions, date)."""

from __future__ import annotations

import datetime
import platform
import subprocess

import torch


def _driver() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None
    except (OSError, subprocess.SubprocessError):
        return None


def environment() -> dict:
    import attntune

    try:
        import triton

        triton_v = triton.__version__
    except Exception:
        triton_v = None
    env = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "triton": triton_v,
        "cuda": torch.version.cuda,
        "hip": torch.version.hip,
        "attntune": attntune.__version__,
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
    }
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        env.update(gpu=p.name, sm_count=p.multi_processor_count, capability=f"{p.major}.{p.minor}",
                   driver=_driver(), cudnn=torch.backends.cudnn.version())
    else:
        env.update(gpu=None, cpu=platform.processor() or platform.machine(), threads=torch.get_num_threads())
    return env


def bench_target(smoke: bool, shapes: dict, smoke_shapes: dict, script: str):
    """What a shape benchmark runs on: ``(shapes, device, dtype)`` — with ``smoke``, ``smoke_shapes`` in float32
    on the CPU through the Triton interpreter (set here, before Triton is imported by the run); otherwise
    ``shapes`` in bfloat16 on the GPU, or None (after saying so on stderr) where there is no CUDA GPU."""
    import os
    import sys

    if smoke:
        os.environ["TRITON_INTERPRET"] = "1"
        return smoke_shapes, "cpu", torch.float32
    if not torch.cuda.is_available():
        print(f"{script}: needs a CUDA GPU (or --smoke)", file=sys.stderr)
        return None
    return shapes, "cuda", torch.bfloat16
