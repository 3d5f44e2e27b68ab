"""Learning-rate schedules of the Pitfalls paper (Ashukha et al., 2020, appendix B) and recipes.

Pure functions of the step position; the training methods compose them in their ``lr_at`` hook.
Each is written in the paper's own variables so that a test can check it against the equation.

- :func:`linear_decay_lr` — eq. (10), the "conventional network" schedule (Table 1) that also
  pre-trains FGE, SWAG, VI and K-FAC Laplace.
- :func:`cosine_cycle_lr` — eq. (16), the cosine cycles of snapshot ensembles and cyclical SGLD.
- :func:`fge_lr` and :func:`fge_cycle_position` — eq. (17), fast geometric ensembling's
  piecewise-linear cycles.
- :func:`one_cycle_lr` — torch's ``OneCycleLR`` (cosine annealing), the project's AdamW recipe.

:data:`SCHEDULES` registers the whole-run schedules a single-network recipe can choose by name
(``TrainRecipe.schedule``): ``f(step, total_steps, steps_per_epoch, lr) -> float`` with ``step`` the
0-based gradient step whose learning rate is wanted.

References
----------
.. [1] Ashukha, Lyzhov, Molchanov, Vetrov. Pitfalls of in-domain uncertainty estimation and
   ensembling in deep learning. ICLR 2020 (appendix B, eqs. 10, 16, 17).
.. [2] Huang et al. Snapshot ensembles: train 1, get M for free. ICLR 2017.
.. [3] Garipov et al. Loss surfaces, mode connectivity, and fast ensembling of DNNs. NeurIPS 2018.
"""

from __future__ import annotations

import math

from uqmetrics.metrics.registry import Registry

__all__ = [
    "SCHEDULES",
    "cosine_cycle_lr",
    "fge_cycle_position",
    "fge_lr",
    "linear_decay_lr",
    "one_cycle_lr",
]


def linear_decay_lr(i: float, epochs: float, lr_init: float) -> float:
    """Eq. (10): constant for the first half, linear decay to 1 % by 90 %, then constant.

    Parameters
    ----------
    i : float
        Position in epochs, ``0 <= i <= epochs`` (fractional epochs allowed).
    epochs : float
        Length of the run (> 0).
    lr_init : float

    Notes
    -----
    .. math::
        lr(i) = lr_{init} \\begin{cases} 1 & i/E \\le 0.5 \\\\
        1 - 0.99 (i/E - 0.5)/0.4 & 0.5 < i/E \\le 0.9 \\\\ 0.01 & \\text{otherwise} \\end{cases}

    Examples
    --------
    >>> [round(linear_decay_lr(i, 100, 0.1), 6) for i in (0, 50, 70, 90, 99)]
    [0.1, 0.1, 0.0505, 0.001, 0.001]
    """
    if not epochs > 0:
        raise ValueError(f"epochs must be > 0, got {epochs!r}")
    t = i / epochs
    if t <= 0.5:
        factor = 1.0
    elif t <= 0.9:
        factor = 1.0 - 0.99 * (t - 0.5) / 0.4
    else:
        factor = 0.01
    return lr_init * factor


def cosine_cycle_lr(t: int, total: int, cycles: int, lr0: float) -> float:
    """Eq. (16): ``M`` cosine cycles over ``T`` iterations, each from ``lr0`` towards zero.

    Parameters
    ----------
    t : int
        Iteration, 1-based (``1 <= t <= T``).
    total : int
        ``T``, the number of iterations of the run.
    cycles : int
        ``M``, the number of cycles.
    lr0 : float
        ``alpha_0``, the learning rate at the start of each cycle.

    Notes
    -----
    .. math:: \\alpha(t) = \\frac{\\alpha_0}{2}\\left(\\cos\\left(\\frac{\\pi\\,
        \\mathrm{mod}(t-1, \\lceil T/M\\rceil)}{\\lceil T/M\\rceil}\\right) + 1\\right)

    Examples
    --------
    >>> [round(cosine_cycle_lr(t, 40, 4, 0.2), 6) for t in (1, 6, 11, 16)]
    [0.2, 0.1, 0.2, 0.1]
    """
    if t < 1 or cycles < 1 or total < cycles:
        raise ValueError(f"need 1 <= t and 1 <= cycles <= total, got t={t!r}, "
                         f"total={total!r}, cycles={cycles!r}")
    length = math.ceil(total / cycles)
    return lr0 / 2 * (math.cos(math.pi * ((t - 1) % length) / length) + 1)


