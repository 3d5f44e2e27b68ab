"""A model source from a plugin: ``toy/meancolour``, a linear classifier of an image's mean
colour, with timm's feature interface (``forward_features``, ``forward_head``,
``num_features``) so that embeddings and head variables work as for timm models."""

from __future__ import annotations

import torch
from safetensors.torch import load_file
from torch import nn

from uqvision.data import DataConfig, eval_transform
from uqvision.models import LoadedModel, ModelSpec, file_sha256

#: The preprocessing of every toy model: 32 px, no crop, mean and std 0.5.
DATA_CONFIG = DataConfig(input_size=(3, 32, 32), mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5),
                         crop_pct=1.0, interpolation="bilinear")


class MeanColour(nn.Module):
    """Logits = a linear map of the image's mean colour (3 features)."""

    num_features = 3

    def __init__(self, num_classes: int):
        super().__init__()
        self.head = nn.Linear(3, num_classes)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean(dim=(2, 3))

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        return x if pre_logits else self.head(x)

    def get_classifier(self) -> nn.Module:
        return self.head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))


class ToySource:
    """``toy/meancolour``: a checkpoint (safetensors of :class:`MeanColour`) or seeded random
    weights."""

    @staticmethod
    def check_name(name: str) -> None:
        if name != "meancolour":
            raise ValueError(f"unknown toy model {name!r}; the toy source has: meancolour")

    @staticmethod
    def load(spec: ModelSpec, num_classes: int | None, allow_random_init: bool) -> LoadedModel:
        ToySource.check_name(spec.model_name)
        if spec.checkpoint is not None:
            state = load_file(str(spec.checkpoint))
            n = int(state["head.weight"].shape[0])
            if num_classes is not None and n != num_classes:
                raise ValueError(f"checkpoint {str(spec.checkpoint)!r} has {n} classes but the "
                                 f"data has {num_classes}")
            model = MeanColour(n)
            model.load_state_dict(state)
            sha, tag = file_sha256(spec.checkpoint), "checkpoint"
        elif allow_random_init:
            n = num_classes or 10
            model = MeanColour(n)
            g = torch.Generator().manual_seed(0)
            with torch.no_grad():
                model.head.weight.copy_(torch.randn(n, 3, generator=g))
                model.head.bias.copy_(torch.randn(n, generator=g))
            sha, tag = "", "random_init"
        else:
            raise ValueError(f"model {spec.name!r} has no checkpoint (allow random init)")
        return LoadedModel(model.eval(), spec, DATA_CONFIG, eval_transform(DATA_CONFIG), n,
                           "toy_meancolour", tag, sha)

    @staticmethod
    def data_config(spec: ModelSpec) -> DataConfig:
        ToySource.check_name(spec.model_name)
        return DATA_CONFIG
