"""Label files of a flat layout (:data:`LABEL_FILES`): the ILSVRC2012 devkit (its folder, its
``data`` files or its ``.tar.gz``: ground truth + ``meta.mat``) and Kaggle's
``LOC_val_solution.csv``; reading one (:func:`read_label_file`), looking for one beside the data
(:data:`LABEL_SEARCH`, :func:`find_label_files`). Labelling flat images by one is
:func:`uqvision.layouts.base._label_flat` (what the flat layouts share).

A label file is given explicitly (``labels=``, ``--labels FILE``) or looked for, in this order,
in the folder that holds the flat folder or the archive, then in the folder above it, then (for
a folder at ``ILSVRC/Data/CLS-LOC/<split>``, the Kaggle tree) in the folder that holds
``ILSVRC``; in each folder: ``ILSVRC2012_devkit_t12/`` (its ``data/`` files),
``ILSVRC2012_devkit_t12.tar.gz``, ``LOC_val_solution.csv``.
"""

from __future__ import annotations

import csv
import hashlib
import io
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from uqmetrics import InputError
from uqmetrics.metrics.registry import Registry

from .names import _WNID, _is_image, _tar_names

__all__ = [
    "DEVKIT_GROUND_TRUTH",
    "DEVKIT_META",
    "LABEL_FILES",
    "LABEL_SEARCH",
    "LabelFile",
    "LabelFormat",
    "find_label_file",
    "find_label_files",
    "read_label_file",
]

#: The devkit's files, relative to ``ILSVRC2012_devkit_t12``.
DEVKIT_GROUND_TRUTH = "data/ILSVRC2012_validation_ground_truth.txt"
DEVKIT_META = "data/meta.mat"
#: What a label file is looked for as, in each folder searched, in this order.
LABEL_SEARCH = ("ILSVRC2012_devkit_t12", "ILSVRC2012_devkit_t12.tar.gz", "LOC_val_solution.csv")


@dataclass(frozen=True)
class LabelFile:
    """A label file read: image stem -> WordNet id, and what identifies its content.

    Attributes
    ----------
    kind : str
        Its entry in :data:`LABEL_FILES`.
    path : Path
        The file (or devkit folder / archive) given or found.
    labels : mapping str -> str, shape (n_listed,)
        Image file name without extension (``ILSVRC2012_val_00000001``) -> WordNet id.
    sha256 : str
        SHA-256 over the content of the files read (the ground truth and ``meta.mat`` for the
        devkit, whether from its folder or its archive).
    """

    kind: str
    path: Path
    labels: Mapping[str, str]
    sha256: str

    @property
    def name(self) -> str:
        return str(self.path)


@dataclass(frozen=True)
class LabelFormat:
    """A kind of label file: ``accepts(path)`` whether a given path is one, ``read(path)`` ->
    :class:`LabelFile`."""

    name: str
    description: str
    accepts: Callable[[Path], bool]
    read: Callable[[Path], LabelFile]


#: Label files of a flat layout: name -> :class:`LabelFormat` (an explicit ``--labels`` is read
#: by the first that accepts it).
LABEL_FILES: Registry[LabelFormat] = Registry("label file")



def _devkit_accepts(path: Path) -> bool:
    return path.is_dir() or path.suffix in (".txt", ".mat") or _tar_names(path)


def _devkit_bytes(path: Path) -> tuple[bytes, bytes, str]:
    """(ground truth, meta.mat) bytes of a devkit given as its folder, its ``data`` folder, one
    of the two files, or its archive (read in memory), and how a message names ``meta.mat``
    (its path, or ``archive:member``)."""
    gt_name, meta_name = Path(DEVKIT_GROUND_TRUTH).name, Path(DEVKIT_META).name
    if path.is_file() and _tar_names(path):
        import tarfile  # deferred: only a devkit archive needs it

        found: dict[str, bytes] = {}
        names: dict[str, str] = {}
        try:
            with tarfile.open(path, "r:*") as tf:
                for ti in tf:
                    base = ti.name.rsplit("/", 1)[-1]
                    if ti.isfile() and base in (gt_name, meta_name) \
                            and ti.name.rsplit("/", 2)[-2:-1] == ["data"]:
                        found[base] = tf.extractfile(ti).read()
                        names[base] = ti.name
        except (tarfile.TarError, OSError, EOFError) as err:
            raise InputError(f"labels: devkit archive {str(path)!r} cannot be read ({err})") \
                from None
        lacking = [n for n in (gt_name, meta_name) if n not in found]
        if lacking:
            raise InputError(f"labels: devkit archive {str(path)!r} holds no data/"
                             f"{' nor data/'.join(lacking)}")
        return found[gt_name], found[meta_name], f"{path}:{names[meta_name]}"
    if path.is_dir():
        folder = path / "data" if (path / "data").is_dir() else path
    else:
        folder = path.parent
    files = [folder / gt_name, folder / meta_name]
    lacking = [str(f) for f in files if not f.is_file()]
    if lacking:
        raise InputError(f"labels: devkit {str(path)!r} lacks {', '.join(map(repr, lacking))}")
    return files[0].read_bytes(), files[1].read_bytes(), str(files[1])


