"""A sweep's preprocessing groups: the models of one folder whose evaluation transforms share
their geometry (resize, crop, interpolation, size: :func:`uqvision.predict.decoded.
split_transform`, the mean and std aside) decode each image once.

Before its cells run, :func:`uqvision.sweep.sweep_predictions` groups the models left to
compute on each folder by that key (:func:`preprocessing_groups`, from each model's data
configuration, :func:`uqvision.models.data_config`: nothing is built), and for every group of
two models or more decodes the folder once (:func:`uqvision.predict.decoded.decode_images`,
threads of the sweep's own process, which has checked every image already) into
``<out_dir>/.decoded/<dataset>.<key>.npy``; each cell of the group reads it (its ``decoded``
parameter, :func:`uqvision.predict.predict`). The file is removed once every cell of its
group has succeeded, and kept otherwise: a rerun reuses it (same folder fingerprint, samples
and key) instead of decoding again. A group whose file cannot be made (not enough free disk:
more than half of what is free; images the head leaves of different sizes) runs as before,
each model decoding the files itself; so does a model of another source than timm.

The planning process also fingerprints each folder once (:func:`plan_fingerprints`: every
image's bytes hashed, :func:`uqvision.data.sample_digests`) and writes the digests beside the
decoded files (``<dataset>.<fingerprint>.digests.json``); each cell is given the fingerprint
and that file, and checks every image's bytes as it reads them instead of hashing the folder
again (:func:`uqvision.predict.predict`'s ``planned``). A decode checks the images it reads
the same way (docs/conventions.md#fingerprint-rules).
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from uqmetrics.runs.io import temporary_beside
from uqmetrics.runs.sweep import Cell, cell_path, is_complete

from ..data import eval_transform, readable_images, sample_digests
from ..models import ModelSpec, data_config
from ..predict.decoded import DecodedImages, TransformSplit, decode_images, split_transform
from ..predict.plan import _fingerprint
from .plan import _train_fingerprint
from .sets import SweepTarget

__all__ = ["DECODED_DIR", "PreprocessingGroup", "decode_groups", "plan_fingerprints",
           "planned_content", "preprocessing_groups", "remove_fingerprints"]

#: Folder of the decoded files, inside a sweep's caches folder.
DECODED_DIR = ".decoded"

#: Modes whose cells use the model's evaluation transform (they may share decoding).
_SHARED_MODES = ("plain", "mc_dropout")


@dataclass
class PreprocessingGroup:
    """The models of one target sharing a transform head, and their cells left to compute.

    ``path`` is the decoded file once made (``None`` when the group decodes per model).
    """

    target: SweepTarget
    split: TransformSplit
    models: list[str] = field(default_factory=list)
    cells: list[Cell] = field(default_factory=list)
    path: Path | None = None


def _split_of(spec: ModelSpec) -> TransformSplit | None:
    """The transform split of a timm model, from its data configuration (not built)."""
    if spec.source != "timm":
        return None
    try:
        return split_transform(eval_transform(data_config(spec)))
    except (ValueError, OSError):
        return None


def preprocessing_groups(cells: Iterable[Cell], targets: Iterable[SweepTarget],
                         out_dir: str | os.PathLike, *, overwrite: bool = False
                         ) -> list[PreprocessingGroup]:
    """The groups of two models or more with cells to compute (not complete in ``out_dir``,
    or all of them with ``overwrite``), per target, in plan order; and a group of one model
    whose decoded file an earlier run kept (its other models done)."""
    by_name = {t.dataset_name: t for t in targets}
    splits: dict[str, TransformSplit | None] = {}
    groups: dict[tuple[str, str], PreprocessingGroup] = {}
    for cell in cells:
        target = by_name.get(cell.params["dataset_name"])
        if (target is None or target.config.mode not in _SHARED_MODES
                or target.config.decoder != "pil"):  # a decoder on the device: no shared file
            continue
        if not overwrite and is_complete(cell_path(out_dir, cell)):
            continue
        spec = ModelSpec(cell.params["name"], cell.params["checkpoint"], cell.params["label"])
        if spec.row not in splits:
            splits[spec.row] = _split_of(spec)
        split = splits[spec.row]
        if split is None:
            continue
        g = groups.setdefault((target.dataset_name, split.key),
                              PreprocessingGroup(target, split))
        if spec.row not in g.models:
            g.models.append(spec.row)
        g.cells.append(cell)
    return [g for g in groups.values() if len(g.models) > 1
            or DecodedImages.read(_path(out_dir, g)) is not None]


def _path(out_dir: str | os.PathLike, g: PreprocessingGroup) -> Path:
    """Where a group's decoded file goes."""
    return Path(out_dir) / DECODED_DIR / f"{g.target.dataset_name}.{g.split.key[:16]}.npy"


