"""The recurrent state-space model (RSSM) of DreamerV3, with an ensemble of prior heads.

Owns the latent dynamics: the block-GRU core, the posterior (obs step) and the K prior heads
(img step), the is_first reset of state *and* previous control, and the scans `observe` and
`imagine`. Knows nothing of observations beyond the encoder's tokens.

State (an explicit carry): `deter` h (B, deter) and `stoch` z (B, S, C) one-hot. Step t of a
sequence holds obs_t and the previous control u_{t-1} = concat(a_{t-1}, e_{t-1}); the core maps
(h_{t-1}, z_{t-1}, u_{t-1}) -> h_t, the posterior q(z_t | h_t, x_t), each prior head p_k(z_t | h_t).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from einops import rearrange, repeat
from torch import nn

from wmcheck.worldmodel.config import WorldModelConfig
from wmcheck.worldmodel.distributions import gumbel_noise, straight_through_sample, unimix_logits
from wmcheck.worldmodel.layers import MLP, BlockLinear, Linear, NormAct, RMSNorm


@dataclass
class State:
    """Latent state; leading dims are (B,) for a carry or (B, T) for a sequence."""

    deter: torch.Tensor  # (..., deter)
    stoch: torch.Tensor  # (..., S, C) one-hot (straight-through)

    def feat(self) -> torch.Tensor:
        """Heads read concat(h, flatten(z)): (..., deter + S*C)."""
        return torch.cat([self.deter, self.stoch.flatten(-2)], -1)

    def index(self, *idx) -> State:
        return State(self.deter[idx], self.stoch[idx])

    def detach(self) -> State:
        return State(self.deter.detach(), self.stoch.detach())


@dataclass
class Observed:
    """What `observe` returns per step: posterior states and both distributions' log-probs."""

    state: State  # (B, T, ...)
    post_logp: torch.Tensor  # (B, T, S, C) log of unimixed posterior probs
    prior_logp: torch.Tensor  # (B, T, K, S, C) log of unimixed probs of each prior head