def _read_devkit(path: Path) -> LabelFile:
    """The devkit's validation labels, as torchvision's ``ImageNet`` reads them: ``meta.mat``'s
    ``synsets`` give ILSVRC2012_ID -> WNID for the leaf synsets (``num_children == 0``), and
    line ``i`` of the ground truth is the ILSVRC2012_ID of ``ILSVRC2012_val_{i:08d}``.

    A ``meta.mat`` that scipy cannot read (not a MATLAB file, truncated, damaged: scipy then
    raises one of many exception types) is an ``InputError`` naming it."""
    import scipy.io  # deferred: only a devkit needs it

    gt, meta_bytes, meta_where = _devkit_bytes(path)
    try:
        mat = scipy.io.loadmat(io.BytesIO(meta_bytes), squeeze_me=True)
    except Exception as err:  # noqa: BLE001 (scipy raises ValueError, OSError, TypeError,
        # NotImplementedError, MatReadError, IndexError, ... on a damaged file)
        text = " ".join(str(err).split()) or type(err).__name__
        raise InputError(f"labels: devkit meta.mat {meta_where!r} cannot be read as a MATLAB "
                         f"file ({len(meta_bytes)} bytes; {text}): it is damaged or truncated, "
                         "get the devkit again") from None
    try:
        synsets = mat["synsets"].reshape(-1)
        ids, wnids = synsets["ILSVRC2012_ID"], synsets["WNID"]
        children = synsets["num_children"]
        leaf = {int(i): str(w) for i, w, n in zip(ids, wnids, children, strict=True)
                if int(n) == 0}
    except (ValueError, KeyError, TypeError, IndexError, AttributeError) as err:
        raise InputError(f"labels: devkit meta.mat {meta_where!r} has no 'synsets' struct with "
                         f"ILSVRC2012_ID, WNID and num_children ({err})") from None
    labels: dict[str, str] = {}
    for line_no, line in enumerate(gt.decode("utf-8", "replace").splitlines(), 1):
        text = line.strip()
        if not text:
            continue
        try:
            wnid = leaf[int(text)]
        except (ValueError, KeyError):
            raise InputError(f"labels: devkit {str(path)!r}: line {line_no} of the ground truth "
                             f"is {text!r}, not the ILSVRC2012_ID of a leaf synset of meta.mat "
                             f"({len(leaf)} leaves)") from None
        labels[f"ILSVRC2012_val_{line_no:08d}"] = wnid
    if not labels:
        raise InputError(f"labels: devkit {str(path)!r}: the ground truth lists no image")
    digest = hashlib.sha256(b"devkit\0" + hashlib.sha256(gt).digest()
                            + hashlib.sha256(meta_bytes).digest()).hexdigest()
    return LabelFile("devkit", path, labels, digest)


def _read_loc_csv(path: Path) -> LabelFile:
    """``LOC_val_solution.csv`` (``ImageId,PredictionString``; the first token of the
    prediction string is the image's WordNet id, the rest its boxes).

    ``ImageId`` is the file name without extension, as Kaggle ships it; an id that carries an
    image extension (``ILSVRC2012_val_00000001.JPEG``, as some re-exports write it) is read
    without it."""
    data = path.read_bytes()
    rows = csv.reader(io.StringIO(data.decode("utf-8-sig", "replace")))
    header = next(rows, None)
    if header is None or [h.strip() for h in header[:2]] != ["ImageId", "PredictionString"]:
        raise InputError(f"labels: {str(path)!r} is not a LOC_val_solution.csv (its header is "
                         f"{header!r}, not ['ImageId', 'PredictionString'])")
    labels: dict[str, str] = {}
    for line_no, row in enumerate(rows, 2):
        if not row:
            continue
        tokens = row[1].split() if len(row) > 1 else []
        if not tokens or not _WNID.fullmatch(tokens[0]):
            raise InputError(f"labels: {str(path)!r} line {line_no}: the prediction string of "
                             f"{row[0]!r} does not start with a WordNet id (got {row[1:]!r})")
        image = row[0].strip()
        if _is_image(image):  # an id with its extension: the file name without it
            image = os.path.splitext(image)[0]
        if labels.setdefault(image, tokens[0]) != tokens[0]:
            raise InputError(f"labels: {str(path)!r} line {line_no}: image {image!r} is "
                             f"listed twice, as {labels[image]!r} and {tokens[0]!r}")
    if not labels:
        raise InputError(f"labels: {str(path)!r} lists no image")
    digest = hashlib.sha256(b"loc_csv\0" + hashlib.sha256(data).digest()).hexdigest()
    return LabelFile("loc_csv", path, labels, digest)


