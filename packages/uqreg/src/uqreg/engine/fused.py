"""The fused training path: a hand-written forward/backward of the stacked MLP, one flat parameter
buffer and ONE fused Adam call per step, with every buffer allocated once per chunk.

The autograd path (:func:`uqreg.engine.train.train_batched` with ``backend="autograd"``)
records a graph, allocates every activation and gradient anew, and steps eight parameter
tensors per step. Here, for the ``B`` networks of a chunk:

* parameters live in ONE flat buffer (weights of every layer, then biases and the head's
  parameters, each part padded to a multiple of :data:`PAD`, and every network's block of every
  part, like every activation and input buffer, starting at an aligned address:
  :func:`~uqreg.engine.network.aligned_blocks`); weights ``W[l] (B, fan_in, fan_out)``,
  biases ``b[l] (B, 1, fan_out)`` and head parameters are views into it, and the gradients,
  Adam's moments and the step count are flat buffers of the same layout, so one
  ``torch._fused_adam_`` call steps everything (the padding keeps every parameter in the
  vectorised body of the kernels over the buffer: a scalar tail can round differently, e.g.
  fused Adam's, which would make a network's result depend on its position in the chunk);
* a hidden layer is ``baddbmm`` (``addcmul`` when its fan-in is 1) followed by an in-place
  leaky ReLU; the backward reuses the activation as the mask (``leaky_relu_backward`` on the
  result: one pass, gradient × (h > 0 ? 1 : slope)) and writes ``dW = hᵀ·dz`` and
  ``dX = dz·Wᵀ`` with ``out=`` into buffers allocated once per chunk; a coupled L2 adds
  ``λ·W`` to the weights' gradients in one op over the weights' part of the flat buffer;
* the k→1 output layer is a reduction over k (forward) and over the rows (its weight
  gradient), never a GEMV; so is the weight gradient of a first layer with fan-in 1 (a
  one-row product): BLAS computes a product with a dimension of 1 in a batch of one network
  with another kernel than in a larger batch (measured: MKL's one-row ``bmm`` of one network
  differs in the last bits from the same product in a batch of 40, on AMD Zen and Intel
  AVX-512 alike, whatever ``ATEN_CPU_CAPABILITY`` or ``MKL_ENABLE_INSTRUCTIONS`` say), so no
  product the engine sends to BLAS has a dimension of 1;
* no op whose rounding may differ between a kernel's vectorised body and its scalar tail
  (``torch.sigmoid``, multiply-adds such as ``addcmul`` or ``add(alpha=)``) runs over a
  tensor whose flattened position depends on the chunk: :func:`~uqreg.engine.heads.sigmoid`
  and separate multiplies and adds instead, so a network's bits do not depend on its chunk;
* each head (:data:`FUSED_HEADS`, one per entry of :data:`~uqreg.engine.heads.HEADS`) draws its
  noise with the registered head's own ``draw``, and writes its forward and the backward of its
  forward and of its regulariser by hand; FGSM (``fgsm_step``) takes the input gradient
  ``dz₁·W₁ᵀ`` of the first pass and accumulates the second pass's gradients;
* a mean–variance network (objective ``gaussian_nll``) has a second k→1 output layer, the
  variance output, whose weight and bias sit in the flat buffer after the layers' weights and
  biases (so the coupled L2 reaches its weight, never its bias); :meth:`Workspace.output_forward`
  and :meth:`Workspace.output_backward` compute it from the same input as the mean for every
  head, and the registered objective's ``grad`` gives dJ/dμ and dJ/ds. A quantile network
  (objective ``pinball``, docs/conventions.md#r-6-cqr) is the same two-output network: its
  outputs are ``q_lo`` and ``q_hi`` and the objective's ``grad`` gives dJ/dq_lo and dJ/dq_hi.

The result is the same network as the autograd path's (``tests/test_fused.py`` checks every
gradient against autograd and Adam steps against ``torch.optim.Adam``/``AdamW`` in float64;
``tests/test_engine.py`` checks the fused engine against the plain per-network loop).
"""

from __future__ import annotations

import itertools
import math
import threading
from collections.abc import Callable

import torch
from uqmetrics.metrics.registry import Registry

from .config import ADAM_EPS, TrainConfig
from .heads import CONCRETE_EPS, LOG_ALPHA_RANGE, MOLCHANOV_K, clipped_log_alpha, sigmoid
from .network import BatchedMLP, aligned_blocks, block_stride, empty_aligned
from .samplers import SAMPLERS

#: The flat buffers are padded to a multiple of this many elements (see the module notes).
PAD = 64

