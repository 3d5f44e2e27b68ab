"""Evaluation sets in the layouts ImageNet ships in: where the images are, how they are labelled.

A ``--data`` path is read in the first layout of :data:`LAYOUTS` that claims it:

- ``class_folders``: a folder with one sub-folder per class, ``root/<class>/.../<image>`` (the
  ImageFolder convention of torchvision and timm; ImageNet-A/R/O ship so, with WordNet ids as
  folder names);
- ``flat``: a folder of images and no class sub-folder (``ILSVRC2012_val_00000001.JPEG``, ...)
  labelled by a label file (:data:`LABEL_FILES`): the devkit's ground truth
  (``ILSVRC2012_devkit_t12``: ``data/ILSVRC2012_validation_ground_truth.txt`` + ``data/meta.mat``,
  or its ``.tar.gz``) or the Kaggle redistribution's ``LOC_val_solution.csv``;
- ``tar``: an uncompressed ``.tar`` archive, read in place (nothing is extracted): class folders
  inside it, one ``<class>.tar`` per class inside it (``ILSVRC2012_img_train.tar``), or flat
  images with a label file (``ILSVRC2012_img_val.tar``). A tar whose every member sits in one
  top folder (``imagenet-r.tar`` holds ``imagenet-r/<wnid>/...``) is read as that folder.

Whatever the layout, a scan (:class:`Scan`) gives the classes (sorted), the samples sorted by
class and then by sample id (the relative path of the image: in the folder, or in the archive,
a member of ``<class>.tar`` being ``<class>/<member>``), an image source that opens a sample
and knows its size, and the label file with its content hash (part of the dataset fingerprint).

A label file is given explicitly (``labels=``, ``--labels FILE``) or looked for, in this order,
in the folder that holds the flat folder or the archive, then in the folder above it, then (for
a folder at ``ILSVRC/Data/CLS-LOC/<split>``, the Kaggle tree) in the folder that holds
``ILSVRC``; in each folder: ``ILSVRC2012_devkit_t12/`` (its ``data/`` files),
``ILSVRC2012_devkit_t12.tar.gz``, ``LOC_val_solution.csv`` (:data:`LABEL_SEARCH`).

Why timm's tar readers (``timm.data.readers.ReaderImageTar``, ``ReaderImageInTar``) are not
used to read archives: ``ReaderImageInTar`` lists an archive in streaming mode, which reads
every byte of it (138 GB for ``ILSVRC2012_img_train.tar``) at each scan; both keep open
``TarFile`` objects whose shared file position is not safe under the threads of the image
check or forked DataLoader workers; both label an image by the folder that directly holds it
and order classes by timm's natural key (``class_10`` after ``class_9``), and read only
``.png``/``.jpg``/``.jpeg``. Here an archive is listed from its headers only (one level of
``.tar`` members included, as ``ReaderImageInTar`` does), and a sample is read with one
``os.pread`` at its offset, safe in threads and processes; the tests check the listing and the
bytes against ``ReaderImageInTar``'s. Unlike ``tarfile`` (and timm's readers), a listing requires
the end-of-archive marker (a truncated copy is refused, not read as a smaller archive) and
resolves link members as extraction would.

What is refused or reported rather than dropped (docs/conventions.md#v-data): images both
directly in a folder and in class folders (a mixed layout), dangling symbolic links and file
names that are not UTF-8 (unreadable images, :attr:`Scan.problems`), absent images of the label
file unless the scan is a subset (``subset=True``, :class:`Subset`).
"""

from __future__ import annotations

import csv
import functools
import hashlib
import io
import os
import posixpath
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from uqmetrics import InputError
from uqmetrics.registry import Registry

__all__ = [
    "DEVKIT_GROUND_TRUTH",
    "DEVKIT_META",
    "IMG_EXTENSIONS",
    "LABEL_FILES",
    "LABEL_SEARCH",
    "LAYOUTS",
    "FileSource",
    "LabelFile",
    "Layout",
    "Scan",
    "Subset",
    "TarSource",
    "UnreadableFileError",
    "find_label_file",
    "find_label_files",
    "list_classes",
    "read_label_file",
    "scan_layout",
    "wnid_description",
]

