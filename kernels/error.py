"""Error measures for approximate variants (Nyström): what the tuner stores beside an approximate winner."""

from __future__ import annotations

import torch


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """Relative Frobenius error ``||out - ref||_F / ||ref||_F``, computed in float64.

    ``out`` and ``ref`` must have the same shape (any dtypes/devices; ``out`` is moved to ``ref``'s
    device). A zero ``ref`` gives 0.0 when ``out`` is zero too, else ``inf``. Non-finite values in
    ``out`` give ``nan`` or ``inf`` (never a small number).

    >>> relative_error(torch.tensor([3.0, 4.0]), torch.tensor([3.0, 0.0]))
    1.3333333333333333
    """
    if out.shape != ref.shape:
        raise ValueError(f"relative_error: shapes differ, out {tuple(out.shape)} vs ref {tuple(ref.shape)}")
    r = ref.detach().to(torch.float64)
    diff = torch.linalg.vector_norm(out.detach().to(device=r.device, dtype=torch.float64) - r)
    den = torch.linalg.vector_norm(r)
    if den == 0:
        return 0.0 if diff == 0 else float("inf")
    return float(diff / den)