LABEL_FILES.add("devkit", LabelFormat(
    "devkit", "the ILSVRC2012 devkit (folder, data/ folder, ground-truth .txt, meta.mat, or its "
    ".tar.gz): ground truth + meta.mat", _devkit_accepts, _read_devkit))
LABEL_FILES.add("loc_csv", LabelFormat(
    "loc_csv", "LOC_val_solution.csv of the Kaggle redistribution (ImageId,PredictionString)",
    lambda p: p.suffix.lower() == ".csv", _read_loc_csv))

#: Label files read in this process: (path, its files' sizes and times) -> LabelFile.
_LABELS_READ: dict[tuple, LabelFile] = {}


def _stamp_inputs(path: Path) -> tuple:
    """Sizes and modification times of the files reading ``path`` may read."""
    gt, meta = Path(DEVKIT_GROUND_TRUTH).name, Path(DEVKIT_META).name
    folders = [path, path / "data"] if path.is_dir() else [path.parent]
    files = ([path] if path.is_file() else []) + [f / n for f in folders for n in (gt, meta)]
    return tuple((str(p), st.st_size, st.st_mtime_ns) for p in files
                 if p.is_file() and (st := p.stat()))


def read_label_file(path: str | os.PathLike) -> LabelFile:
    """Read a label file (the first kind of :data:`LABEL_FILES` that accepts it); kept for the
    process, keyed by its files' sizes and modification times.

    Raises
    ------
    FileNotFoundError
        ``path`` does not exist.
    uqmetrics.InputError
        No kind accepts it, or it is malformed (the message names the file and the line).
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"label file {str(path)!r} does not exist")
    key = (str(path.resolve()), _stamp_inputs(path))
    if key in _LABELS_READ:
        return _LABELS_READ[key]
    for fmt in LABEL_FILES.values():
        if fmt.accepts(path):
            out = fmt.read(path)
            break
    else:
        raise InputError(f"labels: {str(path)!r} is not a label file; expected "
                         + "; ".join(f.description for f in LABEL_FILES.values()))
    if len(_LABELS_READ) > 8:
        _LABELS_READ.clear()
    _LABELS_READ[key] = out
    return out


def _search_folders(data: Path) -> list[Path]:
    """Where a label file of ``data`` (a flat folder or an archive) is looked for, in order."""
    data = data.resolve()
    folders = [data.parent, data.parent.parent]
    parts = data.parts
    if len(parts) >= 5 and [p.lower() for p in parts[-4:-1]] == ["ilsvrc", "data", "cls-loc"]:
        folders.append(data.parents[3])  # the Kaggle tree: ILSVRC/Data/CLS-LOC/<split>
    return list(dict.fromkeys(folders))


def find_label_files(data: str | os.PathLike) -> list[Path]:
    """Every label file found for ``data``, in the order they are looked for: folder by folder
    (the folder holding it, the one above, the Kaggle tree's root), and in each folder in the
    order of :data:`LABEL_SEARCH` (the devkit before ``LOC_val_solution.csv``). The first is
    the one read (:func:`find_label_file`); the others are passed over, and the command line
    says so.

    Returns
    -------
    list of Path
        The label files found (devkit folders, devkit archives, CSVs), in search order.
    """
    found = []
    for folder in _search_folders(Path(data)):
        for name in LABEL_SEARCH:
            p = folder / name
            if (p.is_dir() and (p / DEVKIT_GROUND_TRUTH).is_file()) or p.is_file():
                found.append(p)
    return found


def find_label_file(data: str | os.PathLike) -> Path | None:
    """The first of :data:`LABEL_SEARCH` in the folders searched for ``data``'s labels (the
    folder holding it, the one above, the Kaggle tree's root), or ``None``."""
    found = find_label_files(data)
    return found[0] if found else None


def _no_label_file(data: Path, what: str) -> FileNotFoundError:
    where = ", ".join(repr(str(f)) for f in _search_folders(data))
    return FileNotFoundError(
        f"{what} {str(data)!r} holds images but no class sub-folder, and no label file was "
        f"found: looked for {', '.join(LABEL_SEARCH)} in {where}; pass --labels FILE "
        "(library: labels=)")


def _labels_for(data: Path, labels: Path | None,
                what: str) -> tuple[LabelFile, tuple[Path, ...]]:
    """The label file given, or the first found (:func:`find_label_files`), and the other
    label files found."""
    if labels is not None:
        return read_label_file(labels), ()
    found = find_label_files(data)
    if not found:
        raise _no_label_file(data, what)
    return read_label_file(found[0]), tuple(found[1:])
