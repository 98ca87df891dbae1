"""attntune.kernels — every attention variant (torch SDPA backends, Triton kernels) and the registry.

Each variant module exposes ``VARIANTS``; the modules listed here are imported once and their variants
registered. A module that cannot be imported (e.g. Triton missing) is recorded in ``UNAVAILABLE`` for
``attntune doctor`` instead of failing the import of attntune.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from typing import Dict

if __name__ != "attntune.kernels":
    # This directory was imported as a top-level package named ``kernels``: the repository root is on
    # sys.path (``python -m ...`` or a script run from the root) and shadows the installed distribution
    # of that name — Hugging Face's kernel hub, which transformers >= 5.25 imports. Hand the import to the
    # installed package (searched on sys.path without the root), so that neither breaks.
    from importlib.machinery import PathFinder

    _root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    _spec = PathFinder.find_spec(__name__, [p for p in sys.path if os.path.abspath(p or os.curdir) != _root])
    if _spec is None or _spec.loader is None:
        # No other package of that name: stand in as an absent one instead of raising, because importers
        # probe optional packages by importing them — transformers' ``is_kernels_available`` imports
        # ``kernels`` unguarded and reads "no ``__version__`` and no ``__file__``" as "not installed" (an
        # exception here broke ``import transformers.modeling_utils``, measured with transformers 5.17).
        import types

        _msg = (f"{__name__!r} here is attntune's source directory {os.path.dirname(__file__)} "
                "(import it as attntune.kernels); no other package of that name is installed")
        _absent = types.ModuleType(__name__, _msg)
        _absent.__file__ = None
        _absent.__spec__ = __spec__  # importlib.util.find_spec reads it once the name is in sys.modules

        def _no_attribute(name: str, _msg: str = _msg):
            raise AttributeError(f"{_msg}: no attribute {name!r}")

        _absent.__getattr__ = _no_attribute
        sys.modules[__name__] = _absent
    else:
        _mod = importlib.util.module_from_spec(_spec)
        sys.modules[__name__] = _mod  # the import statement returns what sys.modules holds after this runs
        _spec.loader.exec_module(_mod)
else:
    from attntune.kernels import registry
    from attntune.kernels.base import Config, Param, Space, Variant
    from attntune.kernels.reference import reference_attention

    VARIANT_MODULES = (
        "attntune.kernels.eager",
        "attntune.kernels.sdpa",
        "attntune.kernels.triton_flash_variant",
        "attntune.kernels.triton_local_variant",
        "attntune.kernels.triton_decode_variant",
        "attntune.kernels.gluon_flash_variant",
        "attntune.kernels.nystrom",
        "attntune.kernels.flex",
        "attntune.kernels.fp8_dequant",
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
