"""The whole evaluation of a model zoo in one resumable command (``uqvision evaluate FILE``;
docs/evaluate.md).

An evaluation is a TOML file (:func:`read_evaluation`, every key and value checked there): the
models (names, wildcards, ``NAME=FILE``, zoos), the sets with the role each plays
(:data:`uqvision.roles.SET_ROLES`), the protocols to score with their options (the options of
``uqvision score NAME``, plugin protocols included), the ensembles to form and the output
folder. :func:`plan_evaluation` plans it once: every model predicts every set a chosen
protocol reads (:data:`READS`; one sweep, :func:`uqvision.sweep.sweep_predictions`: each
image decoded once per preprocessing group, every cell resumed), each set recording only the
variables the chosen protocols read (the embeddings and the linear head only on the sets a
feature detector reads, and only when one is asked for); then every protocol is scored as
``uqvision score NAME`` scores it, given the caches of the roles it reads, its sets named by
role (``--test``, ``--calibration``, ``--fit``) and its ensembles declared (``--ensemble``):
it prints and writes its headline table. Its figures are drawn and the report site is
written (:func:`run_evaluation`).

What is done is recorded in ``OUT/evaluate.state.json``: for each set, the variables its
caches hold; for each score file, the command that made it and the caches it read (their
size and modification time). A rerun computes only what is missing or out of date:

- a cell whose cache is complete is skipped (the sweep's own resume); a set whose caches lack
  a variable a protocol now needs has them recomputed with it (the variables a set's caches
  hold are never taken away: a cache that is right stays), and so does a set the file now
  gives another role (its caches record the role, ``set_role``, outside their identity);
- a score is recomputed when its options, the sets named to it or the caches of the roles it
  reads changed (a model added, a cache recomputed), and not otherwise: a protocol added
  computes that protocol alone (and the sets and variables it reads that no other did);
- a protocol's figures when its score file changed, the site when any did.

A sweep where a model failed stops the evaluation before any score is written: a score file
is never rewritten with fewer models. Files in the output folder that the evaluation did not
write are never replaced without ``overwrite``.

Killed at any point, a rerun resumes to the same results: every file is written whole, a
score (and the site) is recorded as being written before its command runs (its files are
then the evaluation's own, out of date: removed and written anew, as the first time; the
record names a mark the run made in the output folder, by its inode and change time, so that
a state file received with a folder vouches for none of its files), and a run holds
:data:`LOCK_FILE` and first removes what writes cut short left in the output folder
(tests/test_evaluate_interrupted.py).

The file and the output folder may come from someone else (tests/test_evaluate_received.py):
the file's ``out`` stays inside the file's folder (``--out`` writes anywhere), a link
inside the output folder where the evaluation writes is refused before any work, and where
and how the models run is the command line's: ``[predict]`` refuses the launcher options
(``device``, the loader's ``workers``), which ``uqvision evaluate`` takes as options
(:func:`add_launcher_options`, tests/test_evaluate_launchers.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import re
import sys
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from uqmetrics import InputError

from .roles import SET_ROLES

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

__all__ = ["LOCK_FILE", "READS", "STATE_FILE", "Evaluation", "EvaluationPlan",
           "EvaluationReport", "EvaluationSet", "add_launcher_options", "dry_run_lines",
           "launcher_settings", "plan_evaluation", "read_evaluation", "read_state",
           "run_evaluation"]

#: Where an evaluation records what it did, below its output folder.
STATE_FILE = "evaluate.state.json"
#: The lock an evaluation holds on its output folder while it runs (one at a time).
LOCK_FILE = ".evaluate.lock"
#: The keys of an evaluation file (tables: ``predict``, ``sets``, ``ensembles``, ``protocols``).
TOP_KEYS = ("out", "root", "models", "zoo", "figures", "predict", "sets", "ensembles",
            "protocols")
#: The keys of a set's table.
SET_KEYS = ("role", "set", "path")
#: The option of ``uqvision score NAME`` each role is named to (where the protocol has it).
ROLE_OPTIONS = {"test": "--test", "calibration": "--calibration", "fit": "--fit"}
#: The option of ``uqvision score NAME`` the declared ensembles are given to.
ENSEMBLE_OPTION = "--ensemble"
#: Options of ``uqvision score NAME`` the evaluation gives itself (never from its file).
_SCORE_OWN = ("caches", "out", "dataset", "overwrite", "config", "skip-incomplete",
              *(o[2:] for o in ROLE_OPTIONS.values()), ENSEMBLE_OPTION[2:])
#: Prediction options (``uqvision sweep``'s) the evaluation decides itself: the variables
#: every set records, each set's evaluation set and role, the names of the caches.
_PREDICT_OWN = ("embeddings", "cache-variables", "eval-set", "eval-member", "role", "labels",
                "subset", "dataset-name", "overwrite", "config")
#: The roles of the sets each protocol reads: its score command is given their caches, and
#: its score is recomputed when they change (a protocol not listed, a plugin's, reads every
#: set). Calibration is a split of the test set unless a calibration set is declared.
READS = {"selective": ("test",),
         "shift": ("test", "calibration", "shift"),
         "ood": ("test", "fit", "ood-near", "ood-far", "calibration", "ood-val"),
         "conformal": ("test", "calibration", "shift")}
#: The roles whose sets the OOD protocol's feature detectors read (the ID test set, the fit
#: subset and the OOD sets): where the embeddings and the head are recorded.
_FEATURE_ROLES = READS["ood"]


def _shown(value: Any) -> str:
    return json.dumps(value) if isinstance(value, (str, bool, list, dict)) else repr(value)


# ---------------------------------------------------------------------------------------------
# the evaluation file


@dataclass(frozen=True)
class EvaluationSet:
    """One set of an evaluation.

    Attributes
    ----------
    name : str
        Its table's name: the dataset name of its caches (an expanded set's members are named
        ``<set>-<member>``, e.g. ``imagenet-c-fog-3``).
    role : str
        The role it plays (:data:`uqvision.roles.SET_ROLES`).
    eval_set : str
        What the folder is (:data:`uqvision.evalsets.EVAL_SETS`).
    path : Path
        The folder, archive or image list (absolute).
    """

    name: str
    role: str
    eval_set: str
    path: Path

    @property
    def expanded(self) -> bool:
        """Whether the set stands for several member folders (ImageNet-C)."""
        from .evalsets import EVAL_SETS

        return bool(EVAL_SETS.lookup(self.eval_set).members())

    @property
    def value(self) -> str:
        """The set as ``uqvision sweep --sets`` takes it: ``ROLE:EVALSET:NAME=PATH`` (an
        expanded set: ``ROLE:EVALSET=PATH``).

        Examples
        --------
        >>> EvaluationSet("fit", "fit", "folder", Path("/data/fit")).value
        'fit:folder:fit=/data/fit'
        >>> EvaluationSet("c", "shift", "imagenet-c", Path("/data/c")).value
        'shift:imagenet-c=/data/c'
        """
        name = "" if self.expanded else f":{self.name}"
        return f"{self.role}:{self.eval_set}{name}={self.path}"


@dataclass(frozen=True)
class Evaluation:
    """An evaluation file, read and checked (:func:`read_evaluation`).

    Attributes
    ----------
    source : Path
        The file.
    out : Path
        The output folder (absolute).
    models : tuple of str
        Names, wildcards and ``NAME=FILE`` (``FILE`` absolute), as ``uqvision sweep
        --models`` takes them.
    zoos : tuple of str
    sets : tuple of EvaluationSet
        In the file's order, the test set first.
    protocols : dict
        Protocol name -> its options as ``uqvision score NAME`` arguments.
    ensembles : dict
        Ensemble name -> its members (model rows).
    predict : tuple of str
        The prediction options as ``uqvision sweep`` arguments.
    figures : bool
        Draw the protocols' figures (and put them on the site).
    out_given : str
        How errors name the output folder: ``--out``, or the file's key that gave it.
    """

    source: Path
    out: Path
    models: tuple[str, ...]
    zoos: tuple[str, ...]
    sets: tuple[EvaluationSet, ...]
    protocols: dict[str, tuple[str, ...]]
    ensembles: dict[str, tuple[str, ...]]
    predict: tuple[str, ...] = ()
    figures: bool = True
    out_given: str = "--out"

    def of_role(self, role: str) -> list[EvaluationSet]:
        """The sets that play ``role``."""
        return [s for s in self.sets if s.role == role]

    @property
    def test(self) -> EvaluationSet:
        """The test set (every evaluation has one)."""
        return self.of_role("test")[0]


class _Refusing(argparse.ArgumentParser):
    """A parser whose errors are :class:`InputError` (the caller names the file and key)."""

    def __init__(self, prog: str):
        super().__init__(prog=prog, allow_abbrev=False, add_help=False)

    def error(self, message: str):
        raise InputError(" ".join(message.split()))


def _actions(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """``{key: action}`` of a parser's long options (the key: the option without ``--``)."""
    out = {}
    for action in parser._actions:
        for flag in action.option_strings:
            if flag.startswith("--") and not flag.startswith("--no-"):
                out.setdefault(flag[2:], action)
    return out


