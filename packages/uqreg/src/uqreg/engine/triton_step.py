"""One Triton kernel for a whole training step of the ensemble networks (backend ``"triton"``).

The fused backend (:mod:`uqreg.engine.fused`) runs a step as some thirty kernels: every product,
activation, reduction and Adam's pass over the flat buffers reads and writes the chunk's
activations and parameters in device memory. For the paper's networks (d→128→64→32→1, 50 rows)
that traffic, not the products, bounds the step on a GPU: per epoch of 6,000 networks, about
5 GB against 0.85 ms of products (docs/gpu.md). Here ONE program per network runs the forward
pass, the backward pass, the L2 term and Adam's update: the parameters and Adam's two moments
are read and written once, no gradient is stored, and the element-wise work happens in
registers. The products' computed operands (``h1``, ``h2``, ``dz3``, ``dz2``) are written once
to the network's blocks of the workspace's activation buffers and read back in slices of
:data:`BLOCK_K` along the contracted dimension, mostly from the GPU's caches: Triton's exact
float32 product holds its operands' whole contracted dimension in each thread's registers, and
compiled for sm_90 the same step with whole 128-wide products spilled 27 KB per thread at 8
warps, against 0.3 KB now (``benchmarks/triton_resources.py`` measures this without a GPU).
Each parameter is updated once every thread of the program has read it (a barrier precedes
each update's stores: an element may be held by several threads).

What it covers (:func:`uncovered` says why a step is not): the deterministic head (the
ensembles ``ens``, ``ens_bs`` and ``ens_adv``) with the ½·MSE objective and unweighted rows,
three hidden layers (the paper's network and ``ens+``'s), float32. With FGSM the program runs two
passes: the first keeps its gradients in the workspace's gradient buffer and writes the
adversarial input ``x + ε·sign(dJ/dx)`` into the workspace's ``x_adv``; the second adds its
gradients to them before Adam, as the fused backend accumulates them. Other steps of a
``"triton"`` configuration run the fused backend's ops, so a sweep may mix methods freely.

Arithmetic: the same operations as the fused backend (``tests/test_triton_step.py`` checks the
kernel against it step by step, within float32 rounding), in another order: the products'
accumulation order and the row sums' reduction trees are Triton's. The products are exact
float32 (``input_precision="ieee"``: no TF32). A network's program reads and writes its own
blocks only, so its bits depend neither on the other networks nor on its position in the chunk,
and two runs on one GPU are bit-identical. Adam is PyTorch's (``torch._fused_adam_``'s
formulas: ``m ← β₁m + (1 − β₁)g``, ``v ← β₂v + (1 − β₂)g²``,
``w ← w − lr/(1 − β₁ᵗ) · m/(√v/√(1 − β₂ᵗ) + ε)``), with the coupled L2 added to the weights'
gradients or the decoupled decay applied to the weights first, as the fused backend does.

Rows and widths are padded to powers of two of at least 16 (what ``tl.dot`` needs): the padded
rows' loss gradient is zero, so they add exact zeros to every sum, and the padded columns read
zero weights and are never written.

On a machine without a GPU the kernel runs under Triton's interpreter (``TRITON_INTERPRET=1``,
set before this module is imported), which is how the tests check it on the CPU.
"""

from __future__ import annotations

import math
import os

import torch

from .config import ADAM_EPS

try:  # an optional dependency: uqreg[triton]; PyTorch's CUDA wheels bring it
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - reported by check_available
    triton = tl = None

