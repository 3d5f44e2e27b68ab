"""The options of a training run, :class:`ImageTrainConfig` (recorded in the checkpoint's
sidecar), apart from the loop that runs it (:mod:`~uqvision.training.loop`): ``uqvision
train``'s options are generated from its fields, with no torch imported
(docs/conventions.md#fast-help).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ADAMW_RECIPE", "ImageTrainConfig", "TrainConfig"]

#: uqvision's recipe before the method registry (AdamW + OneCycle): ``ImageTrainConfig(hparams=
#: ADAMW_RECIPE)`` or ``--set optimizer=adamw --set schedule=onecycle --set lr_init=3e-3
#: --set weight_decay=0.05`` with the ``deep_ensemble`` (or ``mc_dropout``) method.
ADAMW_RECIPE: dict[str, Any] = {"optimizer": "adamw", "schedule": "onecycle", "lr_init": 3e-3,
                                "weight_decay": 0.05}

#: Initial learning-rate field of a method's hyper-parameters, for ``ImageTrainConfig.lr``.
_LR_FIELDS = ("lr_init", "lr0", "lr")


@dataclass
class ImageTrainConfig:
    """Options of :func:`train_model` (all recorded in the checkpoint sidecar).

    ``method`` names a :data:`~uqvision.training.method.TRAINING_METHODS` entry and ``hparams``
    overrides its hyper-parameters (values, or ``"key=value"``-style strings converted to the
    field's type: ``--set``); ``epochs``, ``batch_size``, ``lr`` (the method's initial rate:
    ``lr_init`` or ``lr0``) and ``weight_decay`` are shorthands for the same overrides (``None``:
    the method's default). The default is the Pitfalls recipe of a conventional network (SGD,
    momentum 0.9, eq. 10); uqvision's former AdamW + OneCycle recipe is
    ``hparams=ADAMW_RECIPE``.

    ``input_size`` is the square side the images are resized to; ``augment`` names a policy of
    :data:`uqvision.data.TTA_POLICIES` (``None``: no augmentation); ``drop_rate`` is timm's
    classifier dropout; ``model_kwargs`` go to ``timm.create_model`` (e.g. ``patch_size`` for
    small inputs). ``init_checkpoint`` starts from a local checkpoint (its weights, and the
    cost recorded in its sidecar, which the new sidecar cumulates); ``val_data`` is a
    validation folder for methods that tune on one (K-FAC Laplace's noise scale).

    ``classes`` trains on a class-subset view of ``data`` (folder class names, the head's
    classes in that order; or a mapping folder class -> label name, several classes to one
    label) and ``index_file`` on the positions of that view an index file of
    :func:`uqvision.protocols.uimnet.index.make_index_files` lists (UIMNET's 90/10 in-domain split): no image
    is copied (:func:`uqvision.data.image_view`). ``spectral``: one-sided spectral
    normalisation (bound 5) of every Conv/Linear weight but the classifier's and of every
    BatchNorm's Lipschitz constant (:func:`uqvision.models.spectral.spectral_normalize`),
    UIMNET's ablation for every method.

    The likelihood is cross-entropy with ``label_smoothing``; with ``teachers`` (``NAME=
    CHECKPOINT`` specs, trained on the same classes and preprocessing) the loss is Hinton et
    al.'s knowledge distillation from their ensemble, ``(1 - α) CE + α T² KL(p̄_T ‖
    softmax(z / T))`` with ``α = distill_alpha``, ``T = distill_temperature`` and ``p̄_T`` the
    mean of the teachers' ``softmax(z_k / T)`` on the same augmented batch (defaults α = 0.9,
    T = 4: the KD baseline of Tian et al., "Contrastive representation distillation", ICLR
    2020). ``amp``: autocast (bf16 on CPU, fp16 with a gradient scaler on CUDA).
    """

    arch: str = "resnet10t"
    method: str = "deep_ensemble"
    hparams: dict = field(default_factory=dict)
    epochs: float | None = None
    batch_size: int | None = None
    lr: float | None = None
    weight_decay: float | None = None
    input_size: int = 32
    augment: str | None = "crop"
    drop_rate: float = 0.0
    mean: tuple[float, float, float] = (0.5, 0.5, 0.5)
    std: tuple[float, float, float] = (0.5, 0.5, 0.5)
    seed: int = 0
    device: str = "cpu"
    num_workers: int = 0
    tag: str | None = None
    model_kwargs: dict = field(default_factory=dict)
    init_checkpoint: str | None = None
    val_data: str | None = None
    amp: bool = False
    label_smoothing: float = 0.0
    teachers: tuple[str, ...] = ()
    distill_alpha: float = 0.9
    distill_temperature: float = 4.0
    classes: tuple[str, ...] | dict[str, str] | None = None
    index_file: str | None = None
    spectral: bool = False

    def method_hparams(self):
        """The method's hyper-parameters: its defaults, ``hparams``, then the shorthands."""
        from .method import TRAINING_METHODS  # torch: imported on use

        method = TRAINING_METHODS.lookup(self.method)
        names = {f.name for f in dataclasses.fields(method.hparams)}
        over: dict[str, Any] = dict(self.hparams)
        for key in ("epochs", "batch_size", "weight_decay"):
            if getattr(self, key) is not None:
                if key not in names:
                    raise ValueError(f"{key}={getattr(self, key)!r} does not apply to method "
                                     f"{self.method!r} (its hyper-parameters: "
                                     f"{', '.join(sorted(names))})")
                over[key] = getattr(self, key)
        if self.lr is not None:
            lr_field = next((f for f in _LR_FIELDS if f in names), None)
            if lr_field is None:
                raise ValueError(f"lr does not apply to method {self.method!r}; set its "
                                 f"learning rates by name ({', '.join(sorted(names))})")
            over[lr_field] = self.lr
        return method.hparams_from(over)


#: The earlier name of :class:`ImageTrainConfig` (the README and docs/reproduction-vision.md
#: document it), kept importable; uqreg has its own ``uqreg.engine.TrainConfig``.
TrainConfig = ImageTrainConfig
