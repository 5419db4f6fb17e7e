"""The image encoder/decoder (reference section 2) and the world model with camera frames; B != T != 1."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from wmcheck.worldmodel import WorldModel, WorldModelConfig, preset
from wmcheck.worldmodel.image import ImageDecoder, ImageEncoder, image_loss, image_target
from wmcheck.worldmodel.layers import RMSNorm

B, T, D, A = 3, 5, 4, 2


def image_cfg(size=16, **kw):
    return preset(
        "debug",
        obs_dim=D,
        action_dim=A,
        image_keys=["image"],
        image_key_channels=[3],
        image_shape=[size, size, 3],
        **kw,
    )


def image_seq(cfg, b=B, t=T, seed=0):
    g = torch.Generator().manual_seed(seed)
    H, W, C = cfg.image_shape
    seq = SimpleNamespace(
        obs=torch.randn(b, t, D, generator=g),
        prev_action=torch.randn(b, t, A, generator=g),
        prev_input=torch.zeros(b, t, 0),
        reward=torch.randn(b, t, generator=g),
        is_first=torch.zeros(b, t, dtype=torch.bool),
        is_last=torch.zeros(b, t, dtype=torch.bool),
        is_terminal=torch.zeros(b, t, dtype=torch.bool),
        images={"image": torch.randint(0, 256, (b, t, H, W, C), generator=g, dtype=torch.uint8)},
    )
    seq.is_first[:, 0] = True
    return seq


@pytest.mark.parametrize("size,stages", [(16, 2), (32, 3), (64, 4)])
def test_reference_stages_and_final_resolution(size, stages):
    cfg = image_cfg(size)
    assert cfg.cnn_mults == [2, 3, 4, 4][:stages]
    enc = ImageEncoder(cfg)
    convs = [m for m in enc.stages if isinstance(m, torch.nn.Conv2d)]
    assert [c.out_channels for c in convs] == [cfg.cnn_depth * m for m in cfg.cnn_mults]
    assert all(c.kernel_size == (5, 5) and c.stride == (1, 1) for c in convs)
    assert sum(isinstance(m, torch.nn.MaxPool2d) for m in enc.stages) == stages
    x = {"image": torch.zeros(B, T, size, size, 3, dtype=torch.uint8)}
    tokens = enc(x)  # (B, T, 4*4*depth)
    assert tokens.shape == (B, T, 4 * 4 * cfg.cnn_depth * cfg.cnn_mults[-1])


def test_encoder_scaling_and_time_independence():
    cfg = image_cfg(16)
    torch.manual_seed(0)
    enc = ImageEncoder(cfg)
    x = torch.randint(0, 256, (B, T, 16, 16, 3), dtype=torch.uint8)
    full = enc({"image": x})
    # each frame is encoded on its own: encoding frame (1, 2) alone gives the same tokens
    alone = enc({"image": x[1:2, 2:3]})
    assert torch.allclose(full[1, 2], alone[0, 0], atol=1e-5)
    # input scaling x/255 - 0.5: a mid-grey (127.5) frame is the zero input, so the first conv output is its bias (0)
    conv = enc.stages[0]
    grey = torch.full((1, 3, 16, 16), 127.5 / 255 - 0.5)
    assert conv(grey).abs().max() < 1e-6


def test_decoder_shapes_sigmoid_and_upsampling():
    cfg = image_cfg(32)
    torch.manual_seed(0)
    dec = ImageDecoder(cfg)
    feat = torch.randn(B, T, cfg.feat_dim)
    out = dec(feat)  # (B, T, 32, 32, 3)
    assert out.shape == (B, T, 32, 32, 3)
    assert (out > 0).all() and (out < 1).all()
    ups = [m for m in dec.stages if isinstance(m, torch.nn.Upsample)]
    assert len(ups) == len(cfg.cnn_mults) and all(u.mode == "nearest" for u in ups)
    assert dec.sp0.groups == 8
    norms = [m for m in dec.modules() if isinstance(m, RMSNorm)]
    assert all(n.eps == 1e-4 for n in norms)
    # each (b, t) is decoded on its own
    assert torch.allclose(dec(feat[2:3, 4:5])[0, 0], out[2, 4], atol=1e-5)


def test_image_loss_is_sum_of_squares_over_pixels():
    pred = torch.full((B, T, 4, 4, 3), 0.5)
    imgs = {"image": torch.zeros(B, T, 4, 4, 3, dtype=torch.uint8)}
    imgs["image"][0, 1] = 255
    loss = image_loss(pred, image_target(imgs, ["image"]))  # (B, T)
    assert loss.shape == (B, T)
    assert torch.allclose(loss, torch.full((B, T), 0.25 * 48))


def test_model_with_images_loss_backward_and_surface():
    cfg = image_cfg(16)
    torch.manual_seed(0)
    model = WorldModel(cfg)
    seq = image_seq(cfg)
    out = model.loss(seq)
    assert "loss/image" in out.metrics and out.metrics["loss/image"] > 0
    out.loss.backward()
    assert model.image_encoder.stages[0].weight.grad.abs().sum() > 0
    assert model.image_decoder.sp0.weight.grad.abs().sum() > 0
    emb = model.embed_images(seq.images)
    assert emb.shape == (B, T, model.image_encoder.out_dim)
    frames = model.decode_images(out.observed.state)
    assert frames["image"].shape == (B, T, 16, 16, 3)
    ol = model.openloop(seq, context=2, samples=4)
    assert ol["images"]["image"].shape == (B, T - 2, 16, 16, 3)
    sc = model.scores(seq)
    assert sc["nll"].shape == (B, T, D)


def test_images_change_the_posterior():
    cfg = image_cfg(16)
    torch.manual_seed(0)
    model = WorldModel(cfg).eval()
    seq = image_seq(cfg)
    a, _ = model.observe(seq, sample=False)
    seq.images = {"image": 255 - seq.images["image"]}
    b, _ = model.observe(seq, sample=False)
    assert not torch.allclose(a.post_logp, b.post_logp)


def test_model_rejects_missing_images():
    model = WorldModel(image_cfg(16))
    seq = image_seq(image_cfg(16))
    seq.images = {}
    with pytest.raises(AssertionError, match="image key 'image'"):
        model.loss(seq)


def test_config_rejects_bad_image_shapes():
    with pytest.raises(ValueError, match="3-16"):
        image_cfg(16, cnn_mults=[2, 3, 4, 4])
    with pytest.raises(ValueError, match="divide"):
        preset("debug", obs_dim=D, action_dim=A, image_keys=["image"], image_key_channels=[3], image_shape=[18, 16, 3])
    with pytest.raises(ValueError, match="dec_blocks"):
        image_cfg(16, cnn_depth=3)
    with pytest.raises(ValueError, match="one channel count per image key"):
        preset("debug", obs_dim=D, action_dim=A, image_keys=["a", "b"], image_key_channels=[3], image_shape=[16, 16, 6])
    # round trip through JSON-like dicts (the checkpoint) keeps the resolved multipliers
    cfg = image_cfg(32)
    assert WorldModelConfig.from_dict(cfg.to_dict()) == cfg


def test_vector_model_has_no_image_modules():
    model = WorldModel(preset("debug", obs_dim=D, action_dim=A))
    assert model.image_encoder is None and model.image_decoder is None
    assert not any("image" in n for n, _ in model.named_parameters())
