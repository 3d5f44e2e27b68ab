"""The options of a prediction: :class:`PredictConfig`, its autocast modes (:data:`AMP_MODES`,
:func:`amp_mode`), the default passes of a mode (:data:`DEFAULT_PASSES`), the pinned execution
of the reproduction drivers (:data:`REFERENCE_EXECUTION`), the image decoders
(:data:`DECODERS`, :func:`decoder_suggestion`) and the command-line options of its
evaluation-set and cache-variable fields (:data:`PREDICT_CONFIG_OPTIONS`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from uqmetrics.metrics.registry import Registry

from ..evalsets import DEFAULT_EVAL_SET, EVAL_SETS
from ..options import ConfigOption
from ..roles import SET_ROLES
from .variables import CACHE_VARIABLES

if TYPE_CHECKING:
    import torch

__all__ = [
    "AMP_MODES",
    "CHANNELS_LAST_CPU_FAMILIES",
    "DECODERS",
    "DEFAULT_PASSES",
    "DEVICE_DECODING_MODES",
    "PREDICT_CONFIG_OPTIONS",
    "REFERENCE_EXECUTION",
    "Decoder",
    "PredictConfig",
    "amp_mode",
    "decoder_suggestion",
    "resolve_channels_last",
]


@dataclass(frozen=True)
class Decoder:
    """How a prediction turns image files into the network's input (``PredictConfig.decoder``).

    Attributes
    ----------
    name : str
    description : str
        One line (CLI help).
    on_device : bool
        Whether it decodes and resizes on the prediction's device
        (:mod:`uqvision.predict.device_decode`); the loader's workers then only read bytes.
    """

    name: str
    description: str
    on_device: bool


#: The image decoders of a prediction (``PredictConfig.decoder``, ``--decoder``); part of a
#: cache's identity (docs/conventions.md#v-decoders).
DECODERS: Registry[Decoder] = Registry("decoder")
DECODERS.register(Decoder(
    "pil", "Pillow on the CPU, in the loader's workers, then the model's own timm transform "
           "(the default: the pixels of timm's own loop, bit for bit)", on_device=False))
DECODERS.register(Decoder(
    "torchvision", "torchvision.io.decode_jpeg in batches on --device (nvJPEG on CUDA, "
                   "libjpeg-turbo on the CPU), resized, cropped and normalised there; the "
                   "workers only read file bytes; a preprocessing of its own (pixels differ "
                   "from Pillow's)", on_device=True))

#: Modes whose input is the model's evaluation transform, the only ones a decoder on the
#: device runs (an augmentation of ``tta``, or a protocol's mode, is made on PIL images).
DEVICE_DECODING_MODES = ("plain", "mc_dropout")


def decoder_suggestion(decoder: str, device: str, cuda_available: bool) -> str | None:
    """The line a dry run prints to suggest decoding on the GPU, ``None`` when there is none
    to make: the prediction runs on CUDA (or CUDA is available and ``device`` is the CPU) and
    decodes with Pillow on the CPU.

    Examples
    --------
    >>> decoder_suggestion("pil", "cpu", cuda_available=False) is None
    True
    >>> decoder_suggestion("torchvision", "cuda", cuda_available=True) is None
    True
    >>> decoder_suggestion("pil", "cuda", cuda_available=True)[:48]
    'suggestion: --decoder torchvision decodes the JP'
    """
    if not cuda_available or DECODERS.lookup(decoder).on_device:
        return None
    where = "" if str(device).startswith("cuda") else " with --device cuda"
    return ("suggestion: --decoder torchvision decodes the JPEGs on the GPU (nvJPEG, in "
            f"batches){where}, where Pillow on the loader's CPU workers bounds the speed; its "
            "pixels differ from Pillow's (a preprocessing of its own: caches of the two never "
            "mix; docs/conventions.md#v-decoders)")


@dataclass
class PredictConfig:
    """Options of :func:`predict` (recorded in every cache's ``config`` attr).

    ``passes`` counts TTA augmentations or MC-dropout passes (ignored for ``plain``); ``None``
    (the default) means :data:`DEFAULT_PASSES` of the mode (MC dropout: the Selective paper's
    30); ``first_pass`` offsets the TTA pass indices (pass ``p`` uses seed ``derive_seed(seed, p)``),
    so a member ``k`` of an ensemble can run its own pass ``k``; ``seed`` also seeds the
    MC-dropout masks (sample ``i`` in pass ``r``: ``derive_seed(seed, r, i)``).

    A checkpoint trained by :func:`uqvision.training.loop.train_model` yields its method's prediction
    samples (snapshots, posterior draws, stochastic passes; one network for a deep-ensemble
    member): ``samples`` of them from ``first_sample`` on (``None``: every snapshot, 10
    posterior draws or passes, the network itself), one cache per sample and pass. Sample
    ``k`` of a run trained with seed ``s`` draws its weights / noise from
    ``derive_seed(seed, s)`` and its TTA pass ``p`` from ``derive_seed(derive_seed(seed, s,
    k), p)``, so members and samples never share an augmentation. ``train_data`` is the
    folder the BatchNorm statistics of sampled weights are recomputed on (SWAG, K-FAC
    Laplace; default: the run's training folder). ``logits=False`` (with ``embeddings``): no
    logits are kept and the folder may have other classes than the model (zero-shot, V.4).
    The folder's images are checked before the model is built
    (:func:`uqvision.data.readable_images`): an unreadable one is an error naming it, or with
    ``skip_bad_images`` is left out and recorded in the caches' attrs (``skipped_images``,
    JSON relative path -> why, and ``n_skipped_images``).

    How the network runs (docs/conventions.md#v-predict-speed): ``channels_last`` runs it on
    NHWC tensors and weights (faster for most convolutional networks on CPU and with AMP on
    GPU; logits equal to float rounding, within 1e-7 on the networks measured, not bit for
    bit); ``None`` (the default) chooses by architecture and device
    (:func:`resolve_channels_last`: on the CPU for the convolutional timm families of
    :data:`CHANNELS_LAST_CPU_FAMILIES`, else off), and a cache records the choice made
    (``channels_last`` in its attrs and its ``config``; ``channels_last_source``: ``"auto"``,
    chosen so, or ``"given"``, by the caller; for a model resumed, pinned to the format of its
    caches already there, theirs: :func:`uqvision.predict.predict_to_files`); ``amp`` is
    autocast (:data:`AMP_MODES`: ``"off"``, ``"fp16"`` on CUDA only, ``"bf16"``; ``True`` and
    ``False`` of earlier versions mean fp16 on CUDA / bf16 on CPU, and off). Both are part of
    a cache's identity. ``num_workers`` ``None`` picks the DataLoader workers from the machine
    (:func:`uqvision.runtime.loader_workers`); the logits do not depend on it.

    ``eval_set`` names what the folder is (:data:`uqvision.evalsets.EVAL_SETS`: its role and
    class map; default the generic ``folder`` set, classes matched by name): ``imagenet-v2``
    labels folders ``0`` ... ``999`` by class index, ``imagenet-o`` (OOD) every sample -1. For
    an expanded set (``imagenet-c``) the folder is one member's (``<corruption>/<severity>``)
    and ``eval_member`` names it (``None``: told from the folder's path). Both are part of a
    cache's identity, recorded in its attrs (``eval_set``, ``role``, ``eval_member``,
    ``corruption``, ``severity``). ``role`` is the role the folder plays
    (:data:`uqvision.roles.SET_ROLES`; ``None``: its evaluation set's default, ``test`` for a
    clean folder), recorded as the caches' ``set_role``: not part of their identity (it says
    what the set is for, not how its logits were made). ``extra_variables`` are further variables each cache
    records (:data:`CACHE_VARIABLES`, e.g. ``head_weight``); a cache lacking one is not reused.

    ``model_classes`` are the class names, in the order of its outputs, of a model that
    records none (random weights, a checkpoint without names in its sidecar): its
    in-distribution folder's sorted classes, which ``uqvision sweep`` gives to every other
    folder it predicts (an OOD set, a subset of the classes), so that all of a model's caches
    share one class space. ``None``: the folder's own classes, as many as the model's outputs
    (a random network gets that many); refused for an OOD folder, which has none of the
    model's classes (docs/conventions.md#v-6).

    ``decoder`` (:data:`DECODERS`) is how the image files become the network's input:
    ``"pil"`` (the default) decodes with Pillow in the loader's workers and applies the
    model's timm transform, the pixels of timm's own loop; ``"torchvision"`` decodes JPEGs
    with ``torchvision.io.decode_jpeg`` in batches on ``device`` (nvJPEG on CUDA) and resizes,
    crops and normalises them there (:mod:`uqvision.predict.device_decode`), for the modes of
    :data:`DEVICE_DECODING_MODES`. Its pixels differ from Pillow's, so it is a preprocessing
    of its own: part of a cache's identity, recorded in its attrs (``decoder``;
    docs/conventions.md#v-decoders).
    """

    mode: str = "plain"
    passes: int | None = None
    first_pass: int = 0
    tta_policy: str = "imagenet"
    seed: int = 0
    batch_size: int = 64
    num_workers: int | None = None
    device: str = "cpu"
    amp: str = "off"
    channels_last: bool | None = None
    embeddings: bool = False
    allow_random_init: bool = False
    samples: int | None = None
    first_sample: int = 0
    train_data: str | None = None
    logits: bool = True
    skip_bad_images: bool = False
    eval_set: str = DEFAULT_EVAL_SET
    eval_member: str | None = None
    role: str | None = None
    extra_variables: tuple[str, ...] = ()
    model_classes: tuple[str, ...] | None = None
    decoder: str = "pil"

    def __post_init__(self):
        if self.passes is None:
            self.passes = DEFAULT_PASSES.get(self.mode, 1)
        if isinstance(self.extra_variables, str):
            self.extra_variables = (self.extra_variables,)
        self.extra_variables = tuple(dict.fromkeys(self.extra_variables or ()))
        if self.model_classes is not None:
            self.model_classes = tuple(str(c) for c in self.model_classes)
        self.amp = amp_mode(self.amp, self.device)
        if not self.logits and not self.embeddings:
            raise ValueError("logits=False needs embeddings=True (a cache without logits "
                             "holds embeddings)")


#: Passes of a mode when ``PredictConfig.passes`` is not given (1 for the others).
DEFAULT_PASSES: dict[str, int] = {"mc_dropout": 30}


#: How the reproduction drivers (:mod:`uqvision.protocols`) and ``uqvision demo`` run their
#: networks, pinned whatever the defaults of :class:`PredictConfig`: contiguous tensors, no
#: autocast, images decoded in the main process, as when their published numbers were
#: computed (``PredictConfig(..., **REFERENCE_EXECUTION)``).
REFERENCE_EXECUTION: dict[str, Any] = {"channels_last": False, "amp": "off", "num_workers": 0}


#: timm families (the module of the network's class, ``timm.models.<family>``) whose networks
#: ``PredictConfig(channels_last=None)`` runs NHWC on the CPU: measured 1.3-1.9x faster in
#: fp32 on an AMD EPYC, one thread, batch 32 at 224 px (gernet_s, resnet18, test_resnet,
#: test_byobnet, test_efficientnet, mobilenetv3_small_100, regnetx_002, densenet121,
#: test_nfnet); convnext, vision_transformer and mambaout gained nothing (and ran bit for bit
#: alike). On CUDA it stays off: with the images decoded on the CPU the loop waits for them,
#: and NHWC made the fp32 run slower on an H100 (benchmarks/bench_predict.py).
CHANNELS_LAST_CPU_FAMILIES = frozenset({"resnet", "byobnet", "efficientnet", "mobilenetv3",
                                        "regnet", "densenet", "nfnet"})


def resolve_channels_last(model: torch.nn.Module, config: PredictConfig) -> bool:
    """``config.channels_last``, or for ``None`` the choice by architecture and device: True
    on a CPU for a timm network of :data:`CHANNELS_LAST_CPU_FAMILIES`, else False.

    Examples
    --------
    >>> import timm
    >>> net = timm.create_model("test_resnet")
    >>> resolve_channels_last(net, PredictConfig()), resolve_channels_last(
    ...     net, PredictConfig(device="cuda")), resolve_channels_last(
    ...     net, PredictConfig(channels_last=False))
    (True, False, False)
    """
    import torch  # a network's choice: torch is there (the options import no torch)

    if config.channels_last is not None:
        return bool(config.channels_last)
    module = type(model).__module__
    family = module.rpartition(".")[2] if module.startswith("timm.models.") else ""
    return torch.device(config.device).type == "cpu" and family in CHANNELS_LAST_CPU_FAMILIES


#: Autocast modes of ``PredictConfig.amp``: name -> the name of its torch dtype (``None``: full
#: precision); names, so that the options need no torch.
AMP_MODES: dict[str, str | None] = {"off": None, "fp16": "float16", "bf16": "bfloat16"}


def amp_mode(value: Any, device: Any = "cpu") -> str:
    """``PredictConfig.amp`` as a name of :data:`AMP_MODES`: the booleans of earlier versions
    (and of old caches' ``config``) mean ``"off"`` and autocast's dtype on ``device`` (fp16 on
    CUDA, bf16 on CPU); ``None`` (a cache from before the option) is ``"off"``; other values
    are returned as they are (checked by :func:`predict`)."""
    if value is None or value is False:
        return "off"
    if value is True:
        return "fp16" if str(device).startswith("cuda") else "bf16"
    return value


#: Command-line options of the :class:`PredictConfig` fields of evaluation sets and cache
#: variables (``--eval-set``, ``--eval-member``, ``--cache-variables``), for the ``uqvision
#: predict`` / ``sweep`` option list (defaults from the fields).
PREDICT_CONFIG_OPTIONS = (
    ConfigOption("eval_set", choices=EVAL_SETS.names, metavar="NAME",
                 help="what --data is (its role and how its labels are made; part of a "
                      "cache's identity; default: {default}):\n" + EVAL_SETS.describe()),
    ConfigOption("role", choices=SET_ROLES, metavar="ROLE",
                 help="the role --data plays, recorded in its caches (set_role) for the score "
                      "commands: " + ", ".join(SET_ROLES) + " (default: its --eval-set's: test "
                      "for a clean folder, shift for a shifted one, ood-near/ood-far)"),
    ConfigOption("eval_member", metavar="MEMBER",
                 help="the member of an expanded --eval-set that --data is (e.g. fog-3 of "
                      "imagenet-c, folder <root>/fog/3; default: told from --data's path)"),
    ConfigOption("extra_variables", flag="--cache-variables", nargs="+",
                 choices=CACHE_VARIABLES.names, metavar="NAME",
                 help="also record these variables in every cache (a cache without them is "
                      "not reused):\n" + CACHE_VARIABLES.describe()),
)