class RSSM(nn.Module):
    def __init__(self, cfg: WorldModelConfig, token_dim: int):
        super().__init__()
        self.cfg = cfg
        c = cfg
        # Core input projections: h, flat z and the control each get Linear -> RMSNorm -> SiLU.
        self.dynin_deter = NormAct(c.deter, c.hidden)
        self.dynin_stoch = NormAct(c.stoch * c.classes, c.hidden)
        self.dynin_ctrl = NormAct(max(c.control_dim, 1), c.hidden)
        block_in = c.deter + c.blocks * 3 * c.hidden  # each block sees its h slice + all 3 projections
        layers = []
        for i in range(c.dyn_layers):
            layers += [BlockLinear(block_in if i == 0 else c.deter, c.deter, c.blocks), RMSNorm(c.deter), nn.SiLU()]
        self.dynhid = nn.Sequential(*layers)
        self.gates = BlockLinear(c.deter if c.dyn_layers else block_in, 3 * c.deter, c.blocks)
        # Posterior: concat(h, tokens) -> obs_layers x [Linear+Norm+SiLU] -> logits. Does not see the prior.
        self.obs_net = MLP(c.deter + token_dim, c.hidden, c.obs_layers)
        self.obs_logit = Linear(self.obs_net.out_features, c.stoch * c.classes)
        # K prior heads: h -> img_layers x [Linear+Norm+SiLU] -> logits.
        self.img_nets = nn.ModuleList([MLP(c.deter, c.hidden, c.img_layers) for _ in range(c.ensemble)])
        self.img_logits = nn.ModuleList([Linear(c.hidden, c.stoch * c.classes) for _ in range(c.ensemble)])

    # ------------------------------------------------------------------ state
    def initial(self, batch_size: int, device=None) -> State:
        """Zeros for h and z (the reference has no learned initial state)."""
        c = self.cfg
        device = device or next(self.parameters()).device
        return State(
            torch.zeros(batch_size, c.deter, device=device),
            torch.zeros(batch_size, c.stoch, c.classes, device=device),
        )

    def _logp(self, flat_logits: torch.Tensor) -> torch.Tensor:
        logits = rearrange(flat_logits, "... (s c) -> ... s c", s=self.cfg.stoch)  # (..., S, C)
        return unimix_logits(logits, self.cfg.unimix)

    # ------------------------------------------------------------------ core
    def core(self, state: State, ctrl: torch.Tensor, w: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
        """Block GRU: (h_{t-1}, z_{t-1}, u_{t-1}) -> h_t. ctrl (B, U). `cfg.fused_core` selects the
        optimised rewrite (`core_fused`, same numbers) over the reference formulation."""
        if self.cfg.fused_core:
            return self.core_fused(state, ctrl, w)
        return self.core_reference(state, ctrl)

    def _squash(self, ctrl: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        c = self.cfg
        if c.control_dim == 0:
            ctrl = torch.zeros(like.shape[0], 1, device=like.device, dtype=like.dtype)
        ctrl = ctrl / c.action_scale
        return ctrl / torch.clamp(ctrl.abs(), min=1.0).detach()  # reference squash (see config.action_scale)

    def core_reference(self, state: State, ctrl: torch.Tensor) -> torch.Tensor:
        """The block GRU as in DreamerV3's rssm.py, read top to bottom.

        Three projections (h, flat z, control), each Linear -> RMSNorm -> SiLU, are concatenated and
        broadcast to the G blocks; block g sees [h_g, x]; block-diagonal layers map that to the
        per-block gates [reset, candidate, update]; the update gate is biased by -1.
        """
        c = self.cfg
        G = c.blocks
        deter, stoch = state.deter, state.stoch.flatten(-2)  # (B, deter), (B, S*C)
        u = self._squash(ctrl, deter)  # (B, U)
        x = torch.cat([self.dynin_deter(deter), self.dynin_stoch(stoch), self.dynin_ctrl(u)], -1)  # (B, 3*hidden)
        x = repeat(x, "b f -> b g f", g=G)  # (B, G, 3*hidden): every block sees all projections
        h_g = rearrange(deter, "b (g d) -> b g d", g=G)  # (B, G, deter/G)
        y = rearrange(torch.cat([h_g, x], -1), "b g f -> b (g f)")  # (B, G * (deter/G + 3*hidden))
        y = self.dynhid(y)  # (B, deter) BlockLinear -> RMSNorm -> SiLU, dyn_layers times
        gates = rearrange(self.gates(y), "b (g f) -> b g f", g=G)  # (B, G, 3 * deter/G)
        reset, cand, update = (rearrange(p, "b g d -> b (g d)") for p in gates.chunk(3, -1))  # (B, deter) each
        reset = torch.sigmoid(reset)
        cand = torch.tanh(reset * cand)
        update = torch.sigmoid(update - 1.0)
        return update * cand + (1.0 - update) * deter  # (B, deter)

    def core_weights(self) -> dict[str, torch.Tensor]:
        """Per-scan views of the core's weights, built once per `observe`/`imagine` call.

        The three input projections (h, z, control) are separate Linear layers as in the reference;
        applied as one matmul with a block-diagonal weight they cost one kernel instead of three.
        The first block layer reads [h_g, x] per group g, where x (the three projections) is the
        same for every group: we split its weight into an h part (block-diagonal, bmm) and an x
        part (one dense matmul) instead of materialising x repeated G times. Both are exact
        rewrites of the reference's computation (tests/test_worldmodel.py checks this).
        """
        c = self.cfg
        lins = (self.dynin_deter[0], self.dynin_stoch[0], self.dynin_ctrl[0])
        d = c.deter // c.blocks
        w = {
            "in_w": torch.block_diag(*(lin.weight for lin in lins)),  # (3*hidden, deter + S*C + U)
            "in_b": torch.cat([lin.bias for lin in lins]),  # (3*hidden,)
            "in_scale": torch.stack(
                [m[1].scale for m in (self.dynin_deter, self.dynin_stoch, self.dynin_ctrl)]
            ),  # (3, hidden)
        }
        if c.dyn_layers:
            first = self.dynhid[0]
            w["hid_wh"] = first.weight[:, :d]  # (G, d, deter/G)
            w["hid_wx"] = rearrange(first.weight[:, d:], "g i o -> i (g o)")  # (3*hidden, deter)
        return w

    def core_fused(self, state: State, ctrl: torch.Tensor, w: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
        """`core_reference` rewritten for speed (see `core_weights`); tests/test_worldmodel.py ties them."""
        c = self.cfg
        w = w if w is not None else self.core_weights()
        deter, stoch = state.deter, state.stoch.flatten(-2)  # (B, deter), (B, S*C)
        B, G = deter.shape[0], c.blocks
        ctrl = self._squash(ctrl, deter)
        x = F.linear(torch.cat([deter, stoch, ctrl], -1), w["in_w"], w["in_b"])  # (B, 3*hidden)
        x = F.rms_norm(x.float().view(B, 3, c.hidden), (c.hidden,), eps=self.dynin_deter[1].eps)  # (B, 3, hidden)
        x = F.silu(x * w["in_scale"]).reshape(B, 3 * c.hidden).to(deter.dtype)  # (B, 3*hidden)
        h_g = deter.view(B, G, -1).transpose(0, 1)  # (G, B, d)
        if c.dyn_layers:
            first = self.dynhid[0]
            y = torch.bmm(h_g, w["hid_wh"]).transpose(0, 1).reshape(B, c.deter)  # (B, deter)
            y = torch.addmm(y + first.bias, x, w["hid_wx"])  # (B, deter)
            y = self.dynhid[2](self.dynhid[1](y))  # RMSNorm, SiLU
            for i in range(1, c.dyn_layers):
                y = self.dynhid[3 * i + 2](self.dynhid[3 * i + 1](self.dynhid[3 * i](y)))
        else:
            y = rearrange(torch.cat([h_g.transpose(0, 1), x[:, None].expand(B, G, -1)], -1), "b g f -> b (g f)")
        gates = torch.bmm(y.view(B, G, -1).transpose(0, 1), self.gates.weight)  # (G, B, 3*d)
        gates = gates + self.gates.bias.view(G, 1, -1)
        reset, cand, update = gates.chunk(3, -1)  # (G, B, d) each: per block [reset, cand, update]
        reset = torch.sigmoid(reset)
        cand = torch.tanh(reset * cand)
        update = torch.sigmoid(update - 1.0)
        h_new = update * cand + (1.0 - update) * h_g  # (G, B, d)
        return h_new.transpose(0, 1).reshape(B, c.deter)  # (B, deter)

    def prior_logp(self, deter: torch.Tensor, head: int | None = None) -> torch.Tensor:
        """Prior log-probs of every head (..., K, S, C), or of one head (..., S, C)."""
        if head is not None:
            return self._logp(self.img_logits[head](self.img_nets[head](deter)))
        return torch.stack([self._logp(lin(net(deter))) for net, lin in zip(self.img_nets, self.img_logits)], -3)

    def post_logp(self, deter: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        return self._logp(self.obs_logit(self.obs_net(torch.cat([deter, tokens], -1))))

    @staticmethod
    def reset(state: State, ctrl: torch.Tensor, is_first: torch.Tensor) -> tuple[State, torch.Tensor]:
        """Zero h, z *and the previous control* where is_first (B,) is set."""
        keep = (~is_first).to(state.deter.dtype)  # (B,)
        return State(state.deter * keep[:, None], state.stoch * keep[:, None, None]), ctrl * keep[:, None]

    # ------------------------------------------------------------------ scans
    def observe(
        self,
        tokens: torch.Tensor,  # (B, T, F) encoder output
        ctrl: torch.Tensor,  # (B, T, U) previous control u_{t-1}
        is_first: torch.Tensor,  # (B, T) bool
        state: State | None = None,
        sample: bool = True,
    ) -> tuple[Observed, State]:
        """Filter a sequence into posterior states; returns per-step results and the last carry."""
        B, T = tokens.shape[:2]
        assert ctrl.shape[:2] == (B, T) and is_first.shape == (B, T), (
            f"observe: tokens {tuple(tokens.shape)}, ctrl {tuple(ctrl.shape)}, is_first {tuple(is_first.shape)}"
        )
        state = state if state is not None else self.initial(B, tokens.device)
        w = self.core_weights() if self.cfg.fused_core else None
        noise = gumbel_noise((B, T, self.cfg.stoch, self.cfg.classes), tokens.device) if sample else None
        deters, stochs, posts = [], [], []
        for t in range(T):
            state, u = self.reset(state, ctrl[:, t], is_first[:, t])
            deter = self.core(state, u, w)  # (B, deter)
            logp = self.post_logp(deter, tokens[:, t])  # (B, S, C)
            state = State(deter, straight_through_sample(logp, sample, None if noise is None else noise[:, t]))
            deters.append(deter)
            stochs.append(state.stoch)
            posts.append(logp)
        deter_seq = torch.stack(deters, 1)  # (B, T, deter)
        seq = State(deter_seq, torch.stack(stochs, 1))  # (B, T, ...)
        # Priors are a function of h_t only, so all heads run once over the whole sequence.
        prior = self.prior_logp(deter_seq)  # (B, T, K, S, C)
        return Observed(seq, torch.stack(posts, 1), prior), state

    def imagine(
        self,
        state: State,  # (B, ...) carry at step t0
        ctrl: torch.Tensor,  # (B, H, U) controls u_{t0}, ..., u_{t0+H-1}
        sample: bool = True,
        head: int | torch.Tensor | None = None,
    ) -> tuple[State, torch.Tensor]:
        """Roll forward H steps under given controls, drawing z from the prior.

        head: None draws a random prior head per step and sequence (the ensemble's predictive
        distribution); an int uses that head; a (B,) long tensor fixes one head per sequence.
        Returns states (B, H, ...) for steps t0+1..t0+H and their prior log-probs (B, H, S, C).
        """
        B, H = ctrl.shape[:2]
        K = self.cfg.ensemble
        w = self.core_weights() if self.cfg.fused_core else None
        deters, stochs, logps = [], [], []
        for t in range(H):
            deter = self.core(state, ctrl[:, t], w)
            all_logp = self.prior_logp(deter)  # (B, K, S, C)
            if K == 1:  # one head: nothing to choose (and no random draw spent on it)
                logp = all_logp[:, 0]  # (B, S, C)
            else:
                if head is None:
                    idx = torch.randint(0, K, (B,), device=deter.device)
                elif isinstance(head, int):
                    idx = torch.full((B,), head, device=deter.device, dtype=torch.long)
                else:
                    idx = head
                logp = all_logp[torch.arange(B, device=deter.device), idx]  # (B, S, C)
            state = State(deter, straight_through_sample(logp, sample))
            deters.append(deter)
            stochs.append(state.stoch)
            logps.append(logp)
        return State(torch.stack(deters, 1), torch.stack(stochs, 1)), torch.stack(logps, 1)
