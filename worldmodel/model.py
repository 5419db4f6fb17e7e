"""The world model: encoder + RSSM + decoder + reward/continue heads, its loss and its scores.

Owns the public surface the rest of wmcheck uses (names from the reference):
  - `initial(B)`                    zero carry
  - `observe(seq, state)`           filter a sequence into posterior states
  - `imagine(state, actions, inputs)` roll forward under given controls (sampled or mode)
  - `decode(state)`                 predicted observations (normalised units) with noise scale
  - `loss(seq)`                     the DreamerV3 world-model objective and metrics
  - `scores(seq)`                   per-step, per-channel, non-reduced scores for the checks
  - `openloop(seq, context)`        observe a context, imagine the rest under logged controls

A sequence `seq` is any object with tensor attributes (the training view, already normalised):
  obs (B, T, D) float, prev_action (B, T, A), prev_input (B, T, E), reward (B, T),
  is_first / is_last / is_terminal (B, T) bool, and, for a model with `image_keys`,
  images {key: (B, T, H, W, c) uint8}.
Vector observations are modelled in symlog space of the normalised values, as in the reference;
camera frames by the CNN encoder/decoder of `image.py` (tokens of both are concatenated).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from wmcheck.worldmodel.config import WorldModelConfig
from wmcheck.worldmodel.distributions import (
    TwoHot,
    categorical_entropy,
    categorical_kl,
    sample_categorical,
    symexp,
    symlog,
)
from wmcheck.worldmodel.heads import ContinueHead, RewardHead, VectorDecoder, VectorEncoder
from wmcheck.worldmodel.image import ImageDecoder, ImageEncoder, image_loss, image_target
from wmcheck.worldmodel.rssm import RSSM, Observed, State

_LOG_2PI = math.log(2 * math.pi)


@dataclass
class LossOut:
    loss: torch.Tensor  # () total, scale-weighted
    metrics: dict[str, torch.Tensor]  # scalar tensors keyed "loss/...", "kl/...", "entropy/..."
    observed: Observed
    last: State


def _control(seq) -> torch.Tensor:
    return torch.cat([seq.prev_action, seq.prev_input], -1).float()  # (B, T, A+E)


def _gauss_nll(y: torch.Tensor, mean: torch.Tensor, log_std: torch.Tensor) -> torch.Tensor:
    return 0.5 * ((y - mean) * torch.exp(-log_std)).pow(2) + log_std + 0.5 * _LOG_2PI


class WorldModel(nn.Module):
    def __init__(self, cfg: WorldModelConfig):
        super().__init__()
        if cfg.obs_dim < 1:
            raise ValueError("WorldModelConfig.obs_dim must be set from the data (>= 1)")
        self.cfg = cfg
        self.encoder = VectorEncoder(cfg)
        self.image_encoder = ImageEncoder(cfg) if cfg.image_keys else None
        self.image_decoder = ImageDecoder(cfg) if cfg.image_keys else None
        tokens = self.encoder.out_dim + (self.image_encoder.out_dim if cfg.image_keys else 0)
        self.rssm = RSSM(cfg, tokens)
        self.decoder = VectorDecoder(cfg)
        self.reward = RewardHead(cfg)
        self.cont = ContinueHead(cfg)
        self.twohot = TwoHot(cfg.reward_bins)  # bins are a buffer: they follow the model's device

    # ------------------------------------------------------------------ surface
    def initial(self, batch_size: int) -> State:
        return self.rssm.initial(batch_size)

    def observe(self, seq, state: State | None = None, sample: bool = True) -> tuple[Observed, State]:
        self._check(seq)
        return self.rssm.observe(self._tokens(seq), _control(seq), seq.is_first.bool(), state, sample)

    def _tokens(self, seq) -> torch.Tensor:
        """The encoders' tokens of every step (B, T, units [+ cnn])."""
        tokens = self.encoder(seq.obs.float())  # (B, T, units)
        if self.image_encoder is not None:
            tokens = torch.cat([tokens, self.image_encoder(seq.images)], -1)  # (B, T, units + cnn)
        return tokens

    def embed_images(self, images: dict[str, torch.Tensor]) -> torch.Tensor:
        """The image encoder's embedding of frames {key: (B, T, H, W, c) uint8} -> (B, T, E).

        The visual-gap check measures distances between real and checked frames in this space."""
        if self.image_encoder is None:
            raise ValueError("this world model has no image encoder (trained without image_keys)")
        return self.image_encoder(images).float()

    def decode_images(self, state: State) -> dict[str, torch.Tensor]:
        """Predicted frames {key: (B, T, H, W, c)} in [0, 1] from states (B, T, ...)."""
        if self.image_decoder is None:
            raise ValueError("this world model has no image decoder (trained without image_keys)")
        return self.image_decoder.split(self.image_decoder(state.feat()))

    def imagine(
        self, state: State, prev_action: torch.Tensor, prev_input: torch.Tensor, sample: bool = True, head=None
    ) -> State:
        """Controls (B, H, A) / (B, H, E) are u_{t0..t0+H-1}; returns states t0+1..t0+H (B, H, ...)."""
        ctrl = torch.cat([prev_action, prev_input], -1).float()  # (B, H, U)
        states, _ = self.rssm.imagine(state, ctrl, sample=sample, head=head)
        return states

    def decode(self, state: State) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns (mean, log_std) of symlog(obs) (B, T, D); obs = symexp(mean) in normalised units."""
        return self.decoder(state.feat())

    @staticmethod
    def to_obs(symlog_values: torch.Tensor) -> torch.Tensor:
        return symexp(symlog_values)

    # ------------------------------------------------------------------ loss
    def loss(self, seq, state: State | None = None) -> LossOut:
        c = self.cfg
        obsd, last = self.observe(seq, state)
        feat = obsd.state.feat()  # (B, T, F)
        mean, log_std = self.decoder(feat)  # (B, T, D)
        target = symlog(seq.obs.float())  # (B, T, D)
        rec = (mean - target).pow(2).sum(-1)  # (B, T)  symlog-MSE summed over channels
        std_nll = _gauss_nll(target, mean.detach(), log_std).sum(-1) if c.learn_obs_std else torch.zeros_like(rec)
        if self.image_decoder is not None:  # (B, T): squared error summed over H, W, C
            img = image_loss(self.image_decoder(feat), image_target(seq.images, c.image_keys))
        else:
            img = torch.zeros_like(rec)
        rew = -self.twohot.log_prob(self.reward(feat), seq.reward.float())  # (B, T)
        cont_target = (1.0 - seq.is_terminal.float()) * (1.0 - 1.0 / c.cont_horizon)
        con = F.binary_cross_entropy_with_logits(self.cont(feat), cont_target, reduction="none")  # (B, T)

        post = obsd.post_logp[:, :, None]  # (B, T, 1, S, C)
        prior = obsd.prior_logp  # (B, T, K, S, C)
        dyn_raw = categorical_kl(post.detach(), prior)  # (B, T, K)  trains the priors
        rep_raw = categorical_kl(post, prior.detach())  # (B, T, K)  trains the posterior/encoder
        dyn = torch.clamp(dyn_raw, min=c.free_nats)  # free nats per (b, t), after summing latents
        rep = torch.clamp(rep_raw, min=c.free_nats)
        w = self._head_weights(seq.obs.shape[0], seq.obs.device)  # (B, K)
        wbt = w[:, None, :].expand_as(dyn)  # (B, T, K)
        dyn_l = (dyn * wbt).sum((0, 1)) / wbt.sum((0, 1)).clamp(min=1.0)  # (K,)
        rep_l = (rep * wbt).sum((0, 1)) / wbt.sum((0, 1)).clamp(min=1.0)

        terms = {
            "rec": rec.mean(),
            "obs_std": std_nll.mean(),
            "rew": rew.mean(),
            "con": con.mean(),
            "dyn": dyn_l.mean(),
            "rep": rep_l.mean(),
        }
        if self.image_decoder is not None:
            terms["image"] = img.mean()
        total = (
            c.rec_scale * (terms["rec"] + terms.get("image", 0.0))
            + terms["obs_std"]
            + c.rew_scale * terms["rew"]
            + c.con_scale * terms["con"]
            + c.dyn_scale * terms["dyn"]
            + c.rep_scale * terms["rep"]
        )
        metrics = {f"loss/{k}": v.detach() for k, v in terms.items()}
        metrics["loss/total"] = total.detach()
        metrics["kl/dyn"] = dyn_raw.mean().detach()
        metrics["kl/rep"] = rep_raw.mean().detach()
        metrics["entropy/post"] = categorical_entropy(obsd.post_logp).mean().detach()
        metrics["entropy/prior"] = categorical_entropy(prior).mean().detach()
        return LossOut(total, metrics, obsd, last)

    def _head_weights(self, batch: int, device) -> torch.Tensor:
        K = self.cfg.ensemble
        if K == 1 or not self.cfg.bootstrap or not self.training:
            return torch.ones(batch, K, device=device)
        return torch.bernoulli(torch.full((batch, K), 0.5, device=device))

    # ------------------------------------------------------------------ scores
    @torch.no_grad()
    def scores(self, seq, state: State | None = None, samples: int = 8) -> dict[str, torch.Tensor]:
        """Per-step, per-channel, non-reduced scores of a sequence under the model.

        Returns (all float32):
          nll          (B, T, D) one-step predictive NLL of each channel (normalised units): the
                       prior's mixture over `samples` latent draws (random heads) given h_t, i.e.
                       given everything up to step t-1 and the control u_{t-1}
          error        (B, T, D) one-step prediction error obs - predicted mean (normalised units)
          pred_std     (B, T, D) one-step predictive std (normalised units, from the mixture)
          kl           (B, T)    KL(post || prior), mean over heads: surprise of the transition
          disagreement (B, T, D) std across prior heads of the decoded one-step mean (0 for K=1)
          prior_jsd    (B, T)    Jensen-Shannon divergence among the heads' priors (0 for K=1)
          feat         (B, T, F) posterior features, for support/coverage measures
          last         the posterior `State` after the last step (the carry of an online filter)
        """
        obsd, last = self.observe(seq, state, sample=False)
        K, S = self.cfg.ensemble, samples
        deter = obsd.state.deter  # (B, T, deter)
        prior = obsd.prior_logp  # (B, T, K, S_lat, C)
        B, T = deter.shape[:2]
        # Draw `samples` latents per step, cycling through heads so every head is represented.
        heads = torch.arange(S, device=deter.device) % K  # (S,)
        logp = prior[:, :, heads]  # (B, T, S, S_lat, C)
        z = F.one_hot(sample_categorical(logp), self.cfg.classes).float()
        feat = torch.cat([deter[:, :, None].expand(B, T, S, deter.shape[-1]), z.flatten(-2)], -1)  # (B, T, S, F)
        mean, log_std = self.decoder(feat)  # (B, T, S, D) symlog space
        y = symlog(seq.obs.float())[:, :, None]  # (B, T, 1, D)
        logpdf = -_gauss_nll(y, mean, log_std)  # (B, T, S, D)
        nll_y = -(torch.logsumexp(logpdf, 2) - math.log(S))  # (B, T, D)
        nll = nll_y + torch.log1p(seq.obs.float().abs())  # change of variables symlog -> obs
        obs_samples = symexp(mean)  # (B, T, S, D)
        pred_mean = obs_samples.mean(2)
        # Predictive std in obs units: spread of the means plus the (delta-method) noise scale.
        noise = (torch.exp(log_std) * torch.exp(mean.abs())).pow(2).mean(2)
        pred_std = (obs_samples.var(2, unbiased=False) + noise).sqrt()
        if K > 1:
            head_means = torch.stack([obs_samples[:, :, heads == k].mean(2) for k in range(K)], 2)  # (B, T, K, D)
            disagreement = head_means.std(2, unbiased=False)
            p = prior.exp()  # (B, T, K, S_lat, C)
            mix = p.mean(2).clamp_min(1e-12)
            jsd = -(mix * mix.log()).sum((-1, -2)) - categorical_entropy(prior).mean(2)
        else:
            disagreement = torch.zeros_like(pred_mean)
            jsd = torch.zeros(B, T, device=deter.device)
        kl = categorical_kl(obsd.post_logp[:, :, None], prior).mean(-1)  # (B, T)
        return {
            "nll": nll,
            "error": seq.obs.float() - pred_mean,
            "pred_std": pred_std,
            "kl": kl,
            "disagreement": disagreement,
            "prior_jsd": jsd,
            "feat": obsd.state.feat().float(),
            "last": last,
        }

    # ------------------------------------------------------------------ open loop
    @torch.no_grad()
    def openloop(self, seq, context: int, samples: int = 8, sample: bool = True) -> dict[str, torch.Tensor]:
        """Observe steps [0, context), imagine steps [context, T) under the logged controls.

        Returns in normalised obs units: `samples` (N, B, T-context, D) predictive draws (latent
        samples plus observation noise), `mean` (B, T-context, D) the mean of the decoded means,
        and `truth` (B, T-context, D).
        """
        B, T = seq.obs.shape[:2]
        if not 0 < context < T:
            raise ValueError(f"openloop: context {context} must be in [1, T={T})")
        ctx = _Slice(seq, 0, context)
        self._check(ctx)

        def rep(x):  # (B, ...) -> (N*B, ...), draw-major: rows [n*B, (n+1)*B) are draw n
            return x.repeat(samples, *([1] * (x.dim() - 1)))

        # Each draw filters the context with its own posterior samples: the state at the end of
        # the context is uncertain too, and one draw shared by all N (as before) left that
        # uncertainty out of the spread; the encoders run once, on the B sequences.
        _, state = self.rssm.observe(rep(self._tokens(ctx)), rep(_control(ctx)), rep(ctx.is_first.bool()), None, sample)
        states = self.imagine(
            state, rep(seq.prev_action[:, context:].float()), rep(seq.prev_input[:, context:].float()), sample=sample
        )  # (N*B, H, ...)
        mean, log_std = self.decode(states)  # (N*B, H, D)
        draws = symexp(mean + torch.exp(log_std) * torch.randn_like(mean))
        H, D = mean.shape[1], mean.shape[2]
        out = {
            "samples": draws.reshape(samples, B, H, D),
            "mean": symexp(mean).reshape(samples, B, H, D).mean(0),
            "truth": seq.obs[:, context:].float(),
        }
        if self.image_decoder is not None:  # frames of the first latent draw, (B, H, h, w, c) in [0, 1]
            first = State(states.deter[:B], states.stoch[:B])
            out["images"] = self.decode_images(first)
        return out

    # ------------------------------------------------------------------ checks
    def _check(self, seq) -> None:
        c = self.cfg
        B, T = seq.obs.shape[:2]
        assert seq.obs.shape == (B, T, c.obs_dim), f"obs {tuple(seq.obs.shape)} != (B, T, {c.obs_dim})"
        assert seq.prev_action.shape == (B, T, c.action_dim), (
            f"prev_action {tuple(seq.prev_action.shape)} != (B, T, {c.action_dim})"
        )
        assert seq.prev_input.shape == (B, T, c.input_dim), (
            f"prev_input {tuple(seq.prev_input.shape)} != (B, T, {c.input_dim})"
        )
        assert seq.is_first.shape == (B, T), f"is_first {tuple(seq.is_first.shape)} != (B, T)"
        if c.image_keys:
            images = getattr(seq, "images", None) or {}
            for key in c.image_keys:
                assert key in images, f"the model reads image key {key!r}; the sequence has {sorted(images)}"
                assert tuple(images[key].shape[:2]) == (B, T), (
                    f"images[{key}] {tuple(images[key].shape)} != (B, T, H, W, C)"
                )


class _Slice:
    """A time slice [start, stop) of a sequence object (attributes sliced on axis 1)."""

    FIELDS = ("obs", "prev_action", "prev_input", "reward", "is_first", "is_last", "is_terminal")

    def __init__(self, seq, start: int, stop: int):
        for name in self.FIELDS:
            setattr(self, name, getattr(seq, name)[:, start:stop])
        self.images = {k: v[:, start:stop] for k, v in (getattr(seq, "images", None) or {}).items()}
