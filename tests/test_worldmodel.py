"""Unit tests pinning the reference mechanics of the world model (B != T != 1 throughout)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from wmcheck.worldmodel import WorldModel, preset
from wmcheck.worldmodel.distributions import (
    TwoHot,
    categorical_kl,
    straight_through_sample,
    symexp,
    symlog,
    unimix_logits,
)
from wmcheck.worldmodel.layers import BlockLinear, RMSNorm
from wmcheck.worldmodel.rssm import State

B, T, D, A, E = 3, 5, 4, 2, 1


def make_seq(b=B, t=T, seed=0):
    g = torch.Generator().manual_seed(seed)
    seq = SimpleNamespace(
        obs=torch.randn(b, t, D, generator=g),
        prev_action=torch.randn(b, t, A, generator=g),
        prev_input=torch.randn(b, t, E, generator=g),
        reward=torch.randn(b, t, generator=g),
        is_first=torch.zeros(b, t, dtype=torch.bool),
        is_last=torch.zeros(b, t, dtype=torch.bool),
        is_terminal=torch.zeros(b, t, dtype=torch.bool),
    )
    seq.is_first[:, 0] = True
    return seq


def make_model(**kw):
    torch.manual_seed(0)
    return WorldModel(preset("debug", obs_dim=D, action_dim=A, input_dim=E, **kw))


def test_symlog_symexp_inverse():
    x = torch.tensor([-1e6, -3.5, -1.0, 0.0, 1e-4, 2.0, 1e5])
    assert torch.allclose(symexp(symlog(x)), x, rtol=1e-5)
    assert torch.allclose(symlog(symexp(x[1:-1] / 1e3)), x[1:-1] / 1e3, rtol=1e-5, atol=1e-6)


def test_twohot_roundtrip_and_bins():
    th = TwoHot(255)
    assert torch.allclose(
        th.bins[[0, 127, 254]], torch.tensor([-symexp(torch.tensor(20.0)), 0.0, symexp(torch.tensor(20.0))]), atol=1e-6
    )
    x = torch.tensor([[-1234.5, -1.0, 0.0], [0.3, 7.0, 1e5]])  # (2, 3)
    w = th.encode(x)  # (2, 3, 255)
    assert torch.allclose(w.sum(-1), torch.ones_like(x))
    assert ((w > 0).sum(-1) <= 2).all()
    # interpolation is in raw space: the weighted bins reproduce x exactly
    assert torch.allclose((w * th.bins).sum(-1), x, rtol=1e-5, atol=1e-5)
    # decoding logits = log(two-hot) gives back the value
    assert torch.allclose(th.mean(torch.log(w + 1e-30)), x, rtol=1e-4, atol=1e-4)


def test_unimix_probabilities():
    logits = torch.tensor([[[50.0, -50.0, -50.0, -50.0]]])  # (1, 1, 4), nearly one-hot
    p = unimix_logits(logits, 0.01).exp()
    assert torch.allclose(p.sum(-1), torch.ones(1, 1))
    assert torch.allclose(p[..., 1:], torch.full((1, 1, 3), 0.01 / 4), atol=1e-7)
    assert torch.allclose(p[..., 0], torch.tensor(0.99 + 0.01 / 4))


def test_the_short_softmax_without_gradients_is_torchs():
    """unimix_logits computes softmax by hand for few classes on CPU without gradients (faster
    there): the numbers are torch's to float precision, extreme logits included. With gradients
    (training) torch's own kernel runs: bit for bit the reference, where the hand-written one is not."""
    from wmcheck.worldmodel import distributions

    logits = torch.cat([torch.randn(256, 8, 4) * 5, torch.tensor([[[80.0, -80.0, 0.0, 1e-3]] * 8])])
    reference = torch.log(0.99 * torch.softmax(logits, -1) + 0.01 / 4)
    with torch.no_grad():
        fast = unimix_logits(logits, 0.01)
        assert torch.isfinite(distributions._softmax(torch.tensor([[1e4, -1e4]]))).all()
    assert torch.allclose(fast, reference, atol=1e-6) and not torch.equal(fast, reference)
    assert torch.equal(unimix_logits(logits.clone().requires_grad_(True), 0.01).detach(), reference)