#: File suffixes read as images (torchvision's list).
IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
#: The devkit's files, relative to ``ILSVRC2012_devkit_t12``.
DEVKIT_GROUND_TRUTH = "data/ILSVRC2012_validation_ground_truth.txt"
DEVKIT_META = "data/meta.mat"
#: What a label file is looked for as, in each folder searched, in this order.
LABEL_SEARCH = ("ILSVRC2012_devkit_t12", "ILSVRC2012_devkit_t12.tar.gz", "LOC_val_solution.csv")
#: The extension a sample listed in a label file but absent is named with (ImageNet's).
_LISTED_SUFFIX = ".JPEG"
_WNID = re.compile(r"n\d{8}")


def list_classes(root: str | os.PathLike) -> list[str]:
    """The class sub-folders of an image folder, sorted (hidden folders are skipped).

    Only the top level is listed (cheap on ImageNet); an empty list when there is none.

    Raises
    ------
    FileNotFoundError
        ``root`` is not a folder.
    """
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"image folder {str(root)!r} does not exist")
    return sorted(e.name for e in os.scandir(root) if e.is_dir() and not e.name.startswith("."))


def _is_image(name: str) -> bool:
    return os.path.splitext(name)[1].lower() in IMG_EXTENSIONS


def _utf8(name: str) -> bool:
    """Whether a file name decoded by the OS (undecodable bytes kept as surrogates,
    ``os.fsdecode``) is valid UTF-8, i.e. can be written to a cache and a message."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _shown(name: str) -> str:
    """A file name for messages and records: its bytes that are not UTF-8 as ``\\xNN``."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def _not_utf8(name: str) -> str:
    """The problem recorded for a file whose name is not valid UTF-8 (its bytes shown)."""
    raw = name.rsplit("/", 1)[-1].encode("utf-8", "surrogateescape")
    return f"file name is not valid UTF-8 ({raw!r}); rename the file"


def _refuse_class_name(root: Path, name: str) -> None:
    if not _utf8(name):
        raise InputError(f"image folder {_shown(str(root))!r}: class folder {_shown(name)!r} has "
                         "a name that is not valid UTF-8; rename it (class names are recorded "
                         "in every cache and matched to the model's)")


@functools.lru_cache(maxsize=1)
def _imagenet_info():
    from timm.data import ImageNetInfo  # timm's class info: WordNet ids, lemmas, definitions

    return ImageNetInfo("imagenet-1k")


def wnid_description(wnid: str) -> str | None:
    """The lemmas of a WordNet id (``n01440764`` -> ``tench, Tinca tinca``) from timm's ImageNet
    class info (``timm.data.ImageNetInfo``), ``None`` for a name it does not know.

    Examples
    --------
    >>> wnid_description("n01440764")
    'tench, Tinca tinca'
    >>> wnid_description("cat") is None
    True
    """
    if not _WNID.fullmatch(str(wnid)):
        return None
    try:
        return _imagenet_info().label_name_to_description(str(wnid))
    except KeyError:
        return None


# --------------------------------------------------------------------------------------------
# image sources: open a sample, its size, a key that changes when its bytes may have


class UnreadableFileError(FileNotFoundError):
    """A sample with no bytes to read (a tar link whose target the archive lacks); ``why``
    says why in a few words (the image check records it as the problem)."""

    def __init__(self, message: str, why: str):
        super().__init__(message)
        self.why = why


class FileSource:
    """Images as files under ``root``; a sample id is the path relative to ``root``."""

    def __init__(self, root: Path):
        self.root = Path(root)

    def open(self, rel: str) -> Path:
        """What PIL opens for sample ``rel`` (the file's path)."""
        return self.root / rel

    def where(self, rel: str) -> str:
        """How a message names sample ``rel``."""
        return str(self.root / rel)

    def size(self, rel: str) -> int:
        """Bytes of sample ``rel``; -1 when the file does not exist or cannot be stat'ed (a
        dangling symbolic link, a loop of them)."""
        try:
            return (self.root / rel).stat().st_size
        except OSError:
            return -1

    def read(self, rel: str) -> bytes:
        return (self.root / rel).read_bytes()

    def stamp(self, rel: str) -> tuple:
        """``(path, size, modification time)``; ``OSError`` when the file cannot be stat'ed."""
        p = self.root / rel
        st = p.stat()
        return (str(p), st.st_size, st.st_mtime_ns)