def _anchored(text: str, root: Path) -> str:
    """``text`` made absolute against ``root`` where it is a relative path that names
    something there (``NAME=PATH``: its path)."""
    if not text or os.path.isabs(text):
        return text
    if (root / text).exists():
        return os.path.abspath(root / text)  # a link keeps its name (a model's row)
    name, eq, path = text.rpartition("=")
    if eq and name and path and not os.path.isabs(path) and (root / path).exists():
        return f"{name}={os.path.abspath(root / path)}"
    return text


def _argv_of(table: Mapping[str, Any], parser: argparse.ArgumentParser, where: str,
             own: Sequence[str], root: Path) -> list[str]:
    """The arguments a table of options stands for (key = the option's long name, with
    dashes or underscores), each value checked by the option's own type and choices.

    Raises
    ------
    InputError
        An unknown key, a key the evaluation gives itself (``own``), a launcher option
        (:func:`uqmetrics.runs.config_options.is_launcher`: the device, the loader's workers;
        ``uqvision evaluate`` takes them on its command line), a key given in both spellings
        (``n_cal`` and ``n-cal``: one option, as ``--config`` refuses it), a value of the
        wrong kind or one the option refuses: one line naming ``where``, the key and the
        value.
    """
    from uqmetrics.runs.config_options import is_launcher

    actions = _actions(parser)
    argv: list[str] = []
    seen: dict[str, str] = {}
    for key, value in table.items():
        name = str(key).replace("_", "-")
        said = f"{where}: key {key!r} = {_shown(value)}"
        if name in seen:  # TOML keeps both: the last would silently win
            raise InputError(f"{where}: keys {seen[name]!r} and {key!r} are one option "
                             f"(--{name}): give it once")
        seen[name] = str(key)
        if name in own:
            raise InputError(f"{said}: the evaluation gives it itself (the sets' roles, "
                             "[ensembles], the output folder); leave it out")
        action = actions.get(name)
        if action is None:
            known = ", ".join(k for k in sorted(actions) if k not in own and k != "help"
                              and not is_launcher(actions[k]))
            raise InputError(f"{said}: unknown key; known: {known}")
        flag = f"--{name}"
        if is_launcher(action):  # a file is data: it never says where or how the work runs
            raise InputError(f"{said}: where and how the work runs (the device, the processes "
                             "and threads it starts) is never taken from a file; leave it out "
                             f"and give {flag} on the command line (uqvision evaluate FILE "
                             f"{flag} ...)")
        if action.nargs == 0:  # a flag
            if not isinstance(value, bool):
                raise InputError(f"{said}: expected true or false")
            if isinstance(action, argparse.BooleanOptionalAction):
                argv.append(flag if value else f"--no-{name}")
            elif value == action.const:
                argv.append(flag)
            continue
        many = (isinstance(action, (argparse._AppendAction, argparse._ExtendAction))
                or action.nargs in ("+", "*") or isinstance(action.nargs, int))
        values = value if isinstance(value, list) else [value]
        if not many and isinstance(value, list):  # a comma list (1,2,5) written as a list
            values = [",".join(_text(v, said) for v in value)]
        texts = [_anchored(_text(v, said), root) if action.type in (None, str)
                 and action.choices is None else _text(v, said) for v in values]
        if isinstance(action, argparse._AppendAction) and action.nargs is None:
            argv += [f"{flag}={t}" for t in texts]
        elif many:
            argv += [flag, *texts]
        else:
            argv.append(f"{flag}={texts[0]}")
    return argv


def _text(value: Any, said: str) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise InputError(f"{said}: expected a string or a number")
    return repr(value) if isinstance(value, float) else str(value)


def _check_argv(parser: argparse.ArgumentParser, argv: list[str], where: str) -> None:
    """Parse ``argv`` with ``parser``: any refusal is one line naming ``where``."""
    try:
        parser.parse_args(argv)
    except InputError as exc:
        raise InputError(f"{where}: {exc}") from None


@functools.cache
def _score_parser(name: str) -> tuple[Any, argparse.ArgumentParser]:
    """The protocol ``uqvision score NAME`` means and a parser of its options (built once)."""
    from .protocols import score_protocol
    from .score_options import add_score_options  # the command's own options

    proto = score_protocol(name)
    parser = _Refusing(f"uqvision score {proto.name}")
    add_score_options(proto, parser)
    return proto, parser


def _predict_parser() -> argparse.ArgumentParser:
    """A parser of the prediction options ``uqvision sweep`` has (and ``--weights-dir``)."""
    from .predict.options import add_predict_options

    parser = _Refusing("uqvision evaluate [predict]")
    add_predict_options(parser)
    parser.add_argument("--weights-dir", default=None)
    return parser


def _launchers() -> list[Any]:
    """The prediction options that are launcher options (those of
    :data:`uqvision.predict.options.PREDICT_OPTIONS` marked ``launcher``: ``--device``, the
    loader's ``--workers``)."""
    from .predict.options import PREDICT_OPTIONS

    return [o for o in PREDICT_OPTIONS if o.launcher]


def add_launcher_options(parser: argparse.ArgumentParser) -> None:
    """Add the prediction's launcher options (``--device``, the loader's ``--workers``: every
    option of :data:`uqvision.predict.options.PREDICT_OPTIONS` marked ``launcher``, as
    ``uqvision sweep`` has them) to ``parser``: ``uqvision evaluate``'s command line gives
    them, its file's ``[predict]`` table never does (:func:`read_evaluation` refuses them
    there). Read them back with :func:`launcher_settings`."""
    from .options import add_config_options
    from .predict.config import PredictConfig

    add_config_options(parser, PredictConfig, _launchers())


def launcher_settings(args: argparse.Namespace) -> dict[str, Any]:
    """``{PredictConfig field: value}`` of the launcher options :func:`add_launcher_options`
    added, as parsed in ``args`` (a field's default where not given): what
    :func:`plan_evaluation` takes as ``launcher``."""
    return {o.field: getattr(args, o.field) for o in _launchers()}


def _check_out(out_dir: Path, option: str, given: Any) -> None:
    """Refuse, before anything is read or written, an output folder that could not be
    written (a file where it or a folder it holds must be, no permission, a read-only file
    system), naming how it was given (``--out``, or the file's ``out`` key) and the value."""
    from .options import check_output_folder

    for folder in (out_dir, *(out_dir / f for f in ("caches", "scores", "plots", "site"))):
        check_output_folder(option, folder, given=given)


#: What an evaluation writes into below its output folder, besides each protocol's
#: ``plots/NAME``: a link at any of them (or on the way) is refused before any work
#: (:func:`_refuse_links`).
_WRITTEN_INSIDE = ("caches", "caches/.replaced", "scores", "plots", "site", "content_hashes",
                   LOCK_FILE)


def _refuse_links(out_dir: Path, option: str, protocols: Sequence[str]) -> None:
    """Refuse a symbolic link where the evaluation writes or deletes inside ``out_dir``
    (:func:`uqmetrics.runs.io.refuse_links`: one line naming ``option``, the link and where it
    points). An output folder may be someone else's results, received to resume or extend:
    ``scores -> /their/results`` would have the evaluation delete and write files there."""
    from uqmetrics.runs.io import refuse_links

    from .sweep import LOG_FILE  # appended to, through a link too

    refuse_links(option, out_dir, [*_WRITTEN_INSIDE, LOG_FILE,
                                   *(f"plots/{name}" for name in protocols)])


def _file_out(where: str, here: Path, value: str) -> Path:
    """The output folder the file's ``out`` names (relative to the file's folder ``here``).

    A file is data, possibly from another user: the folder it names must lie inside its own
    folder, so that running it writes nowhere the user did not choose. ``--out`` on the
    command line is the user's choice, and is not checked so.

    Raises
    ------
    uqmetrics.InputError
        An absolute path, a ``..`` part, or a path that leads out of ``here`` through a link:
        one line naming the file, the key and the value.
    """
    said = f"{where}: key 'out' = {_shown(value)}"
    advice = (f"an output folder named by the file must be a relative path without '..', "
              f"inside the file's folder {str(here)!r}; to write elsewhere, pass --out on "
              "the command line")
    if os.path.isabs(value) or ".." in PurePosixPath(value).parts:
        raise InputError(f"{said}: {advice}")
    out_dir = Path(os.path.abspath(here / value))
    real = Path(os.path.realpath(out_dir))
    if real != here and here not in real.parents:
        raise InputError(f"{said}: {str(out_dir)!r} leads to {str(real)!r} through a link; "
                         f"{advice}")
    return out_dir


def _strings(value: Any, said: str) -> tuple[str, ...]:
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(v, str) and v.strip() for v in items):
        raise InputError(f"{said}: expected a list of names")
    return tuple(v.strip() for v in items)


