"""The roles of evaluation sets, and the options a score command takes them by.

Every set a model predicts has a declared **role** (:data:`SET_ROLES`), recorded in its caches
(attr :data:`ROLE_ATTR`): ``calibration`` (where a temperature or conformal sets are
calibrated), ``test`` (the in-distribution test set), ``fit`` (the in-distribution training
subset a feature detector fits on: never scored), ``ood-near`` and ``ood-far`` (OOD sets),
``shift`` (a shifted copy of the classes: each member of ImageNet-C, V2, Sketch, ...) and
``ood-val`` (an OOD validation set, which ``uqvision score ood --tune-detectors`` selects the
detectors' parameters on: never scored as a test OOD set; declared, never a default). A sweep
takes it from ``--sets ROLE:NAME=PATH`` or gives a set its evaluation set's default
(:func:`uqvision.evalsets.default_role`).

A score command takes its sets by role and name (``--test val``, ``--calibration val``,
``--fit fit``): without one, the only set of that role (:func:`uqvision.predictors.pick_set`);
two of a role are refused, naming them and the option; nothing is taken from the order of the
datasets, and a ``fit`` set is never a test or calibration set. Ensembles are declared too:
``--ensemble NAME=M1,M2,...`` (:func:`declared_ensembles`), besides the members of one
``uqvision train --members K`` run.

This module holds only names and option definitions (no numpy, no torch): the protocols'
option lists import it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from uqmetrics import InputError
from uqmetrics.runs.config_options import ConfigOption

__all__ = ["LABELLED_ROLES", "RETIRED_ROLE_OPTIONS", "ROLE_ALIASES", "ROLE_ATTR", "SET_ROLES",
           "declared_ensembles", "ensemble_option", "legacy_config", "role_option"]

#: The roles of a set (see the module docstring), recorded in a cache's attr :data:`ROLE_ATTR`.
SET_ROLES = ("calibration", "test", "fit", "ood-near", "ood-far", "shift", "ood-val")
#: The cache attr that records its set's role (``role`` records the evaluation set's kind:
#: clean, shifted, ood or relabelled).
ROLE_ATTR = "set_role"
#: The roles a test or calibration set may have (a ``fit`` set is training images; an OOD set
#: has no labels; a ``shift`` set is scored as shifted).
LABELLED_ROLES = ("test", "calibration")

#: What each role option is for, in the help (``{protocol}``: the protocol's name).
_ROLE_HELP = {
    "test": "{protocol}: dataset_name of the test set (default: the only set of role test; "
            "two are refused, naming them; never a set of role fit)",
    "calibration": "{protocol}: dataset_name of the calibration set (default: the only set of "
                   "role calibration, else a held-out split of the test set; never a set of "
                   "role fit)",
    "fit": "{protocol}: dataset_name of the ID training subset the feature detectors fit on "
           "(default: the only set of role fit; none: those detectors are skipped)",
}


def role_option(field: str, protocol: str, help: str | None = None) -> ConfigOption:
    """The option of a score config's role field (``test``, ``calibration``, ``fit``):
    ``--test NAME`` etc., a dataset name."""
    return ConfigOption(field, metavar="NAME",
                        help=help or _ROLE_HELP[field].format(protocol=protocol))


def ensemble_option(protocol: str) -> ConfigOption:
    """``--ensemble NAME=M1,M2,... [NAME=...]``: the ensembles a score command forms, besides
    the members of each ``uqvision train --members K`` run (config field ``ensembles``)."""
    return ConfigOption(
        "ensembles", flag="--ensemble", nargs="+", metavar="NAME=M1,M2",
        help=f"{protocol}: an ensemble row NAME averaging the models M1, M2, ... (their caches' "
             "model attr; several: NAME=... NAME=...). Rows are formed only from models "
             "declared together: here, or the members of one uqvision train --members K run; "
             "models of different architectures are warned about and noted in the result")


def declared_ensembles(value: Any) -> dict[str, tuple[str, ...]]:
    """A config's ``ensembles`` as ``{name: (member, ...)}``.

    Parameters
    ----------
    value : mapping, iterable of str, str or None
        ``{name: [member, ...]}``, or ``NAME=M1,M2,...`` strings (``--ensemble``); ``None`` or
        empty: none.

    Raises
    ------
    uqmetrics.InputError
        A value that is not ``NAME=M1,M2,...``, an empty name or member, fewer than two
        members, a member twice, or a name declared twice; the message names the value.

    Examples
    --------
    >>> declared_ensembles(["e=a,b", "f=c, d"])
    {'e': ('a', 'b'), 'f': ('c', 'd')}
    >>> declared_ensembles({"e": ["a", "b"]})
    {'e': ('a', 'b')}
    """
    if value is None:
        return {}
    pairs: Iterable[tuple[Any, Any]]
    if isinstance(value, Mapping):
        pairs = value.items()
    else:
        items = [value] if isinstance(value, str) else list(value)
        pairs = []
        for item in items:
            name, sep, members = str(item).partition("=") if isinstance(item, str) \
                else ("", "", "")
            if not sep:
                raise InputError(f"ensembles (--ensemble) {item!r}: not NAME=M1,M2,... (an "
                                 "ensemble row is declared with its members, e.g. "
                                 "ens=resnet50,vit_b_16; the members of one uqvision train "
                                 "--members K run form theirs without it)")
            pairs.append((name, members.split(",")))
    out: dict[str, tuple[str, ...]] = {}
    for name, members in pairs:
        name = str(name).strip()
        members = [str(m).strip() for m in ([members] if isinstance(members, str) else members)]
        text = f"{name}={','.join(members)}"
        if not name or not all(members):
            raise InputError(f"ensembles (--ensemble) {text!r}: an empty name or member")
        if len(members) < 2 or len(set(members)) != len(members):
            raise InputError(f"ensembles (--ensemble) {text!r}: an ensemble needs two or more "
                             "distinct members")
        if name in out:
            raise InputError(f"ensembles (--ensemble): {name!r} is declared twice")
        out[name] = tuple(members)
    return out


#: The score options of before set roles that name a set: old flag -> the role option it is
#: now a hidden alias of, where a protocol has that option (``uqvision score NAME``).
ROLE_ALIASES = {"--dataset": "--test", "--calibration-dataset": "--calibration",
                "--clean-dataset": "--test", "--id-dataset": "--test", "--fit-data": "--fit"}
#: The score options of before declared ensembles: old flag -> (the option that replaces it,
#: the one-line refusal; ``{value}``: the value given).
RETIRED_ROLE_OPTIONS = {
    "--ensembles": ("--ensemble", ("ensembles are declared now: write --ensemble "
                                   "NAME=M1,M2,... (the members of one uqvision train "
                                   "--members K run form their row without it); got "
                                   "--ensembles {value}"))}

#: Config fields renamed when sets got roles: old name -> new (:func:`legacy_config`).
_RENAMED = {"calibration_dataset": "calibration", "clean_dataset": "test",
            "id_dataset": "test", "fit_data": "fit", "dataset": "test"}


def legacy_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """A score file's recorded configuration with the fields of before set roles renamed
    (``calibration_dataset`` -> ``calibration``, ``clean_dataset``/``id_dataset``/``dataset``
    -> ``test``, ``fit_data`` -> ``fit``), and ``ensembles`` of training-method names (rows
    were then formed per method) dropped: what ``uqvision verify`` rescores such a file with
    (its ensemble rows, no longer formed, are then reported as differing)."""
    out = {_RENAMED.get(k, k): v for k, v in config.items()}
    ens = out.get("ensembles")
    if ens is not None and not isinstance(ens, Mapping) and all(
            isinstance(e, str) and "=" not in e for e in ([ens] if isinstance(ens, str)
                                                          else ens)):
        out["ensembles"] = None
    return out