def test_straight_through_gradient_uses_mixed_probs():
    logits = torch.randn(B, 6, 4, requires_grad=True)
    logp = unimix_logits(logits, 0.01)
    z = straight_through_sample(logp)
    zd = z.detach()
    assert torch.allclose(zd, zd.round(), atol=1e-6) and torch.allclose(zd.sum(-1), torch.ones(B, 6))
    (z * torch.arange(4.0)).sum().backward()
    # gradient of sum_c c * (onehot + p - sg(p)) wrt logits is that of sum_c c * p: nonzero
    expected_logits = logits.detach().clone().requires_grad_(True)
    (unimix_logits(expected_logits, 0.01).exp() * torch.arange(4.0)).sum().backward()
    assert torch.allclose(logits.grad, expected_logits.grad, atol=1e-6)


def test_blocklinear_init_uses_full_fan_in_and_is_block_diagonal():
    torch.manual_seed(0)
    bl = BlockLinear(512, 256, 8)
    assert abs(bl.weight.std().item() - 1 / math.sqrt(512)) < 0.1 / math.sqrt(512)
    x = torch.zeros(2, 512)
    x[:, :64] = torch.randn(2, 64)  # only block 0 is nonzero
    y = bl(x)
    assert (y[:, 32:] == 0).all() and (y[:, :32] != 0).any()


def test_rmsnorm_scale_only_fp32():
    n = RMSNorm(8)
    assert [name for name, _ in n.named_parameters()] == ["scale"]
    x = torch.randn(2, 3, 8, dtype=torch.bfloat16) * 100
    y = n(x)
    assert y.dtype == torch.bfloat16
    rms = y.float().pow(2).mean(-1).sqrt()
    assert torch.allclose(rms, torch.ones_like(rms), atol=0.02)


@pytest.mark.parametrize("K", [1, 3])
def test_shapes_loss_scores_openloop(K):
    m = make_model(ensemble=K)
    seq = make_seq()
    out = m.loss(seq)
    assert out.loss.ndim == 0 and torch.isfinite(out.loss)
    assert out.observed.state.deter.shape == (B, T, m.cfg.deter)
    assert out.observed.state.stoch.shape == (B, T, m.cfg.stoch, m.cfg.classes)
    assert out.observed.prior_logp.shape == (B, T, K, m.cfg.stoch, m.cfg.classes)
    out.loss.backward()
    s = m.scores(seq)
    for key in ("nll", "error", "pred_std", "disagreement"):
        assert s[key].shape == (B, T, D), key
    assert s["kl"].shape == (B, T) and s["prior_jsd"].shape == (B, T)
    assert (s["kl"] >= -1e-5).all() and (s["pred_std"] > 0).all()
    if K == 1:
        assert (s["disagreement"] == 0).all()
    else:
        assert (s["disagreement"] > 0).any() and (s["prior_jsd"] > 0).any()
    ol = m.openloop(seq, context=2, samples=4)
    assert ol["samples"].shape == (4, B, T - 2, D) and ol["mean"].shape == (B, T - 2, D)
    states = m.imagine(m.initial(B), torch.zeros(B, 7, A), torch.zeros(B, 7, E), sample=False)
    assert states.deter.shape == (B, 7, m.cfg.deter)


def test_initial_state_is_zero_and_first_core_step_sees_zeros():
    m = make_model()
    s0 = m.initial(B)
    assert (s0.deter == 0).all() and (s0.stoch == 0).all()


def test_reset_at_is_first_masks_state_and_previous_action():
    m = make_model()
    seq = make_seq()
    seq.is_first[:, 3] = True  # a new episode starts at t=3
    out1, _ = m.observe(seq, sample=False)
    seq2 = make_seq(seed=1)
    seq2.is_first[:, 3] = True
    seq2.obs[:, 3:] = seq.obs[:, 3:]
    seq2.prev_action[:, 4:] = seq.prev_action[:, 4:]
    seq2.prev_input[:, 4:] = seq.prev_input[:, 4:]
    seq2.prev_action[:, 3] = 100.0  # the previous action at the reset must be ignored
    seq2.prev_input[:, 3] = -50.0
    out2, _ = m.observe(seq2, sample=False)
    assert torch.allclose(out1.state.deter[:, 3:], out2.state.deter[:, 3:], atol=1e-6)
    assert not torch.allclose(out1.state.deter[:, :3], out2.state.deter[:, :3])
    # a carried-in state is also discarded at is_first
    junk = State(torch.randn(B, m.cfg.deter), out1.state.stoch[:, 0])
    out3, _ = m.observe(seq, state=junk, sample=False)
    assert torch.allclose(out1.state.deter, out3.state.deter, atol=1e-6)


def _grad_names(model, loss):
    model.zero_grad(set_to_none=True)
    loss.backward(retain_graph=True)
    return {n for n, p in model.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0}


