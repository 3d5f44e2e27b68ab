"""The evaluation sets a sweep predicts besides its ``--data`` (``uqvision sweep --sets
EVALSET[:DATASET_NAME]=PATH ...``): each ``EVALSET=PATH`` parsed and checked (:func:`parse_set`), and expanded
into the folders every model predicts (:func:`sweep_targets`, :class:`SweepTarget`): one per
set, or one per member found below ``PATH`` for an expanded set (``imagenet-c``: every
``<corruption>/<severity>/`` folder there).

Each set plays a role (:data:`uqvision.roles.SET_ROLES`), recorded in its caches
(``set_role``) for the score commands: declared as ``ROLE:DATASET_NAME=PATH`` (``fit:fit=
/data/imagenet-fit``, ``calibration:val=...``, ``test:test=...``: an image folder of the
model's classes, the generic ``folder`` set) or ``ROLE:EVALSET:DATASET_NAME=PATH``
(``calibration:imagenet-val:val=...``), else the evaluation set's default
(:func:`uqvision.evalsets.default_role`: ``test`` for a clean set, ``shift`` for a shifted or
relabelled one, ``ood-near``/``ood-far`` for an OOD set). ``--data`` plays the role of
``--role`` (default its evaluation set's).

A target is predicted as ``uqvision predict --eval-set EVALSET [--eval-member MEMBER]`` predicts
it: its cells carry the :class:`~uqvision.predict.PredictConfig` with ``eval_set`` and
``eval_member`` set, and its caches are named by
:func:`uqvision.evalsets.member_dataset_name` (``imagenet-c-fog-3``; a set of one folder: the
folder's name, or the ``DATASET_NAME`` given).

OOD sets (``uqvision sweep --ood-sets OODSET[:DATASET_NAME]=PATH ...``) are the same targets,
restricted to the evaluation sets of role ``ood`` (``ssb-hard``, ``ninco``, ``inaturalist``,
``textures``, ``openimage-o``, ``imagenet-o``, and ``ood-near``/``ood-far`` for any other
folder), and their caches are named by the set (``ninco``; ``DATASET_NAME`` given: by it). PATH
is a folder, an archive or an image list (OpenOOD's ``test_ninco.txt``: the ``image_list``
layout of :mod:`uqvision.layouts`). Every OOD target is checked disjoint from ``--data`` by
content hash before any model runs (:func:`check_ood_targets`).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from uqmetrics import InputError

from ..data import ImageFolderDataset, check_disjoint
from ..evalsets import (
    DEFAULT_EVAL_SET,
    EVAL_SETS,
    check_role,
    iter_member_folders,
    member_dataset_name,
    resolve_member,
)
from ..layouts import is_folder
from ..predict import PredictConfig
from ..roles import SET_ROLES

__all__ = ["OOD_OPTION", "SweepTarget", "check_ood_targets", "parse_set", "sweep_targets"]

#: The option of the OOD sets (how their errors name them).
OOD_OPTION = "--ood-sets"


@dataclass(frozen=True)
class SweepTarget:
    """One folder every model of a sweep predicts.

    Attributes
    ----------
    folder : ImageFolderDataset
        The folder, scanned once.
    config : PredictConfig
        The sweep's, with ``eval_set`` and ``eval_member`` of the target.
    dataset_name : str
        The ``dataset_name`` of its caches (part of their file names).
    source : str or None
        The ``EVALSET=PATH`` it comes from (``None``: the sweep's ``--data``).
    option : str
        The option it was given to (``--sets``, ``--ood-sets``; how errors name it).
    """

    folder: ImageFolderDataset
    config: PredictConfig
    dataset_name: str
    source: str | None = None
    option: str = "--sets"

    @property
    def member(self) -> str | None:
        return self.config.eval_member


def parse_set(value: str | tuple[str, str | os.PathLike], *, option: str = "--sets",
              role: str | None = None) -> tuple[str, Path, str | None, str | None]:
    """``[ROLE:]EVALSET[:DATASET_NAME]=PATH`` or ``ROLE:DATASET_NAME=PATH`` -> (set name,
    path, dataset name or None, declared role or None), checked.

    Parameters
    ----------
    value : str or (str, path)
        ``EVALSET=PATH`` (``EVALSET`` a name of :data:`uqvision.evalsets.EVAL_SETS`), or the
        pair; ``EVALSET:DATASET_NAME=PATH`` names the caches of a set of one folder (default
        the folder's name), e.g. ``imagenet-real:real=/data/imagenet/val``, where the folder
        is the ``--data`` folder too. A role (:data:`uqvision.roles.SET_ROLES`) first
        declares the role the set plays: ``ROLE:DATASET_NAME=PATH`` for an image folder of the
        model's classes (``fit:fit=/data/imagenet-fit``; the generic ``folder`` set), or
        ``ROLE:EVALSET:DATASET_NAME=PATH``; without one, the set plays its default role
        (:func:`uqvision.evalsets.default_role`).
    option : str
        How errors name the option.
    role : str, optional
        Accept only the sets of this kind (``ood`` for ``--ood-sets``).

    Raises
    ------
    uqmetrics.InputError
        Not ``NAME=PATH``, an unknown evaluation set (or one of another kind than ``role``), a
        role the set cannot play (:func:`uqvision.evalsets.check_role`), a dataset name for an
        expanded set, or a path that does not exist; the message names the value.

    Examples
    --------
    >>> parse_set(("fit:fit", "."))[::2], parse_set(("imagenet-c", "."))[::2]
    (('folder', 'fit'), ('imagenet-c', None))
    """
    known = [n for n in EVAL_SETS.names() if role is None or EVAL_SETS[n].role == role]
    if isinstance(value, str):
        name, sep, path = value.partition("=")
        if not sep or not name.strip() or not path.strip():
            example = "ninco=/data/ninco" if role == "ood" else "imagenet-c=/data/imagenet-c"
            raise InputError(f"{option} {value!r}: not EVALSET=PATH (e.g. {example}; sets: "
                             f"{', '.join(known)}; or ROLE:NAME=PATH, e.g. fit:fit=/data/fit)")
    else:
        name, path = value
        value = f"{name}={path}"
    parts = [p.strip() for p in name.split(":")]
    declared: str | None = None
    if len(parts) > 3:
        raise InputError(f"{option} {value!r}: not [ROLE:]EVALSET[:NAME]=PATH")
    if len(parts) == 3 or (parts[0] in SET_ROLES and parts[0] not in EVAL_SETS):
        declared = parts.pop(0)
        if declared not in SET_ROLES:
            raise InputError(f"{option} {value!r}: unknown role {declared!r}; roles: "
                             f"{', '.join(SET_ROLES)}")
        if len(parts) == 1 and parts[0] not in EVAL_SETS:  # ROLE:NAME: a folder of the classes
            if declared == "shift":
                raise InputError(f"{option} {value!r}: role 'shift' is a shifted evaluation "
                                 "set's own: give the set (imagenet-c=PATH, imagenet-v2=PATH, "
                                 "...; shift:EVALSET:NAME=PATH)")
            parts.insert(0, DEFAULT_EVAL_SET)
        elif not parts:
            parts = [DEFAULT_EVAL_SET]
    name = parts[0]
    dataset_name = (parts[1] if len(parts) > 1 else "") or None
    if name not in known:
        what = "unknown evaluation set" if name not in EVAL_SETS else \
            f"evaluation set of role {EVAL_SETS[name].role!r}, not {role!r},"
        raise InputError(f"{option} {value!r}: {what} {name!r}; known: {', '.join(known)}")
    check_role(name, declared, f"{option} {value!r}")
    if dataset_name is not None and EVAL_SETS.lookup(name).members():
        raise InputError(f"{option} {value!r}: a dataset name is for a set of one folder; the "
                         f"caches of {name!r}'s members are named <set>-<member>")
    if not (Path(path).exists() or is_folder(path)):  # a folder inside a tar too
        raise InputError(f"{option} {value!r}: {str(path)!r} does not exist")
    return name, Path(path), dataset_name, declared


def _members(name: str, root: Path, value: str, option: str
             ) -> list[tuple[str | None, Path]]:
    """(member name or None, folder) of one set: a set of one folder is ``root``; an expanded
    set is its member folders found below ``root`` (or ``root`` itself when it is one)."""
    if not EVAL_SETS.lookup(name).members():
        return [(None, root)]
    found = [(m.name, folder) for m, folder in iter_member_folders(root, name)
             if is_folder(folder)]  # extracted, or in an archive (blur.tar/defocus_blur/3)
    if found:
        return found
    try:  # the folder of one member (.../fog/3)
        member = resolve_member(name, None, root)
    except InputError:
        member = None
    if member is None:
        raise InputError(f"{option} {value!r}: {str(root)!r} holds no member folder of eval "
                         f"set {name!r} (<corruption>/<severity>/ folders, e.g. "
                         f"{EVAL_SETS.lookup(name).members()[0].folder!r})")
    return [(member.name, root)]


def sweep_targets(data: ImageFolderDataset, config: PredictConfig,
                  sets: Iterable[str | tuple[str, str | os.PathLike] | SweepTarget] = (), *,
                  dataset_name: str | None = None, option: str = "--sets",
                  ood_sets: Iterable[str | tuple[str, str | os.PathLike]] = ()
                  ) -> list[SweepTarget]:
    """The folders a sweep predicts: ``data`` (first), every member of ``sets``, then every
    OOD set of ``ood_sets``.

    Parameters
    ----------
    data : ImageFolderDataset
        The sweep's ``--data``, predicted with ``config`` as it is.
    config : PredictConfig
    sets : iterable of str or (str, path) or SweepTarget
        ``EVALSET=PATH`` each (:func:`parse_set`), or targets an earlier call returned (their
        folders are not scanned again; their config is ``config`` with their set, member,
        role and variables: ``uqvision evaluate`` records the embeddings only on the sets
        its detectors read).
    dataset_name : str, optional
        The dataset name of ``data`` (default the folder's name).
    option : str
        How errors name the option of ``sets``.
    ood_sets : iterable of str or (str, path)
        ``OODSET[:DATASET_NAME]=PATH`` each (:data:`OOD_OPTION`): as ``sets``, restricted to
        the sets of role ``ood``, their caches named by the set unless ``DATASET_NAME`` is
        given. Predicted with ``config`` as the others (``embeddings``, ``extra_variables``:
        what the OOD detectors read must be asked of every target alike).

    Returns
    -------
    list of SweepTarget

    Raises
    ------
    uqmetrics.InputError
        A bad ``EVALSET=PATH`` (:func:`parse_set`), an expanded set with no member folder
        below its path, or two targets with one dataset name (their caches would share file
        names).
    """
    check_role(config.eval_set, config.role, f"--role {config.role!r}")
    # the --data's caches are named as before the sets (its folder's name)
    targets = [SweepTarget(data, config, dataset_name or Path(data.root).resolve().name)]
    seen = {targets[0].dataset_name: "--data"}
    for value in sets:
        if isinstance(value, SweepTarget):  # checked and scanned by an earlier call
            if value.dataset_name in seen:
                raise InputError(f"{option} {value.source!r}: its dataset name "
                                 f"{value.dataset_name!r} is {seen[value.dataset_name]}'s too")
            seen[value.dataset_name] = f"{value.option} {value.source!r}"
            targets.append(dataclasses.replace(value, config=dataclasses.replace(
                config, eval_set=value.config.eval_set, eval_member=value.member,
                role=value.config.role, embeddings=value.config.embeddings,
                extra_variables=value.config.extra_variables)))
            continue
        targets.extend(_targets_of(value, config, option, seen, role=None))
    for value in ood_sets:
        targets.extend(_targets_of(value, config, OOD_OPTION, seen, role="ood"))
    return targets


def _targets_of(value: str | tuple[str, str | os.PathLike], config: PredictConfig,
                option: str, seen: dict[str, str], *, role: str | None) -> list[SweepTarget]:
    """The targets of one ``EVALSET=PATH`` (each member of an expanded set), their dataset
    names recorded in ``seen`` (name -> who has it); an OOD set (``role="ood"``) is named by
    its set by default. Each plays its declared role, else its set's default (never the
    ``--data``'s ``--role``)."""
    name, root, given, declared = parse_set(value, option=option, role=role)
    text = value if isinstance(value, str) else f"{name}={root}"
    out = []
    for member, folder in _members(name, root, text, option):
        cfg = dataclasses.replace(config, eval_set=name, eval_member=member, role=declared)
        ds = ImageFolderDataset(folder, unlabelled=EVAL_SETS.lookup(name).class_map == "none")
        label = given or (name if role == "ood" and member is None else member_dataset_name(
            name, None if member is None else EVAL_SETS.lookup(name).member(member), folder))
        if label in seen and member is not None:  # an expanded set's members: <set>-<member>
            raise InputError(
                f"{option} {text!r}: its member {member!r} is named {label!r} (the caches' file "
                f"names: <set>-<member>), as {seen[label]}'s; two {name} sets cannot share one "
                "caches folder: evaluate the other in another output folder")
        if label in seen:
            raise InputError(
                f"{option} {text!r}: its dataset name {label!r} (the caches' file names) is "
                f"{seen[label]}'s too; give the folders other names (or "
                f"{name}:NAME={root})"
                + (" or --data another --dataset-name" if seen[label] == "--data" else ""))
        seen[label] = f"{option} {text!r}"
        out.append(SweepTarget(ds, cfg, label, text, option))
    return out


def check_ood_targets(data: ImageFolderDataset, targets: Iterable[SweepTarget], *,
                      cache_dir: str | os.PathLike | None = None) -> int:
    """Check every target of role ``ood`` disjoint from ``data`` by content hash
    (:func:`uqvision.data.check_disjoint`), before any model runs.

    Parameters
    ----------
    data : ImageFolderDataset
        The sweep's ``--data`` (hashed once for all the OOD sets).
    targets : iterable of SweepTarget
        :func:`sweep_targets`'s (``--data``'s own target, of its own set, included or not).
    cache_dir : path, optional
        Where the content hashes are kept (:func:`uqvision.data.content_hashes`).

    Returns
    -------
    int
        The number of OOD images checked.

    Raises
    ------
    uqmetrics.InputError
        An OOD set holding an image of ``data``: one line naming the set (its option and
        value), the count and the first (ID, OOD) pairs.
    """
    n = 0
    for t in targets:
        if t.source is not None and EVAL_SETS.lookup(t.config.eval_set).role == "ood":
            n += check_disjoint(data, t.folder, name=f"{t.option} {t.source!r}",
                                cache_dir=cache_dir)
    return n