def _table(data: Mapping[str, Any], key: str, where: str) -> dict[str, Any]:
    value = data.get(key, {})
    if not isinstance(value, Mapping):
        raise InputError(f"{where}: key {key!r} = {_shown(value)}: expected a table ([{key}])")
    return dict(value)


def _read_set(name: str, table: Any, at: str, root: Path, out_dir: Path) -> EvaluationSet:
    """One ``[sets.NAME]`` table (``at``: how errors name it), checked: its role (else its
    evaluation set's default), its evaluation set (else its role's, or its name's: e.g.
    ``[sets.imagenet-v2]``), its path (relative to ``root``), which must exist and must not
    hold the output folder."""
    from .evalsets import EVAL_SETS, check_role, default_role

    if not isinstance(table, Mapping):
        raise InputError(f"{at} = {_shown(table)}: expected a table ({', '.join(SET_KEYS)})")
    for key, value in table.items():
        if key not in SET_KEYS:
            raise InputError(f"{at}: unknown key {key!r} = {_shown(value)}; a set has "
                             f"{', '.join(SET_KEYS)}")
        if not isinstance(value, str):
            raise InputError(f"{at}: key {key!r} = {_shown(value)}: expected a string")
    if "path" not in table:
        raise InputError(f"{at}: no key 'path' (the folder, archive or image list)")
    role = table.get("role")
    if role is not None and role not in SET_ROLES:
        raise InputError(f"{at}: key 'role' = {_shown(role)}: not a role; roles: "
                         f"{', '.join(SET_ROLES)}")
    eval_set = table.get("set")
    if eval_set is None:
        eval_set = role if role in ("ood-near", "ood-far") else "folder" if role in (
            "test", "calibration", "fit") else name if name in EVAL_SETS else None
        if eval_set is None:
            raise InputError(f"{at}: no key 'set' (what the folder is: one of "
                             f"{', '.join(EVAL_SETS.names())}) and no role to tell it by")
    if eval_set not in EVAL_SETS:
        raise InputError(f"{at}: key 'set' = {_shown(eval_set)}: unknown evaluation set; "
                         f"known: {', '.join(EVAL_SETS.names())}")
    role = check_role(eval_set, role, f"{at}: key 'role' = {_shown(role)}") \
        if role is not None else default_role(eval_set)
    path = Path(os.path.abspath(root / table["path"]))
    if not path.exists():
        raise InputError(f"{at}: key 'path' = {_shown(table['path'])}: {str(path)!r} does "
                         "not exist")
    if out_dir == path or path in out_dir.parents:
        raise InputError(f"{at}: key 'path' = {_shown(table['path'])}: the output folder "
                         f"{str(out_dir)!r} is inside it; write the evaluation elsewhere")
    return EvaluationSet(name, role, eval_set, path)


