"""The reference optimiser: LaProp with adaptive gradient clipping (AGC) and linear warm-up.

Owns `LaProp`, one optimiser over all world-model parameters applying, per step:
  1. per-tensor AGC: g /= max(1, ||g|| / (clip * max(pmin, ||theta||)))         (clip 0.3, pmin 1e-3)
  2. RMS scaling: v = b2 v + (1-b2) g^2;  u = g / (sqrt(v / (1-b2^t)) + eps)     (b2 0.999, eps 1e-20)
  3. momentum on the scaled update: m = b1 m + (1-b1) u;  m_hat = m / (1-b1^t)   (b1 0.9)
  4. theta -= lr_t * m_hat with lr_t = lr * min(1, t / warmup)                    (lr 4e-5, warmup 1000)
Weight decay 0. After each step `last_stats` holds the global gradient norm (before clipping),
the update RMS and the parameter RMS, which training logs under `train/opt/*`.
Uses torch._foreach ops: the models have ~100 tensors and per-tensor Python loops would dominate
small-model step time on a CPU.
"""

from __future__ import annotations

import torch
from torch.optim import Optimizer


class LaProp(Optimizer):
    def __init__(
        self,
        params,
        lr: float = 4e-5,
        betas=(0.9, 0.999),
        eps: float = 1e-20,
        agc: float = 0.3,
        agc_pmin: float = 1e-3,
        warmup: int = 1000,
    ):
        if lr <= 0:
            raise ValueError(f"lr must be positive, got {lr}")
        if not (0 <= betas[0] < 1 and 0 <= betas[1] < 1):
            raise ValueError(f"betas must be in [0, 1), got {betas}")
        defaults = dict(lr=lr, betas=betas, eps=eps, agc=agc, agc_pmin=agc_pmin, warmup=warmup)
        super().__init__(params, defaults)
        self.last_stats: dict[str, float] = {}

    def current_lr(self, group: dict, step: int) -> float:
        warm = group["warmup"]
        return group["lr"] * (min(1.0, step / warm) if warm > 0 else 1.0)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        sq_grad, sq_update, sq_param, count = 0.0, 0.0, 0.0, 0
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            grads = [p.grad.float() for p in params]
            for p in params:
                state = self.state[p]
                if not state:
                    state["step"] = torch.zeros((), dtype=torch.float32)
                    state["exp_avg"] = torch.zeros_like(p, dtype=torch.float32)
                    state["exp_avg_sq"] = torch.zeros_like(p, dtype=torch.float32)
            states = [self.state[p] for p in params]
            step = int(states[0]["step"].item()) + 1
            for s in states:
                s["step"].fill_(step)
            b1, b2 = group["betas"]

            gnorms = torch._foreach_norm(grads)  # list of () tensors
            pnorms = torch._foreach_norm(params)
            gn = torch.stack(gnorms)
            pn = torch.stack(pnorms)
            sq_grad += float(gn.pow(2).sum())
            sq_param += float(pn.pow(2).sum())
            count += sum(p.numel() for p in params)
            # 1. AGC per tensor
            limit = group["agc"] * torch.clamp(pn, min=group["agc_pmin"])
            scale = 1.0 / torch.clamp(gn / limit, min=1.0)  # (n_tensors,)
            torch._foreach_mul_(grads, list(scale.unbind()))
            # 2. RMS scaling (bias-corrected)
            exp_avg_sq = [s["exp_avg_sq"] for s in states]
            torch._foreach_mul_(exp_avg_sq, b2)
            torch._foreach_addcmul_(exp_avg_sq, grads, grads, value=1 - b2)
            denom = torch._foreach_div(exp_avg_sq, 1 - b2**step)
            torch._foreach_sqrt_(denom)
            torch._foreach_add_(denom, group["eps"])
            updates = torch._foreach_div(grads, denom)
            # 3. momentum (bias-corrected)
            exp_avg = [s["exp_avg"] for s in states]
            torch._foreach_mul_(exp_avg, b1)
            torch._foreach_add_(exp_avg, updates, alpha=1 - b1)
            lr = self.current_lr(group, step)
            final = torch._foreach_mul(exp_avg, -lr / (1 - b1**step))
            sq_update += float(torch.stack(torch._foreach_norm(final)).pow(2).sum())
            torch._foreach_add_(params, final)
        if count:
            self.last_stats = {
                "grad_norm": sq_grad**0.5,
                "update_rms": (sq_update / count) ** 0.5,
                "param_rms": (sq_param / count) ** 0.5,
            }
        return loss
