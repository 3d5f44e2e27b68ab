"""Per-sample MC-dropout masks: torch's arithmetic, batch independence, the global RNG."""

import numpy as np
import pytest
import torch
from torch import nn

from uqvision.models import DROPOUT_TYPES
from uqvision.training.dropout import PerSampleDropout, apply_dropout_mask

# (type, input shape): feature dropout needs (N, C, ...) with its own spatial rank
SHAPES = {nn.Dropout: (4, 6, 5), nn.Dropout1d: (4, 6, 5), nn.Dropout2d: (4, 6, 5, 3),
          nn.Dropout3d: (4, 6, 3, 2, 2), nn.AlphaDropout: (4, 6, 5),
          nn.FeatureAlphaDropout: (4, 6, 5, 3)}


@pytest.mark.parametrize("kind", DROPOUT_TYPES, ids=lambda k: k.__name__)
def test_masks_reproduce_torch_train_mode_output(kind):
    """Given the mask torch drew, apply_dropout_mask gives torch's output bit for bit."""
    module = kind(0.3).train()
    x = torch.randn(SHAPES[kind], generator=torch.Generator().manual_seed(0))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        out = module(x)
    if kind in (nn.AlphaDropout, nn.FeatureAlphaDropout):  # dropped -> one constant value
        dropped = apply_dropout_mask(module, torch.zeros(()), torch.zeros((), dtype=torch.bool))
        keep = out != dropped
    else:
        keep = out != 0
    if kind not in (nn.Dropout, nn.AlphaDropout):  # whole channels
        keep = keep.flatten(2).any(-1).reshape(*x.shape[:2], *(1,) * (x.ndim - 2))
    assert 0 < keep.float().mean() < 1
    torch.testing.assert_close(apply_dropout_mask(module, x, keep), out, rtol=0, atol=0)


def _net():
    return nn.Sequential(nn.Dropout(0.3), nn.Identity(), nn.Dropout(0.5))  # two draws per pass


def test_masks_depend_on_seed_pass_and_sample_only():
    net, x = _net(), torch.ones(10, 40)
    with PerSampleDropout(net, seed=3) as mc:
        mc.start_pass(2, range(10))
        full = net(x)
        parts = []
        for chunk in (range(3), range(3, 7), range(7, 10)):  # other batch sizes
            mc.start_pass(2, chunk)
            parts.append(net(x[chunk.start:chunk.stop]))
        mc.start_pass(2, range(9, -1, -1))  # reversed batch order
        reverse = net(x).flip(0)
        mc.start_pass(3, range(10))
        other_pass = net(x)
    with PerSampleDropout(net, seed=4) as mc:
        mc.start_pass(2, range(10))
        other_seed = net(x)
    assert torch.equal(torch.cat(parts), full) and torch.equal(reverse, full)
    assert not torch.equal(other_pass, full) and not torch.equal(other_seed, full)
    assert not torch.equal(full[0], full[1])  # samples get their own masks


def test_drop_rate_within_binomial_error():
    net, x = nn.Sequential(nn.Dropout(0.3)), torch.ones(20, 500)
    with PerSampleDropout(net, seed=0) as mc:
        mc.start_pass(0, range(20))
        dropped = (net(x) == 0).float().mean().item()
    se = np.sqrt(0.3 * 0.7 / x.numel())
    assert abs(dropped - 0.3) < 4 * se


def test_the_global_rng_is_never_touched():
    net = _net()
    torch.manual_seed(7)
    before = torch.get_rng_state()
    with PerSampleDropout(net, seed=0) as mc:
        mc.start_pass(0, range(4))
        net(torch.ones(4, 8))
    assert torch.equal(torch.get_rng_state(), before)


def test_misuse_raises():
    net = _net()
    with PerSampleDropout(net, seed=0) as mc:
        with pytest.raises(RuntimeError, match="start_pass"):
            net(torch.ones(2, 3))
        mc.start_pass(0, range(3))
        with pytest.raises(ValueError, match="batch-first"):
            net(torch.ones(2, 3))
    with pytest.raises(ValueError, match="batched"), PerSampleDropout(nn.Dropout1d(0.5), 0) as mc:
        mc.start_pass(0, range(2))
        mc.model(torch.ones(2, 3))