def read_evaluation(path: str | os.PathLike, *, out: str | os.PathLike | None = None
                    ) -> Evaluation:
    """Read and check an evaluation file (TOML; docs/evaluate.md).

    Parameters
    ----------
    path : path-like
        The file. Its relative paths start from its ``root`` (itself relative to the file's
        folder; default the file's folder), its ``out`` from the file's folder, inside which
        it must stay (a relative path without ``..``, through no link that leads out).
    out : path-like, optional
        The output folder instead of the file's ``out`` (``--out``; relative to the working
        folder; anywhere).

    Returns
    -------
    Evaluation

    Raises
    ------
    uqmetrics.InputError
        Unreadable or not TOML; an unknown key or a value of the wrong kind (in any table, the
        protocols' and the prediction options included: each checked by its option's type and
        choices), an option given in both spellings (``n_cal`` and ``n-cal``); no model; no set
        of role ``test``, or two; two sets of role ``calibration`` or ``fit``; a role a set
        cannot play, or an evaluation set unknown or of another kind; a path that does not exist
        (a set's, a model's ``FILE``, the ``[predict]`` ``weights-dir`` folder); an unknown
        model name (or a wildcard that matches none); a prediction option the mode does not use
        (``passes`` with ``mode`` plain); an output folder that could not be written (naming
        ``--out`` where it was given); an ``out`` key that leaves the file's folder (absolute,
        ``..``, or through a link); a symbolic link inside the output folder where the
        evaluation writes (``caches``, ``scores``, ``plots``, ``plots/NAME``, ``site``, ...:
        :func:`uqmetrics.runs.io.refuse_links`); an unknown protocol (or one that does not
        score); an ensemble of fewer than two members. One line, naming the file, the key
        and the value.
    """
    from .models import ModelSpec
    from .predict.options import predict_config
    from .sweep import expand_models
    from .zoo import ZOOS

    source = Path(path)
    where = str(source)
    try:
        data = tomllib.loads(source.read_text(encoding="utf-8"))
    except OSError as exc:
        raise InputError(f"cannot read {where!r}: {exc.strerror or exc}") from None
    except UnicodeError as exc:
        raise InputError(f"cannot read {where!r}: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"{where!r} is not a TOML file: {exc}") from None
    for key, value in data.items():
        if key not in TOP_KEYS:
            raise InputError(f"{where}: unknown key {key!r} = {_shown(value)}; an evaluation "
                             f"file has {', '.join(TOP_KEYS)}")
    here = source.resolve().parent
    for key in ("out", "root"):
        if key in data and not (isinstance(data[key], str) and data[key].strip()):
            raise InputError(f"{where}: key {key!r} = {_shown(data[key])}: expected a path")
    root = (here / data.get("root", ".")).resolve()
    if not root.is_dir():
        raise InputError(f"{where}: key 'root' = {_shown(data['root'])}: {str(root)!r} is not "
                         "a folder")
    if out is not None:
        out_dir = Path(os.path.abspath(out))
    elif "out" in data:
        out_dir = _file_out(where, here, data["out"])
    else:
        raise InputError(f"{where}: no key 'out' (the output folder): give it, or --out")
    out_given = "--out" if out is not None else f"{where}: key 'out' ="
    _check_out(out_dir, out_given, out if out is not None else data["out"])
    if not isinstance(data.get("figures", True), bool):
        raise InputError(f"{where}: key 'figures' = {_shown(data['figures'])}: expected true "
                         "or false")

    models = tuple(_anchored(m, root) if "=" in m else m
                   for m in _strings(data.get("models", []), f"{where}: key 'models'"))
    for m in models:
        name, eq, file = m.partition("=")
        if eq and not Path(file).exists():
            raise InputError(f"{where}: key 'models': {m!r}: {file!r} does not exist (a "
                             "relative FILE starts from root)")
    for m in models:  # a known name (close names when not), a wildcard that matches
        try:
            expand_models([m])
        except ValueError as exc:
            raise InputError(f"{where}: key 'models': {m!r}: {' '.join(str(exc).split())}"
                             ) from None
    rows = [ModelSpec.parse(m).row for m in models]
    twice = [m for m, r in zip(models, rows) if rows.count(r) > 1]
    if twice:  # two entries, or two files of one stem: one result row for two models
        raise InputError(f"{where}: key 'models': {twice} give the same result row "
                         f"{sorted({r for r in rows if rows.count(r) > 1})} (a checkpoint's "
                         "row is NAME@<file stem>): list a model once, or rename one file")
    zoos = _strings(data.get("zoo", []), f"{where}: key 'zoo'")
    if not (models or zoos):
        raise InputError(f"{where}: no model: give models = [NAME, NAME=FILE, ...] and/or "
                         "zoo = [ZOO, ...] (uqvision sweep --list-zoos lists the zoos)")
    for zoo in zoos:
        if zoo not in ZOOS:
            raise InputError(f"{where}: key 'zoo' = {_shown(zoo)}: unknown zoo; zoos: "
                             f"{', '.join(ZOOS.names())}")

    sets = [_read_set(str(name), table, f"{where}: [sets.{name}]", root, out_dir)
            for name, table in _table(data, "sets", where).items()]
    tests = [s.name for s in sets if s.role == "test"]
    if len(tests) != 1:
        raise InputError(f"{where}: " + (f"{len(tests)} sets of role 'test' ({', '.join(tests)})"
                                         "; declare one" if tests else
                                         "no set of role 'test' (the in-distribution test set"
                                         ", e.g. [sets.val] role = \"test\")"))
    for role in ("calibration", "fit"):
        named = [s.name for s in sets if s.role == role]
        if len(named) > 1:
            raise InputError(f"{where}: {len(named)} sets of role {role!r} ({', '.join(named)}); "
                             "declare one")
    sets.sort(key=lambda s: s.role != "test")  # the test set first: the sweep's --data

    ensembles = {}
    for name, members in _table(data, "ensembles", where).items():
        said = f"{where}: [ensembles] {name} = {_shown(members)}"
        members = _strings(members, said)
        if len(members) < 2 or len(set(members)) != len(members):
            raise InputError(f"{said}: an ensemble needs two or more distinct members")
        rows = [ModelSpec.parse(m).row for m in models]
        if not zoos and not any(ch in "".join(rows) for ch in "*?["):
            unknown = [m for m in members if m not in rows]
            if unknown:
                raise InputError(f"{said}: {unknown} are not models of this evaluation (its "
                                 f"rows: {', '.join(rows)})")
        ensembles[str(name)] = members

    protocols = {}
    for name, table in _table(data, "protocols", where).items():
        at = f"{where}: [protocols.{name}]"
        if not isinstance(table, Mapping):
            raise InputError(f"{at} = {_shown(table)}: expected a table of its options")
        try:
            proto, parser = _score_parser(str(name))
        except KeyError as exc:
            raise InputError(f"{at}: {exc.args[0]}") from None
        argv = _argv_of(table, parser, at, _SCORE_OWN, root)
        _check_argv(parser, ["--caches", "_", "--out", "_.nc", *argv], at)
        protocols[proto.name] = tuple(argv)
    if not protocols:
        raise InputError(f"{where}: no protocol: give [protocols.NAME] tables (e.g. "
                         "[protocols.selective]; uqvision score -h lists them)")

    options = _table(data, "predict", where)
    predict = _argv_of(options, _predict_parser(), f"{where}: [predict]", _PREDICT_OWN, root)
    _check_argv(_predict_parser(), predict, f"{where}: [predict]")
    try:  # an option the mode does not use (passes with mode plain)
        predict_config(_predict_parser().parse_args(predict))
    except InputError as exc:
        raise InputError(f"{where}: [predict]: {exc}") from None
    weights_dir = _predict_parser().parse_args(predict).weights_dir  # made absolute if found
    if weights_dir is not None and not (os.path.isabs(weights_dir)
                                        and os.path.isdir(weights_dir)):
        key, value = next((k, v) for k, v in options.items()
                          if str(k).replace("_", "-") == "weights-dir")
        raise InputError(f"{where}: [predict]: key {key!r} = {_shown(value)}: "
                         f"{os.path.join(root, weights_dir)!r} is not a folder (a relative "
                         "path starts from root)")
    _refuse_links(out_dir, out_given, list(protocols))
    return Evaluation(source, out_dir, models, zoos, tuple(sets), protocols, ensembles,
                      tuple(predict), bool(data.get("figures", True)), out_given)


# ---------------------------------------------------------------------------------------------
# the plan


def _feature_variables(evaluation: Evaluation) -> tuple[bool, tuple[str, ...], list[str]]:
    """``(embeddings, extra variables, detectors)``: what the OOD protocol's detectors read
    beyond the logits (:data:`uqmetrics.metrics.detectors.NEED_KEYS`), and which detectors need it;
    nothing without the OOD protocol or a feature detector. A detector that fits on training
    images is left out without a set of role ``fit`` unless named (the score command then
    refuses it, naming the option)."""
    argv = evaluation.protocols.get("ood")
    if argv is None:
        return False, (), []
    from uqmetrics.metrics.detectors import DETECTORS, NEED_KEYS, list_detectors

    from .protocols.ood.score import DEFAULT_DETECTORS

    _, parser = _score_parser("ood")
    named = parser.parse_args(["--caches", "_", "--out", "_.nc", *argv]).detectors
    known = list_detectors()  # the plugins' loaded once
    names = list(named) if named else [d for d in DEFAULT_DETECTORS if d in known]
    fit = bool(evaluation.of_role("fit"))
    embeddings, extra, using = False, [], []
    for name in names:
        det = DETECTORS.lookup(name)
        if "fit" in det.needs and not fit and not named:
            continue
        if "embedding" in det.needs:
            embeddings = True
            using.append(name)
        if "head" in det.needs:
            extra += [k for k in NEED_KEYS["head"] if k not in extra]
            if name not in using:
                using.append(name)
    return embeddings, tuple(extra), using


@dataclass
class _SetVariables:
    """What one set's caches record besides the logits."""

    embeddings: bool = False
    extra: tuple[str, ...] = ()

    def covers(self, other: _SetVariables) -> bool:
        return (self.embeddings or not other.embeddings) and set(other.extra) <= set(self.extra)

    def union(self, other: _SetVariables) -> _SetVariables:
        return _SetVariables(self.embeddings or other.embeddings,
                             tuple(dict.fromkeys((*self.extra, *other.extra))))

    def describe(self) -> str:
        return ", ".join((["embedding"] if self.embeddings else []) + list(self.extra))


@dataclass
class _Score:
    """One protocol's score file, and what it is computed from."""

    protocol: str
    path: Path
    argv: list[str]


@dataclass
class EvaluationPlan:
    """An evaluation planned (:func:`plan_evaluation`): nothing computed or written yet.

    Attributes
    ----------
    evaluation : Evaluation
    out : Path
    config : PredictConfig
        The test set's (the sweep's ``--data``); each other set's is in ``targets``.
    data : ImageFolderDataset
        The test set, scanned.
    targets : list of SweepTarget
        Every other folder the models predict (each member of an expanded set).
    variables : dict
        Set name -> the variables its caches record (embedding, head_weight, ...).
    replaced : list of Path
        Caches that lack a variable a protocol now reads: recomputed with it.
    replaced_sets : set of str
        The sets they are of, and those of ``recast``.
    set_of : dict
        Dataset name of a target (an expanded set's member) -> its set's name.
    scores : list
        One per protocol, in the file's order.
    detectors : list of str
        The feature detectors that made the embeddings and head needed.
    state : dict
        What the output folder's :data:`STATE_FILE` records.
    overwrite : bool
    weights_dir : str or None
    recast : list of Path
        Caches of a set whose role the file changed since they were written (they record
        the role they were written for, ``set_role``, which is not part of their identity):
        recomputed, so that they record the role the set plays now.
    roles_changed : dict
        Set name -> the role its caches record, for the sets of ``recast``.
    skipped : dict
        Set name -> {image: what is wrong} of the unreadable images the models leave out
        (``[predict] skip-bad-images = true``; the sets that have none are not listed).
    """

    evaluation: Evaluation
    out: Path
    config: Any
    data: Any
    targets: list[Any]
    variables: dict[str, _SetVariables]
    replaced: list[Path]
    replaced_sets: set[str]
    set_of: dict[str, str]
    scores: list[_Score]
    detectors: list[str]
    state: dict[str, Any]
    overwrite: bool = False
    weights_dir: str | None = None
    recast: list[Path] = field(default_factory=list)
    roles_changed: dict[str, str] = field(default_factory=dict)
    skipped: dict[str, dict[str, str]] = field(default_factory=dict)

    @property
    def caches(self) -> Path:
        return self.out / "caches"

    def lines(self) -> list[str]:
        """The plan, a line each: the models, the sets and their variables, the scores."""
        from .data import describe_labels

        ev = self.evaluation
        out = [f"evaluation {str(ev.source)!r} -> {str(self.out)!r}"]
        models = [*ev.models, *(f"zoo {z}" for z in ev.zoos)]
        out.append(f"  models: {', '.join(_short(m) for m in models)}"
                   + (f"; ensembles: {', '.join(f'{n} ({len(m)})' for n, m in ev.ensembles.items())}"
                      if ev.ensembles else ""))
        for s in ev.sets:
            if s.name not in self.set_of.values():
                out.append(f"  set {s.name}: role {s.role}, read by none of the protocols "
                           "chosen: not predicted")
                continue
            members = [t for t in self.targets if self.set_of[t.dataset_name] == s.name]
            what = (f"{len(members)} member(s)" if s.expanded else s.eval_set)
            variables = self.variables[s.name].describe()
            out.append(f"  set {s.name}: role {s.role}, {what}; {s.path}"
                       + (f"; also records {variables}" if variables else ""))
            labels = describe_labels(self.data) if s.role == "test" else None
            if labels:  # a flat folder: the label file read
                out.append(f"    {labels}")
        if self.detectors:
            out.append(f"  embedding/head: for the OOD detectors {', '.join(self.detectors)}, "
                       "on the sets they read (test, fit, OOD) only")
        role = {s.name: s.role for s in ev.sets}
        for name, was in self.roles_changed.items():
            out.append(f"  set {name}: its caches record role {was!r}, the file gives it "
                       f"role {role[name]!r}: its caches are recomputed")
        if self.replaced:
            out.append(f"  {len(self.replaced)} cache(s) lack a variable the protocols now "
                       "read: recomputed with it (" + _few([p.name for p in self.replaced])
                       + ")")
        return out


def _short(model: str) -> str:
    name, eq, path = model.partition("=")
    return f"{name}={Path(path).name}" if eq else model


def _few(names: Sequence[str], most: int = 3) -> str:
    return ", ".join(names[:most]) + (f", ... ({len(names)} in all)" if len(names) > most
                                      else "")


def read_state(out: str | os.PathLike) -> dict[str, Any]:
    """What an output folder's :data:`STATE_FILE` records (empty without one).

    Raises
    ------
    uqmetrics.InputError
        A state file that is not what an evaluation writes (naming it).
    """
    path = Path(out) / STATE_FILE
    if not path.is_file():
        return {}
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeError, ValueError) as exc:
        raise InputError(f"{str(path)!r} cannot be read ({exc}): delete it (the evaluation "
                         "then recomputes its scores, figures and site) or pass --overwrite")
    if not isinstance(state, dict):
        raise InputError(f"{str(path)!r} is not an evaluation's state: delete it or pass "
                         "--overwrite")
    _check_state_caches(state, path)
    return state