class TarSource:
    """Images as members of an uncompressed tar archive (or of a ``.tar`` member of it), read in
    place with ``os.pread`` at their offset: no extraction, no shared file position (safe in
    threads, forked DataLoader workers get their own descriptor).

    Parameters
    ----------
    path : Path
        The archive.
    members : mapping str -> (str, int, int)
        Sample id -> (member name for messages, offset of its data, size in bytes). A link
        member is listed with its target's data (as extraction would write it).
    broken : mapping str -> (str, str), optional
        Sample ids with no data (a link whose target the archive lacks, a member that is not a
        file) -> (member name, why): reading one raises :class:`UnreadableFileError`.
    """

    def __init__(self, path: Path, members: Mapping[str, tuple[str, int, int]],
                 broken: Mapping[str, tuple[str, str]] | None = None):
        self.root = Path(path)
        self.members = members
        self.broken = dict(broken or {})
        st = self.root.stat()
        self._stat = (str(self.root), st.st_size, st.st_mtime_ns)
        self._file: tuple[int, Any] | None = None
        self._lock = threading.Lock()

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_file"], state["_lock"] = None, None
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def _fd(self) -> int:
        file = self._file
        if file is None or file[0] != os.getpid():
            with self._lock:
                file = self._file
                if file is None or file[0] != os.getpid():
                    file = self._file = (os.getpid(), open(self.root, "rb"))  # noqa: SIM115
        return file[1].fileno()

    def read(self, rel: str) -> bytes:
        """The bytes of sample ``rel``; ``FileNotFoundError`` when the archive lacks it."""
        if rel in self.broken:
            raise UnreadableFileError(f"{self.where(rel)}: {self.broken[rel][1]}",
                                      self.broken[rel][1])
        try:
            _, offset, size = self.members[rel]
        except KeyError:
            raise FileNotFoundError(f"{self.where(rel)} is not in the archive") from None
        if hasattr(os, "pread"):
            data = os.pread(self._fd(), size, offset)
        else:  # pragma: no cover (no pread: one reader at a time)
            with self._lock:
                f = open(self.root, "rb")  # noqa: SIM115
                with f:
                    f.seek(offset)
                    data = f.read(size)
        if len(data) != size:
            raise OSError(f"archive {str(self.root)!r} ends inside member {self.where(rel)}")
        return data

    def open(self, rel: str) -> io.BytesIO:
        """What PIL opens for sample ``rel`` (its bytes in memory)."""
        return io.BytesIO(self.read(rel))

    def where(self, rel: str) -> str:
        member = (self.members[rel][0] if rel in self.members
                  else self.broken[rel][0] if rel in self.broken else rel)
        return f"{self.root}:{member}"

    def size(self, rel: str) -> int:
        return self.members[rel][2] if rel in self.members else -1

    def stamp(self, rel: str) -> tuple:
        if rel in self.broken:
            raise UnreadableFileError(f"{self.where(rel)}: {self.broken[rel][1]}",
                                      self.broken[rel][1])
        if rel not in self.members:
            raise FileNotFoundError(f"{self.where(rel)} is not in the archive")
        return (*self._stat, *self.members[rel][1:])


# --------------------------------------------------------------------------------------------
# label files


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


def _tar_names(path: Path) -> bool:
    return path.name.endswith((".tar.gz", ".tgz", ".tar"))


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


# --------------------------------------------------------------------------------------------
# scans


