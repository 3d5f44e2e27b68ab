"""Zoo sweeps: many models × one image folder (and extra evaluation sets), one cache file per
cell, on Dask.

Cells are (model × dataset × mode × pass), and for a checkpoint of a training method with
several prediction samples (snapshots, posterior draws) also × sample — an MC-dropout cell
holds all its passes, which share one data loading — run by ``uqmetrics.runs.sweep.run_sweep``: a
``LocalCluster`` by default or any scheduler by address; each cell writes its cache atomically,
a rerun skips complete files of the same identity (a model whose caches there were computed from
other inputs is refused and its files kept, unless ``overwrite``), and a model that raises is
reported while the others go on. Model names are checked against the registries (with
suggestions) before anything runs. The models of a folder whose preprocessing resizes and
crops alike (a preprocessing group, :mod:`~.decode`) decode each image once between them, not
once each: the caches are the same bit for bit (``share_decoding``).

Before the first cell is submitted, every model's weights are looked up in one pass, with no
network (:func:`check_weights`): a local file, random weights, or the hub / torch.hub caches
(:func:`uqvision.models.locate_pretrained`). Offline, a model whose weights are not cached
fails there, one record and no cell; online, one short request (:func:`probe_hub`) decides
whether the missing ones can be downloaded, and when the hub cannot be reached they all fail
at once, instead of each cell spending huggingface_hub's retries (docs/conventions.md#v-1-zoos).

Models come from patterns and from named zoos (:data:`uqvision.zoo.ZOOS`, e.g.
``selective-paper``, ``timm-in1k``); a zoo member the installed timm does not know is a failed
model, not an error. Failed models are recorded in a failures file (``sweep_failures.json``,
written atomically as they fail, read by the next run, which retries them by default; a file
that cannot be written is reported in one line and the sweep goes on), each with its kind
(:data:`FAILURE_KINDS`): what to do about it differs. Full tracebacks go to a log file
(``log_file``; ``uqvision sweep`` writes ``sweep.log``), never to the console. Progress counts
cells and models done and left, with an ETA. :func:`dry_run_sweep` says what a sweep would do
without doing it.

Extra evaluation sets (``sets``; ``uqvision sweep --sets EVALSET=PATH ...``, e.g.
``imagenet-c=/data/imagenet-c imagenet-r=/data/imagenet-r``): ``EVALSET`` is a name of
:data:`uqvision.evalsets.EVAL_SETS` and an expanded set (``imagenet-c``) stands for every
member folder found below ``PATH`` (``<corruption>/<severity>/``). Every model predicts each
set, each member, once into the same caches folder, as ``uqvision predict --eval-set EVALSET
[--eval-member M]`` would (the caches record ``eval_set``, ``eval_member``, ``corruption``,
``severity``; they are named by :func:`uqvision.evalsets.member_dataset_name`, e.g.
``imagenet-c-fog-3``). Each (model, member, sample, pass) is one cell: resumed, reported,
listed by the dry run and counted by the progress as the ``--data``'s are. The sets are only
predicted: the sweep's protocols score the ``--data``'s caches (V.1's selective scores are as
without sets); ``uqvision score shift CACHES`` scores the sets' later.

OOD sets (``ood_sets`` of :func:`sweep_targets`; ``uqvision sweep --ood-sets
OODSET[:NAME]=PATH ...``, e.g. OpenOOD v1.5's ImageNet lists ``ssb-hard=.../test_ssb_hard.txt
ninco=.../test_ninco.txt``) are such sets restricted to role ``ood``, their caches named by the
set (``ninco``) and recording its ``ood_split`` (``near``/``far``); each is checked disjoint
from ``--data`` by content hash before any model runs (:func:`check_ood_targets`). A model
with random weights that records no class names predicts every folder but ``--data`` in the
``--data``'s classes (``PredictConfig.model_classes``): a model's class space never comes from
an OOD folder or a subset of the classes.

One concern per module; every name is importable from ``uqvision.sweep`` itself:

- :mod:`~.plan`: the models (:func:`expand_models`), the cells (:func:`plan_sweep`,
  :class:`SweepPlan`) and the checks before the first cell;
- :mod:`~.sets`: the extra evaluation sets and OOD sets (:func:`parse_set`,
  :func:`sweep_targets`, :class:`SweepTarget`, :func:`check_ood_targets`);
- :mod:`~.weights`: the weights lookup (:func:`find_weights`, :func:`check_weights`,
  :func:`weights_status`, :func:`probe_hub`, :class:`WeightsStatus`);
- :mod:`~.failures`: failure kinds, the failures file and log (:data:`FAILURE_KINDS`,
  :data:`FAILURES_FILE`, :data:`LOG_FILE`), :class:`ModelSweepReport`;
- :mod:`~.decode`: the preprocessing groups (the models of a folder that resize and crop
  alike), each image decoded once per group for their cells;
- :mod:`~.run`: :func:`sweep_predictions` and its cell, :func:`predict_cell`;
- :mod:`~.dry_run`: :func:`dry_run_sweep`, :class:`SweepDryRun`.

A sweep's figures are its score file's, drawn by the protocol that scores it (the selective
protocol's: the paper's figures, AURC vs accuracy, the risk-coverage curves).
"""

from .dry_run import SweepDryRun, dry_run_sweep
from .failures import (
    FAILURE_KINDS,
    FAILURES_FILE,
    LOG_FILE,
    ModelSweepReport,
    _FailureLog,  # noqa: F401  (private, imported by tests/test_zoo.py)
)
from .plan import SweepPlan, expand_models, plan_sweep
from .run import predict_cell, sweep_predictions
from .sets import OOD_OPTION, SweepTarget, check_ood_targets, parse_set, sweep_targets
from .weights import (
    PROBE_TIMEOUT,
    WEIGHT_SUFFIXES,
    WeightsStatus,
    check_weights,
    find_weights,
    probe_hub,
    weights_status,
)

__all__ = [
    "FAILURES_FILE",
    "FAILURE_KINDS",
    "LOG_FILE",
    "OOD_OPTION",
    "PROBE_TIMEOUT",
    "WEIGHT_SUFFIXES",
    "ModelSweepReport",
    "SweepDryRun",
    "SweepPlan",
    "SweepTarget",
    "WeightsStatus",
    "check_ood_targets",
    "check_weights",
    "dry_run_sweep",
    "expand_models",
    "find_weights",
    "parse_set",
    "plan_sweep",
    "predict_cell",
    "probe_hub",
    "sweep_predictions",
    "sweep_targets",
    "weights_status",
]
