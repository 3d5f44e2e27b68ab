"""``uqreg verify``: recompute a study's entries (one per method) and compare
(:mod:`uqmetrics.report.verify`).

:func:`rescore_study` recomputes a study file:

- a study made by ``uqreg sweep`` (or ``uqreg reproduce``) records its cells (attr
  ``caches``): they are re-combined (:func:`uqreg.sweep.combine_cells`) and summarised
  (:func:`uqreg.study.summarize`), and every per-method variable — the raw per-repetition
  values and the summary — is compared with the file's: a cell changed since the study was
  combined disagrees;
- any other study: the summary is recomputed from the raw per-repetition variables and the
  task data the file holds, and every derived variable is compared: a summary value changed in
  the file disagrees.
"""

from __future__ import annotations

from pathlib import Path

import xarray as xr
from uqmetrics.runs.io import decode_attr

from .study import RAW_VARS, StudyConfig, summarize
from .sweep import combine_cells

__all__ = ["INPUT_VARS", "PROTOCOL", "rescore_study", "rescorer"]

#: The protocol name of a study in a report site and in ``verify``'s lines.
PROTOCOL = "uqreg"
#: The variables a study's summary is computed from: the raw ones and the task data.
INPUT_VARS = (*RAW_VARS, "truth", "reference_uncertainty", "in_distribution", "x_test",
              "x_train", "y_train", "y_test", "gamma", "n_train", "input_size")


def rescore_study(study: xr.Dataset, path: Path | None = None) -> xr.Dataset:
    """The variables of a study recomputed from its cells or its raw variables (module
    docstring).

    Parameters
    ----------
    study : xarray.Dataset
        A study file as read (attrs not decoded).
    path : Path, optional
        Its file (unused: a study records what it is recomputed from).

    Returns
    -------
    xarray.Dataset
        The variables to compare: a swept study's raw and summary variables; another's
        summary variables.

    Raises
    ------
    ValueError
        A study without its ``config`` attr, or with none of the raw variables.
    """
    config = decode_attr(study.attrs.get("config"))
    cells = decode_attr(study.attrs.get("caches"))
    if isinstance(cells, dict) and cells:
        if not isinstance(config, dict):
            raise ValueError("the study records no configuration (attr 'config')")
        cfg = StudyConfig.from_dict(config)
        missing = [p for p in cells if not Path(p).is_file()]
        if missing:
            raise FileNotFoundError(f"cell file {missing[0]} does not exist"
                                    + (f" ({len(missing) - 1} more)" if len(missing) > 1 else ""))
        return summarize(combine_cells(list(cells), cfg))
    inputs = [v for v in INPUT_VARS if v in study.data_vars]
    if "prediction" not in inputs:
        raise ValueError("the study holds no raw per-repetition variables to recompute its "
                         "summary from")
    raw = study[inputs]
    raw.attrs = dict(study.attrs)
    out = summarize(raw)
    return out[[v for v in out.data_vars if v not in inputs]]


def rescorer(protocol: str):
    """``uqreg verify``'s rescoring: :func:`rescore_study` for a study (protocol
    :data:`PROTOCOL`); None for another protocol's entry of a site (uqvision's: ``uqvision
    verify`` verifies it)."""
    return rescore_study if protocol == PROTOCOL else None