@dataclass(frozen=True)
class Scan:
    """What a layout found: classes, samples in order, how to read them, how they are labelled.

    Attributes
    ----------
    root : Path
        The folder or archive given.
    layout : str
        The layout, with the arrangement inside an archive: ``class_folders``, ``flat``,
        ``tar/class_folders``, ``tar/class_tars``, ``tar/flat``.
    classes : list of str, shape (n_classes,)
        Sorted class names (folder names, per-class tar names or WordNet ids of a label file).
    samples : list of (str, int), shape (n_samples,)
        Sample id and class index, sorted by class and then by id.
    source : FileSource or TarSource
    label_file : LabelFile, optional
        The label file of a flat layout.
    label_problems : mapping str -> str
        Images listed in the label file but absent (samples, whose ids are the listed names)
        and images without a label (not samples) -> why.
    problems : mapping str -> str
        Image files found that cannot be samples (a name that is not valid UTF-8, keyed by the
        name with its undecodable bytes as ``\\xNN``) -> why: unreadable images.
    subset : Subset, optional
        Set when the scan was asked for a subset (``subset=True``) and some images of the label
        file are absent: they are left out (not samples, not problems).
    label_others : tuple of Path
        Label files found by the search but not read (the first found wins; empty when the
        label file was given).
    label_found : bool
        Whether the label file was found by the search (not given).
    """

    root: Path
    layout: str
    classes: list[str]
    samples: list[tuple[str, int]]
    source: Any
    label_file: LabelFile | None = None
    label_problems: Mapping[str, str] = field(default_factory=dict)
    problems: Mapping[str, str] = field(default_factory=dict)
    subset: Subset | None = None
    label_others: tuple[Path, ...] = ()
    label_found: bool = False


@dataclass(frozen=True)
class Subset:
    """A layout with a label file read as a subset of it (``subset=True``, ``--subset``): the
    label file's images that are absent are left out, and recorded by counts and a hash (not
    listed: a 40-image subset of ImageNet's validation set would list 49,960 names).

    Attributes
    ----------
    n_labelled : int
        Images the label file labels.
    n_present : int
        Those present (the samples).
    sha256 : str
        SHA-256 of the sorted sample ids, one per line (UTF-8, ``\\n`` after each).
    """

    n_labelled: int
    n_present: int
    sha256: str

    def attrs(self) -> dict[str, Any]:
        """The cache attrs that record the subset: ``subset_n_labelled``, ``subset_n_present``,
        ``subset_sha256``."""
        return {"subset_n_labelled": self.n_labelled, "subset_n_present": self.n_present,
                "subset_sha256": self.sha256}


@dataclass(frozen=True)
class Layout:
    """A data layout: ``claims(path)`` whether ``path`` is in it (:data:`LAYOUTS` asks each in
    order), ``scan(path, labels)`` -> :class:`Scan`."""

    name: str
    description: str
    claims: Callable[[Path], bool]
    scan: Callable[[Path, Path | None], Scan]


#: Data layouts: name -> :class:`Layout`; a path is read in the first that claims it.
LAYOUTS: Registry[Layout] = Registry("data layout")


def _ordered(root: Path, layout: str, labelled: Sequence[tuple[str, str]], source,
             label_file: LabelFile | None = None,
             problems: Mapping[str, str] | None = None) -> Scan:
    """A :class:`Scan` from ``(sample id, class name)`` pairs: classes sorted, samples sorted by
    class and then by id."""
    classes = sorted({c for _, c in labelled})
    index = {c: i for i, c in enumerate(classes)}
    samples = sorted(((rel, index[c]) for rel, c in labelled), key=lambda s: (s[1], s[0]))
    return Scan(root, layout, classes, samples, source, label_file, dict(problems or {}))


def _label_flat(root: Path, layout: str, names: Sequence[str], source,
                label_file: LabelFile, where: str) -> Scan:
    """Label flat images by their file name without extension; record the listed images that
    are absent (as samples named ``<stem>.JPEG``) and the images without a label."""
    labels = label_file.labels
    stems = {os.path.splitext(n)[0] for n in names}
    labelled = [(n, labels[os.path.splitext(n)[0]]) for n in names
                if os.path.splitext(n)[0] in labels]
    missing = [(stem + _LISTED_SUFFIX, w) for stem, w in labels.items() if stem not in stems]
    problems = {rel: f"listed in {label_file.name!r} but not in the {where}" for rel, _ in missing}
    problems.update({n: f"no label in {label_file.name!r}" for n in names
                     if os.path.splitext(n)[0] not in labels})
    if not labelled:
        example = f" (e.g. {names[0]!r} is not; it lists {next(iter(labels))!r}, ...)" \
            if names else ""
        raise InputError(f"{where} {str(root)!r}: none of its {len(names)} images is listed in "
                         f"label file {label_file.name!r}{example}")
    return _ordered(root, layout, labelled + missing, source, label_file, problems)


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