def decode_groups(groups: list[PreprocessingGroup], out_dir: str | os.PathLike, *,
                  threads: int | None = None) -> None:
    """Decode each group's folder once and point its cells at the file (``decoded`` in their
    params); a group whose file cannot be made is left to decode per model (one line on
    stderr says why)."""
    where = Path(out_dir) / DECODED_DIR
    for g in groups:
        folder = readable_images(g.target.folder, skip_bad=g.target.config.skip_bad_images)
        h, w = g.split.head.transforms[-1].size
        need = len(folder) * h * w * 3
        path = _path(out_dir, g)
        try:
            where.mkdir(parents=True, exist_ok=True)
            free = shutil.disk_usage(where).free
            if need > free // 2 and not path.exists():
                raise OSError(f"{need / 2**30:.1f} GiB needed, {free / 2**30:.1f} GiB free")
            fingerprint = _fingerprint(folder)  # hashed by the plan: nothing read again
            decode_images(folder.expecting(sample_digests(folder)), g.split, path,
                          fingerprint, threads=threads)
        except (OSError, ValueError) as exc:
            print(f"uqvision sweep: the models {g.models} decode {g.target.dataset_name!r} "
                  f"each (a shared decoding was not made: {' '.join(str(exc).split())})",
                  file=sys.stderr, flush=True)
            continue
        g.path = path
        for cell in g.cells:
            cell.params["decoded"] = str(path)


def remove_decoded(groups: list[PreprocessingGroup], failed: Iterable[str],
                   out_dir: str | os.PathLike) -> None:
    """Remove the decoded file of every group none of whose cells failed (``failed``: cell
    keys), and the folder of the decoded files once empty; the others are kept for the
    rerun."""
    failed = set(failed)
    for g in groups:
        if g.path is not None and not any(c.key in failed for c in g.cells):
            for p in (g.path, g.path.with_suffix(".json")):
                p.unlink(missing_ok=True)
    try:
        (Path(out_dir) / DECODED_DIR).rmdir()
    except OSError:
        pass


#: Suffix of a folder's digests file (:func:`plan_fingerprints`).
_DIGESTS_SUFFIX = ".digests.json"


def plan_fingerprints(cells: Iterable[Cell], targets: Iterable[SweepTarget],
                      out_dir: str | os.PathLike, *, overwrite: bool = False) -> list[Path]:
    """Fingerprint, once in the planning process, every target that has cells to run (not
    complete in ``out_dir``, or all with ``overwrite``; :func:`uqvision.data.
    folder_fingerprint`, its digests shared with the checks of the plan); write each target's per-sample digests to ``<out_dir>/.decoded/<dataset>.<first
    16 hex digits of the fingerprint>.digests.json`` (atomically) and give its cells
    ``fingerprint`` and ``digests`` (that file's path); give the cells of a run whose samples
    recompute their BatchNorm statistics (SWAG, K-FAC Laplace) the fingerprint of that
    folder, ``train_fingerprint``, hashed once per sweep (:func:`~.plan._train_fingerprint`:
    with the plan's checks; a model whose sidecar cannot say is left to its cells, which
    fail naming why). Returns the files written."""
    cells = [c for c in cells if overwrite or not is_complete(cell_path(out_dir, c))]
    names = {c.params["dataset_name"] for c in cells}
    targets = list(targets)
    trains: dict[ModelSpec, str | None] = {}
    for cell in cells:
        spec = ModelSpec(cell.params["name"], cell.params["checkpoint"], cell.params["label"])
        if spec not in trains:
            try:
                trains[spec] = _train_fingerprint(spec, targets)
            except (ValueError, OSError):  # a damaged sidecar, an unknown method: the cell says
                trains[spec] = None
        if trains[spec]:
            cell.params["train_fingerprint"] = trains[spec]
    written = []
    for target in targets:
        if target.dataset_name not in names:
            continue
        fingerprint = _fingerprint(target.folder)
        digests = sample_digests(target.folder)
        path = (Path(out_dir) / DECODED_DIR / f"{target.dataset_name}."
                f"{fingerprint.rpartition(':')[2][:16]}{_DIGESTS_SUFFIX}")
        with temporary_beside(path) as tmp:
            tmp.write_text(json.dumps({"fingerprint": fingerprint, "digests": digests}))
            os.replace(tmp, path)
        written.append(path)
        for cell in cells:
            if cell.params["dataset_name"] == target.dataset_name:
                cell.params.update(fingerprint=fingerprint, digests=str(path))
    return written


@functools.lru_cache(maxsize=2)
def _read_digests(path: str, fingerprint: str) -> Mapping[str, str | None] | None:
    try:
        rec = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(rec, dict) or rec.get("fingerprint") != fingerprint \
            or not isinstance(rec.get("digests"), dict):
        return None
    return rec["digests"]


def planned_content(fingerprint: str | None, digests: str | None
                    ) -> tuple[str, Mapping[str, str | None]] | None:
    """A cell's ``(fingerprint, digests)`` from the plan (:func:`plan_fingerprints`; read once
    per worker process), ``None`` when it has none or its file cannot be read or records
    another fingerprint: the cell then fingerprints the folder itself."""
    if fingerprint is None or digests is None:
        return None
    got = _read_digests(str(digests), fingerprint)
    return None if got is None else (fingerprint, got)


def remove_fingerprints(paths: Iterable[Path]) -> None:
    """Remove the digests files of :func:`plan_fingerprints` (a rerun plans again)."""
    for p in paths:
        p.unlink(missing_ok=True)
