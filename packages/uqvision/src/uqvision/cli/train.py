"""``uqvision data MAKER`` and ``uqvision train``: what a model is trained on and its training.
``data`` writes a development image folder with a registered dataset maker, one sub-command
per maker, whose options and help are read from the maker's signature and docstring;
``train`` trains a timm architecture with a training method, one run per seed (its options
generated from :class:`~uqvision.training.config.ImageTrainConfig`, every output and the
method's hyper-parameters checked before the first run). The runs of one ``train`` command are
recorded as one group (:class:`~uqvision.training.loop.EnsembleMember`): one run of the default
method is a ``single`` model, the K runs of ``--members K`` (or of K ``--seeds``) the members
of one deep ensemble. The parsers import no torch (the makers' module, the training config and
the names of :mod:`uqvision.catalog`); the commands import what they run.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import typing
from functools import partial
from pathlib import Path

from uqmetrics import InputError
from uqmetrics.runs.config_options import mark_launcher
from uqmetrics.runs.run_config import add_config_option, config_beside, config_in
from uqmetrics.runs.sweep import ClusterSpec, add_cluster_options

from .. import catalog
from ..data.corruptions import (
    MAX_JPEG_QUALITY,
    MIN_CROP,
    make_imagenet_c_folder,
    parse_corruptions,
    parse_severities,
)
from ..data.makers import (
    DATASET_MAKERS,
    make_digits_folder,
    make_subset_folder,
    make_synthetic_folder,
)
from ..options import (
    COUNT,
    INDEX,
    SEED,
    ConfigOption,
    add_config_options,
    at_least,
    check_output_file,
    check_output_folder,
    config_kwargs,
    device_type,
    non_negative_float,
    positive_float,
    set_pairs,
)
from ..protocols.base import fraction
from ..training.config import ImageTrainConfig
from .base import _add_subcommands, _print, parameter_help, summary

#: Parameters of every maker that are not its own options: the folder written (``--out``,
#: its first parameter), ``--seed`` and ``--overwrite`` (added first), and the cluster the
#: maker's work runs on (``scheduler``: given by the cluster options,
#: :func:`uqmetrics.runs.sweep.add_cluster_options`, as a :class:`~uqmetrics.runs.sweep.ClusterSpec`).
_COMMON_MAKER_OPTIONS = ("seed", "overwrite")
_CLUSTER_MAKER_OPTION = "scheduler"

#: Earlier spellings of maker options, still accepted.
_MAKER_ALIASES = {"n_classes": ["--classes"], "n_per_class": ["--per-class"]}


def _checked_by(parse: typing.Callable[[str], object]) -> typing.Callable[[str], str]:
    """argparse type: the text as given, once ``parse`` takes it (its ``ValueError`` is the
    parser's error, naming the option)."""

    def check(text: str) -> str:
        try:
            parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        return text

    return check


#: argparse types of the makers' options whose values are bounded (and of a ``--seed`` narrower
#: than :data:`~uqvision.options.SEED`): a bad value is the parser's one-line error naming the
#: option as typed (and the value), before anything runs. The makers refuse the same values
#: when called from Python, naming the parameter.
_MAKER_TYPES: dict[typing.Callable, dict[str, typing.Callable[[str], object]]] = {
    make_digits_folder: {"test_fraction": fraction, "max_per_class": COUNT,
                         "seed": at_least(0, 2**32 - 1, " (scikit-learn's random_state)")},
    make_synthetic_folder: {"n_classes": COUNT, "n_per_class": COUNT, "image_size": COUNT},
    make_subset_folder: {"n_per_class": COUNT},
    make_imagenet_c_folder: {
        "corruptions": _checked_by(parse_corruptions),
        "severities": _checked_by(parse_severities), "resize": COUNT,
        "crop": at_least(MIN_CROP), "quality": at_least(1, MAX_JPEG_QUALITY,
                                                        " (PIL's JPEG qualities)"),
        "workers": COUNT},
}


#: Makers' options that must be given although their parameter has a default (``None``: the
#: maker refuses it when called from Python, naming the parameter): required on the command
#: line, and shown so in the usage line.
_MAKER_REQUIRED: dict[typing.Callable, tuple[str, ...]] = {make_imagenet_c_folder: ("src",)}


def _maker_options(maker: typing.Callable) -> dict[str, tuple[typing.Callable, object]]:
    """A maker's own options, from its signature: keyword -> (argparse type, default;
    :data:`inspect.Parameter.empty`: required). The type is the bounded one of
    :data:`_MAKER_TYPES`, else ``int``, ``float`` or ``str`` from the annotation."""
    hints = typing.get_type_hints(maker)
    bounded = _MAKER_TYPES.get(maker, {})
    out: dict[str, tuple[typing.Callable, object]] = {}
    for name, param in inspect.signature(maker).parameters.items():
        if param.kind is not param.KEYWORD_ONLY or name in (*_COMMON_MAKER_OPTIONS,
                                                            _CLUSTER_MAKER_OPTION):
            continue
        hint = hints.get(name, str)
        out[name] = (bounded.get(name) or next((t for t in (*typing.get_args(hint), hint)
                                                if t in (int, float, str)), str), param.default)
    return out


def _check_src(src: str | None) -> None:
    """A maker's ``--src`` (the image folder it reads: a folder, an archive, an image list, a
    folder inside a tar) refused, naming the option and the value, when it does not exist."""
    from ..layouts import is_folder

    if src is not None and not (src and (Path(src).exists() or is_folder(src))):
        raise InputError(f"--src {src!r} does not exist: give the image folder to read")


def _cmd_data(a: argparse.Namespace) -> int:
    check_output_folder("--out", a.out)
    maker = DATASET_MAKERS.lookup(a.kind)
    given = {k: getattr(a, k) for k in _maker_options(maker)}
    if "src" in given:  # before the maker reads it: its error would not name the option
        _check_src(given["src"])
    if _CLUSTER_MAKER_OPTION in inspect.signature(maker).parameters:
        cluster = ClusterSpec.from_args(a)
        if not cluster.local_default:  # --scheduler or --cluster: the maker's work on Dask
            given[_CLUSTER_MAKER_OPTION] = cluster
    root = maker(a.out, seed=a.seed, overwrite=a.overwrite, **given)
    _print(str(root))
    return 0


def _args_data(p: argparse.ArgumentParser) -> None:
    _add_subcommands(p, "kind", "MAKER", "dataset makers (uqvision data MAKER -h for its "
                     "options)", [(name, (), summary(maker), partial(_args_maker, maker))
                                  for name, maker in DATASET_MAKERS.items_ordered()])


def _args_maker(maker: typing.Callable, p: argparse.ArgumentParser) -> None:
    """The options of ``uqvision data MAKER``: ``--out`` (the maker's first parameter),
    ``--seed``, ``--overwrite``, its keyword parameters (their help from its docstring), and
    the cluster options for a maker that runs on one."""
    params = inspect.signature(maker).parameters
    docs = parameter_help(maker)

    def text(name: str, default: object = None) -> str | None:
        shown = "" if default in (None, inspect.Parameter.empty) else f" (default: {default})"
        return (docs.get(name, "") + shown).strip() or None

    p.add_argument("--out", required=True, metavar="FOLDER",
                   help=docs.get(next(iter(params)), "") or "the folder written")
    seed = params["seed"].default if "seed" in params else 0  # every maker takes seed=
    p.add_argument("--seed", type=_MAKER_TYPES.get(maker, {}).get("seed", SEED), default=seed,
                   help=text("seed", seed))
    p.add_argument("--overwrite", action="store_true", help=text("overwrite"))
    for name, (kind, default) in _maker_options(maker).items():
        flags = ["--" + name.replace("_", "-"), *_MAKER_ALIASES.get(name, [])]
        required = (default is inspect.Parameter.empty
                    or name in _MAKER_REQUIRED.get(maker, ()))
        action = p.add_argument(*flags, dest=name, type=kind, required=required,
                                default=None if required else default,
                                help=text(name, default))
        if name == "workers":  # a maker's local processes: a launcher option
            mark_launcher(action)
    if _CLUSTER_MAKER_OPTION in params:  # imagenet-c: --scheduler, --cluster, --jobs, ...
        add_cluster_options(p, workers=None, local="local processes (--workers)")
    add_config_option(p)


def _config_files_data(a: argparse.Namespace, config) -> list[Path]:
    """``OUT/data.config.toml``, in the folder written."""
    return [config_in(a.out, "data")]


def _config_files_train(a: argparse.Namespace, config) -> list[Path]:
    """``<checkpoint stem>.config.toml`` beside each seed's checkpoint."""
    return [config_beside(_seed_out(a, seed)) for seed in _train_seeds(a)]


def _seed_out(a: argparse.Namespace, seed: int) -> str:
    """``--out`` of the run of ``seed``: its ``{seed}`` filled in (``InputError`` naming
    ``--out`` for any other field in braces)."""
    try:
        return a.out.format(seed=seed)
    except (IndexError, KeyError, ValueError, AttributeError, TypeError) as err:
        raise InputError(f"--out {a.out!r}: only '{{seed}}' may stand in braces, as in "
                         f"'m{{seed}}.safetensors' (a brace itself is '{{{{' or '}}}}'): "
                         f"{type(err).__name__}: {err}") from None


def _train_seeds(a: argparse.Namespace) -> list[int]:
    """The seed of each run: ``--seeds``, else 0 to K - 1 for ``--members K`` (default: one
    run, seed 0)."""
    return list(a.seeds) if a.seeds else list(range(a.members or 1))


def _training_images(a: argparse.Namespace) -> int:
    """The number of images a run of ``uqvision train`` trains on (the view of ``--data`` that
    :func:`uqvision.data.image_view` makes of ``--classes`` and ``--index-file``), once its
    inputs are checked before any run, each refusal naming its option and the value: the
    folders of ``--data`` and ``--val-data``, the ``--init`` checkpoint, the ``--index-file``
    and the classes that ``--classes`` (or the index file) names."""
    from ..data import ClassSubset, ImageFolderDataset, read_index_file
    from ..models import check_checkpoint_file
    from .predict import named_input

    data = ImageFolderDataset(a.data, option="--data")
    if a.val_data is not None:
        ImageFolderDataset(a.val_data, option="--val-data")
    if a.init_checkpoint is not None:
        named_input("--init", a.init_checkpoint,
                    partial(check_checkpoint_file, a.init_checkpoint))
    index = None
    if a.index_file is not None:
        index = named_input("--index-file", a.index_file,
                            partial(read_index_file, a.index_file))
        if not isinstance(index.get("classes"), list) or not isinstance(
                index.get("indices"), list):
            raise InputError(f"--index-file {a.index_file!r}: records no 'classes' and "
                             "'indices' lists (damaged?)")
    classes = _classes_option(a.classes)
    named = ("--classes", a.classes) if classes is not None else ("--index-file", a.index_file)
    if classes is None and index is not None:
        classes = tuple(index["classes"])
    if not classes:
        return len(data)
    missing = [c for c in classes if c not in data.class_to_idx]
    if missing:
        raise InputError(f"{named[0]} {named[1]!r}: {len(missing)} class(es) not in --data "
                         f"{a.data!r}: {missing[:5]} (its classes: "
                         f"{', '.join(data.classes[:8])}{', ...' if len(data.classes) > 8 else ''})")
    if index is not None and list(index["classes"]) != list(classes):
        raise InputError(f"--index-file {a.index_file!r} indexes classes "
                         f"{index['classes'][:5]}..., not those of --classes {a.classes!r} "
                         f"{list(classes)[:5]}...: give the classes it records, or leave "
                         "--classes out")
    try:
        view = ClassSubset(data, classes, index["indices"] if index is not None else None)
    except ValueError as exc:
        raise InputError(f"{named[0]} {named[1]!r}: {exc}") from None
    return len(view)


def _cmd_train(a: argparse.Namespace) -> int:
    from ..training.loop import (
        EnsembleMember,
        checkpoint_files,
        epoch_batches,
        new_ensemble_id,
        train_model,
    )
    from ..training.method import TRAINING_METHODS
    from ..training.runs import SINGLE

    seeds = _train_seeds(a)
    if a.members is not None and a.seeds and len(a.seeds) != a.members:
        raise InputError(f"--members {a.members} but --seeds lists {len(a.seeds)} seed(s) "
                         f"{a.seeds}: give one seed per member, or --members alone (seeds 0 to "
                         f"{a.members - 1})")
    if len(seeds) > 1 and "{seed}" not in a.out:
        raise InputError(f"--out {a.out!r}: with several runs (--members, --seeds), it must "
                         "contain '{seed}'")
    if len(set(seeds)) != len(seeds):
        raise InputError(f"--seeds lists a seed twice: {seeds}")
    for seed in seeds:  # every output, before the first run trains
        if Path(_seed_out(a, seed)).is_dir():  # not a folder with the files beside it
            raise InputError(f"--out {_seed_out(a, seed)!r} is a folder; give a checkpoint "
                             "file name")
        for path in checkpoint_files(_seed_out(a, seed)):
            check_output_file("--out", path, a.overwrite)
    n = _training_images(a)  # --data, --val-data, --init, --index-file, --classes: named
    cfgs = train_configs(a)
    hp = cfgs[0].method_hparams()  # a bad --set is refused here, before any run
    steps = TRAINING_METHODS.lookup(a.method).total_steps(
        hp, len(epoch_batches(n, hp.batch_size, 0, 0)))
    if steps == 0 and a.init_checkpoint is None:
        raise InputError(f"--epochs/--set: method {a.method!r} would take no gradient step "
                         f"(epochs={getattr(hp, 'epochs', '?')}) and starts from no checkpoint "
                         "(--init): the saved network would be untrained")
    # the runs of this command, one group: a single model, or the members of one ensemble
    group, k = new_ensemble_id(), len(seeds)
    shown = SINGLE if a.method == "deep_ensemble" and k == 1 else a.method
    for i, (seed, cfg) in enumerate(zip(seeds, cfgs, strict=True)):
        r = train_model(a.data, _seed_out(a, seed), cfg, overwrite=a.overwrite,
                        ensemble=EnsembleMember(group, k, i),
                        progress=True)  # stderr; off under uqvision --quiet
        if int(os.environ.get("RANK", "0")) == 0:
            member = f"  member {i + 1}/{k} of {group}" if k > 1 else ""
            _print(f"{r.checkpoint}  {shown}{member}  "
                   f"loss={r.losses[-1] if r.losses else float('nan'):.4f}"
                   f"  epochs={r.epochs:g}  steps={r.steps}  {r.wall_time_s:.1f}s")
    return 0


def train_configs(a: argparse.Namespace) -> list[ImageTrainConfig]:
    """The training config of each run (seed) of a parsed ``uqvision train`` command line.

    Raises
    ------
    uqmetrics.InputError
        ``--model-kwargs`` is not a JSON object of keyword arguments, names a ``timm``
        option that loads weights, or a key ``--arch`` does not take (the model built once
        on the meta device, :func:`uqvision.models.check_model_kwargs`).
    ValueError
        ``--classes`` names no classes, or a JSON file that holds none.
    """
    from ..data import read_index_file
    from ..models import check_model_kwargs

    classes = _classes_option(a.classes)
    if a.index_file is not None and classes is None:  # the classes the index file records
        classes = tuple(read_index_file(a.index_file)["classes"])
    try:
        model_kwargs = json.loads(a.model_kwargs)
    except json.JSONDecodeError as err:
        raise InputError(f"--model-kwargs {a.model_kwargs!r} is not JSON ({err})") from None
    check_model_kwargs(model_kwargs, "--model-kwargs", arch=a.arch)  # keys --arch takes
    return [ImageTrainConfig(**{**config_kwargs(a, _TRAIN_OPTIONS),
                                "augment": None if a.augment == "none" else a.augment},
                             arch=a.arch, hparams=set_pairs(a.set), seed=seed,
                             model_kwargs=model_kwargs, classes=classes)
            for seed in _train_seeds(a)]


def _classes_option(value: str | None) -> tuple[str, ...] | dict[str, str] | None:
    """``--classes``: folder classes as ``a,b,c`` or a JSON file holding a list of them or an
    object folder class -> label (``ValueError`` naming the option on anything else)."""
    if value is None:
        return None
    if value.endswith(".json"):
        try:
            loaded = json.loads(Path(value).read_text())
        except (OSError, json.JSONDecodeError) as err:
            raise ValueError(f"--classes {value!r}: cannot read a JSON list or object "
                             f"({err})") from None
        if isinstance(loaded, dict) and all(isinstance(v, str) for v in loaded.values()):
            return {str(k): v for k, v in loaded.items()}
        if isinstance(loaded, list) and all(isinstance(v, str) for v in loaded):
            return tuple(loaded)
        raise ValueError(f"--classes {value!r} must hold a list of class names or an object "
                         f"class -> label name, got {type(loaded).__name__}")
    names = tuple(c.strip() for c in value.split(","))
    if not all(names):
        raise ValueError(f"--classes expects class names separated by commas, got {value!r}")
    return names


def _drop_rate(text: str) -> float:
    """argparse type of ``--drop-rate``: a probability, 0 to 1."""
    value = non_negative_float(text)
    if value > 1:
        raise argparse.ArgumentTypeError(f"must be a probability (0 to 1), got {text}")
    return value


#: ``uqvision train`` options generated from :class:`ImageTrainConfig` (defaults from its
#: fields; ``--augment none`` is ``augment=None``).
_TRAIN_OPTIONS = (
    ConfigOption("method", choices=lambda: catalog.names("training method"),
                 help="training method:\n" + catalog.describe("training method")),
    ConfigOption("epochs", type=non_negative_float,
                 help="shorthand for --set epochs= (0 only with --init)"),
    ConfigOption("batch_size", type=COUNT, help="shorthand for --set batch_size="),
    ConfigOption("lr", type=positive_float,
                 help="shorthand for the method's initial learning rate (lr_init or lr0)"),
    ConfigOption("init_checkpoint", flag="--init", help="start from this local checkpoint"),
    ConfigOption("val_data",
                 help="validation folder (K-FAC Laplace tunes its noise scale on it)"),
    ConfigOption("amp", help="autocast (fp16 on CUDA, bf16 on CPU)"),
    ConfigOption("index_file", metavar="FILE",
                 help="train on the images of this index file only "
                      "(uqvision.protocols.uimnet.index.make_index_files: UIMNET's 90/10 "
                      "in-domain split), with the classes it records unless --classes names "
                      "them"),
    ConfigOption("spectral",
                 help="one-sided spectral normalisation of the featurizer (conv/linear sigma "
                      "and BatchNorm Lipschitz constant at most 5; UIMNET)"),
    ConfigOption("input_size", type=COUNT),
    ConfigOption("augment", choices=lambda: [*catalog.names("augmentation"), "none"],
                 help="training augmentation:\n" + catalog.describe("augmentation")
                      + "\nnone: no augmentation"),
    ConfigOption("drop_rate", type=_drop_rate),
    ConfigOption("device", type=device_type, help="cpu | cuda | cuda:N", launcher=True),
    ConfigOption("num_workers", flag="--workers", type=INDEX, launcher=True),
)


def _args_train(p: argparse.ArgumentParser) -> None:
    p.add_argument("--arch", required=True, help="timm architecture, e.g. resnet10t, test_vit")
    p.add_argument("--data", required=True, help="training image folder")
    p.add_argument("--out", required=True, help="checkpoint path ('{seed}' for several seeds)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="a hyper-parameter of the method (repeatable), e.g. cycles=5; "
                        "uqvision's former AdamW recipe: optimizer=adamw schedule=onecycle "
                        "lr_init=3e-3 weight_decay=0.05")
    p.add_argument("--seeds", type=SEED, nargs="+",
                   help="one run per seed (default 0); several: the members of one ensemble")
    p.add_argument("--members", type=COUNT, metavar="K",
                   help="train K runs (seeds 0 to K-1, or the K --seeds) as one group: with "
                        "--method deep_ensemble, one deep ensemble (their caches record method "
                        "deep_ensemble and this command's ensemble id); default 1: one "
                        "network (method single)")
    p.add_argument("--classes", default=None, metavar="A,B,C | FILE.json",
                   help="train on these folder classes only, the head's classes in this order; "
                        "a JSON file holds a list, or an object folder class -> label to group "
                        "classes (UIMNET's in-vs-out oracle)")
    add_config_options(p, ImageTrainConfig, _TRAIN_OPTIONS)
    p.add_argument("--model-kwargs", default="{}", help="JSON kwargs for timm.create_model")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an existing checkpoint (and its sidecar and state file)")
    add_config_option(p)