def _as_subset(scan: Scan) -> Scan:
    """``scan`` without the label file's images that are absent (:class:`Subset`)."""
    if scan.label_file is None:
        raise InputError(f"subset: {str(scan.root)!r} is in the {scan.layout} layout (no label "
                         "file), so --subset (library: subset=True) does not apply: a subset "
                         "leaves out the images a label file lists but the folder lacks")
    ids = {rel for rel, _ in scan.samples}
    absent = {rel for rel in scan.label_problems if rel in ids}
    if not absent:
        return scan
    kept = [(rel, scan.classes[y]) for rel, y in scan.samples if rel not in absent]
    present = sorted(rel for rel, _ in kept)
    digest = hashlib.sha256("".join(f"{rel}\n" for rel in present).encode()).hexdigest()
    problems = {rel: why for rel, why in scan.label_problems.items() if rel not in absent}
    out = _ordered(scan.root, scan.layout, kept, scan.source, scan.label_file, problems)
    return replace(out, problems=scan.problems, label_others=scan.label_others,
                   label_found=scan.label_found,
                   subset=Subset(len(scan.label_file.labels), len(kept), digest))


def _mixed(root: Path, what: str, flat: Sequence[str], classes: Sequence[str],
           n_in_classes: int) -> InputError:
    """The error of a folder or archive that holds images both directly and in class
    folders."""
    shown = ", ".join(repr(_shown(c)) for c in classes[:5]) + (", ..." if len(classes) > 5
                                                               else "")
    return InputError(
        f"{what} {str(root)!r} mixes two layouts: {len(flat)} image(s) directly in it (flat, "
        f"e.g. {_shown(flat[0])!r}) and {len(classes)} class folder(s) holding {n_in_classes} "
        f"image(s) ([{shown}]); it is read in one layout only, class folders "
        "(<class>/<image>) or flat images with a label file: move the images into their class "
        "folders, or out of the class folders beside the others")


def _refuse_labels(data: Path, labels: Path | None, layout: str) -> None:
    if labels is not None:
        raise InputError(f"labels: {str(data)!r} is in the {layout} layout (its classes are its "
                         f"folders), so label file {str(labels)!r} does not apply; a label file "
                         "labels a flat folder or archive of images")


# -- class folders ----------------------------------------------------------------------------

def _scan_class_folders(root: Path, labels: Path | None) -> Scan:
    """Class folders; an image file that is a dangling symbolic link is a sample (the image
    check finds it unreadable), one whose name is not UTF-8 a problem; images directly in
    ``root`` beside the class folders are refused (:func:`_mixed`)."""
    _refuse_labels(root, labels, "class-folder")
    classes = list_classes(root)
    for c in classes:
        _refuse_class_name(root, c)
    samples: list[tuple[str, int]] = []
    problems: dict[str, str] = {}
    empty = []
    for i, c in enumerate(classes):
        files = sorted(
            p.relative_to(root).as_posix()
            for p in (root / c).rglob("*")
            if p.suffix.lower() in IMG_EXTENSIONS and (p.is_file() or p.is_symlink())
        )
        if not files:
            empty.append(c)
        samples.extend((f, i) for f in files if _utf8(f))
        problems.update({_shown(f): _not_utf8(f) for f in files if not _utf8(f)})
    flat = _flat_names(root)
    if flat:
        raise _mixed(root, "image folder", flat, classes, len(samples) + len(problems))
    if empty:
        raise FileNotFoundError(
            f"image folder {str(root)!r}: class folder(s) {empty[:5]} contain no image "
            f"({', '.join(IMG_EXTENSIONS)})")
    return Scan(root, "class_folders", classes, samples, FileSource(root), problems=problems)


LAYOUTS.add("class_folders", Layout(
    "class_folders", "a folder with one sub-folder per class: root/<class>/.../<image>",
    lambda p: p.is_dir() and bool(list_classes(p)), _scan_class_folders))


# -- flat folder --------------------------------------------------------------------------------