#: Hidden layers the kernel is written for.
HIDDEN_LAYERS = 3
#: The slice of the contracted dimension a product reads from memory at a time. Triton's exact
#: float32 product (``input_precision="ieee"``, on the CUDA cores) holds its operands' whole
#: contracted dimension in each thread's registers: compiled for sm_90 at 4 warps, a 64×128 by
#: 128×64 product in one ``tl.dot`` spilled 12 KB per thread, in slices of 16 nothing (108
#: registers; docs/gpu.md).
BLOCK_K = 16
#: Warps per program (one program per network). Compiled for sm_90, the paper's network spills
#: least at 8 over the full and the FGSM step together (``benchmarks/triton_resources.py``); its
#: speed is not yet measured on a GPU: ``bench_engine.py --device cuda --triton-warps 4,8,16``.
NUM_WARPS = 8
#: The products' precision: ``"ieee"``, exact float32 on the CUDA cores (the backend's).
#: ``bench_engine.py --triton-precisions ieee,tf32x3`` also times ``"tf32x3"``: each product as
#: three TF32 tensor-core products, close to float32's rounding but not it, so not taken.
PRECISION = "ieee"


def interpreting() -> bool:
    """True when Triton runs kernels in its interpreter (``TRITON_INTERPRET=1``): on the CPU."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def check_available(device: torch.device) -> None:
    """Raise a ``RuntimeError`` naming what is missing when the kernel cannot run on ``device``:
    Triton itself, or a CUDA device (the CPU only under Triton's interpreter)."""
    if triton is None:
        raise RuntimeError("backend 'triton' needs the triton package: pip install 'uqreg[triton]' "
                           "(PyTorch's CUDA wheels bring it)")
    if device.type != "cuda" and not interpreting():
        raise RuntimeError(f"backend 'triton' runs on a CUDA device, not on {device.type!r} (on the CPU "
                           "only under Triton's interpreter, TRITON_INTERPRET=1, as the tests run it)")


def uncovered(ws, y: torch.Tensor) -> str | None:
    """Why the kernel does not cover a step of the workspace ``ws`` with targets ``y``, or None.

    Parameters
    ----------
    ws : uqreg.engine.fused.Workspace
    y : torch.Tensor, shape (B, N) or (B, N, 2)
        The training targets (with row weights when 3-D).
    """
    reasons = [
        (ws.head.name != "deterministic", f"head {ws.head.name!r} (the kernel has the deterministic head)"),
        (ws.mean_variance or ws.objective.name != "mse", f"objective {ws.objective.name!r} (the kernel has ½·MSE)"),
        (y.ndim != 2, "weighted rows"),
        (len(ws.h) != HIDDEN_LAYERS, f"{len(ws.h)} hidden layers (the kernel has {HIDDEN_LAYERS})"),
        (ws.params.dtype != torch.float32, f"dtype {ws.params.dtype} (the kernel is float32)"),
    ]
    return next((why for bad, why in reasons if bad), None)


def _pad(n: int) -> int:
    """``n`` rounded up to a power of two, at least 16 (``tl.dot``'s smallest dimension)."""
    return max(16, 1 << (int(n) - 1).bit_length())


class TritonStep:
    """The workspace's training step as one kernel launch (one program per network).

    Parameters
    ----------
    ws : uqreg.engine.fused.Workspace
        The chunk's workspace: its flat ``params``, ``exp_avg``, ``exp_avg_sq`` and ``step`` are
        read and updated in place; its activation buffers ``h`` and ``d`` hold the products'
        computed operands, and its ``grads`` FGSM's first pass (otherwise no gradient leaves the
        registers).
    num_warps : int, optional
        Warps per program; default :data:`NUM_WARPS` (read when the step is made).
    precision : str, optional
        The products' ``input_precision``; default :data:`PRECISION` (read when the step is made).
    """

    def __init__(self, ws, num_warps: int | None = None, precision: str | None = None):
        self.ws, self.num_warps = ws, int(NUM_WARPS if num_warps is None else num_warps)
        self.precision = PRECISION if precision is None else precision
        base = ws.params.storage_offset()
        # element offset of network 0's block and the network stride of W1..W4, b1..b4
        self.layout = []
        for t in [*ws.W, *ws.b]:
            if t.stride()[1:] != (t.shape[2], 1):  # the kernel indexes a block as row-major
                raise ValueError(f"a parameter block of strides {t.stride()} is not row-major")
            self.layout += [t.storage_offset() - base, t.stride(0)]
        # where the products read their computed operand from: h1, h2, dz3, dz2, in the blocks of
        # the fused step's activation buffers (rows of H1, H2, H3, H2 values)
        self.scratch = (ws.h[0], ws.h[1], ws.d[2], ws.d[1])
        for t in self.scratch:
            if t.stride()[1:] != (t.shape[2], 1):
                raise ValueError(f"an activation block of strides {t.stride()} is not row-major")
        d_in = ws.W[0].shape[1]
        h1, h2, h3 = (w.shape[2] for w in ws.W[:HIDDEN_LAYERS])
        cfg = ws.cfg
        lr, (b1, b2) = float(cfg.lr), (float(x) for x in cfg.betas)
        self.scalars = {"slope": float(ws.slope), "lr": lr, "beta1": b1, "beta2": b2,
                        "c_beta1": 1.0 - b1, "c_beta2": 1.0 - b2,
                        "log_beta1": math.log(b1) if b1 > 0 else -math.inf,
                        "log_beta2": math.log(b2) if b2 > 0 else -math.inf, "eps": ADAM_EPS,
                        "l2": 0.0 if ws.decoupled else ws.l2,
                        "decay": 1.0 - lr * ws.l2 if ws.decoupled else 1.0}
        self.shapes = {"D": d_in, "H1": h1, "H2": h2, "H3": h3, "P1": _pad(h1), "P2": _pad(h2), "P3": _pad(h3)}

    def __call__(self, xb: torch.Tensor, yb: torch.Tensor, fgsm_step: torch.Tensor | None = None) -> None:
        """One optimiser step on the batch ``xb (B, n, d)``, ``yb (B, n)`` (any strides); with
        ``fgsm_step (d,)``, FGSM's: the loss on ``xb`` plus the loss on
        ``xb + fgsm_step·sign(dJ/dxb)`` (the fused backend's :meth:`~uqreg.engine.fused.Workspace.gradients`)."""
        ws = self.ws
        n = yb.shape[1]
        xa = ws.x_adv
        ws.step.add_(1)
        _step_kernel[(ws.n_networks,)](
            ws.params, ws.grads, ws.exp_avg, ws.exp_avg_sq, ws.step, xb, yb, xa,
            ws.step if fgsm_step is None else fgsm_step, *self.scratch, *self.layout,
            xb.stride(0), xb.stride(1), xb.stride(2), yb.stride(0), yb.stride(1), *xa.stride(),
            *(t.stride(0) for t in self.scratch), n, 1.0 / n,
            **self.scalars, **self.shapes, NP=_pad(n), FGSM=fgsm_step is not None, PREC=self.precision,
            num_warps=self.num_warps)


if triton is not None:
    _BLOCK_K = tl.constexpr(BLOCK_K)

    @triton.jit
    def _mm(a_ptr, a_sm, a_sk, b_ptr, b_sk, b_sn, m_valid, k_valid, n_valid,
            M: tl.constexpr, K: tl.constexpr, N: tl.constexpr, PREC: tl.constexpr):
        """``A·B`` (M, N) of ``A (M, K)`` at ``a_ptr + m·a_sm + k·a_sk`` and ``B (K, N)`` at
        ``b_ptr + k·b_sk + n·b_sn`` (entries outside ``m_valid``, ``k_valid``, ``n_valid`` read
        as 0), in slices of :data:`BLOCK_K` along K read from memory, at ``input_precision``
        ``PREC``."""
        rm, rn, rk = tl.arange(0, M), tl.arange(0, N), tl.arange(0, _BLOCK_K)
        acc = tl.zeros((M, N), dtype=tl.float32)
        for k0 in tl.static_range(0, K, _BLOCK_K):
            kk = k0 + rk
            a = tl.load(a_ptr + rm[:, None] * a_sm + kk[None, :] * a_sk,
                        mask=(rm[:, None] < m_valid) & (kk[None, :] < k_valid), other=0.0)
            b = tl.load(b_ptr + kk[:, None] * b_sk + rn[None, :] * b_sn,
                        mask=(kk[:, None] < k_valid) & (rn[None, :] < n_valid), other=0.0)
            acc = tl.dot(a, b, acc, input_precision=PREC)
        return acc

    @triton.jit
    def _update(p_ptr, g_ptr, m_ptr, v_ptr, offs, mask, w, g, l2, decay, beta1, beta2, c_beta1, c_beta2,
                step_size, bc2_sqrt, eps, MODE: tl.constexpr):
        """The parameters at ``offs`` (value ``w``, this pass's gradient ``g``). ``MODE`` 0: Adam's
        update; 1 (FGSM's first pass): ``g`` stored in the gradient buffer; 2 (its second pass):
        Adam's update with the stored gradient plus ``g``. Before Adam, the coupled L2
        ``g + l2·w`` (``l2`` 0 for biases) and the decoupled decay ``decay·w`` (1 for biases).
        Every read of these parameters by any thread of the program comes before the barrier
        that precedes the stores (a tensor's element may be held by several threads)."""
        if MODE == 1:
            tl.store(g_ptr + offs, g, mask=mask)
        else:
            if MODE == 2:
                g = tl.load(g_ptr + offs, mask=mask, other=0.0) + g
            g = g + l2 * w
            w = w * decay
            m = tl.load(m_ptr + offs, mask=mask, other=0.0)
            v = tl.load(v_ptr + offs, mask=mask, other=0.0)
            m = beta1 * m + c_beta1 * g
            v = beta2 * v + c_beta2 * g * g
            # IEEE square root and divisions, as PyTorch's Adam (Triton's defaults are approximate on a GPU)
            w = w - tl.div_rn(step_size * m, tl.div_rn(tl.sqrt_rn(v), bc2_sqrt) + eps)
            tl.debug_barrier()
            tl.store(m_ptr + offs, m, mask=mask)
            tl.store(v_ptr + offs, v, mask=mask)
            tl.store(p_ptr + offs, w, mask=mask)

    @triton.jit
    def _activation_backward(p_ptr, g_ptr, m_ptr, v_ptr, d, h, s_dz, ob, b, rows, rmask, c, m, slope,
                             beta1, beta2, c_beta1, c_beta2, step_size, bc2_sqrt, eps, H: tl.constexpr,
                             MODE: tl.constexpr):
        """A hidden layer's leaky ReLU given ``d = dJ/dh``: ``dz = d·(h > 0 ? 1 : slope)`` written
        to the rows at ``s_dz`` (where :func:`_product_backward` reads it; a barrier follows),
        and the layer's bias ``b`` (at ``ob``) passed to :func:`_update` with ``Σ_rows dz``."""
        dz = tl.where(h > 0, d, d * slope)
        tl.store(s_dz + rows[:, None] * H + c[None, :], dz, mask=rmask[:, None] & m[None, :])
        tl.debug_barrier()
        _update(p_ptr, g_ptr, m_ptr, v_ptr, ob, m, b, tl.sum(dz, axis=0), 0.0, 1.0,
                beta1, beta2, c_beta1, c_beta2, step_size, bc2_sqrt, eps, MODE)

    @triton.jit
    def _product_backward(p_ptr, g_ptr, m_ptr, v_ptr, s_in, s_dz, ow, n_rows, c_in, m_in, c_out, m_out, l2, decay,
                          beta1, beta2, c_beta1, c_beta2, step_size, bc2_sqrt, eps, H_in: tl.constexpr,
                          H_out: tl.constexpr, NP: tl.constexpr, P_in: tl.constexpr, P_out: tl.constexpr,
                          PREC: tl.constexpr, MODE: tl.constexpr):
        """A layer ``z = h_in·W + b`` (``W`` at ``ow``, ``H_in × H_out``) given its input's rows at
        ``s_in`` and ``dz = dJ/dz``'s at ``s_dz``: ``W`` passed to :func:`_update` with the
        gradient ``h_inᵀ·dz``, and ``dJ/dh_in = dz·Wᵀ`` (NP, P_in) returned, computed from ``W``
        before its update."""
        gw = _mm(s_in, 1, H_in, s_dz, H_out, 1, H_in, n_rows, H_out, P_in, NP, P_out, PREC)
        d_in = _mm(s_dz, H_out, 1, p_ptr + ow, 1, H_out, n_rows, H_out, H_in, NP, P_out, P_in, PREC)
        offs = ow + c_in[:, None] * H_out + c_out[None, :]
        mask = m_in[:, None] & m_out[None, :]
        _update(p_ptr, g_ptr, m_ptr, v_ptr, offs, mask, tl.load(p_ptr + offs, mask=mask, other=0.0), gw, l2, decay,
                beta1, beta2, c_beta1, c_beta2, step_size, bc2_sqrt, eps, MODE)
        return d_in

    @triton.jit
    def _pass(p_ptr, g_ptr, m_ptr, v_ptr, x_row, sx_d, xa_row, sa_d, eps_ptr, y, n_rows, s1, s2, s3, s4,
              ow1, ow2, ow3, ow4, ob1, ob2, ob3, ob4,
              inv_n, slope, l2, decay, beta1, beta2, c_beta1, c_beta2, step_size, bc2_sqrt, eps,
              D: tl.constexpr, H1: tl.constexpr, H2: tl.constexpr, H3: tl.constexpr, NP: tl.constexpr,
              P1: tl.constexpr, P2: tl.constexpr, P3: tl.constexpr, PREC: tl.constexpr, MODE: tl.constexpr):
        """One forward and backward pass of a network on the rows at ``x_row`` (column stride
        ``sx_d``), each parameter passed to :func:`_update` once nothing reads it any more.
        ``ow*``, ``ob*``: the network's weight and bias blocks in the flat buffers; ``s1 … s4``:
        its blocks of the workspace's activation buffers (rows of ``H1``, ``H2``, ``H3``, ``H2``
        values), where the products read ``h1``, ``h2``, ``dz3`` and ``dz2`` from. ``MODE`` 1
        also writes FGSM's input ``x + ε·sign(dJ/dx)`` at ``xa_row``."""
        rows = tl.arange(0, NP)
        rmask = rows < n_rows
        c1, c2, c3 = tl.arange(0, P1), tl.arange(0, P2), tl.arange(0, P3)
        m1, m2, m3 = c1 < H1, c2 < H2, c3 < H3
        one = tl.arange(0, 1)  # the output bias, as a tensor of one element

        # forward: h = leaky_relu(x·W + b), layer by layer; pred = h3·w4 + b4
        b1 = tl.load(p_ptr + ob1 + c1, mask=m1, other=0.0)
        z1 = tl.zeros((NP, P1), dtype=tl.float32) + b1[None, :]
        for k in tl.static_range(D):
            xk = tl.load(x_row + k * sx_d, mask=rmask, other=0.0)
            z1 += xk[:, None] * tl.load(p_ptr + ow1 + k * H1 + c1, mask=m1, other=0.0)[None, :]
        h1 = tl.where(z1 > 0, z1, z1 * slope)
        tl.store(s1 + rows[:, None] * H1 + c1[None, :], h1, mask=rmask[:, None] & m1[None, :])
        tl.debug_barrier()
        b2 = tl.load(p_ptr + ob2 + c2, mask=m2, other=0.0)
        z2 = _mm(s1, H1, 1, p_ptr + ow2, H2, 1, n_rows, H1, H2, NP, P1, P2, PREC) + b2[None, :]
        h2 = tl.where(z2 > 0, z2, z2 * slope)
        tl.store(s2 + rows[:, None] * H2 + c2[None, :], h2, mask=rmask[:, None] & m2[None, :])
        tl.debug_barrier()
        b3 = tl.load(p_ptr + ob3 + c3, mask=m3, other=0.0)
        z3 = _mm(s2, H2, 1, p_ptr + ow3, H3, 1, n_rows, H2, H3, NP, P2, P3, PREC) + b3[None, :]
        h3 = tl.where(z3 > 0, z3, z3 * slope)
        w4 = tl.load(p_ptr + ow4 + c3, mask=m3, other=0.0)
        b4 = tl.load(p_ptr + ob4 + one)
        pred = tl.sum(h3 * w4[None, :], axis=1) + b4
        g = tl.where(rmask, (pred - y) * inv_n, 0.0)  # dJ/dpred of ½·mean (pred − y)²

        # backward: the output layer, then each hidden layer's dz = dJ/dh·(h > 0 ? 1 : slope),
        # bias gradient Σ_rows dz, weight gradient h_inᵀ·dz and dJ/dh_in = dz·Wᵀ
        _activation_backward(p_ptr, g_ptr, m_ptr, v_ptr, g[:, None] * w4[None, :], h3, s3, ob3 + c3, b3, rows,
                             rmask, c3, m3, slope, beta1, beta2, c_beta1, c_beta2, step_size, bc2_sqrt, eps, H3, MODE)
        _update(p_ptr, g_ptr, m_ptr, v_ptr, ow4 + c3, m3, w4, tl.sum(h3 * g[:, None], axis=0), l2, decay,
                beta1, beta2, c_beta1, c_beta2, step_size, bc2_sqrt, eps, MODE)
        _update(p_ptr, g_ptr, m_ptr, v_ptr, ob4 + one, one < 1, b4, tl.sum(g, axis=0, keep_dims=True), 0.0, 1.0,
                beta1, beta2, c_beta1, c_beta2, step_size, bc2_sqrt, eps, MODE)
        d2 = _product_backward(p_ptr, g_ptr, m_ptr, v_ptr, s2, s3, ow3, n_rows, c2, m2, c3, m3, l2, decay,
                               beta1, beta2, c_beta1, c_beta2, step_size, bc2_sqrt, eps, H2, H3, NP, P2, P3, PREC,
                               MODE)
        h2 = tl.load(s2 + rows[:, None] * H2 + c2[None, :], mask=rmask[:, None] & m2[None, :], other=0.0)
        _activation_backward(p_ptr, g_ptr, m_ptr, v_ptr, d2, h2, s4, ob2 + c2, b2, rows, rmask, c2, m2, slope,
                             beta1, beta2, c_beta1, c_beta2, step_size, bc2_sqrt, eps, H2, MODE)
        d1 = _product_backward(p_ptr, g_ptr, m_ptr, v_ptr, s1, s4, ow2, n_rows, c1, m1, c2, m2, l2, decay,
                               beta1, beta2, c_beta1, c_beta2, step_size, bc2_sqrt, eps, H1, H2, NP, P1, P2, PREC,
                               MODE)
        h1 = tl.load(s1 + rows[:, None] * H1 + c1[None, :], mask=rmask[:, None] & m1[None, :], other=0.0)
        dz1 = tl.where(h1 > 0, d1, d1 * slope)
        for k in tl.static_range(D):
            xk = tl.load(x_row + k * sx_d, mask=rmask, other=0.0)
            w1k = tl.load(p_ptr + ow1 + k * H1 + c1, mask=m1, other=0.0)
            if MODE == 1:  # FGSM's input: dJ/dx_k = dz1·W1[k]ᵀ, a reduction over the layer's units
                dxk = tl.sum(dz1 * w1k[None, :], axis=1)
                sign = tl.where(dxk > 0, 1.0, tl.where(dxk < 0, -1.0, 0.0))
                tl.store(xa_row + k * sa_d, sign * tl.load(eps_ptr + k) + xk, mask=rmask)
            _update(p_ptr, g_ptr, m_ptr, v_ptr, ow1 + k * H1 + c1, m1, w1k, tl.sum(xk[:, None] * dz1, axis=0), l2,
                    decay, beta1, beta2, c_beta1, c_beta2, step_size, bc2_sqrt, eps, MODE)
        _update(p_ptr, g_ptr, m_ptr, v_ptr, ob1 + c1, m1, b1, tl.sum(dz1, axis=0), 0.0, 1.0,
                beta1, beta2, c_beta1, c_beta2, step_size, bc2_sqrt, eps, MODE)

    @triton.jit
    def _step_kernel(p_ptr, g_ptr, m_ptr, v_ptr, step_ptr, x_ptr, y_ptr, xa_ptr, eps_ptr, s1_ptr, s2_ptr, s3_ptr,
                     s4_ptr, o_w1, s_w1, o_w2, s_w2, o_w3, s_w3, o_w4, s_w4,
                     o_b1, s_b1, o_b2, s_b2, o_b3, s_b3, o_b4, s_b4,
                     sx_b, sx_n, sx_d, sy_b, sy_n, sa_b, sa_n, sa_d, ss1, ss2, ss3, ss4, n_rows, inv_n,
                     slope, lr, beta1, beta2, c_beta1, c_beta2, log_beta1, log_beta2, eps, l2, decay,
                     D: tl.constexpr, H1: tl.constexpr, H2: tl.constexpr, H3: tl.constexpr,
                     P1: tl.constexpr, P2: tl.constexpr, P3: tl.constexpr, NP: tl.constexpr,
                     FGSM: tl.constexpr, PREC: tl.constexpr):
        i = tl.program_id(0).to(tl.int64)
        rows = tl.arange(0, NP)
        # Adam's bias corrections 1 − βᵗ in float64: in float32, βᵗ near 1 would lose them
        step = tl.load(step_ptr).to(tl.float64)
        step_size = (lr / (1.0 - tl.exp(step * log_beta1))).to(tl.float32)
        bc2_sqrt = tl.sqrt(1.0 - tl.exp(step * log_beta2)).to(tl.float32)  # float64: IEEE on a GPU too
        x_row = x_ptr + i * sx_b + rows * sx_n
        xa_row = xa_ptr + i * sa_b + rows * sa_n
        y = tl.load(y_ptr + i * sy_b + rows * sy_n, mask=rows < n_rows, other=0.0)
        s1, s2, s3, s4 = s1_ptr + i * ss1, s2_ptr + i * ss2, s3_ptr + i * ss3, s4_ptr + i * ss4
        ow1, ow2, ow3, ow4 = o_w1 + i * s_w1, o_w2 + i * s_w2, o_w3 + i * s_w3, o_w4 + i * s_w4
        ob1, ob2, ob3, ob4 = o_b1 + i * s_b1, o_b2 + i * s_b2, o_b3 + i * s_b3, o_b4 + i * s_b4
        if FGSM:  # the gradients of the pass on x, kept in the gradient buffer; then the pass on x_adv
            _pass(p_ptr, g_ptr, m_ptr, v_ptr, x_row, sx_d, xa_row, sa_d, eps_ptr, y, n_rows, s1, s2, s3, s4,
                  ow1, ow2, ow3, ow4, ob1, ob2, ob3, ob4, inv_n, slope, l2, decay, beta1, beta2, c_beta1, c_beta2,
                  step_size, bc2_sqrt, eps, D, H1, H2, H3, NP, P1, P2, P3, PREC, 1)
            tl.debug_barrier()  # the first pass's stores are read by other threads of the program
            _pass(p_ptr, g_ptr, m_ptr, v_ptr, xa_row, sa_d, xa_row, sa_d, eps_ptr, y, n_rows, s1, s2, s3, s4,
                  ow1, ow2, ow3, ow4, ob1, ob2, ob3, ob4, inv_n, slope, l2, decay, beta1, beta2, c_beta1, c_beta2,
                  step_size, bc2_sqrt, eps, D, H1, H2, H3, NP, P1, P2, P3, PREC, 2)
        else:
            _pass(p_ptr, g_ptr, m_ptr, v_ptr, x_row, sx_d, xa_row, sa_d, eps_ptr, y, n_rows, s1, s2, s3, s4,
                  ow1, ow2, ow3, ow4, ob1, ob2, ob3, ob4, inv_n, slope, l2, decay, beta1, beta2, c_beta1, c_beta2,
                  step_size, bc2_sqrt, eps, D, H1, H2, H3, NP, P1, P2, P3, PREC, 0)


__all__ = ["BLOCK_K", "HIDDEN_LAYERS", "NUM_WARPS", "PRECISION", "TritonStep", "check_available", "interpreting", "uncovered"]
