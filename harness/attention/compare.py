"""Error statistics of an attention output against a reference, and the
tolerance test: every element must satisfy |actual - expected| <= allowed,
the per-element allowance of the error model (tolerances.py)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(slots=True)
class ErrorStats:
    max_abs: float = 0.0
    # max |actual - expected| / |expected| over elements with |expected| above
    # their allowance (near zero, relative error says nothing).
    max_rel: float = 0.0
    # How far past its allowance the worst element is: <= 1 passes.
    worst_ratio: float = 0.0
    # (token, head, dim) of the worst element; None when nothing was compared.
    worst_index: tuple[int, ...] | None = None
    num_elements: int = 0
    nonfinite: int = 0  # NaN/inf in actual where expected is finite
    # Largest |expected| seen: the scale the errors are relative to.
    max_value: float = 0.0

    def merge(self, other: ErrorStats) -> None:
        self.max_abs = max(self.max_abs, other.max_abs)
        self.max_rel = max(self.max_rel, other.max_rel)
        self.max_value = max(self.max_value, other.max_value)
        if other.worst_ratio > self.worst_ratio or self.worst_index is None:
            self.worst_ratio, self.worst_index = other.worst_ratio, other.worst_index
        self.num_elements += other.num_elements
        self.nonfinite += other.nonfinite

    @property
    def ok(self) -> bool:
        return self.nonfinite == 0 and self.worst_ratio <= 1.0

    def as_dict(self) -> dict:
        return {"max_abs": self.max_abs, "max_rel": self.max_rel,
                "worst_ratio": self.worst_ratio, "num_elements": self.num_elements,
                "nonfinite": self.nonfinite, "max_value": self.max_value}


def error_stats(actual: torch.Tensor, expected: torch.Tensor,
                allowed: torch.Tensor) -> ErrorStats:
    if actual.shape != expected.shape or allowed.shape != expected.shape:
        raise ValueError(f"shapes differ: {tuple(actual.shape)} vs {tuple(expected.shape)} "
                         f"(allowance {tuple(allowed.shape)})")
    if actual.numel() == 0:
        return ErrorStats()
    a = actual.detach().cpu().to(torch.float64)
    e = expected.detach().cpu().to(torch.float64)
    tol = allowed.detach().cpu().to(torch.float64)
    finite = torch.isfinite(e)
    bad = finite & ~torch.isfinite(a)
    diff = (a - e).abs().masked_fill(~finite, 0.0).nan_to_num(0.0)
    # An exact match passes even a zero allowance (0 / 0 would be NaN).
    ratio = torch.where(diff == 0, 0.0, diff / tol)
    ratio = ratio.masked_fill(bad, float("inf"))
    worst = int(ratio.flatten().argmax())
    big = e.abs() > tol
    rel = (diff[big] / e.abs()[big]).max().item() if big.any() else 0.0
    return ErrorStats(
        max_abs=diff.max().item(), max_rel=rel, worst_ratio=ratio.flatten()[worst].item(),
        worst_index=tuple(int(i) for i in torch.unravel_index(torch.tensor(worst), a.shape)),
        num_elements=a.numel(), nonfinite=int(bad.sum()),
        max_value=e.abs().masked_fill(~finite, 0.0).max().item(),
    )
