"""The ``tar`` layout: an uncompressed ``.tar`` archive read in place (nothing is extracted),
holding class folders, one ``<class>.tar`` per class (``ILSVRC2012_img_train.tar``), or flat
images with a label file (``ILSVRC2012_img_val.tar``); registered in
:data:`~uqvision.layouts.LAYOUTS` after the folder layouts.

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

A folder inside an archive is a path through it, ``ARCHIVE.tar/<inner>/<dir>`` (ImageNet-C's
``blur.tar/defocus_blur/3``): the ``tar_folder`` layout, registered after ``tar``, reads it as
the ``tar`` layout reads a whole archive (its sub-folders are the classes), from the same
listing: an archive is listed once whichever of its folders are read, and a folder's images
are found in the sorted listing by bisection. Its layout records the inner folder
(``tar/class_folders:defocus_blur/3``), so the fingerprints of two folders of one archive
differ. :func:`is_folder` says whether a path is a folder, on disk or in an archive.
"""

from __future__ import annotations

import bisect
import os
import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from uqmetrics import InputError

from .base import (
    LAYOUTS,
    Layout,
    Scan,
    _hidden_class,
    _label_flat,
    _mixed,
    _ordered,
    _refuse_labels,
)
from .labels import _labels_for
from .names import (
    IMG_EXTENSIONS,
    _hidden,
    _is_image,
    _not_utf8,
    _refuse_class_name,
    _shown,
    _tar_names,
    _utf8,
)
from .sources import TarSource

__all__ = ["is_folder"]


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


def _scan_tar(path: Path, labels: Path | None, archive: Path | None = None,
              inner: str = "") -> Scan:
    """Scan an archive, or its folder ``inner`` (``path`` then being ``archive/inner``): class
    folders, class tars or flat images with a label file; a whole archive whose every image
    sits in one top folder is read as that folder (a folder inside it never is: its
    sub-folders are the classes, however many)."""
    archive = path if archive is None else archive
    everything = _tar_listing(archive)
    listing = _below(everything, inner + "/") if inner else everything
    if inner and not listing:
        raise _no_folder(path, archive, inner, everything)
    if not listing:
        raise FileNotFoundError(f"archive {str(path)!r} holds no image "
                                f"({', '.join(IMG_EXTENSIONS)})")
    prefix = inner + "/" if inner else _unwrap([rel for rel, *_ in listing])
    everyone = [(rel[len(prefix):], *rest) for rel, *rest in listing]
    # hidden names at any depth are not read, as in a folder (uqvision.layouts.names._hidden)
    entries = [e for e in everyone if not any(map(_hidden, e[0].split("/")))]
    problems = {_shown(rel): _not_utf8(rel) for rel, *_ in entries if not _utf8(rel)}
    members = {rel: (member, offset, size) for rel, member, offset, size, _, why in entries
               if not why and _utf8(rel)}
    broken = {rel: (member, why) for rel, member, _, _, _, why in entries
              if why and _utf8(rel)}
    source = TarSource(archive, members, broken)
    within = f":{inner}" if inner else ""  # the layout of a folder in an archive names it
    ids = [rel for rel, *_ in entries]
    nested = [rel for rel in ids if "/" in rel]
    if nested:
        _refuse_labels(path, labels, "class-folder")
        classes = sorted({rel.split("/", 1)[0] for rel in nested})
        for c in classes:
            _refuse_class_name(path, c)
        hidden = sorted(rel for rel, *_ in everyone if "/" in rel and _hidden(rel))
        if hidden:  # a folder extraction writes beside the class folders: refused, as there
            top = hidden[0].split("/", 1)[0]
            raise _hidden_class(path, "archive", top,
                                [rel for rel in hidden if rel.startswith(top + "/")], classes)
        flat = [rel for rel in ids if "/" not in rel]
        if flat:
            raise _mixed(path, "archive", flat, classes, len(nested))
        tars = any(in_tar for *_, in_tar, _ in entries)
        layout = ("tar/class_tars" if tars else "tar/class_folders") + within
        scan = _ordered(path, layout, [(rel, rel.split("/", 1)[0]) for rel in nested
                                       if _utf8(rel)], source)
        return replace(scan, problems=problems)
    label_file, others = _labels_for(path, labels, "archive")
    scan = _label_flat(path, "tar/flat" + within, sorted(rel for rel in ids if _utf8(rel)),
                       source, label_file, "archive")
    return replace(scan, problems=problems, label_others=others, label_found=labels is None)