def _image_entry(e: os.DirEntry) -> bool:
    """An image file, or a symbolic link named as one (dangling ones included: the image check
    reports them, they are not dropped)."""
    return not e.name.startswith(".") and _is_image(e.name) and (e.is_file() or e.is_symlink())


def _flat_names(root: Path) -> list[str]:
    with os.scandir(root) as entries:
        return sorted(e.name for e in entries if _image_entry(e))


def _scan_flat(root: Path, labels: Path | None) -> Scan:
    names = _flat_names(root)
    label_file, others = _labels_for(root, labels, "image folder")
    scan = _label_flat(root, "flat", [n for n in names if _utf8(n)], FileSource(root),
                       label_file, "folder")
    return replace(scan, problems={_shown(n): _not_utf8(n) for n in names if not _utf8(n)},
                   label_others=others, label_found=labels is None)


def _holds_images(root: Path) -> bool:
    with os.scandir(root) as entries:  # stops at the first image
        return any(_image_entry(e) for e in entries)


LAYOUTS.add("flat", Layout(
    "flat", "a folder of images (no class sub-folder) with a label file: the devkit's ground "
            "truth or LOC_val_solution.csv",
    lambda p: p.is_dir() and not list_classes(p) and _holds_images(p), _scan_flat))


# -- tar archive ----------------------------------------------------------------------------------

_COMPRESSED = {b"\x1f\x8b": "gzip", b"BZh": "bzip2", b"\xfd7zXZ\x00": "xz",
               b"\x28\xb5\x2f\xfd": "zstd"}
#: Archives listed in this process: (path, size, modification time) -> [(id, member, offset,
#: size, whether inside a .tar member, why it cannot be read or "")].
_TARS_LISTED: dict[tuple, list[tuple[str, str, int, int, bool, str]]] = {}
#: Links followed in a chain before a link is given up on (as the OS's ELOOP).
_MAX_LINKS = 40


def _compression(path: Path) -> str | None:
    with open(path, "rb") as f:
        head = f.read(6)
    return next((kind for magic, kind in _COMPRESSED.items() if head.startswith(magic)), None)


def _check_end(tf, path: Path, inside: str) -> None:
    """Refuse an archive (or its ``.tar`` member ``inside``) whose members are not followed by
    the end-of-archive marker, two 512-byte zero blocks (POSIX): ``tarfile`` stops without an
    error at the end of the data or at a damaged header, so a copy truncated at a member
    boundary would otherwise read as a smaller archive."""
    import tarfile  # deferred: only an archive needs it

    marker = 2 * tarfile.BLOCKSIZE
    tf.fileobj.seek(tf.offset)
    end = tf.fileobj.read(marker)
    if end == bytes(marker):
        return
    what = f"member {inside!r} of archive {str(path)!r}" if inside else f"archive {str(path)!r}"
    last = f" (the last {tf.members[-1].name!r})" if tf.members else ""
    if end.strip(b"\0"):
        found = "neither a member header nor the end-of-archive marker (two 512-byte zero " \
                "blocks): it is damaged"
    else:
        found = ("the end of the data" if not end else f"{len(end)} zero bytes and then the end")
        found += " instead of the end-of-archive marker (two 512-byte zero blocks): it is " \
                 "truncated"
    raise InputError(f"{what}: after its {len(tf.members)} member(s){last}, at byte "
                     f"{tf.offset}, comes {found}; copy or download it again")


def _resolve_link(name: str, ti, files: Mapping[str, Any],
                  links: Mapping[str, Any]) -> tuple[Any, str]:
    """The regular member a link member resolves to, as extraction would write it (a hard
    link: the member it names; a symbolic link: its target relative to its folder, links
    followed), or ``(None, why)``."""
    seen = 0
    while True:
        if ti.islnk():
            kind, target = "hard link", _norm(ti.linkname)
        else:
            kind = "symbolic link"
            if ti.linkname.startswith("/"):
                return None, f"{kind} to {ti.linkname!r}, outside the archive"
            target = posixpath.normpath(posixpath.join(posixpath.dirname(name), ti.linkname))
            if target == ".." or target.startswith("../"):
                return None, f"{kind} to {ti.linkname!r}, outside the archive"
            target = _norm(target)
        if target in files:
            return files[target], ""
        if target in links and seen < _MAX_LINKS:
            name, ti, seen = target, links[target], seen + 1
            continue
        why = "a chain of links too long (a loop?)" if seen >= _MAX_LINKS \
            else "which is not a file in the archive"
        return None, f"{kind} to {ti.linkname!r}, {why}"


