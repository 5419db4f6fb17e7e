"""Distributions and transforms of the reference: symlog, unimix categoricals, two-hot, KL.

Owns: `symlog`/`symexp`; categorical latents with 1% uniform mixing and straight-through
one-hot samples (onehot + probs - sg(probs), using the *mixed* probs); KL between categoricals;
the two-hot reward distribution over symexp-spaced bins with targets interpolated in raw space.
Everything here runs in fp32 regardless of autocast.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def symlog(x: torch.Tensor) -> torch.Tensor:
    return torch.sign(x) * torch.log1p(torch.abs(x))


def symexp(x: torch.Tensor) -> torch.Tensor:
    return torch.sign(x) * torch.expm1(torch.abs(x))


SHORT_SOFTMAX = 8  # classes up to which softmax is computed by hand on CPU without gradients


def _softmax(x: torch.Tensor) -> torch.Tensor:
    """softmax over the last axis. Without gradients on CPU and with few classes (the `debug`
    preset's 4), by hand: torch's kernel took 341 us at (1024, 8, 4) against 143 us by hand, and it
    is most of the open-loop scan's time there. With gradients (training, the corrections' fit)
    and elsewhere, torch's own, so training is unchanged."""
    if x.shape[-1] <= SHORT_SOFTMAX and x.device.type == "cpu" and not torch.is_grad_enabled():
        e = (x - x.amax(-1, keepdim=True)).exp()
        return e / e.sum(-1, keepdim=True)
    return F.softmax(x, -1)


def unimix_logits(logits: torch.Tensor, unimix: float) -> torch.Tensor:
    """Mix softmax(logits) with a uniform over the last axis; return log of the mixed probs."""
    probs = _softmax(logits.float())
    if unimix > 0:
        probs = (1.0 - unimix) * probs + unimix / probs.shape[-1]
    return torch.log(probs)


def gumbel_noise(shape, device=None) -> torch.Tensor:
    """Standard Gumbel noise; argmax(log p + g) is an exact sample from p (drawn once per scan)."""
    u = torch.rand(shape, device=device).clamp_(1e-12, 1.0 - 1e-7)
    return -torch.log(-torch.log(u))


def sample_categorical(log_probs: torch.Tensor) -> torch.Tensor:
    """One draw per row of normalised log-probs (..., C): class indices (...,), by the inverse CDF
    (one uniform per row against the cumulative probs). At (64, 64, 16, 8, 4) on one CPU thread it
    took 15 ms against torch.distributions.Categorical's 113 ms (which re-normalises the logits
    and calls multinomial); a row whose probs sum to just under 1 maps the rest to the last class."""
    u = torch.rand(log_probs.shape[:-1] + (1,), device=log_probs.device)
    below = (log_probs.exp().cumsum(-1) < u).sum(-1)  # (...,) classes whose cumulative prob is below u
    return below.clamp_max(log_probs.shape[-1] - 1)


def straight_through_sample(
    log_probs: torch.Tensor, sample: bool = True, noise: torch.Tensor | None = None
) -> torch.Tensor:
    """One-hot sample (or mode) with straight-through gradients through the mixed probs.

    log_probs: (..., S, C) log of unimixed probs; noise: optional Gumbel noise of the same shape
    (pre-drawn for a whole sequence). Returns (..., S, C) float32: onehot + probs - sg(probs).
    """
    probs = log_probs.exp()
    if sample:
        g = noise if noise is not None else gumbel_noise(log_probs.shape, log_probs.device)
        index = (log_probs.detach() + g).argmax(-1)
    else:
        index = probs.argmax(-1)
    onehot = F.one_hot(index, probs.shape[-1]).to(probs.dtype)
    if not (torch.is_grad_enabled() and probs.requires_grad):  # scoring: no gradient to pass through
        return onehot
    return onehot + probs - probs.detach()


def categorical_kl(log_p: torch.Tensor, log_q: torch.Tensor) -> torch.Tensor:
    """KL(p || q) summed over classes and latents: (..., S, C) -> (...)."""
    p = log_p.exp()
    return (p * (log_p - log_q)).sum((-1, -2))


def categorical_entropy(log_p: torch.Tensor) -> torch.Tensor:
    """Entropy summed over latents: (..., S, C) -> (...)."""
    return -(log_p.exp() * log_p).sum((-1, -2))


class TwoHot(nn.Module):
    """Two-hot distribution over `bins` = symexp(linspace(-20, 20, n)) (the reference's v2 head).

    The target is interpolated in raw space between neighbouring bins; the mean is sum(p * bins),
    summed from both ends towards the middle so that large bins do not swamp small ones. The bins
    are a non-persistent buffer: they move with the model (`.to(device)`) and are not saved in
    checkpoints (they are a function of `num_bins`).
    """

    def __init__(self, num_bins: int = 255, low: float = -20.0, high: float = 20.0, device=None):
        super().__init__()
        bins = symexp(torch.linspace(low, high, num_bins, dtype=torch.float64)).float().to(device)  # (K,)
        self.register_buffer("bins", bins, persistent=False)

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """(...,) raw values -> (..., K) two-hot weights (sum 1)."""
        x = x.float()
        bins = self.bins
        below = (bins <= x[..., None]).sum(-1) - 1  # (...,) index of the bin at or below x
        above = len(bins) - (bins > x[..., None]).sum(-1)  # (...,) index of the bin above x
        below = below.clamp(0, len(bins) - 1)
        above = above.clamp(0, len(bins) - 1)
        equal = below == above
        dist_below = torch.where(equal, torch.ones_like(x), (bins[below] - x).abs())
        dist_above = torch.where(equal, torch.ones_like(x), (bins[above] - x).abs())
        total = dist_below + dist_above
        w_below = dist_above / total
        w_above = dist_below / total
        return F.one_hot(below, len(bins)) * w_below[..., None] + F.one_hot(above, len(bins)) * w_above[..., None]

    def mean(self, logits: torch.Tensor) -> torch.Tensor:
        """(..., K) logits -> (...,) expected raw value, summed symmetrically."""
        probs = F.softmax(logits.float(), -1)
        k = probs.shape[-1]
        m = (k - 1) // 2
        p1, p2, p3 = probs[..., :m], probs[..., m : k - m], probs[..., k - m :]
        b1, b2, b3 = self.bins[:m], self.bins[m : k - m], self.bins[k - m :]
        lower = (p1 * b1).flip(-1).cumsum(-1)[..., -1] if m else 0.0
        upper = (p3 * b3).cumsum(-1)[..., -1] if m else 0.0
        return (p2 * b2).sum(-1) + lower + upper

    def log_prob(self, logits: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """Cross-entropy form: sum(twohot(x) * log_softmax(logits)) -> (...,)."""
        return (self.encode(x) * F.log_softmax(logits.float(), -1)).sum(-1)