_leaky_relu_ = torch.nn.functional.leaky_relu_
_leaky_relu_backward = torch.ops.aten.leaky_relu_backward.grad_input


class Workspace:
    """Every buffer one chunk's training step needs, allocated once and reused every step.

    Parameters
    ----------
    model : BatchedMLP
        The ``B`` networks (their parameters are copied in by :meth:`load`).
    n_rows : int
        Rows of one training batch.
    l2 : float
        Factor of the L2 penalty on the weights.
    decoupled : bool
        False: ``gradient += l2·W`` (coupled); True: ``W ← W − lr·l2·W`` before each Adam step.

    Attributes
    ----------
    sigma : float
        The σ of the head's regulariser σ²·KL/N, the model's
        :attr:`~uqreg.engine.network.BatchedMLP.regulariser_sigma` (1 for a mean–variance network).
    params, grads, exp_avg, exp_avg_sq : torch.Tensor, shape (P,)
        Flat buffers: weights of every layer, padding, biases of every layer, head parameters,
        padding (the first :attr:`n_weights` elements are the weights' part).
    W, b, gW, gb : list of torch.Tensor
        Views: ``W[l] (B, fan_in, fan_out)``, ``b[l] (B, 1, fan_out)`` and their gradients.
    hp, ghp : dict of torch.Tensor
        Views of the head's parameters and their gradients (``model.head_params`` names).
    h, d : list of torch.Tensor, each (B, n, width)
        Per hidden layer: the activation (the pre-activation, overwritten in place) and the
        gradient flowing back through it.
    """

    def __init__(self, model: BatchedMLP, n_rows: int, *, l2: float, decoupled: bool):
        b = model.n_networks
        w0 = model.weights[0]
        kw = {"dtype": w0.dtype, "device": w0.device}
        self.n_networks, self.n_rows = b, n_rows
        self.n_train, self.sigma, self.cfg = model.n_train, model.regulariser_sigma, model.cfg
        self.slope = model.cfg.negative_slope
        self.l2, self.decoupled = float(l2), bool(decoupled)
        self.head = FUSED_HEADS.lookup(model.head.name)
        self.draw = model.head.draw if model.head.stochastic else None
        self.objective = model.objective
        self.mean_variance = mv = model.objective.mean_variance
        names = list(model.head_params)
        weights, biases = model.weight_parameters(), model.bias_parameters()  # + the variance output's
        shapes = ([tuple(w.shape[1:]) for w in weights] + [tuple(x.shape[1:]) for x in biases]
                  + [tuple(model.head_params[k].shape[1:]) for k in names])
        # every network's block of every part starts at an aligned address (aligned_blocks)
        sizes = [b * block_stride(math.prod(s), w0.dtype) for s in shapes]
        n_layers, n_w = len(model.weights), len(weights)

        def padded(n: int) -> int:
            return -(-n // PAD) * PAD

        # [weights | padding | biases, head parameters | padding]: ops over the weights part (the
        # coupled L2, the decoupled decay) and over everything (Adam) have no scalar tail; the
        # padding between blocks is zero with zero gradients, so Adam leaves it zero
        self.n_weights = padded(sum(sizes[:n_w]))
        offsets = list(itertools.accumulate(sizes[:n_w], initial=0))[:-1]
        offsets += list(itertools.accumulate(sizes[n_w:], initial=self.n_weights))
        total = padded(offsets.pop())
        self.params = torch.zeros(total, **kw)
        self.grads = torch.zeros(total, **kw)
        self.exp_avg = torch.zeros(total, **kw)
        self.exp_avg_sq = torch.zeros(total, **kw)
        self.step = torch.zeros((), dtype=torch.float32, device=w0.device)

        def views(buf: torch.Tensor) -> list[torch.Tensor]:
            return [aligned_blocks(buf[o:o + size], b, s) for o, size, s in zip(offsets, sizes, shapes)]

        p, g = views(self.params), views(self.grads)
        self._views = p
        self.W, self.b, self.gW, self.gb = p[:n_layers], p[n_w:n_w + n_layers], g[:n_layers], g[n_w:n_w + n_layers]
        # the variance output layer of a mean–variance network: weight (B, k, 1), bias (B, 1, 1)
        self.Wv, self.bv, self.gWv, self.gbv = (p[n_layers], p[n_w + n_layers], g[n_layers], g[n_w + n_layers]) \
            if mv else (None,) * 4
        self.hp = dict(zip(names, p[2 * n_w:]))
        self.ghp = dict(zip(names, g[2 * n_w:]))
        widths = [w.shape[2] for w in model.weights]  # fan-out of every layer, the last is 1
        d_in, k = w0.shape[1], model.weights[-1].shape[1]
        self.h = [empty_aligned(b, (n_rows, w), **kw) for w in widths[:-1]]
        self.d = [empty_aligned(b, (n_rows, w), **kw) for w in widths[:-1]]
        self.dx = empty_aligned(b, (n_rows, d_in), **kw)
        # the batch's inputs, copied into aligned blocks when a product reads them (fan-in > 1)
        self.x = empty_aligned(b, (n_rows, d_in), **kw) if d_in > 1 and len(widths) > 1 else None
        # the products of a fan-in-1 first layer's weight gradient when its dz is read after it
        # (FGSM's input gradient): made at the first such step (weight_grad)
        self.first_tmp = None
        # the head's input (the last activation, or x without hidden layers) and its gradient
        self.head_input = self.h[-1] if self.h else None
        self.d_head = self.d[-1] if self.d else self.dx
        self.row_tmp = torch.empty(b, 1, max(d_in, *widths), **kw)
        self.out_tmp = torch.empty(b, n_rows, k, **kw)
        self.pred = torch.empty(b, n_rows, 1, **kw)
        self.g = torch.empty(b, n_rows, 1, **kw)
        # a mean–variance network's raw variance output and dJ/d(raw)
        self.raw = torch.empty(b, n_rows, 1, **kw) if mv else None
        self.g_raw = torch.empty(b, n_rows, 1, **kw) if mv else None
        self.x_adv = empty_aligned(b, (n_rows, d_in), **kw)
        self.buf = self.head.buffers(b, n_rows, k, kw)
        # the whole step as one kernel (backend "triton", :func:`use_kernel`), or None
        self.kernel = None

    # -- parameters in and out ------------------------------------------------------------------
    def _pairs(self, model: BatchedMLP):
        return zip(self._views, model.weight_parameters() + model.bias_parameters()
                   + list(model.head_params.values()))

    @torch.no_grad()
    def load(self, model: BatchedMLP) -> None:
        """Copy the model's parameters in and reset Adam's state."""
        for mine, theirs in self._pairs(model):
            mine.copy_(theirs)
        for t in (self.grads, self.exp_avg, self.exp_avg_sq, self.step):
            t.zero_()

    @torch.no_grad()
    def store(self, model: BatchedMLP) -> None:
        """Copy the trained parameters back into the model."""
        for mine, theirs in self._pairs(model):
            theirs.copy_(mine)

    # -- the layers -----------------------------------------------------------------------------
    def forward(self, x: torch.Tensor, noise) -> torch.Tensor:
        """``x (B, n, d)`` → predictions ``(B, n, 1)``; activations stay in :attr:`h`."""
        h = x
        for layer, z in enumerate(self.h):
            if h.shape[2] == 1:  # a 1-D input: the layer is an outer product
                torch.addcmul(self.b[layer], h, self.W[layer], out=z)
            else:
                torch.baddbmm(self.b[layer], h, self.W[layer], out=z)
            _leaky_relu_(z, self.slope)
            h = z
        self.head_input = h
        return self.head.forward(self, h, noise)

    def weight_grad(self, layer: int, inp: torch.Tensor, dz: torch.Tensor, acc: bool, *,
                    dz_read_after: bool = True) -> None:
        """``gW[layer] = inpᵀ·dz``, or ``+=`` when ``acc``.

        With a fan-in of 1 the product has one row (``(B, 1, n)·(B, n, w)``): a reduction over
        the rows, never a GEMM, because BLAS libraries compute a one-row product of a batch of
        one with a different kernel (and summation order) than the same product in a larger
        batch, so a network alone in its chunk would round differently. Its elementwise
        products overwrite ``dz`` unless ``dz_read_after``: a buffer of ``dz``'s size less in
        the chunk's working set (with a temporary, the paper-e1 cell's step on two CPU workers
        was about 8 % slower; packages/uqreg/README.md, Performance).
        """
        gw, inp_t = self.gW[layer], inp.transpose(1, 2)
        if inp.shape[2] == 1:
            if dz_read_after:
                if self.first_tmp is None:
                    self.first_tmp = torch.empty_like(dz)
                prod = torch.mul(inp, dz, out=self.first_tmp)
            else:
                prod = dz.mul_(inp)
            self.row_sum(prod, gw, acc)
        elif acc:
            torch.baddbmm(gw, inp_t, dz, out=gw)
        else:
            torch.bmm(inp_t, dz, out=gw)

    def row_sum(self, src: torch.Tensor, dst: torch.Tensor, acc: bool) -> None:
        """``dst = Σ_rows src`` (``src (B, n, k)``, ``dst (B, 1, k)``), or ``+=`` when ``acc``."""
        if acc:
            tmp = self.row_tmp[:, :, :dst.shape[2]]
            torch.sum(src, 1, keepdim=True, out=tmp)
            dst.add_(tmp)
        else:
            torch.sum(src, 1, keepdim=True, out=dst)

    def bias_grad(self, layer: int, dz: torch.Tensor, acc: bool) -> None:
        """``gb[layer] = Σ_rows dz``, or ``+=`` when ``acc``."""
        self.row_sum(dz, self.gb[layer], acc)

    def output_forward(self, h: torch.Tensor) -> torch.Tensor:
        """The k→1 output layer as a reduction over k: ``Σ_k h_k·w_k + b``, (B, n, 1). A
        mean–variance network's variance output layer reads the same ``h`` (the head's
        :meth:`~uqreg.engine.heads.Head.variance_input`) and writes :attr:`raw`."""
        torch.mul(h, self.W[-1].transpose(1, 2), out=self.out_tmp)
        torch.sum(self.out_tmp, 2, keepdim=True, out=self.pred)
        if self.mean_variance:
            torch.mul(h, self.Wv.transpose(1, 2), out=self.out_tmp)
            torch.sum(self.out_tmp, 2, keepdim=True, out=self.raw)
            self.raw.add_(self.bv)
        return self.pred.add_(self.b[-1])

    def output_backward(self, h: torch.Tensor, g: torch.Tensor, acc: bool) -> torch.Tensor:
        """Output-layer gradients from ``g = dJ/dpred (B, n, 1)`` given its input ``h``; returns
        ``d_head = g·wᵀ`` (B, n, k), the gradient reaching ``h`` (plus ``g_raw·w_vᵀ`` and the
        variance output layer's gradients from :attr:`g_raw` for a mean–variance network)."""
        self.row_sum(torch.mul(h, g, out=self.out_tmp), self.gW[-1].transpose(1, 2), acc)  # (B, 1, k)
        self.bias_grad(-1, g, acc)
        d = torch.mul(g, self.W[-1].transpose(1, 2), out=self.d_head)
        if self.mean_variance:
            gr = self.g_raw
            self.row_sum(torch.mul(h, gr, out=self.out_tmp), self.gWv.transpose(1, 2), acc)
            self.row_sum(gr, self.gbv, acc)
            d.add_(torch.mul(gr, self.Wv.transpose(1, 2), out=self.out_tmp))
        return d

    def backward(self, x: torch.Tensor, g: torch.Tensor, *, acc: bool, input_grad: bool) -> None:
        """Backpropagate ``g = dJ/dpred (B, n, 1)`` of the forward pass on ``x``: writes (``acc``:
        adds) every parameter's gradient; ``input_grad``: also ``dx = dJ/dx`` (B, n, d)."""
        self.head.backward(self, g, acc)
        for layer in reversed(range(len(self.h))):
            dz = self.d[layer]
            _leaky_relu_backward(dz, self.h[layer], self.slope, True, grad_input=dz)
            inp = x if layer == 0 else self.h[layer - 1]
            self.bias_grad(layer, dz, acc)  # first: a fan-in-1 weight gradient may overwrite dz
            self.weight_grad(layer, inp, dz, acc, dz_read_after=layer > 0 or input_grad)
            w_t = self.W[layer].transpose(1, 2)
            if layer > 0:
                torch.bmm(dz, w_t, out=self.d[layer - 1])
            elif input_grad and w_t.shape[2] == 1:  # a 1-D input: a reduction, not a GEMV
                torch.mul(dz, self.W[0], out=dz)
                torch.sum(dz, 2, keepdim=True, out=self.dx)
            elif input_grad:
                torch.bmm(dz, w_t, out=self.dx)

    def loss_grad(self, pred: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """dJ/dpred of the per-network ½·mean (pred − y)²: ``(pred − y)/n``, (B, n, 1); for a
        mean–variance network, of its objective (:attr:`objective`'s ``grad``), which also writes
        dJ/d(raw) into :attr:`g_raw`."""
        if self.mean_variance:
            g_mean, g_raw = self.objective.grad(pred, self.raw, y[..., None], self.cfg)
            self.g_raw.copy_(g_raw)
            return self.g.copy_(g_mean)
        if y.ndim == 3:  # targets and row weights w: w·(pred − y)/n
            torch.sub(pred, y[..., :1], out=self.g).mul_(y[..., 1:])
            return self.g.mul_(1.0 / y.shape[1])
        torch.sub(pred, y[..., None], out=self.g)
        return self.g.mul_(1.0 / y.shape[1])

    def adam(self, lr: float, betas: tuple[float, float]) -> None:
        """ONE fused Adam step over the flat buffer (the decoupled decay first, as AdamW)."""
        self.step.add_(1)
        if self.decoupled and self.l2:
            self.params[:self.n_weights].mul_(1.0 - lr * self.l2)
        torch._fused_adam_([self.params], [self.grads], [self.exp_avg], [self.exp_avg_sq], [], [self.step],
                           lr=lr, beta1=betas[0], beta2=betas[1], weight_decay=0.0, eps=ADAM_EPS,
                           amsgrad=False, maximize=False)

    def gradients(self, xb: torch.Tensor, yb: torch.Tensor, counter: int, keys: torch.Tensor,
                  fgsm_step: torch.Tensor | None) -> None:
        """Write into :attr:`grads` the gradient of the summed per-network objective on the batch
        ``xb (B, n, d)``, ``yb (B, n)`` (the autograd path's :func:`~uqreg.engine.train.objective`)
        plus the coupled L2 term; ``counter`` and ``keys`` index the head's draws."""
        k = self.W[-1].shape[1]
        n = yb.shape[1]
        kw = {"dtype": xb.dtype, "device": xb.device}
        if self.x is not None:
            xb = self.x.copy_(xb)
        noise = None if self.draw is None else self.draw(keys, counter, n, k, **kw)
        self.backward(xb, self.loss_grad(self.forward(xb, noise), yb), acc=False, input_grad=fgsm_step is not None)
        if fgsm_step is not None:  # FGSM: x + ε·sign(∇ₓ loss), its loss added
            torch.sign(self.dx, out=self.x_adv)
            self.x_adv.mul_(fgsm_step).add_(xb)
            noise = None if self.draw is None else self.draw(keys, counter + 1, n, k, **kw)
            self.backward(self.x_adv, self.loss_grad(self.forward(self.x_adv, noise), yb), acc=True,
                          input_grad=False)
        self.head.regulariser_backward(self)
        if self.l2 and not self.decoupled:  # the coupled L2: every weight's gradient += l2·W, one op
            self.grads[:self.n_weights].add_(self.params[:self.n_weights], alpha=self.l2)

    def train_step(self, xb: torch.Tensor, yb: torch.Tensor, counter: int, keys: torch.Tensor,
                   fgsm_step: torch.Tensor | None) -> None:
        """One optimiser step: :meth:`gradients`, then :meth:`adam`; or the :attr:`kernel`."""
        if self.kernel is not None:
            self.kernel(xb, yb, fgsm_step)
            return
        self.gradients(xb, yb, counter, keys, fgsm_step)
        self.adam(self.cfg.lr, self.cfg.betas)


# ---------------------------------------------------------------------------------------------
# the heads' backward passes


class FusedHead:
    """The fused forward/backward of a registered head (:data:`~uqreg.engine.heads.HEADS`, same
    name); this one is the deterministic head's. Shapes: ``h (B, n, k)``, ``g = dJ/dpred
    (B, n, 1)``; ``acc`` means add to the gradients instead of writing them."""

    name = "deterministic"

    def buffers(self, b: int, n: int, k: int, kw: dict) -> dict[str, torch.Tensor]:
        """Extra per-chunk buffers."""
        return {}

    def forward(self, ws: Workspace, h: torch.Tensor, noise) -> torch.Tensor:
        return ws.output_forward(h)

    def backward(self, ws: Workspace, g: torch.Tensor, acc: bool) -> None:
        """Gradients of the output layer and the head's parameters, and ``ws.d_head = dJ/dh``."""
        ws.output_backward(ws.head_input, g, acc)

    def regulariser_backward(self, ws: Workspace) -> None:
        """Add the gradient of the head's regulariser."""


class FusedBernoulli(FusedHead):
    """``h̃ = h·keep``, ``keep = [u ≥ p]/(1 − p)``; ``dJ/dh = (g·wᵀ)·keep``."""

    name = "bernoulli"

    def buffers(self, b, n, k, kw):
        return {"keep": torch.empty(b, n, k, **kw), "ht": torch.empty(b, n, k, **kw)}

    def forward(self, ws, h, noise):
        p = ws.cfg.dropout
        keep = ws.buf["keep"]
        torch.ge(noise, p, out=keep)
        keep.div_(1.0 - p)
        return ws.output_forward(torch.mul(h, keep, out=ws.buf["ht"]))

    def backward(self, ws, g, acc):
        ws.output_backward(ws.buf["ht"], g, acc).mul_(ws.buf["keep"])


def _write(grad: torch.Tensor, value: torch.Tensor, acc: bool) -> None:
    if acc:
        grad.add_(value)
    else:
        grad.copy_(value)


class FusedConcrete(FusedHead):
    """Concrete dropout: ``keep = (1 − z)/(1 − p)``, ``z = σ((logit_ε p + logit_ε u)/t)``,
    ``p = σ(ρ)``.

    Notes
    -----
    With ``a(p) = log(p + ε) − log(1 − p + ε)``:
    ``∂keep/∂p = (keep − z(1 − z)·a'(p)/t)/(1 − p)``, ``a'(p) = 1/(p + ε) + 1/(1 − p + ε)``,
    ``∂p/∂ρ = p(1 − p)``. Regulariser ``R = c_w‖W‖²/(1 − p) + c_d·K·(p log p + (1 − p) log(1 − p))``
    (:func:`~uqreg.engine.heads.concrete_regulariser`, ``c_w = σ²l²/(2N)``, ``c_d = σ²/N``,
    σ = :attr:`Workspace.sigma`, 1 for a mean–variance network):
    ``∂R/∂W = 2c_w·W/(1 − p)``, ``∂R/∂p = c_w‖W‖²/(1 − p)² + c_d·K·(log p − log(1 − p))``.
    """

    name = "concrete"

    def buffers(self, b, n, k, kw):
        return {name: torch.empty(b, n, k, **kw) for name in ("keep", "ht", "tmp")}

    def forward(self, ws, h, noise):
        eps, t = CONCRETE_EPS, ws.cfg.concrete_temperature
        p = sigmoid(ws.hp["p_logit"])  # (B, 1, 1)
        logit = torch.log(noise + eps, out=ws.buf["tmp"])
        logit.sub_(torch.log1p(-noise + eps)).add_(torch.log(p + eps) - torch.log1p(-p + eps)).div_(t)
        ws.buf["z"] = z = sigmoid(logit)
        keep = ws.buf["keep"]
        torch.mul(z, -1.0, out=keep)
        keep.add_(1.0).div_(1.0 - p)
        return ws.output_forward(torch.mul(h, keep, out=ws.buf["ht"]))

    def backward(self, ws, g, acc):
        eps, t = CONCRETE_EPS, ws.cfg.concrete_temperature
        z, keep, dkeep = ws.buf["z"], ws.buf["keep"], ws.buf["tmp"]
        d = ws.output_backward(ws.buf["ht"], g, acc)  # dJ/dh̃
        torch.mul(d, ws.head_input, out=dkeep)  # dJ/dkeep
        d.mul_(keep)
        p = sigmoid(ws.hp["p_logit"])
        s_keep = (dkeep * keep).sum(dim=(1, 2), keepdim=True)
        s_z = (dkeep * z * (1.0 - z)).sum(dim=(1, 2), keepdim=True)
        da = 1.0 / (p + eps) + 1.0 / (1.0 - p + eps)
        dp = (s_keep - da / t * s_z) / (1.0 - p)
        _write(ws.ghp["p_logit"], dp * p * (1.0 - p), acc)

    def regulariser_backward(self, ws):
        p = sigmoid(ws.hp["p_logit"])
        w = ws.W[-1]
        s2 = ws.sigma * ws.sigma
        c_w = s2 * ws.cfg.concrete_length_scale**2 / (2.0 * ws.n_train)
        c_d = s2 / ws.n_train
        ws.gW[-1].add_(w * (2.0 * c_w / (1.0 - p)))
        dp = (c_w * w.pow(2).sum(dim=(1, 2), keepdim=True) / (1.0 - p) ** 2
              + c_d * w.shape[1] * (torch.log(p) - torch.log1p(-p)))
        ws.ghp["p_logit"].add_(dp * p * (1.0 - p))


class FusedVariational(FusedHead):
    """Variational dropout, local reparameterisation: ``pred = μ + sqrt(v + 1e-12)·ζ``,
    ``μ = hw + b``, ``v = Σ_k h_k² α_k w_k²``, ``α = exp(clip(log α))``.

    Notes
    -----
    With ``s = g·ζ/(2·sqrt(v + 1e-12))`` and ``S_k = Σ_n h_nk² α_k s_n``:
    ``∂J/∂w_k = Σ_n h_nk g_n + 2 w_k S_k``, ``∂J/∂h_nk = g_n w_k + 2 h_nk α_k w_k² s_n``,
    ``∂J/∂log α_k = w_k² S_k`` inside the clipping range (0 outside, as ``clamp``'s gradient).
    Regulariser ``R = −(σ²/N) Σ_k [k₁σ(k₂ + k₃ log α_k) − ½ log(1 + 1/α_k) − k₁]``
    (:func:`~uqreg.engine.heads.variational_regulariser`):
    ``∂R/∂log α_k = −(σ²/N)·[k₁k₃ s(1 − s) + ½σ(−log α_k)]``, ``s = σ(k₂ + k₃ log α_k)``.
    """

    name = "variational"

    def buffers(self, b, n, k, kw):
        return {"h2a": torch.empty(b, n, k, **kw), "tmp": torch.empty(b, n, k, **kw),
                "std": torch.empty(b, n, 1, **kw), "s": torch.empty(b, n, 1, **kw),
                "spread": torch.empty(b, n, 1, **kw)}

    @staticmethod
    def _in_range(log_alpha):
        return (log_alpha >= LOG_ALPHA_RANGE[0]) & (log_alpha <= LOG_ALPHA_RANGE[1])

    def forward(self, ws, h, noise):
        buf = ws.buf
        buf["alpha"] = alpha = clipped_log_alpha(ws.hp["log_alpha"]).exp()  # (B, 1, k)
        buf["noise"] = noise[..., None]  # (B, n, 1)
        w2 = ws.W[-1].pow(2).transpose(1, 2)
        torch.mul(h, h, out=buf["h2a"]).mul_(alpha)
        torch.mul(buf["h2a"], w2, out=buf["tmp"])
        torch.sum(buf["tmp"], 2, keepdim=True, out=buf["std"])
        buf["std"].add_(1e-12).sqrt_()
        return ws.output_forward(h).add_(torch.mul(buf["std"], buf["noise"], out=buf["spread"]))

    def backward(self, ws, g, acc):
        buf = ws.buf
        w_t = ws.W[-1].transpose(1, 2)  # (B, 1, k)
        s = torch.mul(g, buf["noise"], out=buf["s"]).div_(buf["std"]).mul_(0.5)
        big_s = torch.mul(buf["h2a"], s, out=buf["tmp"]).sum(dim=1, keepdim=True)  # (B, 1, k)
        d = ws.output_backward(ws.head_input, g, acc)
        ws.gW[-1].transpose(1, 2).add_(w_t * big_s * 2.0)
        d.add_(torch.mul(ws.head_input, buf["alpha"], out=buf["tmp"]).mul_(s).mul_(w_t.pow(2)).mul_(2.0))
        la = ws.hp["log_alpha"]
        _write(ws.ghp["log_alpha"], w_t.pow(2) * big_s * self._in_range(la), acc)

    def regulariser_backward(self, ws):
        k1, k2, k3 = MOLCHANOV_K
        raw = ws.hp["log_alpha"]
        la = clipped_log_alpha(raw)
        s = sigmoid(k2 + k3 * la)
        d_neg_kl = k1 * k3 * s * (1.0 - s) + 0.5 * sigmoid(-la)
        ws.ghp["log_alpha"].sub_(d_neg_kl * self._in_range(raw) * (ws.sigma * ws.sigma / ws.n_train))


FUSED_HEADS: Registry[FusedHead] = Registry("fused head")
for _head in (FusedHead(), FusedBernoulli(), FusedConcrete(), FusedVariational()):
    FUSED_HEADS.register(_head)
del _head


def supports(head: str, cfg: TrainConfig) -> bool:
    """True when the fused path can train this head under ``cfg``: the head has a fused backward
    and the leaky-ReLU slope is positive (the activation's sign is then the pre-activation's,
    so the backward can take its mask from the activation)."""
    return head in FUSED_HEADS and cfg.negative_slope > 0


def l2_of(cfg: TrainConfig, n_train: int) -> tuple[float, bool]:
    """The recipe's L2 factor on the weights and whether it is decoupled (AdamW)."""
    recipe = cfg.recipe_spec
    return recipe.weight_decay(n_train, cfg.weight_decay), recipe.decoupled


def use_kernel(ws: Workspace, y: torch.Tensor) -> bool:
    """Give ``ws`` the whole step as one Triton kernel (backend ``"triton"``,
    :mod:`uqreg.engine.triton_step`) where the kernel covers its steps; returns whether it does
    (the fused ops run the others). ``RuntimeError`` when Triton or a CUDA device is missing."""
    from . import triton_step  # Triton only where the backend asks for it

    triton_step.check_available(ws.params.device)
    if triton_step.uncovered(ws, y) is not None:
        return False
    ws.kernel = triton_step.TritonStep(ws)
    return True


def run_epoch(ws: Workspace, smp, x: torch.Tensor, y: torch.Tensor, epoch: int | torch.Tensor, *,
              keys: torch.Tensor, boot_keys: torch.Tensor, fgsm_step: torch.Tensor | None) -> None:
    """One epoch's optimiser steps (the sampler's batches), the draws of step ``s`` counted
    ``2·(epoch·steps + s)`` (and ``+ 1`` for FGSM's second pass). ``epoch`` is an int, or a 0-d
    int64 tensor on the device (:func:`uqreg.rng.uniform`: the same numbers), which a CUDA
    graph of the epoch reads when replayed."""
    steps = smp.steps(ws.cfg)
    for step, (xb, yb) in enumerate(smp.batches(x, y, boot_keys, epoch, ws.cfg)):
        ws.train_step(xb, yb, 2 * (epoch * steps + step), keys, fgsm_step)


#: Serialises the graph captures of concurrent chunks (``parallel_chunks``: one thread each).
_CAPTURE = threading.Lock()


def train_graphed(epoch: Callable[[int | torch.Tensor], None], epochs: int, device: torch.device,
                  progress: Callable[[int], None] | None = None) -> None:
    """Run ``epoch(e)`` for ``e = 0 … epochs − 1`` on CUDA: the first eagerly (it warms up the
    kernels and the cuBLAS workspace on the stream the graph is captured on), the others as
    replays of ONE CUDA graph of an epoch, captured once, whose epoch counter is a device
    tensor that the graph itself increments. A replay launches the epoch's kernels (hundreds:
    every layer's products, the head, Adam) as one graph launch; it runs exactly the kernels
    of the eager epoch, on the same buffers (the workspace allocates them once), so the
    result is the eager path's bit for bit (checked on CUDA by ``tests/test_fused.py``).

    Parameters
    ----------
    epoch : callable
        One epoch's steps given the epoch (an int64 0-d tensor on ``device`` here); it must not
        read a device value on the host (no ``.item()``), as captured work is not run.
    epochs : int
    device : torch.device
        A CUDA device.
    progress : callable, optional
        Called with 1 after each epoch.
    """
    counter = torch.zeros((), dtype=torch.int64, device=device)

    def body():
        epoch(counter)
        counter.add_(1)

    side = torch.cuda.Stream(device=device)  # captures need a stream other than the default one
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        body()
        if progress is not None:
            progress(1)
        if epochs > 1:
            graph = torch.cuda.CUDAGraph()
            with _CAPTURE:  # thread-local mode: the other chunks' threads go on launching work
                graph.capture_begin(capture_error_mode="thread_local")
                try:
                    body()
                finally:
                    graph.capture_end()
            for _ in range(1, epochs):
                graph.replay()
                if progress is not None:
                    progress(1)
    torch.cuda.current_stream(device).wait_stream(side)


def train_fused(model: BatchedMLP, x: torch.Tensor, y: torch.Tensor, *, keys: torch.Tensor,
                boot_keys: torch.Tensor, sampler: str, fgsm_step: torch.Tensor | None, epochs: int,
                progress: Callable[[int], None] | None = None) -> BatchedMLP:
    """Train ``model`` in place with the fused step.

    Parameters
    ----------
    model : BatchedMLP
        ``B`` networks, initialised; trained in place and returned.
    x : torch.Tensor, shape (B, N, d)
        Training inputs of every network (may be an expanded view).
    y : torch.Tensor, shape (B, N)
        Training targets of every network.
    keys, boot_keys : torch.Tensor, int64, shape (B,)
        Keys of the head's draws and of the sampler's draws.
    sampler : str
        Name in :data:`~uqreg.engine.samplers.SAMPLERS`.
    fgsm_step : torch.Tensor, shape (d,), optional
        FGSM step ε per input dimension (adversarial training), or None.
    epochs : int
    progress : callable, optional
        Called with 1 after each epoch.

    Returns
    -------
    BatchedMLP
        ``model``.
    """
    cfg = model.cfg
    smp = SAMPLERS.lookup(sampler)
    x = x.contiguous()
    l2, decoupled = l2_of(cfg, model.n_train)
    ws = Workspace(model, smp.rows(x.shape[1], cfg), l2=l2, decoupled=decoupled)
    ws.load(model)
    if cfg.backend == "triton":
        use_kernel(ws, y)

    def epoch(e):
        run_epoch(ws, smp, x, y, e, keys=keys, boot_keys=boot_keys, fgsm_step=fgsm_step)

    if cfg.cuda_graphs and x.device.type == "cuda":
        train_graphed(epoch, epochs, x.device, progress)
    else:
        for e in range(epochs):
            epoch(e)
            if progress is not None:
                progress(1)
    ws.store(model)
    return model


__all__ = ["ADAM_EPS", "FUSED_HEADS", "PAD", "FusedHead", "Workspace", "l2_of", "run_epoch", "supports",
           "train_fused", "train_graphed", "use_kernel"]