def _check_state_caches(state: Mapping[str, Any], path: Path) -> None:
    """Refuse a state whose sets are not records of their caches by file name in the caches
    folder: the names are moved aside and back when a set's caches are recomputed, so a name
    with a folder in it (``../x.nc``, an absolute path) would move a file outside the output
    folder (a state file is data, possibly from another user)."""
    def bad(what: str) -> InputError:
        return InputError(f"{str(path)!r} records {what}: delete the state file (the "
                          "evaluation then recomputes its scores, figures and site) or pass "
                          "--overwrite")

    sets = state.get("sets", {})
    if not isinstance(sets, dict) or not all(isinstance(r, dict) for r in sets.values()):
        raise bad(f"sets that are not an evaluation's ({sets!r:.80})")
    for record in sets.values():
        names = record.get("caches", [])
        if not isinstance(names, list):
            raise bad(f"caches that are not a list of file names ({names!r:.80})")
        for name in names:
            if not (isinstance(name, str) and PurePosixPath(name).name == name
                    and "\\" not in name and not name.startswith(".")):
                raise bad(f"the cache {name!r}, which is not a file name of the caches folder")


def _write_state(out: Path, state: Mapping[str, Any]) -> None:
    """Write :data:`STATE_FILE` atomically (not at all when it holds this already)."""
    from uqmetrics.runs.io import write_text_file

    text = json.dumps(state, indent=1, sort_keys=True) + "\n"
    path = out / STATE_FILE
    if not (path.is_file() and path.read_text(encoding="utf-8") == text):
        write_text_file(path, text, overwrite=True)


def plan_evaluation(evaluation: Evaluation, *, overwrite: bool = False,
                    launcher: Mapping[str, Any] | None = None) -> EvaluationPlan:
    """Plan an evaluation: the prediction options, the sets scanned and expanded into the
    folders every model predicts (:func:`uqvision.sweep.sweep_targets`), the images of each
    checked (:func:`uqvision.data.readable_images`, as the sweep checks them), the variables
    each set records, the caches to recompute for a variable they lack, each protocol's
    ``uqvision score`` command. Reads the output folder; writes nothing.

    Parameters
    ----------
    evaluation : Evaluation
    overwrite : bool, default False
        Recompute everything (the caches too) and replace what is in the output folder.
    launcher : mapping, optional
        The prediction's launcher options, ``{PredictConfig field: value}`` (``device``,
        ``num_workers``: :func:`launcher_settings` of ``uqvision evaluate``'s command line),
        which an evaluation file never gives. Default: their defaults.

    Raises
    ------
    uqmetrics.InputError
        A set's folder or members (:func:`uqvision.sweep.sweep_targets`; naming the file, the
        set's table and its path), unreadable images in a set the models predict (naming the
        file, the set's table and the images; left out with ``[predict] skip-bad-images =
        true``: :attr:`EvaluationPlan.skipped` then says which), a damaged state file.
    ValueError
        A ``launcher`` key that is not a launcher option.
    """
    from .data import ImageFolderDataset
    from .predict.options import predict_config
    from .sweep import sweep_targets

    ev = evaluation
    state = {} if overwrite else read_state(ev.out)
    ns = _predict_parser().parse_args(list(ev.predict))
    fields = {o.field for o in _launchers()}
    for key, value in (launcher or {}).items():
        if key not in fields:
            raise ValueError(f"launcher: {key!r} is not a launcher option of the prediction "
                             f"({', '.join(sorted(fields))})")
        setattr(ns, key, value)  # the config made once, from every option (amp by device)
    base = predict_config(ns)
    embeddings, extra, detectors = _feature_variables(ev)
    recorded = state.get("sets", {})
    variables = {}
    for s in ev.sets:
        need = _SetVariables(embeddings, extra) if s.role in _FEATURE_ROLES else _SetVariables()
        had = recorded.get(s.name, {})
        variables[s.name] = need.union(_SetVariables(bool(had.get("embeddings")),
                                                     tuple(had.get("extra", ()))))
    test = ev.test
    data = _of_set(ev, test, lambda: ImageFolderDataset(test.path))
    config = dataclasses.replace(base, embeddings=variables[test.name].embeddings,
                                 extra_variables=variables[test.name].extra,
                                 eval_set=test.eval_set, role=test.role)
    read = {role for name in ev.protocols for role in _reads(name)}
    swept = [s for s in ev.sets[1:] if s.role in read]  # a set no protocol reads: not swept
    # each set scanned alone: its errors name its table (the test set's name, which another
    # set's may repeat, is checked with the others' by _check_names)
    scanned = [t for s in swept for t in _of_set(ev, s, lambda s=s: sweep_targets(
        data, config, [s.value], dataset_name=_UNNAMED,
        option=f"{ev.source}: [sets.{s.name}]")[1:])]
    _check_names(ev, test, swept, scanned)
    targets = sweep_targets(data, config, scanned, dataset_name=test.name,
                            option=f"{ev.source}: [sets]")  # errors name the file, not --sets
    by_source = {s.value: s for s in swept}
    skipped = _check_images(ev, [(test, data), *((by_source[t.source], t.folder)
                                                 for t in targets[1:])], base.skip_bad_images)
    set_of = {test.name: test.name}
    for k, t in enumerate(targets[1:], 1):  # each set its own variables
        s = by_source[t.source]
        v = variables[s.name]
        targets[k] = dataclasses.replace(t, config=dataclasses.replace(
            t.config, embeddings=v.embeddings, extra_variables=v.extra))
        set_of[t.dataset_name] = s.name
    replaced, replaced_sets, recast, roles_changed = [], set(), [], {}
    for s in ev.sets:  # caches written without a variable now read, or for another role:
        had = recorded.get(s.name)  # recomputed
        if had is None or s.name not in set_of.values():
            continue
        was = _recorded_role(had, ev.out / "caches") or s.role
        if was != s.role or not _SetVariables(
                bool(had.get("embeddings")), tuple(had.get("extra", ()))).covers(
                variables[s.name]):
            lacking = [ev.out / "caches" / f for f in had.get("caches", ())
                       if (ev.out / "caches" / f).is_file()]
            if was != s.role:
                recast += lacking
                roles_changed.update({s.name: was} if lacking else {})
            else:
                replaced += lacking
            replaced_sets.update([s.name] if lacking else [])
    scores = [_Score(name, ev.out / "scores" / f"{name}.nc", _score_argv(ev, name, argv))
              for name, argv in ev.protocols.items()]
    return EvaluationPlan(ev, ev.out, config, data, targets[1:], variables, replaced,
                          replaced_sets, set_of, scores, detectors, state, overwrite,
                          ns.weights_dir, recast, roles_changed, skipped)


#: What the refusal of unreadable images in a set advises (:func:`uqvision.data.
#: readable_images`' ``skip_option``): the file's key, since ``evaluate`` has no such option.
_SKIP_KEY = "[predict] skip-bad-images = true"


def _check_images(ev: Evaluation, folders: Sequence[tuple[EvaluationSet, Any]],
                  skip_bad: bool) -> dict[str, dict[str, str]]:
    """The images of every folder the models predict (each a set's, or a member of an expanded
    set), checked before anything is written as the sweep checks them
    (:func:`uqvision.data.readable_images`; it checks them again, from the process's record
    of each file): unreadable ones refused in one line naming the file and the set's table,
    or, with ``skip_bad``, left out. Returns set name -> {image: what is wrong} of those left
    out (an expanded set's images named from its path: ``fog/3/n01/x.JPEG``)."""
    from .data import readable_images

    skipped: dict[str, dict[str, str]] = {}
    for s, folder in folders:
        left = _of_set(ev, s, lambda folder=folder: readable_images(
            folder, skip_bad=skip_bad, skip_option=_SKIP_KEY)).skipped
        for rel, why in left.items():
            name = os.path.relpath(os.path.join(folder.root, rel), s.path) if s.expanded \
                else rel
            skipped.setdefault(s.name, {})[name] = why
    return skipped


#: The ``--data`` dataset name a set is scanned beside (:func:`plan_evaluation`): no folder's.
_UNNAMED = "\0"