def _tar_listing(path: Path) -> list[tuple[str, str, int, int, bool, str]]:
    """``(sample id, member name, data offset, size, nested, why)`` of every image in an
    uncompressed tar and in its ``.tar`` members (one level: a member ``n01440764.tar``'s
    images get ids ``n01440764/<name>``), from the headers only.

    A link member named as an image (hard or symbolic) is listed with its target's data, as
    extraction would write it; one whose target the archive lacks, or a member named as an
    image that is neither a file nor a link, is listed with offset -1 and ``why`` (an
    unreadable image). An archive (or ``.tar`` member) that does not end with the
    end-of-archive marker is refused (:func:`_check_end`)."""
    import tarfile  # deferred: only an archive needs it

    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    if key in _TARS_LISTED:
        return _TARS_LISTED[key]
    kind = _compression(path)
    if kind is not None:
        raise InputError(f"archive {str(path)!r} is {kind}-compressed; images are read in place "
                         "from an uncompressed .tar (as ImageNet ships them): decompress it "
                         "(the .tar itself, not its contents)")
    out: dict[str, tuple[str, str, int, int, bool, str]] = {}

    def add(rel: str, member: str, ti, base: int | None) -> None:
        if ti.issparse():
            raise InputError(f"archive {str(path)!r}: member {member!r} is a sparse file, "
                             "which cannot be read in place")
        out[rel] = (rel, member, (base or 0) + ti.offset_data, ti.size, base is not None, "")

    def level(tf, base: int | None, prefix: str, inside: str) -> list:
        """The images of one archive level (the archive, or a ``.tar`` member of it at
        ``base``); the ``.tar`` members of the top level."""
        files, links, odd = {}, {}, {}
        for ti in tf:
            name = _norm(ti.name)
            if not name:
                continue
            if ti.isfile():
                files[name] = ti
            elif ti.issym() or ti.islnk():
                links[name] = ti
            elif not ti.isdir() and _is_image(name):
                odd[name] = ti
        _check_end(tf, path, inside)
        member = f"{inside}:" if inside else ""
        tars = []
        for name, ti in files.items():
            if base is None and name.lower().endswith(".tar"):
                tars.append((name, ti))
            elif _is_image(name):
                add(prefix + name, member + ti.name, ti, base)
        for name, ti in links.items():
            if not _is_image(name):
                continue
            target, why = _resolve_link(name, ti, files, links)
            if target is None:
                out[prefix + name] = (prefix + name, member + ti.name, -1, -1, base is not None,
                                      why)
            else:
                add(prefix + name, f"{member}{ti.name} -> {target.name}", target, base)
        for name, ti in odd.items():
            out[prefix + name] = (prefix + name, member + ti.name, -1, -1, base is not None,
                                  f"not a regular file (tar member type {ti.type!r})")
        return tars

    try:
        with tarfile.open(path, "r:") as tf:
            for name, ti in level(tf, None, "", ""):
                with tarfile.open(fileobj=tf.extractfile(ti), mode="r:") as child:
                    level(child, ti.offset_data, f"{name[:-4]}/", ti.name)
    except tarfile.TarError as err:
        if str(err) == "unexpected end of data":
            raise InputError(f"archive {str(path)!r} is truncated: it ends inside the data of a "
                             "member; copy or download it again") from None
        raise InputError(f"archive {str(path)!r} cannot be read as a tar ({err})") from None
    listing = sorted(out.values())
    if len(_TARS_LISTED) > 8:
        _TARS_LISTED.clear()
    _TARS_LISTED[key] = listing
    return listing


def _norm(name: str) -> str:
    """A member name as a relative posix path (``./a/b`` -> ``a/b``)."""
    parts = [p for p in name.replace("\\", "/").split("/") if p not in ("", ".")]
    return "/".join(parts)