def test_kl_balance_gradients_reach_the_right_networks():
    # One step after a reset: h_1 = core(0, 0, 0) does not depend on the encoder, so the dynamics
    # term can only train the prior heads and the representation term only the posterior/encoder.
    m = make_model(free_nats=0.0)  # no clipping so both terms carry gradient
    seq = make_seq(t=1)
    obsd, _ = m.observe(seq)
    post, prior = obsd.post_logp[:, :, None], obsd.prior_logp
    dyn = categorical_kl(post.detach(), prior).mean()
    rep = categorical_kl(post, prior.detach()).mean()
    dyn_names, rep_names = _grad_names(m, dyn), _grad_names(m, rep)
    assert any(n.startswith("rssm.img_") for n in dyn_names)
    assert not any(n.startswith(("encoder.", "rssm.obs_")) for n in dyn_names)
    assert any(n.startswith("encoder.") for n in rep_names) and any(n.startswith("rssm.obs_") for n in rep_names)
    assert not any(n.startswith("rssm.img_") for n in rep_names)


def test_free_nats_clip_per_step_after_summing_latents():
    m = make_model()
    seq = make_seq()
    out = m.loss(seq)
    obsd = out.observed
    kl = categorical_kl(obsd.post_logp[:, :, None], obsd.prior_logp)  # (B, T, K)
    assert math.isclose(out.metrics["loss/dyn"].item(), torch.clamp(kl, min=1.0).mean().item(), rel_tol=1e-5)
    # with a huge free-nats budget the KL terms carry no gradient at all
    big = make_model(free_nats=1e6)
    loss = big.loss(seq)
    rep_dyn = big.cfg.dyn_scale * loss.metrics["loss/dyn"] + big.cfg.rep_scale * loss.metrics["loss/rep"]
    assert rep_dyn.item() == pytest.approx(1.1e6)
    obsd = big.loss(seq).observed
    kl_term = torch.clamp(categorical_kl(obsd.post_logp[:, :, None], obsd.prior_logp), min=1e6).mean()
    assert not _grad_names(big, kl_term)


def test_continue_target_and_reward_head_zero_init():
    m = make_model()
    assert (m.reward.out.weight == 0).all()
    seq = make_seq()
    seq.reward.zero_()
    out = m.loss(seq)
    # zero-initialised reward logits: uniform over 255 bins
    assert out.metrics["loss/rew"].item() == pytest.approx(math.log(255), rel=1e-4)


def test_fast_core_matches_reference_formulation():
    """The fused block GRU core equals the reference formulation (RSSM.core_reference: concat +
    broadcast to blocks + BlockLinear on the flat vector + split per block), step and scan."""
    import dataclasses

    m = make_model()
    r, c = m.rssm, m.cfg
    g = torch.Generator().manual_seed(3)
    state = State(
        torch.randn(B, c.deter, generator=g),
        torch.nn.functional.one_hot(torch.randint(0, c.classes, (B, c.stoch), generator=g), c.classes).float(),
    )
    ctrl = torch.randn(B, A + E, generator=g) * 5  # beyond the squash's linear range too
    expected = r.core_reference(state, ctrl)
    assert torch.allclose(r.core(state, ctrl), expected, atol=1e-5)
    assert not torch.allclose(r.core(state, ctrl * 0.5), expected, atol=1e-3)  # the test can fail
    seq = make_seq()
    ref = make_model()
    ref.load_state_dict(m.state_dict())
    ref.cfg = ref.rssm.cfg = dataclasses.replace(c, fused_core=False)
    with torch.no_grad():
        a, _ = m.observe(seq, sample=False)
        b, _ = ref.observe(seq, sample=False)
    assert torch.allclose(a.state.deter, b.state.deter, atol=1e-4)


