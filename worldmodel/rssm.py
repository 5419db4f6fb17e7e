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
    def core(self, state: State, ctrl: torch.Tensor) -> torch.Tensor:
        """Block GRU, one step: (h_{t-1}, z_{t-1}, u_{t-1}) -> h_t, ctrl (B, U). A scan should use
        `core_scan`, which projects every step's control at once."""
        return self.core_scan(ctrl[:, None])(state, 0)

    def _squash(self, ctrl: torch.Tensor) -> torch.Tensor:
        c = self.cfg
        if c.control_dim == 0:
            ctrl = ctrl.new_zeros(ctrl.shape[:-1] + (1,))
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
        u = self._squash(ctrl)  # (B, U)
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

    def core_scan(self, ctrl: torch.Tensor):
        """The core for a scan over controls ctrl (B, T, U) (already zeroed where a step resets):
        returns step(state, t) -> h_t (B, deter). `cfg.fused_core` selects the rewrite below
        (`_core_fused`, same numbers up to rounding) over `core_reference`.

        The rewrite: the control's projection (Linear -> RMSNorm -> SiLU) does not depend on the
        state, so it is computed for every step at once, and with it its term of the first block
        layer and that layer's bias (`_control_terms`); h and z are projected by one matmul with a
        block-diagonal weight. The first block layer reads [h_g, x] per group g, where x (the three
        projections) is the same for every group: its weight is split into an h part
        (block-diagonal, bmm) and an x part (dense matmuls) instead of materialising x repeated G
        times; the gates' bias carries the update gate's -1. tests/test_worldmodel.py ties both.
        """
        if not self.cfg.fused_core:
            return lambda state, t: self.core_reference(state, ctrl[:, t])
        w = self._core_weights()
        # per step (B, deter), or (B, hidden) without a dense layer; unbound, so that the backward
        # stacks their gradients once instead of scattering each into a zero (B, T, ...) tensor
        terms = self._control_terms(ctrl, w).unbind(1)
        return lambda state, t: self._core_fused(state, terms[t], w)

    def _core_weights(self) -> dict[str, torch.Tensor]:
        """Per-scan views of the core's weights (see `core_scan`), built once per scan."""
        c = self.cfg
        d = c.deter // c.blocks
        lins = (self.dynin_deter[0], self.dynin_stoch[0])
        w = {
            "hz_w": torch.block_diag(*(lin.weight for lin in lins)),  # (2*hidden, deter + S*C)
            "hz_b": torch.cat([lin.bias for lin in lins]),  # (2*hidden,)
            "hz_scale": torch.stack([self.dynin_deter[1].scale, self.dynin_stoch[1].scale]),  # (2, hidden)
        }
        if c.dyn_layers:
            first = self.dynhid[0]
            wx = rearrange(first.weight[:, d:], "g i o -> i (g o)")  # (3*hidden, deter): rows h, z, control
            w["hid_wh"] = first.weight[:, :d]  # (G, d, deter/G)
            w["hid_wx_hz"] = wx[: 2 * c.hidden]  # (2*hidden, deter)
            w["hid_wx_u"] = wx[2 * c.hidden :]  # (hidden, deter)
        shift = torch.zeros(3, d, device=self.gates.bias.device, dtype=self.gates.bias.dtype)
        shift[2] = 1.0  # the update gate's bias of -1
        w["gates_b"] = (self.gates.bias.view(c.blocks, 3, d) - shift).reshape(c.blocks, 1, 3 * d)  # (G, 1, 3*d)
        return w

    def _control_terms(self, ctrl: torch.Tensor, w: dict[str, torch.Tensor]) -> torch.Tensor:
        """The state-free part of the core for every step: (B, T, U) -> the control projection's term
        of the first block layer plus its bias (B, T, deter), or the projection (B, T, hidden)."""
        x_u = self.dynin_ctrl(self._squash(ctrl))  # (B, T, hidden)
        if not self.cfg.dyn_layers:
            return x_u
        return torch.addmm(self.dynhid[0].bias, x_u.flatten(0, 1), w["hid_wx_u"]).view(*ctrl.shape[:2], -1)

    def _core_fused(self, state: State, term: torch.Tensor, w: dict[str, torch.Tensor]) -> torch.Tensor:
        """One step of the rewrite; term (B, deter) from `_control_terms` (see `core_scan`)."""
        c = self.cfg
        deter, stoch = state.deter, state.stoch.flatten(-2)  # (B, deter), (B, S*C)
        B, G = deter.shape[0], c.blocks
        x = F.linear(torch.cat([deter, stoch], -1), w["hz_w"], w["hz_b"])  # (B, 2*hidden)
        x = F.rms_norm(x.float().view(B, 2, c.hidden), (c.hidden,), eps=self.dynin_deter[1].eps)  # (B, 2, hidden)
        x = F.silu(x * w["hz_scale"]).reshape(B, 2 * c.hidden).to(deter.dtype)  # (B, 2*hidden)
        h_g = deter.view(B, G, -1).transpose(0, 1)  # (G, B, d)
        if c.dyn_layers:
            y = torch.addmm(term, x, w["hid_wx_hz"]).view(B, G, -1)  # (B, G, d): x's term, control's, bias
            y = (y + torch.bmm(h_g, w["hid_wh"]).transpose(0, 1)).reshape(B, c.deter)  # (B, deter)
            y = self.dynhid[2](self.dynhid[1](y))  # RMSNorm, SiLU
            for i in range(1, c.dyn_layers):
                y = self.dynhid[3 * i + 2](self.dynhid[3 * i + 1](self.dynhid[3 * i](y)))
        else:
            x = torch.cat([x, term.to(x.dtype)], -1)  # (B, 3*hidden)
            y = rearrange(torch.cat([h_g.transpose(0, 1), x[:, None].expand(B, G, -1)], -1), "b g f -> b (g f)")
        # + the fp32 bias, not baddbmm: under bf16 autocast the gates and their nonlinearities stay
        # in fp32 as in the reference (baddbmm returned bf16 gates: 1.5x the state's bf16 error)
        gates = torch.bmm(y.view(B, G, -1).transpose(0, 1), self.gates.weight) + w["gates_b"]  # (G, B, 3*d)
        reset, cand, update = gates.chunk(3, -1)  # (G, B, d) each: per block [reset, cand, update]
        cand = torch.tanh(torch.sigmoid(reset) * cand)
        h_new = torch.lerp(h_g, cand.to(h_g.dtype), torch.sigmoid(update).to(h_g.dtype))  # u*cand + (1-u)*h
        return h_new.transpose(0, 1).reshape(B, c.deter)  # (B, deter)

    def prior_logp(self, deter: torch.Tensor, head: int | None = None) -> torch.Tensor:
        """Prior log-probs of every head (..., K, S, C), or of one head (..., S, C)."""
        if head is not None:
            return self._logp(self.img_logits[head](self.img_nets[head](deter)))
        return torch.stack([self._logp(lin(net(deter))) for net, lin in zip(self.img_nets, self.img_logits)], -3)

    def post_logp(self, deter: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """Posterior log-probs (..., S, C) from h (..., deter) and tokens (..., F); `post_scan` is its
        rewrite for a scan (tests/test_worldmodel.py ties them)."""
        return self._logp(self.obs_logit(self.obs_net(torch.cat([deter, tokens], -1))))

    def post_scan(self, tokens: torch.Tensor):
        """The posterior for a scan over tokens (B, T, F): returns step(h_t, t) -> log q(z_t) (B, S, C).
        The first layer reads concat(h, tokens); its tokens' term and bias are computed for every
        step at once, so a step multiplies h only (the same numbers up to rounding)."""
        first = self.obs_net[0][0] if len(self.obs_net) else self.obs_logit  # the Linear on concat(h, tokens)
        d = self.cfg.deter
        w_h = first.weight[:, :d].t()  # (deter, out)
        tok = F.linear(tokens, first.weight[:, d:], first.bias).unbind(1)  # T x (B, out), see core_scan
        rest = list(self.obs_net)[1:]  # the layers after the first

        def step(deter: torch.Tensor, t: int) -> torch.Tensor:
            x = torch.addmm(tok[t], deter, w_h)  # (B, out)
            if not len(self.obs_net):
                return self._logp(x)
            x = self.obs_net[0][2](self.obs_net[0][1](x))  # RMSNorm, SiLU
            for layer in rest:
                x = layer(x)
            return self._logp(self.obs_logit(x))

        return step

    def filter_scan(self, tokens: torch.Tensor, ctrl: torch.Tensor, is_first: torch.Tensor):
        """One filtering step for a scan over tokens (B, T, F), previous controls (B, T, U) and
        is_first (B, T): returns step(state, t) -> (h_t (B, deter), log q(z_t) (B, S, C)). Where
        is_first is set, h, z *and the previous control* restart from zero: the controls are zeroed
        once for every step, the state only at steps where some sequence resets."""
        keep = (~is_first).to(ctrl.dtype)  # (B, T)
        reset_at = is_first.any(0).tolist()
        core, post = self.core_scan(ctrl * keep[..., None]), self.post_scan(tokens)

        def step(state: State, t: int) -> tuple[torch.Tensor, torch.Tensor]:
            if reset_at[t]:
                k = keep[:, t]  # (B,)
                state = State(state.deter * k[:, None], state.stoch * k[:, None, None])
            deter = core(state, t)  # (B, deter)
            return deter, post(deter, t)

        return step

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
        step = self.filter_scan(tokens, ctrl, is_first)
        noise = gumbel_noise((B, T, self.cfg.stoch, self.cfg.classes), tokens.device) if sample else None
        deters, stochs, posts = [], [], []
        for t in range(T):
            deter, logp = step(state, t)  # (B, deter), (B, S, C)
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
        core = self.core_scan(ctrl)
        deters, stochs, logps = [], [], []
        for t in range(H):
            deter = core(state, t)
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
