"""Model metadata for the selective protocol (docs/conventions.md#v-1): size, input size,
family, regime.

The Selective paper's analyses compare models by how they were trained (knowledge distillation,
pre-training data, adversarial training, semi-/self-supervision, the teacher) and by their size.
None of that is in a model's weights, so it comes from a versioned table keyed by the model's
``arch.tag`` (``tv/<name>.<WEIGHTS>`` for torchvision), shipped with the package as
``uqvision/resources/model_metadata.csv``::

    # uqvision model metadata, format_version 1: ...
    key,family,base_architecture,params,input_size,distillation,teacher,pretraining_data,...
    deit_tiny_distilled_patch16_224.fb_in1k,ViT,deit_tiny_patch16_224,5910800,224,yes,...

Columns are the :data:`METADATA_FIELDS` registry (``uqvision metadata --fields``). A value the
table does not know is ``unknown`` (an empty ``params``/``input_size``), and a model that is not
in the table gets ``unknown`` everywhere: a regime is never guessed from a name.

Extending the table: write a CSV with the same header (:func:`write_metadata` or by hand) and
pass it with ``--metadata FILE`` to ``uqvision score``/``sweep``/``metadata``, or list it in the
environment variable ``UQVISION_MODEL_METADATA`` (paths separated by ``os.pathsep``). Later tables
override rows of earlier ones with the same key; a key twice in one file is an error.
``uqvision metadata --unknown --caches DIR`` (or ``--scores selective.nc``) lists the models the
tables do not know; :func:`template_metadata` (``uqvision metadata --template FILE --zoo NAME``
or ``--models ...``) writes rows for them with what timm's pretrained config and the tag say
(parameters, input size, pre-training data by :data:`PRETRAINING_TOKENS`; crop and
interpolation in ``notes``) and ``unknown`` everywhere else.

The table's rows are also the ``selective-paper`` zoo (:data:`uqvision.zoo.ZOOS`,
``uqvision sweep --zoo selective-paper``), read from the same file.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path

import numpy as np
import xarray as xr
from uqmetrics.metrics.registry import Registry

__all__ = [
    "FORMAT_VERSION",
    "METADATA_ENV",
    "METADATA_FIELDS",
    "PRETRAINING_TOKENS",
    "REGIME_FIELDS",
    "UNNAMED_PRETRAINING_TOKENS",
    "MetadataError",
    "MetadataField",
    "ModelMetadata",
    "attach_metadata",
    "load_metadata",
    "metadata_key",
    "model_metadata_key",
    "pretraining_from_tag",
    "read_metadata",
    "shipped_metadata_path",
    "template_metadata",
    "unknown_models",
    "write_metadata",
]

#: Version of the table layout; bumped on any change of columns or allowed values.
FORMAT_VERSION = 1
#: Environment variable listing extra metadata tables (``os.pathsep``-separated paths).
METADATA_ENV = "UQVISION_MODEL_METADATA"
UNKNOWN = "unknown"
_HEADER_RE = re.compile(r"^#\s*uqvision model metadata, format_version (\d+)\b")
_KEY_RE = re.compile(r"^([a-z]+/)?[A-Za-z0-9_\-]+(\.[A-Za-z0-9_\-+]+)?\Z")
_TOKEN_RE = re.compile(r"^[a-z0-9_]+\Z")


class MetadataError(ValueError):
    """A metadata table is malformed (the message names the file, line, column and value)."""


@dataclass(frozen=True)
class MetadataField:
    """One column of the table: what it means and which values it takes.

    ``kind``: ``"key"``, ``"text"`` (free text), ``"token"`` (lower-case ``[a-z0-9_]+``),
    ``"count"`` (a positive integer, empty when unknown) or ``"choice"`` (one of ``choices``).
    ``regime``: the column describes how the model was trained (compared by
    :func:`uqvision.protocols.selective.analysis.paired_comparisons`).
    """

    name: str
    description: str
    kind: str = "text"
    choices: tuple[str, ...] = ()
    regime: bool = False


_YES_NO = ("yes", "no", UNKNOWN)

#: The table's columns in file order (a :class:`~uqmetrics.metrics.registry.Registry` of
#: :class:`MetadataField`).
METADATA_FIELDS: Registry[MetadataField] = Registry("metadata field")
for _f in (
    MetadataField("key", "arch.tag as timm names it; <source>/arch.tag for another model "
                  "source (tv/<name>.<WEIGHTS> for torchvision, proto/ for prototype classifiers)",
                  "key"),
    MetadataField("family", "architecture family (ViT, ResNet, EfficientNet, ...)"),
    MetadataField("base_architecture", "the architecture without the regime's changes (the "
                  "same for a distilled DeiT and its plain twin); pairs are formed within it"),
    MetadataField("params", "number of parameters (empty: unknown)", "count"),
    MetadataField("input_size", "side of the square input in pixels (empty: unknown)", "count"),
    MetadataField("distillation", "trained with knowledge distillation in any form", "choice",
                  _YES_NO, True),
    MetadataField("teacher", "the distillation teacher (a key, a description, or unknown; "
                  "empty without distillation)"),
    MetadataField("pretraining_data", "extra data before ImageNet-1k training: none, in21k, "
                  "jft300m, yfcc100m, ig1b, ... or unknown", "token", (), True),
    MetadataField("adversarial_training", "adversarial examples in training", "choice", _YES_NO,
                  True),
    MetadataField("supervision", "kind of supervision", "choice",
                  ("supervised", "semi_supervised", "semi_weakly_supervised",
                   "weakly_supervised", "self_supervised", "zero_shot", UNKNOWN), True),
    MetadataField("label_smoothing", "label smoothing in training", "choice", _YES_NO, True),
    MetadataField("notes", "source of the row (paper, model card)"),
):
    METADATA_FIELDS.register(_f)
del _f

#: Names of the regime columns (what :func:`uqvision.protocols.selective.analysis.paired_comparisons` compares).
REGIME_FIELDS: tuple[str, ...] = tuple(n for n, f in METADATA_FIELDS.items() if f.regime)
COLUMNS: tuple[str, ...] = tuple(METADATA_FIELDS.names())


@dataclass(frozen=True)
class ModelMetadata:
    """One row of the table (``params``/``input_size`` ``None`` when unknown; an empty
    ``teacher`` reads back as ``unknown`` unless ``distillation`` is ``no``)."""

    key: str
    family: str = UNKNOWN
    base_architecture: str = UNKNOWN
    params: int | None = None
    input_size: int | None = None
    distillation: str = UNKNOWN
    teacher: str = ""
    pretraining_data: str = UNKNOWN
    adversarial_training: str = UNKNOWN
    supervision: str = UNKNOWN
    label_smoothing: str = UNKNOWN
    notes: str = ""

    def row(self) -> dict[str, str]:
        """The CSV row (counts as strings, ``None`` as empty)."""
        return {k: "" if v is None else str(v) for k, v in asdict(self).items()}


def metadata_key(source: str, architecture: str, tag: str) -> str:
    """The table key of a model: ``arch.tag`` (timm) or ``<source>/arch.tag`` (other sources).

    Examples
    --------
    >>> metadata_key("timm", "resnet50", "a1_in1k"), metadata_key("tv", "resnet50", "IMAGENET1K_V1")
    ('resnet50.a1_in1k', 'tv/resnet50.IMAGENET1K_V1')
    >>> metadata_key("timm", "resnet10t", "")
    'resnet10t'
    """
    base = architecture + (f".{tag}" if tag else "")
    return base if source in ("", "timm") else f"{source}/{base}"


def _check_value(field: MetadataField, value: str, where: str) -> str | int | None:
    value = value.strip()
    if field.kind == "key":
        if not _KEY_RE.match(value):
            raise MetadataError(f"{where}: key must be arch.tag or <source>/arch.tag (letters, "
                                f"digits, _ - + only), got {value!r}")
        return value
    if field.kind == "count":
        if value == "":
            return None
        if not value.isdigit() or int(value) < 1:
            raise MetadataError(f"{where}: {field.name} must be a positive integer or empty "
                                f"(unknown), got {value!r}")
        return int(value)
    if field.kind == "choice":
        if value not in field.choices:
            raise MetadataError(f"{where}: {field.name} must be one of "
                                f"{', '.join(field.choices)}; got {value!r}")
        return value
    if field.kind == "token":
        if not _TOKEN_RE.match(value):
            raise MetadataError(f"{where}: {field.name} must be a lower-case token "
                                f"([a-z0-9_]+, e.g. none, in21k, unknown), got {value!r}")
        return value
    return value


def _parse(text: str, name: str) -> dict[str, ModelMetadata]:
    lines = text.splitlines()
    first = next((i for i, line in enumerate(lines) if line.strip()), None)
    m = _HEADER_RE.match(lines[first]) if first is not None else None
    if m is None:
        raise MetadataError(f"{name}: the first line must be '# uqvision model metadata, "
                            f"format_version {FORMAT_VERSION}'")
    if int(m.group(1)) != FORMAT_VERSION:
        raise MetadataError(f"{name}: format_version {m.group(1)}; this uqvision reads "
                            f"format_version {FORMAT_VERSION}")
    numbered = [(i + 1, line) for i, line in enumerate(lines)
                if line.strip() and not line.lstrip().startswith("#")]
    if not numbered:
        raise MetadataError(f"{name}: no header row")
    reader = csv.reader(io.StringIO("\n".join(line for _, line in numbered)))
    header = [h.strip() for h in next(reader)]
    if header != list(COLUMNS):
        missing = [c for c in COLUMNS if c not in header]
        extra = [c for c in header if c not in COLUMNS]
        raise MetadataError(f"{name}:{numbered[0][0]}: header must be {','.join(COLUMNS)}"
                            + (f"; missing {missing}" if missing else "")
                            + (f"; unknown columns {extra}" if extra else "")
                            + ("" if missing or extra else "; columns out of order"))
    table: dict[str, ModelMetadata] = {}
    for (lineno, _), values in zip(numbered[1:], reader, strict=True):
        where = f"{name}:{lineno}"
        if len(values) != len(COLUMNS):
            raise MetadataError(f"{where}: expected {len(COLUMNS)} comma-separated fields, got "
                                f"{len(values)}")
        row = {f.name: _check_value(f, v, where)
               for f, v in zip(METADATA_FIELDS.values(), values, strict=True)}
        if row["key"] in table:
            raise MetadataError(f"{where}: key {row['key']!r} appears twice")
        if row["distillation"] == "no" and row["teacher"]:
            raise MetadataError(f"{where}: teacher {row['teacher']!r} given but distillation is "
                                "'no'")
        if row["distillation"] != "no" and not row["teacher"]:
            row["teacher"] = UNKNOWN
        table[row["key"]] = ModelMetadata(**row)
    return table


def read_metadata(path: str | os.PathLike) -> dict[str, ModelMetadata]:
    """Parse one metadata table: key -> :class:`ModelMetadata`.

    Raises
    ------
    FileNotFoundError
    MetadataError
        A missing or wrong version line, a header other than :data:`COLUMNS`, a row with the
        wrong number of fields, a bad key, value or count, a key twice, or a teacher without
        distillation. The message names the file, line, column and value.
    """
    path = Path(path)
    return _parse(path.read_text(encoding="utf-8"), str(path))


def shipped_metadata_path() -> Path:
    """The table shipped with the package."""
    return Path(str(resources.files("uqvision") / "resources" / "model_metadata.csv"))


def _env_tables() -> list[Path]:
    return [Path(p) for p in os.environ.get(METADATA_ENV, "").split(os.pathsep) if p.strip()]


def _read_env_table(path: Path) -> dict[str, ModelMetadata]:
    """:func:`read_metadata` of a table ``$UQVISION_MODEL_METADATA`` names; an error names the
    variable (a user may not know it is set)."""
    where = f"environment variable {METADATA_ENV}={os.environ.get(METADATA_ENV, '')!r}"
    if not path.is_file():
        what = "is a folder" if path.is_dir() else "does not exist"
        raise MetadataError(f"{where}: {str(path)!r} {what}; the variable lists metadata tables "
                            f"(CSV files) separated by {os.pathsep!r}")
    try:
        return read_metadata(path)
    except MetadataError as err:
        raise MetadataError(f"{where}: {err}") from None
    except (OSError, UnicodeDecodeError) as err:
        raise MetadataError(f"{where}: {str(path)!r} cannot be read ({err})") from None


@dataclass(frozen=True)
class MetadataTables:
    """The merged table and the files it came from (with their SHA-256), for result attrs."""

    rows: Mapping[str, ModelMetadata]
    sources: tuple[tuple[str, str], ...]

    def get(self, key: str) -> ModelMetadata | None:
        return self.rows.get(key)

    def __contains__(self, key: object) -> bool:
        return key in self.rows

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def attrs(self) -> dict[str, str]:
        return {"metadata_format_version": FORMAT_VERSION,
                "metadata_tables": json.dumps(dict(self.sources))}


def load_metadata(extra: Iterable[str | os.PathLike] = (), *, shipped: bool = True,
                  environment: bool = True) -> MetadataTables:
    """The shipped table, then the tables of ``$UQVISION_MODEL_METADATA``, then ``extra``.

    Later tables override rows of earlier ones with the same key.
    """
    tagged = ([(shipped_metadata_path(), "shipped")] if shipped else []) + (
        [(p, "env") for p in _env_tables()] if environment else []) + [
        (Path(p), "extra") for p in extra]
    rows: dict[str, ModelMetadata] = {}
    sources = []
    for p, origin in tagged:
        rows.update(_read_env_table(p) if origin == "env" else read_metadata(p))
        name = "uqvision:resources/model_metadata.csv" if origin == "shipped" else str(p)
        sources.append((name, hashlib.sha256(p.read_bytes()).hexdigest()))
    return MetadataTables(rows, tuple(sources))


def write_metadata(rows: Iterable[ModelMetadata], path: str | os.PathLike) -> Path:
    """Write ``rows`` as a table :func:`read_metadata` reads (checked by reading it back)."""
    buf = io.StringIO()
    buf.write(f"# uqvision model metadata, format_version {FORMAT_VERSION}\n")
    w = csv.DictWriter(buf, COLUMNS, lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow(r.row())
    _parse(buf.getvalue(), str(path))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(buf.getvalue(), encoding="utf-8")
    return path


def unknown_models(keys: Iterable[str], tables: MetadataTables) -> list[str]:
    """The distinct ``keys`` (in first-seen order) that no table has a row for."""
    return [k for k in dict.fromkeys(keys) if k not in tables]


#: Per-model coords :func:`attach_metadata` adds (``params``/``input_size`` are float, NaN when
#: unknown; the others strings).
METADATA_COORDS: tuple[str, ...] = tuple(c for c in COLUMNS if c not in ("key", "notes"))


def attach_metadata(ds: xr.Dataset, tables: MetadataTables, *,
                    measured: Mapping[str, Sequence[float]] | None = None) -> xr.Dataset:
    """Add the metadata of every model of a selective result as per-model coords.

    Parameters
    ----------
    ds : xarray.Dataset
        A result with dim ``model`` and a per-model coord ``metadata_key``.
    tables : MetadataTables
    measured : mapping, optional
        ``params`` and/or ``input_size`` measured from the models themselves, shape (model,)
        (NaN where not measured); they take precedence over the table's values.

    Returns
    -------
    xarray.Dataset
        ``ds`` with coords :data:`METADATA_COORDS` over ``model`` and ``metadata_known``
        (bool: the key has a row), attrs :attr:`MetadataTables.attrs`.
    """
    if "metadata_key" not in ds.coords:
        raise ValueError("the result has no 'metadata_key' coord (not a selective result?)")
    keys = [str(k) for k in ds["metadata_key"].values]
    rows = [tables.get(k) or ModelMetadata(k, teacher=UNKNOWN) for k in keys]
    coords: dict[str, tuple[str, np.ndarray]] = {}
    for name in METADATA_COORDS:
        if METADATA_FIELDS[name].kind == "count":
            table = np.array([np.nan if getattr(r, name) is None else getattr(r, name)
                              for r in rows], dtype=np.float64)
            got = np.asarray((measured or {}).get(name, np.full(len(rows), np.nan)), np.float64)
            coords[name] = ("model", np.where(np.isnan(got), table, got))
        else:
            coords[name] = ("model", np.array([getattr(r, name) for r in rows], dtype=object))
    coords["metadata_known"] = ("model", np.array([k in tables for k in keys]))
    out = ds.assign_coords(coords)
    out.attrs = {**ds.attrs, **tables.attrs}
    return out


# --------------------------------------------------------------------------------------------
# templates from what timm (or torchvision) already knows

#: Tag tokens that name pre-training data -> the ``pretraining_data`` value (the table's
#: spelling: ImageNet-22k is ImageNet-21k's full release, ``in21k``; Noisy Student's ``jft`` is
#: JFT-300M). Several in one tag are joined in tag order (``laion2b_in12k``).
PRETRAINING_TOKENS: dict[str, str] = {
    "in21k": "in21k", "in22k": "in21k", "in12k": "in12k", "jft": "jft300m",
    "yfcc100m": "yfcc100m", "ig1b": "ig1b", "laion2b": "laion2b", "laiona": "laiona",
    "m30m": "m30m", "m38m": "m38m", "webli": "webli",
}
#: Tag tokens that mean a pre-training stage whose data the tag does not name (OpenAI's CLIP,
#: SWAG, SEER, PaddleClas SSLD, BEiT-3's in-domain data): ``pretraining_data`` stays unknown.
UNNAMED_PRETRAINING_TOKENS: frozenset[str] = frozenset(
    {"openai", "swag", "seer", "ssld", "indomain", "stage1", "stage2"})


def pretraining_from_tag(tag: str) -> str:
    """The ``pretraining_data`` a pretrained tag says (docs/conventions.md#v-1-template).

    Tokens are the tag's ``_``-separated parts, lower-cased (torchvision's ``IMAGENET1K`` reads
    as ``in1k``). In order: a token of :data:`UNNAMED_PRETRAINING_TOKENS` -> ``unknown``;
    tokens of :data:`PRETRAINING_TOKENS` -> their values joined; a fine-tuning (``ft``) with no
    dataset token before it (``fcmae_ft_in1k``, ``openai_ft_in1k``) -> ``unknown``; ``in1k``
    alone -> ``none`` (trained on ImageNet-1k only); anything else -> ``unknown``.

    Examples
    --------
    >>> [pretraining_from_tag(t) for t in ("a1_in1k", "fb_in22k_ft_in1k", "fb_ssl_yfcc100m_ft_in1k",
    ...                                    "sw_in12k_ft_in1k_288", "ns_jft_in1k",
    ...                                    "clip_laion2b_augreg_ft_in12k_in1k_384")]
    ['none', 'in21k', 'yfcc100m', 'in12k', 'jft300m', 'laion2b_in12k']
    >>> [pretraining_from_tag(t) for t in ("openai_ft_in1k", "swag_lc_in1k", "fcmae_ft_in1k",
    ...                                    "mae_in1k_ft_in1k", "IMAGENET1K_V2", "")]
    ['unknown', 'unknown', 'unknown', 'none', 'none', 'unknown']
    """
    tokens = ["in1k" if t == "imagenet1k" else t for t in tag.lower().split("_") if t]
    if any(t in UNNAMED_PRETRAINING_TOKENS for t in tokens):
        return UNKNOWN
    data = list(dict.fromkeys(PRETRAINING_TOKENS[t] for t in tokens if t in PRETRAINING_TOKENS))
    if data:
        return "_".join(data)
    if "ft" in tokens and "in1k" not in tokens[:tokens.index("ft")]:
        return UNKNOWN
    return "none" if "in1k" in tokens else UNKNOWN


def model_metadata_key(name: str) -> str:
    """The table key a cache of model ``name`` will carry (``arch.tag``; ``tv/<name>.<WEIGHTS>``,
    a bare torchvision name with its ``DEFAULT`` weights' name). ``NAME=CHECKPOINT``: NAME's."""
    name = name.partition("=")[0].strip()
    if name.startswith("tv/") and "." not in name:
        import torchvision

        try:
            return f"{name}.{torchvision.models.get_model_weights(name[3:]).DEFAULT.name}"
        except (ValueError, KeyError, AttributeError):
            return name
    return name


def _timm_row(key: str) -> ModelMetadata:
    import timm
    import torch
    from timm.models import get_pretrained_cfg

    arch, _, tag = key.partition(".")
    if not timm.is_model(arch) or (tag and key not in timm.list_pretrained(key)):
        return ModelMetadata(key, notes=f"not a model of the installed timm {timm.__version__}")
    cfg = get_pretrained_cfg(key)
    params, how = None, ""
    # parameters without memory or initialisation: the architecture on the meta device (every
    # in1k tag of timm 1.0.31 builds there, ~0.1 s each); else on the CPU, else left empty
    for device, how in (("meta", "meta device"), ("cpu", "cpu")):
        try:
            with torch.device(device):
                model = timm.create_model(key, pretrained=False)
        except Exception as exc:  # noqa: BLE001  (one model's build never stops the template)
            how = f"not counted ({type(exc).__name__} building it)"
            continue
        params = int(sum(p.numel() for p in model.parameters()))
        break
    side, notes = None, [f"template from timm {timm.__version__}"]
    if cfg is not None:
        size = tuple(cfg.input_size or ())
        if len(size) == 3 and size[1] == size[2]:
            side = int(size[1])
        notes.append("input_size " + "x".join(map(str, size)) + f", crop_pct {cfg.crop_pct}"
                     + (f" ({cfg.crop_mode})" if cfg.crop_mode else "")
                     + f", interpolation {cfg.interpolation}")
    notes.append((f"params counted on the {how}" if params else f"params {how}")
                 + "; pretraining_data from the tag")
    return ModelMetadata(key, params=params, input_size=side,
                         pretraining_data=pretraining_from_tag(tag), notes="; ".join(notes))


def _tv_row(key: str) -> ModelMetadata:
    import torchvision

    arch, _, weights = key[3:].partition(".")
    try:
        member = torchvision.models.get_model_weights(arch)[weights]
    except (ValueError, KeyError, AttributeError):
        return ModelMetadata(key, notes=f"not weights of the installed torchvision "
                                        f"{torchvision.__version__}")
    t = member.transforms()
    crop, resize = int(t.crop_size[0]), int(t.resize_size[0])
    params = member.meta.get("num_params")
    return ModelMetadata(key, params=int(params) if params else None, input_size=crop,
                         pretraining_data=pretraining_from_tag(weights),
                         notes=f"template from torchvision {torchvision.__version__} weights "
                               f"{weights}: resize {resize}, crop {crop}, interpolation "
                               f"{t.interpolation.value}; params from the weights' meta; "
                               "pretraining_data from the weights' name")


def template_metadata(names: Iterable[str], *, progress: bool = False) -> list[ModelMetadata]:
    """Rows for ``names`` filled with what the model's pretrained config and tag say.

    Parameters
    ----------
    names : iterable of str
        Model names (``arch.tag``, ``tv/<name>.<WEIGHTS>``, ``NAME=CHECKPOINT``), each once.
    progress : bool, default False
        Report progress on stderr (:func:`uqmetrics.runs.sweep.progress_bar`; ~0.1 s a model).

    Returns
    -------
    list of ModelMetadata
        One per name, keyed by :func:`model_metadata_key`: ``params`` (the architecture's
        parameters, counted on the meta device, or from the torchvision weights' meta),
        ``input_size`` (the pretrained config's, when square), ``pretraining_data``
        (:func:`pretraining_from_tag`) and ``notes`` (the config's input size, crop and
        interpolation, and where each value came from). Every other column is ``unknown``: a
        regime is never guessed. A name the installed timm/torchvision does not know gets an
        ``unknown`` row saying so; ``proto/`` models an ``unknown`` row.
    """
    from uqmetrics.runs.sweep import progress_bar

    keys = list(dict.fromkeys(model_metadata_key(n) for n in names))
    bar = progress_bar(len(keys), "metadata template", unit="model", enabled=progress)
    rows = []
    for key in keys:
        if key.startswith("tv/"):
            rows.append(_tv_row(key))
        elif "/" in key:
            rows.append(ModelMetadata(key))
        else:
            rows.append(_timm_row(key))
        bar.update(1)
    bar.close()
    return rows