@pytest.mark.parametrize("shape", [{}, {"dyn_layers": 0}, {"dyn_layers": 2}, {"obs_layers": 0}, {"obs_layers": 2}])
def test_the_scans_precomputed_terms_give_the_reference_numbers(shape):
    """The scan computes the control's and the tokens' terms for every step before the loop
    (RSSM.core_scan, post_scan) and resets only at steps where some sequence starts: the filtered
    states equal the reference core's, with a reset in mid-sequence, and the posterior equals its
    layers applied to concat(h, tokens), for every layer count the two rewrites branch on; under
    bf16 autocast (the GPU's training precision) the loss is finite and close to fp32's."""
    import dataclasses

    m = make_model(**shape)
    with torch.no_grad():  # the reference init zeroes every bias and gives RMSNorm unit scales
        for name, p in m.named_parameters():
            if name.endswith(("bias", "scale")):
                p.add_(torch.randn_like(p) * 0.5)
    ref = WorldModel(dataclasses.replace(m.cfg, fused_core=False))
    ref.load_state_dict(m.state_dict())
    seq = make_seq(t=9)
    seq.is_first[1, 4] = True
    with torch.no_grad():
        a, _ = m.observe(seq, sample=False)
        b, _ = ref.observe(seq, sample=False)
        direct = m.rssm.post_logp(a.state.deter, m._tokens(seq))
        moved, _ = m.observe(make_seq(t=9, seed=1), sample=False)
        whole, _ = m.observe(make_seq(t=9), sample=False)  # no reset in mid-sequence
        tail = make_seq(t=9)
        tail.prev_action[1, 4] = tail.prev_input[1, 4] = 0.0  # what a reset zeroes
        fresh, _ = m.observe(SimpleNamespace(**{k: v[1:2, 4:] for k, v in vars(tail).items()}), sample=False)
    assert torch.allclose(a.state.deter, b.state.deter, atol=1e-5)
    assert torch.allclose(a.post_logp, direct, atol=1e-5)
    # the reset at [1, 4] restarts sequence 1 there and leaves the others alone (both paths share it)
    assert torch.allclose(a.state.deter[[0, 2]], whole.state.deter[[0, 2]], atol=1e-6)
    assert torch.allclose(a.state.deter[1, 4:], fresh.state.deter[0], atol=1e-5)
    assert not torch.allclose(a.state.deter, moved.state.deter, atol=1e-3)  # the comparison can fail
    torch.manual_seed(5)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low = m.loss(seq).loss
    torch.manual_seed(5)  # the same latent draws
    assert torch.isfinite(low) and low.item() == pytest.approx(m.loss(seq).loss.item(), rel=0.05)


def test_openloop_draws_start_from_their_own_posterior_samples():
    """The open-loop predictive integrates over the state at the end of the context: each of the N
    draws filters the context with its own posterior samples (one draw shared by all N left that
    uncertainty out of the spread), and with sample=False all draws are the posterior mode."""
    model = make_model().eval()
    seq = make_seq(t=8)
    seen = []
    imagine = model.rssm.imagine

    def spy(state, ctrl, **kw):
        seen.append(state)
        return imagine(state, ctrl, **kw)

    model.rssm.imagine = spy
    N, C = 6, 5
    out = model.openloop(seq, C, samples=N)
    assert out["samples"].shape == (N, B, T + 3 - C, D) and out["mean"].shape == (B, T + 3 - C, D)
    stoch = seen[-1].stoch.reshape(N, B, -1)  # draw-major rows
    for b in range(B):  # an untrained posterior is diffuse: the draws' context states differ
        assert len({tuple(stoch[n, b].tolist()) for n in range(N)}) > 1
    model.openloop(seq, C, samples=N, sample=False)
    mode = seen[-1].stoch.reshape(N, B, -1)
    assert torch.equal(mode, mode[:1].expand_as(mode))
    # the context's posterior is the one `observe` gives (same tokens, controls and resets)
    _, last = model.observe(SimpleNamespace(**{k: v[:, :C] for k, v in vars(seq).items()}), sample=False)
    assert torch.allclose(seen[-1].deter[:B], last.deter, atol=1e-6)


def test_sample_categorical_draws_each_class_with_its_probability():
    """sample_categorical (the one-step scores' latent draws) against the probabilities: 200,000
    draws per row, every class's frequency within 5 standard errors, on rows with a dominant
    class, a uniform row, a class at the unimix floor and a row whose probs sum to just under 1
    (its rest goes to the last class, never out of range). An inverse CDF off by one class (an
    exclusive cumulative sum) moves whole classes' mass and fails here."""
    from wmcheck.worldmodel.distributions import sample_categorical

    torch.manual_seed(0)
    p = torch.tensor(
        [[0.7, 0.2, 0.09, 0.01], [0.25] * 4, [0.0025, 0.0025, 0.0025, 0.9925], [0.1, 0.2, 0.3, 0.4 - 1e-7]]
    )
    N = 200_000
    idx = sample_categorical(torch.log(p)[:, None].expand(4, N, 4))  # (4, N)
    assert idx.shape == (4, N) and int(idx.min()) >= 0 and int(idx.max()) <= 3
    freq = torch.stack([torch.bincount(row, minlength=4) for row in idx]).double() / N  # (4, 4)
    se = (p.double() * (1 - p.double()) / N).sqrt()
    assert ((freq - p.double()).abs() <= 5 * se + 1e-9).all(), (freq, p)
