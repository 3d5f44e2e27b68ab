"""Input conversion and validation at the public boundary.

Every public metric converts its inputs with :func:`as_numpy` and validates them with the
``check_*`` helpers below, which raise :class:`ValueError` naming the argument and quoting the
offending shape or value. Metrics never ``assert`` on user input.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import xarray as xr

#: Absolute tolerance on ``sum(probs, axis=-1) == 1``.
PROB_SUM_ATOL = 1e-4


def as_numpy(x: Any, name: str, *, dtype: Any = None) -> np.ndarray:
    """Convert a numpy array, torch tensor, xarray object or sequence to a numpy array.

    Parameters
    ----------
    x : array_like, torch.Tensor, xarray.DataArray
        Input. Torch tensors are detached and moved to the CPU; a floating dtype numpy lacks
        (``bfloat16``, the float8 types) is widened to float32, which holds its values
        exactly. xarray objects give their ``.values`` (dims are the caller's responsibility).
    name : str
        Argument name used in error messages.
    dtype : numpy dtype, optional
        Target dtype.

    Returns
    -------
    numpy.ndarray
    """
    if x is None:
        raise ValueError(f"{name} must be an array, got None")
    mod = type(x).__module__
    if mod.startswith("torch"):
        x = x.detach().cpu()
        try:
            x = x.numpy()
        except TypeError as exc:  # a dtype numpy has no equivalent of
            if not x.is_floating_point():
                raise ValueError(f"{name} has torch dtype {x.dtype}, which numpy cannot "
                                 "hold") from exc
            x = x.float().numpy()  # bfloat16, float8: float32 holds every value exactly
    elif mod.startswith("xarray"):
        x = x.values
    try:
        arr = np.asarray(x, dtype=dtype)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} could not be converted to an array: {exc}") from exc
    if arr.dtype == object:
        raise ValueError(f"{name} must be numeric, got an object array of shape {arr.shape}")
    return arr


def check_finite(arr: np.ndarray, name: str) -> np.ndarray:
    """Raise if ``arr`` contains NaN or inf."""
    if arr.dtype.kind in "fc" and not np.all(np.isfinite(arr)):
        bad = np.argwhere(~np.isfinite(arr))[0]
        raise ValueError(
            f"{name} contains non-finite values (first at index {tuple(int(i) for i in bad)}: "
            f"{arr[tuple(bad)]!r})"
        )
    return arr


def check_nonempty(arr: np.ndarray, name: str) -> np.ndarray:
    if arr.size == 0 or (arr.ndim >= 1 and arr.shape[0] == 0):
        raise ValueError(f"{name} is empty (shape {arr.shape})")
    return arr


def numeric_array(x: Any, name: str) -> np.ndarray:
    """Convert to a finite float64 array of any shape, non-empty unless 0-d."""
    arr = as_numpy(x, name)
    if arr.dtype.kind not in "biuf":
        raise ValueError(f"{name} must be numeric, got dtype {arr.dtype}")
    arr = arr.astype(np.float64, copy=False)
    if arr.ndim:
        check_nonempty(arr, name)
    return check_finite(arr, name)


def check_positive(arr: np.ndarray, name: str, *, strict: bool) -> np.ndarray:
    """Raise unless every entry is ``> 0`` (``strict``) or ``>= 0``, quoting the first bad one."""
    bad = (arr <= 0) if strict else (arr < 0)
    if bad.any():
        i = tuple(int(j) for j in np.argwhere(bad)[0])
        rel = "> 0" if strict else ">= 0"
        raise ValueError(f"{name} must be {rel}, got {arr[i]!r} at index {i}")
    return arr


def check_positive_number(value: Any, name: str) -> float:
    """A finite scalar ``> 0`` (a temperature, an interval multiplier ``z``)."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a positive number, got {value!r}") from None
    if not (np.isfinite(v) and v > 0):
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")
    return v


def check_same_shape(**arrays: np.ndarray) -> None:
    """Raise if the named arrays do not all have the shape of the first."""
    shapes = {k: v.shape for k, v in arrays.items()}
    first_name, first = next(iter(shapes.items()))
    for k, s in shapes.items():
        if s != first:
            raise ValueError(
                f"{k} must have the same shape as {first_name} {first}, got shape {s}"
            )


