"""The gradient check shared by the two-output objectives' tests (``+mv``'s Gaussian NLL in
test_meanvar.py, ``+qr``'s pinball pair in test_cqr.py): the fused step's hand-written
gradients of every parameter equal autograd's."""

from __future__ import annotations

import torch

from uqreg.engine.fused import Workspace, l2_of
from uqreg.engine.train import objective


def assert_fused_gradients_equal_autograd(model, cfg, n_train: int, fgsm: bool, label: str) -> None:
    """Every parameter's gradient of ``model`` (a :class:`~uqreg.engine.BatchedMLP` of 3
    networks with two output layers, inputs of dimension 2) on one seeded batch, with FGSM
    steps when ``fgsm``, from :class:`~uqreg.engine.fused.Workspace` against autograd of the
    objective plus the coupled L2 (every weight and the second output's weight), float64."""
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(3, n_train, 2, generator=gen, dtype=torch.float64)
    y = torch.randn(3, n_train, generator=gen, dtype=torch.float64)
    step = torch.tensor([0.05, 0.2], dtype=torch.float64) if fgsm else None
    params = [*model.weights, *model.biases, *model.head_params.values(), model.var_weight, model.var_bias]
    expected = torch.autograd.grad(objective(model, x, y, 4, fgsm_step=step).sum(), params)
    l2, _ = l2_of(cfg, n_train)
    ws = Workspace(model, n_train, l2=l2, decoupled=False)
    ws.load(model)
    ws.gradients(x, y, 4, model.dropout_keys, step)
    actual = ws.gW + ws.gb + list(ws.ghp.values()) + [ws.gWv, ws.gbv]
    assert len(actual) == len(expected)
    penalised = set(range(len(model.weights))) | {len(params) - 2}
    for i, (a, e) in enumerate(zip(actual, expected)):
        e = e + l2 * params[i].detach() if i in penalised else e
        torch.testing.assert_close(a, e, rtol=1e-10, atol=1e-12 * float(e.abs().max()) + 1e-300,
                                   msg=lambda m, i=i: f"{label} parameter {i}: {m}")
