"""The toy protocol's scores: per cache, accuracy, NLL and ECE, through uqmetrics' one scoring
path, in a result file of the shared schema."""

from __future__ import annotations

import os
from collections.abc import Iterable

import numpy as np
import xarray as xr
from uqmetrics import input_checksum, score_metrics, stamp_result
from uqmetrics.metrics.calibration import softmax

from uqvision.cache import find_caches, read_cache

METRICS = ("accuracy", "nll", "ece")


def score_toy(caches: Iterable[str | os.PathLike], *, fraction: float = 1.0) -> xr.Dataset:
    """``(model,)`` variables ``accuracy``, ``nll``, ``ece`` of each cache (logits of one
    pass, or the mean softmax over passes), on the first ``fraction`` of its labelled samples."""
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction must be in (0, 1], got {fraction!r}")
    names, rows, sums = [], [], []
    for path in find_caches(caches):
        c = read_cache(path)
        p = softmax(c["logits"].values)
        if p.ndim == 3:  # (pass, sample, class)
            p = p.mean(axis=0)
        y = c["label"].values
        keep = np.flatnonzero(y >= 0)
        keep = keep[:max(1, round(fraction * keep.size))]
        scores = score_metrics(y[keep], p[keep], metrics=METRICS)
        names.append(f"{c.attrs['model']}:{path.stem}")
        rows.append([scores[m] for m in METRICS])
        sums.append(input_checksum(c))
    if not names:
        raise ValueError(f"no caches in {[str(c) for c in caches]}")
    values = np.asarray(rows)
    ds = xr.Dataset({m: ("model", values[:, i]) for i, m in enumerate(METRICS)},
                    coords={"model": names})
    return stamp_result(ds, "toy", input_checksums=sums, metrics={m: m for m in METRICS},
                        config={"fraction": fraction})