def _unwrap(ids: list[str]) -> str:
    """The one top folder every id sits in (``imagenet-r/``), or ``""``."""
    tops = {rel.split("/", 1)[0] for rel in ids}
    if len(tops) == 1 and all("/" in rel for rel in ids):
        return next(iter(tops)) + "/"
    return ""


def _scan_tar(path: Path, labels: Path | None) -> Scan:
    listing = _tar_listing(path)
    if not listing:
        raise FileNotFoundError(f"archive {str(path)!r} holds no image "
                                f"({', '.join(IMG_EXTENSIONS)})")
    prefix = _unwrap([rel for rel, *_ in listing])
    entries = [(rel[len(prefix):], *rest) for rel, *rest in listing]
    problems = {_shown(rel): _not_utf8(rel) for rel, *_ in entries if not _utf8(rel)}
    members = {rel: (member, offset, size) for rel, member, offset, size, _, why in entries
               if not why and _utf8(rel)}
    broken = {rel: (member, why) for rel, member, _, _, _, why in entries
              if why and _utf8(rel)}
    source = TarSource(path, members, broken)
    ids = [rel for rel, *_ in entries if not rel.startswith(".")]
    nested = [rel for rel in ids if "/" in rel]
    if nested:
        _refuse_labels(path, labels, "class-folder")
        classes = sorted({rel.split("/", 1)[0] for rel in nested})
        for c in classes:
            _refuse_class_name(path, c)
        flat = [rel for rel in ids if "/" not in rel]
        if flat:
            raise _mixed(path, "archive", flat, classes, len(nested))
        tars = any(in_tar for *_, in_tar, _ in entries)
        layout = "tar/class_tars" if tars else "tar/class_folders"
        scan = _ordered(path, layout, [(rel, rel.split("/", 1)[0]) for rel in nested
                                       if _utf8(rel)], source)
        return replace(scan, problems=problems)
    label_file, others = _labels_for(path, labels, "archive")
    scan = _label_flat(path, "tar/flat", sorted(rel for rel in ids if _utf8(rel)), source,
                       label_file, "archive")
    return replace(scan, problems=problems, label_others=others, label_found=labels is None)


LAYOUTS.add("tar", Layout(
    "tar", "an uncompressed .tar, read in place: class folders, one <class>.tar per class "
           "(ILSVRC2012_img_train.tar), or flat images with a label file "
           "(ILSVRC2012_img_val.tar); one top folder holding everything is read as the root",
    lambda p: p.is_file() and _tar_names(p), _scan_tar))


def scan_layout(root: str | os.PathLike, labels: str | os.PathLike | None = None, *,
                subset: bool = False) -> Scan:
    """Scan ``root`` in the first layout of :data:`LAYOUTS` that claims it.

    Parameters
    ----------
    root : path
        A folder or a ``.tar`` archive.
    labels : path, optional
        The label file of a flat folder or archive (default: looked for, see the module
        docstring); refused for class folders.
    subset : bool, default False
        Read a layout with a label file as a subset of it: the images the label file lists but
        ``root`` lacks are left out (:class:`Subset`) instead of being samples that the image
        check refuses. Refused for a layout without a label file.

    Raises
    ------
    FileNotFoundError
        ``root`` does not exist, holds no class folder and no image, a class folder holds no
        image, or a flat folder has no label file (the message names the files looked for).
    uqmetrics.InputError
        A label file that does not apply or is malformed, a compressed, truncated or
        unreadable archive, a folder or archive with images both directly in it and in class
        folders, a class folder whose name is not UTF-8, ``subset`` without a label file.
    """
    root = Path(root)
    labels = None if labels is None else Path(labels)
    if labels is not None and not labels.exists():
        raise FileNotFoundError(f"label file {str(labels)!r} does not exist")
    for layout in LAYOUTS.values():
        if layout.claims(root):
            scan = layout.scan(root, labels)
            return _as_subset(scan) if subset else scan
    if not root.exists():
        raise FileNotFoundError(f"image folder {str(root)!r} does not exist")
    if root.is_file():
        raise FileNotFoundError(f"{str(root)!r} is a file, neither an image folder nor a .tar "
                                "archive")
    raise FileNotFoundError(f"image folder {str(root)!r} has no class sub-folder and no image")