def _check_names(ev: Evaluation, test: EvaluationSet, swept: Sequence[EvaluationSet],
                 scanned: Sequence[Any]) -> None:
    """Refuse two sets whose caches would have one dataset name (their file names): one line
    naming the file, both tables and why. A set of one folder names its caches by its table;
    an expanded set's member by ``<set>-<member>`` whatever its table's name (as ``uqvision
    sweep --sets`` names them, so that the caches are the same either way, and as the shift
    and conformal scores read them: one row per corruption and severity), so two ImageNet-C
    sets with a member in common cannot share one output folder."""
    by_source = {s.value: s for s in swept}
    owner: dict[str, tuple[EvaluationSet, str | None]] = {test.name: (test, None)}
    for t in scanned:
        s, member = by_source[t.source], t.member
        if t.dataset_name not in owner:
            owner[t.dataset_name] = (s, member)
            continue
        other, other_member = owner[t.dataset_name]
        if member is not None and other_member is not None:
            why = (f"an expanded set's caches are named <set>-<member> whatever its table's "
                   f"name, and the shift and conformal scores hold one row per corruption "
                   f"and severity, so two {s.eval_set} sets with a member in common cannot "
                   "be evaluated together: evaluate one of them in another file, with "
                   "another out")
        else:
            expanded, plain = ((s, other) if member is not None else (other, s))
            why = (f"[sets.{expanded.name}]'s member caches are named <set>-<member>, "
                   f"[sets.{plain.name}]'s by its table; rename [sets.{plain.name}]")
        raise InputError(f"{ev.source}: [sets.{other.name}] and [sets.{s.name}] would both "
                         f"write the caches of dataset {t.dataset_name!r}: {why}")


def _of_set(ev: Evaluation, s: EvaluationSet, scan: Callable[[], Any]) -> Any:
    """``scan()`` of the set ``s``: its refusal (a path that is a file, a folder of no image, a
    bad label file) as one line naming the evaluation file, the set's table and its path."""
    at = f"{ev.source}: [sets.{s.name}]"
    try:
        return scan()
    except (InputError, OSError) as exc:
        text = " ".join(str(exc).split())
        if text.startswith(at):  # named already (sweep_targets' own checks)
            raise
        raise InputError(f"{at}: key 'path' = {_shown(str(s.path))}: {text}") from None


def _check_scores(plan: EvaluationPlan) -> None:
    """Refuse, before any sweep (and in a dry run, as :func:`run_evaluation` would), a score
    command that would refuse its options after the sweep (:func:`_check_score`)."""
    for score in plan.scores:
        _check_score(plan.evaluation, score, len(plan.data))


def _check_score(ev: Evaluation, score: _Score, n_test: int) -> None:
    """Refuse a score command that would refuse its options after the sweep: its whole
    command line as it will run (the file's options, the sets by role, the ensembles) parsed
    by the protocol's own parser and types, and checked by the protocol against the images of
    the test set (:attr:`uqvision.protocols.Protocol.check_options`). One line naming the
    file, the protocol's table and what is refused."""
    at = f"{ev.source}: [protocols.{score.protocol}]"
    proto, parser = _score_parser(score.protocol)
    argv = ["--caches", "_", *score.argv]
    _check_argv(parser, argv, at)
    if proto.check_options is None:
        return
    try:
        proto.check_options(parser.parse_args(argv), n_test)
    except ValueError as exc:
        raise InputError(f"{at}: {' '.join(str(exc).split())} (the test set "
                         f"[sets.{ev.test.name}] has {n_test} image(s))") from None


def _recorded_role(had: Mapping[str, Any], caches: Path) -> str | None:
    """The role a set's caches were written for: its record in the state, else (a state
    written before roles were recorded) the ``set_role`` of the first of its caches that can
    be read; None when neither tells.

    Parameters
    ----------
    had : dict
        The set's record in :data:`STATE_FILE` (``caches``: its caches' file names).
    caches : Path
        The evaluation's caches folder.
    """
    if "role" in had:
        return str(had["role"])
    from uqmetrics.runs.io import READ_ERRORS, open_netcdf

    from .evalsets import cache_eval_set

    for name in had.get("caches", ()):
        try:
            with open_netcdf(caches / name) as ds:
                return cache_eval_set(ds.attrs)["set_role"]
        except READ_ERRORS:
            continue
    return None


def _score_argv(ev: Evaluation, name: str, options: Sequence[str]) -> list[str]:
    """``uqvision score NAME``'s arguments but ``--caches`` (given when it runs) and
    ``--overwrite``: the score file, the sets by role, the ensembles, the file's options."""
    _, parser = _score_parser(name)
    has = _actions(parser)
    argv = ["--out", str(ev.out / "scores" / f"{name}.nc")]
    for role, option in ROLE_OPTIONS.items():
        named = ev.of_role(role)
        if named and option[2:] in has:
            argv += [option, named[0].name]
    if ev.ensembles and ENSEMBLE_OPTION[2:] in has:
        argv += [ENSEMBLE_OPTION, *(f"{n}={','.join(m)}" for n, m in ev.ensembles.items())]
    return argv + list(options)


# ---------------------------------------------------------------------------------------------
# what is up to date