# -- a folder inside a tar archive --------------------------------------------------------------

def _in_tar(path: Path) -> tuple[Path, str] | None:
    """``(archive, inner folder)`` of a path through an archive (``d/blur.tar/fog/3`` ->
    ``(d/blur.tar, "fog/3")``): the nearest existing path above ``path`` is a file named as an
    archive; ``None`` otherwise (``path`` exists, or its nearest existing parent is a
    folder)."""
    if os.path.lexists(path):
        return None
    for above in path.parents:
        if os.path.lexists(above):
            if above.is_file() and _tar_names(above):
                return above, _norm(path.relative_to(above).as_posix())
            return None
    return None


def _below(listing: Sequence[tuple], prefix: str) -> Sequence[tuple]:
    """The entries of a sorted listing whose id starts with ``prefix`` (``""`` or a folder and
    ``/``), found by bisection: ids below ``fog/3/`` sort before ``fog/30``."""
    if not prefix:
        return listing
    lo = bisect.bisect_left(listing, (prefix,))
    return listing[lo:bisect.bisect_left(listing, (prefix[:-1] + "0",), lo)]


def _no_folder(path: Path, archive: Path, inner: str,
               listing: Sequence[tuple]) -> FileNotFoundError:
    """The error of a path through an archive to a folder it lacks, naming the folders the
    archive's ``listing`` has in the nearest folder above it that it has."""
    parent = posixpath.dirname(inner)
    while parent and not _below(listing, parent + "/"):
        parent = posixpath.dirname(parent)
    prefix = parent + "/" if parent else ""
    there = sorted({rel[len(prefix):].split("/", 1)[0] for rel, *_ in _below(listing, prefix)
                    if "/" in rel[len(prefix):]})
    shown = ", ".join(repr(_shown(prefix + f)) for f in there[:8]) + (", ..." if len(there) > 8
                                                                      else "")
    where = f"in {parent!r}" if parent else "at its top"
    return FileNotFoundError(
        f"image folder {str(path)!r}: archive {str(archive)!r} has no folder {inner!r} (no image "
        f"below it); its folders {where} are [{shown}]")


def _scan_tar_folder(path: Path, labels: Path | None) -> Scan:
    archive, inner = _in_tar(path)
    return _scan_tar(path, labels, archive, inner)


def is_folder(path: str | os.PathLike) -> bool:
    """Whether ``path`` is an image folder: a folder on disk, or one inside an uncompressed tar
    archive, ``ARCHIVE.tar/<inner>/<dir>``, that holds an image below it (the archive is
    listed from its headers, once: :mod:`uqvision.layouts.tars`).

    Parameters
    ----------
    path : path

    Raises
    ------
    uqmetrics.InputError
        The path runs through an archive that is compressed, truncated or unreadable.

    Examples
    --------
    >>> is_folder("/nonexistent/blur.tar/defocus_blur/3")
    False
    """
    path = Path(path)
    if path.is_dir():
        return True
    found = _in_tar(path)
    return found is not None and bool(_below(_tar_listing(found[0]), found[1] + "/"))


LAYOUTS.add("tar", Layout(
    "tar", "an uncompressed .tar, read in place: class folders, one <class>.tar per class "
           "(ILSVRC2012_img_train.tar), or flat images with a label file "
           "(ILSVRC2012_img_val.tar); one top folder holding everything is read as the root",
    lambda p: p.is_file() and _tar_names(p), _scan_tar))


LAYOUTS.add("tar_folder", Layout(
    "tar_folder", "a folder inside an uncompressed .tar, given as ARCHIVE.tar/<inner>/<dir> "
                  "(ImageNet-C's blur.tar/defocus_blur/3), read in place as the tar layout "
                  "reads an archive: its sub-folders are the classes",
    lambda p: _in_tar(p) is not None, _scan_tar_folder))