def check_broadcast(**arrays: np.ndarray) -> tuple[np.ndarray, ...]:
    """The named arrays broadcast against each other; ``ValueError`` naming them otherwise."""
    names = tuple(arrays)
    try:
        return tuple(np.broadcast_arrays(*arrays.values()))
    except ValueError:
        desc = ", ".join(f"{n} {a.shape}" for n, a in arrays.items())
        raise ValueError(f"{names[0]} and {', '.join(names[1:])} cannot be broadcast together: "
                         f"{desc}") from None


def check_counts(successes: Any, trials: Any) -> tuple[np.ndarray, np.ndarray]:
    """Binomial counts ``0 <= successes <= trials``, ``trials >= 1``, broadcast together."""
    s = numeric_array(successes, "successes")
    n = numeric_array(trials, "trials")
    for arr, name in ((s, "successes"), (n, "trials")):
        if not np.all(arr == np.round(arr)):
            raise ValueError(f"{name} must be integer counts, got {arr[arr != np.round(arr)][0]!r}")
    if (n < 1).any():
        raise ValueError(f"trials must be >= 1, got {n[n < 1][0]!r}")
    if (s < 0).any():
        raise ValueError(f"successes must be >= 0, got {s[s < 0][0]!r}")
    s, n = check_broadcast(successes=s, trials=n)
    if (s > n).any():
        i = tuple(int(j) for j in np.argwhere(s > n)[0])
        raise ValueError(f"successes must be <= trials, got {s[i]!r} > {n[i]!r} at index {i}")
    return s, n


def dataarrays(**inputs: Any) -> dict[str, xr.DataArray]:
    """xarray path: DataArrays (or scalars) only, numeric and finite, aligned exactly."""
    out = {}
    for name, x in inputs.items():
        if isinstance(x, xr.DataArray):
            da = x
        elif np.ndim(as_numpy(x, name)) == 0:
            da = xr.DataArray(as_numpy(x, name))
        else:
            raise ValueError(
                f"{name} must be an xarray.DataArray (or a scalar) when another input is one; "
                f"got {type(x).__name__} (mixing labelled and unlabelled arrays is ambiguous)"
            )
        if da.dtype.kind not in "biuf":
            raise ValueError(f"{name} must be numeric, got dtype {da.dtype}")
        numeric_array(da, name)
        out[name] = da.astype(np.float64)
    try:
        aligned = xr.align(*out.values(), join="exact")
    except ValueError as exc:
        raise ValueError(f"{', '.join(out)} have conflicting coordinates: {exc}") from None
    return dict(zip(out, aligned, strict=True))


def check_ndim(arr: np.ndarray, name: str, ndim: int, shape_doc: str) -> np.ndarray:
    if arr.ndim != ndim:
        raise ValueError(f"{name} must have shape {shape_doc}, got shape {arr.shape}")
    return arr


def float_array(x: Any, name: str, ndim: int, shape_doc: str, *, dtype=np.float64) -> np.ndarray:
    """Convert to a finite, non-empty float array with ``ndim`` dimensions."""
    arr = as_numpy(x, name)
    if arr.dtype.kind not in "biuf":
        raise ValueError(f"{name} must be numeric, got dtype {arr.dtype}")
    arr = arr.astype(dtype, copy=False)
    check_ndim(arr, name, ndim, shape_doc)
    check_nonempty(arr, name)
    return check_finite(arr, name)


def check_probs(probs: Any, name: str = "probs") -> np.ndarray:
    """Validate class probabilities of shape (n, C): finite, in [0, 1], rows summing to 1."""
    p = float_array(probs, name, 2, "(n_samples, n_classes)")
    if p.shape[1] < 2:
        raise ValueError(f"{name} must have at least 2 classes, got shape {p.shape}")
    if p.min() < 0 or p.max() > 1 + PROB_SUM_ATOL:
        raise ValueError(f"{name} must lie in [0, 1], got range [{p.min():.6g}, {p.max():.6g}]")
    s = p.sum(axis=1)
    bad = np.abs(s - 1) > PROB_SUM_ATOL
    if bad.any():
        i = int(np.argmax(bad))
        raise ValueError(
            f"{name} rows must sum to 1 (atol {PROB_SUM_ATOL}), row {i} sums to {s[i]:.6g}"
        )
    return p