def _stat(path: Path) -> list[int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return [st.st_size, st.st_mtime_ns]


def _reads(protocol: str) -> tuple[str, ...]:
    """The roles of the sets ``protocol`` reads (:data:`READS`; every role for another)."""
    return READS.get(protocol, SET_ROLES)


def _inputs(caches: Mapping[str, str], plan: EvaluationPlan, protocol: str
            ) -> dict[str, list[int] | None]:
    """``{cache file name: [size, mtime_ns]}`` of the caches (file name -> dataset name) of
    the sets ``protocol`` reads: what its score command is given."""
    role = {s.name: s.role for s in plan.evaluation.sets}
    return {name: _stat(plan.caches / name) for name, dataset in sorted(caches.items())
            if role[plan.set_of[dataset]] in _reads(protocol)}


def _why_score(score: _Score, plan: EvaluationPlan, caches: Mapping[str, str] | None,
               changed: set[str]) -> str:
    """Why ``score`` is (re)computed, or "" when it is up to date. ``caches``: the
    evaluation's caches (file name -> dataset name) when known (after the sweep), else None;
    ``changed``: the sets the sweep computes caches of (a dry run's)."""
    if plan.overwrite:
        return "--overwrite"
    done = plan.state.get("scores", {}).get(score.protocol)
    if not score.path.is_file():
        return "no score file"
    if not isinstance(done, dict):
        return "not written by this evaluation"
    if done.get("file") is None:
        return "the run writing it was cut short"
    if done.get("argv") != score.argv:
        return "its options or sets changed"
    role = {s.name: s.role for s in plan.evaluation.sets}
    if caches is None:
        new = [d for d in changed if role[d] in _reads(score.protocol)]
        if new:
            return f"the sweep computes caches it reads ({_few(sorted(new))})"
        gone = [n for n, was in done.get("inputs", {}).items()
                if _stat(plan.caches / n) != was]
        return f"caches it read changed ({_few(gone)})" if gone else ""
    now = _inputs(caches, plan, score.protocol)
    if now != done.get("inputs"):
        diff = sorted(set(now) ^ set(done.get("inputs", {})) | {
            n for n in now if now[n] != done.get("inputs", {}).get(n)})
        return f"the caches it reads changed ({_few(diff)})"
    return ""


# ---------------------------------------------------------------------------------------------
# the run


@dataclass
class EvaluationReport:
    """What :func:`run_evaluation` did.

    Attributes
    ----------
    status : int
        0: everything is up to date; 1: a model failed (nothing scored); 2: a score command
        refused (its message printed); 130: interrupted.
    computed, skipped : list of Path
        The caches computed and found complete.
    scored : list of str
        The protocols scored (their files replaced or written).
    figures : list of Path
    site : Path or None
        The site's ``index.html`` when written.
    """

    status: int = 0
    computed: list[Path] = field(default_factory=list)
    skipped: list[Path] = field(default_factory=list)
    scored: list[str] = field(default_factory=list)
    figures: list[Path] = field(default_factory=list)
    site: Path | None = None


def _foreign_outputs(plan: EvaluationPlan) -> None:
    """Refuse, before any work, a score file or a site in the output folder that this
    evaluation did not write (unless ``overwrite``). A score file is this evaluation's when
    :data:`STATE_FILE` records its size and modification time, or records it as being written
    by a run cut short that left its mark here (:func:`_marked`): a record saying only that it
    is being written (``"file": null``) is not enough, since a state file may come with a
    folder received from someone else."""
    if plan.overwrite:
        return
    mine = plan.state.get("scores", {})
    for s in plan.scores:
        done = mine.get(s.protocol)
        there = [p for p in _score_files(s) if os.path.lexists(p)]
        if not there:
            continue
        if not isinstance(done, dict):
            raise InputError(f"{str(there[0])!r} exists and was not written by this "
                             f"evaluation (no record in {STATE_FILE}): pass --overwrite to "
                             "replace it, or give another --out")
        if done.get("file") is None and not _marked(plan.out, done):
            raise InputError(f"{str(there[0])!r} exists, and {STATE_FILE} records it as being "
                             "written, but by no run of this evaluation here (the mark such a "
                             "run leaves in the output folder is not there): it may be someone "
                             "else's; pass --overwrite to replace it, or give another --out")
        if done.get("file") is not None and s.path.exists() \
                and done["file"] != _stat(s.path):
            raise InputError(f"{str(s.path)!r} changed since this evaluation wrote it: pass "
                             "--overwrite to replace it, or give another --out")
    site = plan.out / "site"
    if site.exists() and any(site.iterdir()) and "site" not in plan.state:
        raise InputError(f"{str(site)!r} exists and was not written by this evaluation: pass "
                         "--overwrite to replace it, or give another --out")


def _score_files(score: _Score) -> list[Path]:
    """A score file and what its command writes beside it (its table, its configuration)."""
    from uqmetrics.runs.run_config import config_beside

    proto, _ = _score_parser(score.protocol)
    table = proto.score_table.suffixes if proto.score_table is not None else ()
    path = score.path
    return [path, *(path.with_name(path.stem + suffix) for suffix in table),
            config_beside(path)]


def dry_run_lines(plan: EvaluationPlan, *, n_workers: int = 2) -> list[str]:
    """What :func:`run_evaluation` would do, without doing it: the plan, the sweep's cells to
    compute and those complete with its cost (:func:`uqvision.sweep.dry_run_sweep`), the
    scores to compute and why, the figures and the site. Nothing is computed, downloaded or
    written."""
    from .evalsets import EVAL_SETS
    from .sweep import dry_run_sweep

    ev = plan.evaluation
    _check_scores(plan)  # refused as the run would be
    _refuse_links(plan.out, ev.out_given, [s.protocol for s in plan.scores])
    _foreign_outputs(plan)
    lines = plan.lines()
    dry = dry_run_sweep(list(ev.models), plan.data, plan.caches, plan.config,
                        zoos=ev.zoos, weights_dir=plan.weights_dir, dataset_name=ev.test.name,
                        n_workers=n_workers, overwrite=plan.overwrite,
                        failures_file=plan.out / "sweep_failures.json", sets=plan.targets,
                        recompute=[*plan.replaced, *plan.recast])
    lines += ["  " + line for line in dry.lines()]
    ood = [t for t in plan.targets if EVAL_SETS.lookup(t.config.eval_set).role == "ood"]
    if ood:
        lines.append(f"  {len(ood)} OOD set(s): checked disjoint from the test set by content "
                     "hash when it runs (reads every image; not by --dry-run)")
    changed = {plan.set_of[t["dataset_name"]] for t in dry.sets if t["compute"]}
    if dry.cells_to_compute > sum(t["compute"] for t in dry.sets):
        changed.add(ev.test.name)
    changed.update(plan.replaced_sets)
    todo = []
    for s in plan.scores:
        why = _why_score(s, plan, None, changed)
        lines.append(f"  score {s.protocol}: " + (f"to compute ({why})" if why else
                                                  "up to date") + f" -> {s.path}")
        todo += [s.protocol] if why else []
    if todo or plan.state.get("site") != _site_record(plan, plan.state) \
            or not (plan.out / "site" / "index.html").is_file():
        lines.append(f"  then: the figures of {', '.join(todo) or 'no protocol'}"
                     f"{'' if ev.figures else ' (figures = false: none)'}, and the site "
                     f"{plan.out / 'site'}")
    else:
        lines.append("  figures and site: up to date")
    return lines


def run_evaluation(plan: EvaluationPlan, *, command: Callable[[list[str]], int],
                   scheduler: Any = None, n_workers: int = 2, threads: int | None = None,
                   log: Callable[[str], None] = print, client: Any = None) -> EvaluationReport:
    """Run a planned evaluation: the sweep, the scores, the figures, the site; each step only
    where its output is missing or out of date (module docstring).

    Parameters
    ----------
    plan : EvaluationPlan
    command : callable
        The ``uqvision`` command line, ``command(argv) -> exit status``
        (:func:`uqvision.cli.main`, which ``uqvision evaluate`` passes): each score runs as
        ``command(["score", NAME, ...])``, as ``uqvision score NAME`` runs it.
    scheduler : ClusterSpec or str, optional
        Where the sweep's cells run (:func:`uqvision.sweep.sweep_predictions`).
    n_workers : int, default 2
    threads : int, optional
        torch threads in each cell.
    log : callable
        Receives the lines the run prints (each score command prints its table itself).
    client : dask.distributed.Client, optional
        An existing client for the sweep (tests).

    Returns
    -------
    EvaluationReport

    Raises
    ------
    uqmetrics.InputError
        A score command's options that its protocol would refuse after the sweep (naming the
        file, the protocol's table, the key and the value), a score file or site there that
        the evaluation did not write (without ``overwrite``), an OOD set holding an image of
        the test set, and what the sweep refuses before its first cell.
    uqmetrics.runs.io.LockedError
        Another evaluation runs into the output folder (it holds ``OUT/.evaluate.lock``).
    """
    from uqmetrics.runs.io import exclusive_lock

    _check_scores(plan)  # before any sweep: a score that would refuse its options after it
    # again (read_evaluation checked them): a plan made otherwise, a link made since
    _refuse_links(plan.out, plan.evaluation.out_given, [s.protocol for s in plan.scores])
    _foreign_outputs(plan)
    with exclusive_lock(plan.out / LOCK_FILE,
                        advice="wait for that evaluation to finish, or give another --out"):
        _remove_orphans(plan.out, plan.state)  # no other evaluation writes here: a cut
        # write's leftovers
        return _run(plan, command, log, scheduler=scheduler, n_workers=n_workers,
                    threads=threads, client=client)


def _run(plan: EvaluationPlan, command: Callable[[list[str]], int],
         log: Callable[[str], None], **launch: Any) -> EvaluationReport:
    """:func:`run_evaluation`'s steps, its lock held."""
    for line in plan.lines():
        log(line)
    report = EvaluationReport()
    state = json.loads(json.dumps(plan.state))  # a copy, written after each step
    state.setdefault("sets", {})
    state.setdefault("scores", {})
    caches = _sweep(plan, report, state, log, **launch)
    if caches is not None:
        report.status = _score(plan, report, state, caches, log, command)
    if report.status == 0:
        _draw(plan, report, state, log)
    if not (report.status or report.computed or report.scored or report.figures
            or report.site):
        log(f"nothing to compute: the {len(report.skipped)} caches, the "
            f"{len(plan.scores)} score file(s), their figures and the site are up to date "
            f"({plan.out / 'site' / 'index.html'})")
    return report


def _sweep(plan: EvaluationPlan, report: EvaluationReport, state: dict[str, Any],
           log: Callable[[str], None], **launch: Any) -> dict[str, str] | None:
    """The sweep (the OOD sets checked first; the caches lacking a variable set aside and
    recomputed): the evaluation's caches, file name -> dataset name, recorded by set in
    ``state``; None (``report.status`` 1) where a model failed."""
    from .evalsets import EVAL_SETS
    from .sweep import LOG_FILE, check_ood_targets, sweep_predictions

    ev, out = plan.evaluation, plan.out
    ood = [t for t in plan.targets if EVAL_SETS.lookup(t.config.eval_set).role == "ood"]
    if ood:
        check_ood_targets(plan.data, ood, cache_dir=out / "content_hashes")
    aside = _set_aside([*plan.replaced, *plan.recast], plan.caches)
    try:
        sweep = sweep_predictions(
            list(ev.models), plan.data, plan.caches, plan.config, zoos=ev.zoos,
            weights_dir=plan.weights_dir, dataset_name=ev.test.name, overwrite=plan.overwrite,
            progress=True, failures_file=out / "sweep_failures.json", log_file=out / LOG_FILE,
            sets=plan.targets, **launch)
    finally:
        _restore(aside, plan.caches)
    report.computed, report.skipped = list(sweep.computed), list(sweep.skipped)
    log(f"sweep: computed {len(sweep.computed)}, skipped {len(sweep.skipped)} (already "
        f"complete), failed {len(sweep.failed_models)} model(s)")
    if sweep.failed_models:
        for row, rec in sorted(sweep.failed_models.items()):
            log(f"  FAILED {row}: {' '.join(str(rec.get('error', '')).split())}")
        log(f"uqvision evaluate: {len(sweep.failed_models)} model(s) failed (recorded in "
            f"{out / 'sweep_failures.json'}; tracebacks in {out / LOG_FILE}): nothing is "
            "scored, so that no score file holds fewer models; fix them (or leave them out of "
            "the file) and run it again: what is complete is kept")
        report.status = 1
        return None
    caches = {Path(p).name: sweep.datasets[Path(p).stem]
              for p in [*sweep.computed, *sweep.skipped] if Path(p).stem in sweep.datasets}
    by_set: dict[str, list[str]] = {}
    for name, dataset in caches.items():
        by_set.setdefault(plan.set_of[dataset], []).append(name)
    for s in ev.sets:
        if s.name in plan.set_of.values():  # not swept: its record (if any) stays
            v = plan.variables[s.name]
            state["sets"][s.name] = {"embeddings": v.embeddings, "extra": list(v.extra),
                                     "role": s.role, "caches": sorted(by_set.get(s.name, []))}
    out.mkdir(parents=True, exist_ok=True)
    _write_state(out, state)
    return caches


def _score(plan: EvaluationPlan, report: EvaluationReport, state: dict[str, Any],
           caches: Mapping[str, str], log: Callable[[str], None],
           main: Callable[[list[str]], int]) -> int:
    """Each score out of date, as ``uqvision score NAME`` (it prints its table; ``main``: the
    command line), given the caches of the roles it reads; the exit status of the first that
    fails, else 0."""
    for s in plan.scores:
        why = _why_score(s, plan, caches, set())
        if not why:
            continue
        log(f"score {s.protocol}: {why}")
        inputs = _inputs(caches, plan, s.protocol)
        argv = ["score", s.protocol, "--caches", *(str(plan.caches / n) for n in inputs),
                *s.argv]
        # its own, out of date (_foreign_outputs refused any other): removed, and written
        # anew as the first time (not --overwrite, which the score file records); a link
        # is removed, not what it points to, and scores/ is no link (_refuse_links)
        for path in _score_files(s):
            path.unlink(missing_ok=True)
        # then recorded as being written (no file), naming a mark made here: what a run cut
        # short leaves is then this evaluation's, and out of date (_marked)
        state["scores"][s.protocol] = {"argv": s.argv, "inputs": inputs, "file": None,
                                       "figures": None,
                                       "writing": _mark_writing(plan.out, s.protocol)}
        _write_state(plan.out, state)
        status = main(argv)
        if status != 0:
            log(f"uqvision evaluate: 'uqvision score {s.protocol}' stopped (exit status "
                f"{status}); the other results are kept")
            return status
        state["scores"][s.protocol] = {"argv": s.argv, "inputs": inputs,
                                       "file": _stat(s.path), "figures": None}
        _write_state(plan.out, state)
        _remove_marks(plan.out, state)  # its own, and one a run cut short left
        report.scored.append(s.protocol)
    return 0


#: The name of the mark of a score being written (:func:`_mark_writing`), in the output
#: folder (beside ``scores/``, whose files it does not add to).
_MARK = re.compile(r"^\.[^/]+\.writing\.[0-9a-f]{32}\Z")


def _mark_writing(out: Path, protocol: str) -> dict[str, Any]:
    """Make an empty file in the output folder ``out`` before a score is recorded as being
    written, and return what the record keeps of it: its name and identity (inode number and
    change time, in nanoseconds), which the file system gives and which no one can write into
    a folder in advance."""
    out.mkdir(parents=True, exist_ok=True)
    name = f".{protocol}.writing.{uuid.uuid4().hex}"
    fd = os.open(out / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL
                 | getattr(os, "O_NOFOLLOW", 0), 0o644)
    try:
        st = os.fstat(fd)
    finally:
        os.close(fd)
    return {"name": name, "id": [st.st_ino, st.st_ctime_ns]}


def _remove_marks(out: Path, state: Mapping[str, Any]) -> None:
    """Remove the marks in the output folder ``out`` (:func:`_mark_writing`) that no
    being-written record of ``state`` names: the score they marked was recorded since, or
    replaced."""
    records = state.get("scores", {})
    named = {r["writing"].get("name") for r in
             (records.values() if isinstance(records, Mapping) else ())
             if isinstance(r, Mapping) and isinstance(r.get("writing"), Mapping)}
    for entry in (out.iterdir() if out.is_dir() else ()):
        if _MARK.match(entry.name) and entry.name not in named and entry.is_file() \
                and not entry.is_symlink():
            entry.unlink(missing_ok=True)


def _marked(out: Path, record: Mapping[str, Any]) -> bool:
    """Whether a score's being-written record (``"file": null``) was written by a run of this
    evaluation on this file system: the mark it names is in the output folder ``out``, with
    the identity it records. A state file is data: one received with the folder (someone
    else's, or made to look cut short) names no mark that is there with that identity, so the
    files it says are being written are not taken for this evaluation's."""
    import stat

    mark = record.get("writing")
    if not isinstance(mark, Mapping) or not isinstance(mark.get("name"), str) \
            or not _MARK.match(mark["name"]):
        return False
    try:
        st = os.lstat(out / mark["name"])
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and mark.get("id") == [st.st_ino, st.st_ctime_ns]


def _draw(plan: EvaluationPlan, report: EvaluationReport, state: dict[str, Any],
          log: Callable[[str], None]) -> None:
    """The figures of each score file drawn since it changed (``OUT/plots/NAME``, as
    ``uqvision plot``), then the site when a score file changed (as ``uqvision report``)."""
    from .protocols import VISION_PROTOCOLS

    ev, out = plan.evaluation, plan.out
    for s in plan.scores if ev.figures else ():
        proto = VISION_PROTOCOLS.lookup(s.protocol)
        done = state["scores"][s.protocol]
        if proto.plots is None or done.get("figures") == done["file"]:
            continue
        folder = out / "plots" / s.protocol
        paths = proto.plots.draw(s.path, folder)
        log(f"figures {s.protocol}: {len(paths)} in {folder}")
        report.figures += paths
        done["figures"] = done["file"]
        _write_state(out, state)
    site = out / "site"
    drawn = _site_record(plan, state)
    if plan.overwrite or state.get("site") != drawn or not (site / "index.html").is_file():
        from uqmetrics.report import build_site

        from .report_hooks import register_report_hooks

        register_report_hooks()
        state["site"] = None  # being written: the evaluation's own, and out of date
        _write_state(out, state)
        built = build_site([str(s.path) for s in plan.scores], site, overwrite=site.exists(),
                           figures=ev.figures, paths="relative")
        report.site = built.out / "index.html"
        state["site"] = drawn
        _write_state(out, state)
        log(f"site: {report.site}")


def _site_record(plan: EvaluationPlan, state: Mapping[str, Any]) -> dict[str, Any]:
    """What the site is drawn from, as :data:`STATE_FILE` records it: each score file's size
    and modification time, and whether it shows figures."""
    return {"scores": {s.protocol: state.get("scores", {}).get(s.protocol, {}).get("file")
                       for s in plan.scores}, "figures": plan.evaluation.figures}


#: The temporary and replaced copies of a folder written whole (``.<name>.<hex>.tmp`` or
#: ``.old``, :func:`uqmetrics.runs.io.folder_replaced`): the site's.
_FOLDER_COPY = re.compile(r"^\.site\.[0-9a-f]{32}\.(tmp|old)\Z")


def _remove_orphans(out: Path, state: Mapping[str, Any]) -> None:
    """Remove what writes cut short (a kill, a crash) left in the output folder: the temporary
    files of the score files, their tables, the figures and the state
    (:func:`uqmetrics.runs.io.remove_stale_temporaries`), the marks of scores written
    (:func:`_mark_writing`) that no record of ``state`` names (a kill between a score's
    record and its mark's removal), and the site's temporary and replaced copies. The caches'
    are the sweep's to remove (under its own lock). Nothing is reached through a link. Call
    it holding :data:`LOCK_FILE`."""
    import shutil

    from uqmetrics.runs.io import remove_stale_temporaries

    plots = out / "plots"
    for folder in (out, out / "scores", plots,
                   *(p for p in (plots.iterdir() if plots.is_dir() else ())
                     if p.is_dir() and not p.is_symlink())):
        remove_stale_temporaries(folder)
    _remove_marks(out, state)
    for entry in out.iterdir() if out.is_dir() else ():
        if _FOLDER_COPY.match(entry.name) and entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)


def _set_aside(paths: Sequence[Path], caches: Path) -> list[tuple[Path, Path]]:
    """Move the caches to recompute into ``caches/.replaced/`` (the sweep computes them as
    missing); :func:`_restore` puts back those the sweep did not write again (and those a
    killed run left there, first)."""
    aside = caches / ".replaced"
    if aside.is_dir():
        _restore([(caches / p.name, p) for p in aside.iterdir()], caches)
    if not paths:
        return []
    aside.mkdir(parents=True, exist_ok=True)
    moved = []
    for p in paths:
        target = aside / p.name
        os.replace(p, target)
        moved.append((p, target))
    return moved


def _restore(moved: Sequence[tuple[Path, Path]], caches: Path) -> None:
    from uqmetrics.runs.sweep import is_complete

    for original, aside in moved:
        if is_complete(original):
            aside.unlink()
        else:  # not computed again (its model failed): the cache it was stays
            os.replace(aside, original)
    if moved and not any((caches / ".replaced").iterdir()):
        (caches / ".replaced").rmdir()
