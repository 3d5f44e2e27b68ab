"""The evaluation sets a sweep predicts besides its ``--data`` (``uqvision sweep --sets
EVALSET[:DATASET_NAME]=PATH ...``): each ``EVALSET=PATH`` parsed and checked (:func:`parse_set`), and expanded
into the folders every model predicts (:func:`sweep_targets`, :class:`SweepTarget`): one per
set, or one per member found below ``PATH`` for an expanded set (``imagenet-c``: every
``<corruption>/<severity>/`` folder there).

A target is predicted as ``uqvision predict --eval-set EVALSET [--eval-member MEMBER]`` predicts
it: its cells carry the :class:`~uqvision.predict.PredictConfig` with ``eval_set`` and
``eval_member`` set, and its caches are named by
:func:`uqvision.evalsets.member_dataset_name` (``imagenet-c-fog-3``; a set of one folder: the
folder's name, or the ``DATASET_NAME`` given).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from uqmetrics import InputError

from ..data import ImageFolderDataset
from ..evalsets import EVAL_SETS, iter_member_folders, member_dataset_name, resolve_member
from ..layouts import is_folder
from ..predict import PredictConfig

__all__ = ["SweepTarget", "parse_set", "sweep_targets"]


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
    """

    folder: ImageFolderDataset
    config: PredictConfig
    dataset_name: str
    source: str | None = None

    @property
    def member(self) -> str | None:
        return self.config.eval_member


def parse_set(value: str | tuple[str, str | os.PathLike], *,
              option: str = "--sets") -> tuple[str, Path, str | None]:
    """``EVALSET[:DATASET_NAME]=PATH`` -> (set name, path, dataset name or None), checked.

    Parameters
    ----------
    value : str or (str, path)
        ``EVALSET=PATH`` (``EVALSET`` a name of :data:`uqvision.evalsets.EVAL_SETS`), or the
        pair; ``EVALSET:DATASET_NAME=PATH`` names the caches of a set of one folder (default
        the folder's name), e.g. ``imagenet-real:real=/data/imagenet/val``, where the folder
        is the ``--data`` folder too.
    option : str
        How errors name the option.

    Raises
    ------
    uqmetrics.InputError
        Not ``NAME=PATH``, an unknown evaluation set, a dataset name for an expanded set, or a
        path that does not exist; the message names the value.
    """
    if isinstance(value, str):
        name, sep, path = value.partition("=")
        if not sep or not name.strip() or not path.strip():
            raise InputError(f"{option} {value!r}: not EVALSET=PATH (e.g. imagenet-c=/data/"
                             f"imagenet-c; sets: {', '.join(EVAL_SETS.names())})")
    else:
        name, path = value
        value = f"{name}={path}"
    name, _, dataset_name = name.strip().partition(":")
    dataset_name = dataset_name.strip() or None
    if name not in EVAL_SETS:
        raise InputError(f"{option} {value!r}: unknown evaluation set {name!r}; known: "
                         f"{', '.join(EVAL_SETS.names())}")
    if dataset_name is not None and EVAL_SETS.lookup(name).members():
        raise InputError(f"{option} {value!r}: a dataset name is for a set of one folder; the "
                         f"caches of {name!r}'s members are named <set>-<member>")
    if not (Path(path).exists() or is_folder(path)):  # a folder inside a tar too
        raise InputError(f"{option} {value!r}: {str(path)!r} does not exist")
    return name, Path(path), dataset_name


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
                  dataset_name: str | None = None, option: str = "--sets"
                  ) -> list[SweepTarget]:
    """The folders a sweep predicts: ``data`` (first) and every member of ``sets``.

    Parameters
    ----------
    data : ImageFolderDataset
        The sweep's ``--data``, predicted with ``config`` as it is.
    config : PredictConfig
    sets : iterable of str or (str, path) or SweepTarget
        ``EVALSET=PATH`` each (:func:`parse_set`), or targets an earlier call returned (their
        folders are not scanned again; their config is ``config`` with their set and
        member).
    dataset_name : str, optional
        The dataset name of ``data`` (default the folder's name).
    option : str
        How errors name the option.

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
    # the --data's caches are named as before the sets (its folder's name)
    targets = [SweepTarget(data, config, dataset_name or Path(data.root).resolve().name)]
    seen = {targets[0].dataset_name: "--data"}
    for value in sets:
        if isinstance(value, SweepTarget):  # checked and scanned by an earlier call
            if value.dataset_name in seen:
                raise InputError(f"{option} {value.source!r}: its dataset name "
                                 f"{value.dataset_name!r} is {seen[value.dataset_name]}'s too")
            seen[value.dataset_name] = f"{option} {value.source!r}"
            targets.append(dataclasses.replace(value, config=dataclasses.replace(
                config, eval_set=value.config.eval_set, eval_member=value.member)))
            continue
        name, root, given = parse_set(value, option=option)
        text = value if isinstance(value, str) else f"{name}={root}"
        for member, folder in _members(name, root, text, option):
            cfg = dataclasses.replace(config, eval_set=name, eval_member=member)
            ds = ImageFolderDataset(folder)
            label = given or member_dataset_name(
                name, None if member is None else EVAL_SETS.lookup(name).member(member), folder)
            if label in seen:
                raise InputError(
                    f"{option} {text!r}: its dataset name {label!r} (the caches' file names) is "
                    f"{seen[label]}'s too; give the folders other names (or "
                    f"{name}:NAME={root})"
                    + (" or --data another --dataset-name" if seen[label] == "--data" else ""))
            seen[label] = f"{option} {text!r}"
            targets.append(SweepTarget(ds, cfg, label, text))
    return targets