def fge_cycle_position(i: int, cycle: int) -> float:
    """``t(i) = (mod(i - 1, c) + 1) / c`` in (0, 1]: where iteration ``i`` (1-based) sits in its
    cycle of ``c`` iterations (Garipov et al.'s FGE).

    Examples
    --------
    >>> [fge_cycle_position(i, 4) for i in (1, 2, 4, 5)]
    [0.25, 0.5, 1.0, 0.25]
    """
    if i < 1 or cycle < 1:
        raise ValueError(f"need i >= 1 and cycle >= 1, got i={i!r}, cycle={cycle!r}")
    return ((i - 1) % cycle + 1) / cycle


def fge_lr(t: float, alpha1: float, alpha2: float) -> float:
    """Eq. (17): linear from ``alpha1`` down to ``alpha2`` at mid-cycle and back up.

    Parameters
    ----------
    t : float
        Position in the cycle, ``0 < t <= 1`` (:func:`fge_cycle_position`).
    alpha1, alpha2 : float
        The largest and the smallest learning rate.

    Notes
    -----
    .. math:: \\alpha(i) = \\begin{cases} (1 - 2t)\\alpha_1 + 2t\\alpha_2 & 0 < t \\le 1/2 \\\\
        (2 - 2t)\\alpha_2 + (2t - 1)\\alpha_1 & 1/2 < t \\le 1 \\end{cases}

    Examples
    --------
    >>> [round(fge_lr(t, 0.05, 0.0005), 6) for t in (0.25, 0.5, 0.75, 1.0)]
    [0.02525, 0.0005, 0.02525, 0.05]
    """
    if not 0 < t <= 1:
        raise ValueError(f"t must be in (0, 1], got {t!r}")
    if t <= 0.5:
        return (1 - 2 * t) * alpha1 + 2 * t * alpha2
    return (2 - 2 * t) * alpha2 + (2 * t - 1) * alpha1


def one_cycle_lr(step: int, total_steps: int, max_lr: float, *, pct_start: float = 0.3,
                 div_factor: float = 25.0, final_div_factor: float = 1e4) -> float:
    """torch's ``OneCycleLR`` (cosine annealing, two phases) at 0-based ``step``.

    Warm-up from ``max_lr / div_factor`` to ``max_lr`` over ``pct_start`` of the run, then
    cosine annealing to ``max_lr / div_factor / final_div_factor``. This is the recipe
    uqvision's AdamW training used before the method registry (Smith & Topin's 1cycle).

    Examples
    --------
    >>> round(one_cycle_lr(0, 100, 1.0), 12), round(one_cycle_lr(29, 100, 1.0), 12)
    (0.04, 1.0)
    """
    if not 0 <= step < total_steps:
        raise ValueError(f"step must be in [0, {total_steps}), got {step!r}")
    initial = max_lr / div_factor
    final = initial / final_div_factor
    warm_end = float(pct_start * total_steps) - 1
    if step <= warm_end:
        start, end, pct = initial, max_lr, step / warm_end
    else:
        start, end, pct = max_lr, final, (step - warm_end) / (total_steps - 1 - warm_end)
    return end + (start - end) / 2 * (math.cos(math.pi * pct) + 1)


SCHEDULES: Registry = Registry("schedule")
"""Whole-run schedules of a single network: ``f(step, total_steps, steps_per_epoch, lr)``."""


@SCHEDULES.register(name="linear_decay")
def _linear_decay(step: int, total_steps: int, steps_per_epoch: int, lr: float) -> float:
    """eq. (10) of Pitfalls: flat for half the run, linear decay to 1 % by 90 %, flat."""
    return linear_decay_lr(step, total_steps, lr)


@SCHEDULES.register(name="onecycle")
def _onecycle(step: int, total_steps: int, steps_per_epoch: int, lr: float) -> float:
    """torch OneCycleLR (cosine) peaking at lr: uqvision's former AdamW recipe."""
    return one_cycle_lr(step, total_steps, lr)


@SCHEDULES.register(name="imagenet_step")
def _imagenet_step(step: int, total_steps: int, steps_per_epoch: int, lr: float) -> float:
    """lr * 0.1 ** (epoch // 30): Pitfalls' ImageNet ResNet-50 recipe."""
    return lr * 0.1 ** ((step // steps_per_epoch) // 30)


@SCHEDULES.register(name="constant")
def _constant(step: int, total_steps: int, steps_per_epoch: int, lr: float) -> float:
    """the initial learning rate throughout."""
    return lr
