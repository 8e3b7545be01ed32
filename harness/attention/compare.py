"""Error statistics of an attention output against a reference, and the
tolerance test: every element must satisfy |actual - expected| <= atol +
rtol * |expected| (as torch.testing.assert_close)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from harness.attention.tolerances import Tolerance


@dataclass(slots=True)
class ErrorStats:
    max_abs: float = 0.0
    # max |actual - expected| / |expected| over elements with |expected| > atol
    # (near zero, relative error says nothing).
    max_rel: float = 0.0
    # How far past its tolerance the worst element is: <= 1 passes.
    worst_ratio: float = 0.0
    # (token, head, dim) of the worst element; None when nothing was compared.
    worst_index: tuple[int, ...] | None = None
    num_elements: int = 0
    nonfinite: int = 0  # NaN/inf in actual where expected is finite

    def merge(self, other: ErrorStats) -> None:
        self.max_abs = max(self.max_abs, other.max_abs)
        self.max_rel = max(self.max_rel, other.max_rel)
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
                "nonfinite": self.nonfinite}


def error_stats(actual: torch.Tensor, expected: torch.Tensor, tol: Tolerance) -> ErrorStats:
    if actual.shape != expected.shape:
        raise ValueError(f"shapes differ: {tuple(actual.shape)} vs {tuple(expected.shape)}")
    if actual.numel() == 0:
        return ErrorStats()
    a = actual.detach().cpu().to(torch.float64)
    e = expected.detach().cpu().to(torch.float64)
    finite = torch.isfinite(e)
    bad = finite & ~torch.isfinite(a)
    diff = (a - e).abs().masked_fill(~finite, 0.0).nan_to_num(0.0)
    allowed = tol.atol + tol.rtol * e.abs().masked_fill(~finite, 0.0)
    # An exact match passes even a zero tolerance (0 / 0 would be NaN).
    ratio = torch.where(diff == 0, 0.0, diff / allowed)
    ratio = ratio.masked_fill(bad, float("inf"))
    worst = int(ratio.flatten().argmax())
    big = e.abs() > tol.atol
    rel = (diff[big] / e.abs()[big]).max().item() if big.any() else 0.0
    return ErrorStats(
        max_abs=diff.max().item(), max_rel=rel, worst_ratio=ratio.flatten()[worst].item(),
        worst_index=tuple(int(i) for i in torch.unravel_index(torch.tensor(worst), a.shape)),
        num_elements=a.numel(), nonfinite=int(bad.sum()),
    )