def check_labels(labels: Any, n_classes: int | None = None, name: str = "labels") -> np.ndarray:
    """Validate integer class labels of shape (n,), in ``[0, n_classes)`` when given."""
    y = as_numpy(labels, name)
    check_ndim(y, name, 1, "(n_samples,)")
    check_nonempty(y, name)
    if y.dtype.kind == "f":
        check_finite(y, name)
        if not np.all(y == np.round(y)):
            raise ValueError(f"{name} must be integers, got non-integer values such as {y[y != np.round(y)][0]!r}")
    elif y.dtype.kind not in "iub":
        raise ValueError(f"{name} must be integer class indices, got dtype {y.dtype}")
    y = y.astype(np.int64)
    if n_classes is not None and (y.min() < 0 or y.max() >= n_classes):
        bad = y[(y < 0) | (y >= n_classes)][0]
        raise ValueError(f"{name} must lie in [0, {n_classes}), got {int(bad)}")
    return y


def check_same_length(**arrays: np.ndarray) -> None:
    """Raise if the leading dimensions of the named arrays differ."""
    lengths = {k: v.shape[0] for k, v in arrays.items()}
    if len(set(lengths.values())) > 1:
        desc = ", ".join(f"{k} has {n}" for k, n in lengths.items())
        raise ValueError(f"inputs must have the same number of samples: {desc}")


def labels_probs(labels: Any, probs: Any) -> tuple[np.ndarray, np.ndarray]:
    """Validate a (labels (n,), probs (n, C)) pair."""
    p = check_probs(probs)
    y = check_labels(labels, p.shape[1])
    check_same_length(labels=y, probs=p)
    return y, p


def check_logits(logits: Any, name: str = "logits") -> np.ndarray:
    z = float_array(logits, name, 2, "(n_samples, n_classes)")
    if z.shape[1] < 2:
        raise ValueError(f"{name} must have at least 2 classes, got shape {z.shape}")
    return z


def labels_logits(labels: Any, logits: Any) -> tuple[np.ndarray, np.ndarray]:
    z = check_logits(logits)
    y = check_labels(labels, z.shape[1])
    check_same_length(labels=y, logits=z)
    return y, z


def check_correct(correct: Any, name: str = "correct") -> np.ndarray:
    """Validate a boolean correctness vector of shape (n,) (0/1 integers accepted)."""
    c = as_numpy(correct, name)
    check_ndim(c, name, 1, "(n_samples,)")
    check_nonempty(c, name)
    if c.dtype != bool:
        if c.dtype.kind not in "iuf" or not np.all(np.isin(c, (0, 1))):
            raise ValueError(f"{name} must be boolean (or 0/1), got dtype {c.dtype} with values {np.unique(c)[:5]}")
        c = c.astype(bool)
    return c


def correct_confidence(correct: Any, confidence: Any) -> tuple[np.ndarray, np.ndarray]:
    """Validate a (correct (n,) bool, confidence (n,) float) pair."""
    c = check_correct(correct)
    k = float_array(confidence, "confidence", 1, "(n_samples,)")
    check_same_length(correct=c, confidence=k)
    return c, k


def check_positive_int(value: Any, name: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def check_seed(seed: Any) -> int:
    """A seed for ``numpy.random.default_rng``: an integer >= 0."""
    return check_positive_int(seed, "seed", minimum=0)


def check_fraction(value: Any, name: str, *, low: float = 0.0, high: float = 1.0,
                   closed: str = "both") -> float:
    """Validate a float in an interval; ``closed`` in {'both', 'left', 'right', 'neither'}."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number, got {value!r}") from None
    lo_ok = v >= low if closed in ("both", "left") else v > low
    hi_ok = v <= high if closed in ("both", "right") else v < high
    if not (np.isfinite(v) and lo_ok and hi_ok):
        lb = "[" if closed in ("both", "left") else "("
        rb = "]" if closed in ("both", "right") else ")"
        raise ValueError(f"{name} must lie in {lb}{low}, {high}{rb}, got {value!r}")
    return v


def check_choice(value: Any, name: str, choices) -> Any:
    if value not in choices:
        raise ValueError(f"{name} must be one of {sorted(choices)}, got {value!r}")
    return value
