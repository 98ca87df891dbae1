"""attntune.kernels — every attention variant (torch SDPA backends, Triton kernels) and the registry.

Each variant module exposes ``VARIANTS``; the modules listed here are imported once and their variants
registered. A module that cannot be imported (e.g. Triton missing) is recorded in ``UNAVAILABLE`` for
``attntune doctor`` instead of failing the import of attntune.
"""

from __future__ import annotations

import importlib
from typing import Dict

from attntune.kernels import registry
from attntune.kernels.base import Config, Param, Space, Variant
from attntune.kernels.reference import reference_attention

VARIANT_MODULES = (
    "attntune.kernels.eager",
    "attntune.kernels.sdpa",
    "attntune.kernels.triton_flash_variant",
    "attntune.kernels.triton_local_variant",
    "attntune.kernels.triton_decode_variant",
    "attntune.kernels.nystrom",
    "attntune.kernels.flex",
)

UNAVAILABLE: Dict[str, str] = {}


def _load() -> None:
    for mod in VARIANT_MODULES:
        try:
            m = importlib.import_module(mod)
        except Exception as e:  # noqa: BLE001 — an optional backend must not break the package
            UNAVAILABLE[mod] = f"{type(e).__name__}: {e}"
            continue
        for v in m.VARIANTS:
            registry.register(v)


_load()

__all__ = ["registry", "Config", "Param", "Space", "Variant", "reference_attention", "UNAVAILABLE"]
