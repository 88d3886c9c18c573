"""qhead.hf: a quantized token table (embedding / lm_head) for transformers causal LMs.

Three ways in:

``quantize_model(model, head="w4g64", embedding=None, rescore=0, dense_rows="cpu")``
    swaps ``model.get_input_embeddings()`` / ``get_output_embeddings()`` of a loaded
    ``PreTrainedModel`` for ``qhead.torch.QuantEmbedding`` / ``QuantLMHead``. A tied model (the
    two roles are one Parameter) gets ONE packed table serving both roles, and its dense
    Parameter is released (kept only as the rescoring rows when ``rescore > 0``).

``from_pretrained(dir, quantization_config=QHeadConfig(head="w4g64", ...))``
    the registered transformers quantizer (``quant_method "qhead"``): a dense checkpoint is
    loaded and its roles quantized after loading (RTN, or the config's ``quantizer`` with its
    ``calibration``; ``untie=True`` gives a tied model two tables); a checkpoint whose roles are already
    packed in the compressed-tensors layout (what ``save_pretrained`` of a qhead model writes,
    and ``qhead quantize MODEL_DIR``) gets them mapped from the file, never dequantized.
    ``from_pretrained(saved_dir)`` of a model saved by ``save_pretrained`` needs no config:
    its ``config.json`` carries ``quantization_config = {"quant_method": "qhead", ...}``.

``load_quantized(dir)``
    a ``qhead quantize`` (compressed-tensors) model directory whose quantized roles are the
    token tables: the packed tensors are mapped into qhead modules (no dense copy), every
    other weight is loaded by transformers.

On disk a role is stored as compressed-tensors stores it: ``<module>.weight_packed``,
``.weight_scale``, [``.weight_zero_point``] and ``.weight_shape``, under the module's name
(``model.embed_tokens``, ``lm_head``; a tied table once, under the embedding's name). With
``rescore > 0`` the full-precision head rows are saved too (``<head module>.dense_weight``),
so that a reloaded model rescores as the saved one did; on reload they stay mapped from the
file.

Importing this module registers the quantizer with transformers.
"""
from __future__ import annotations

import copy
import math
import os
from typing import Any, Dict, List, Optional, Tuple, Union

import torch
from torch import nn

import qhead
from qhead.torch import QuantEmbedding, QuantLMHead, QuantTable, unique_storage_bytes

from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedModel
from transformers.quantizers.auto import (
    AUTO_QUANTIZATION_CONFIG_MAPPING,
    AUTO_QUANTIZER_MAPPING,
    register_quantization_config,
    register_quantizer,
)
from transformers.quantizers.base import HfQuantizer
from transformers.utils.quantization_config import QuantizationConfigMixin

__all__ = ["QHeadConfig", "QHeadHfQuantizer", "quantize_model", "load_quantized", "token_table_bytes"]

QUANT_METHOD = "qhead"
# The suffixes of a packed role's tensors in the compressed-tensors layout.
_PACKED_PARTS = (".weight_packed", ".weight_scale", ".weight_zero_point", ".weight_shape")
# The suffix of the full-precision head rows saved beside a rescoring head.
_DENSE_SUFFIX = ".dense_weight"

_SCALE_DTYPES = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}
_QUANTIZERS = ("rtn", "mse", "gptq", "gptq-mse")
_CALIBRATED = ("gptq", "gptq-mse")
# An untied embedding's quantizer: the head's without calibration (its inputs are token ids).
_EMBEDDING_QUANTIZER = {"rtn": "rtn", "mse": "mse", "gptq": "rtn", "gptq-mse": "mse"}


# ---- the config -----------------------------------------------------------------------------


class QHeadConfig(QuantizationConfigMixin):
    """The qhead quantization config (``quant_method "qhead"``).

    head, embedding: scheme names (``"w4g64"``, ``"w8"``, ``"w4g128a"``, ...) or None to keep that
        role dense. A tied model has one table and one scheme: ``head`` (or ``embedding`` when
        ``head`` is None) quantizes both roles; giving both with different schemes is an error.
    rescore: K > 0 makes the head's top-K logits of every row exact from the full-precision rows.
    dense_rows: where those rows live: ``"cpu"`` (default), ``"device"`` (the head's device) or a
        safetensors path (mapped).
    scale_dtype: ``"f16"`` / ``"bf16"`` / ``"f32"``; None follows the weight's dtype.
    quantizer: how the head (or a tied table) is quantized: ``"rtn"`` (default), ``"mse"``
        (per-group scale/clip search; weighted by the calibration when given), ``"gptq"`` or
        ``"gptq-mse"`` (GPTQ against the calibration's XᵀX; they need ``calibration``). An untied
        embedding gets the quantizer's form without calibration (gptq: rtn, gptq-mse and mse: mse).
    calibration: the head's inputs, [N, H]: a safetensors path (its tensor ``hidden``, as
        ``qhead agree --states`` files hold them, else its only 2-D tensor; ``PATH:TENSOR`` names
        one) or, to ``quantize_model``, a tensor (then not kept in the config).
    damp: GPTQ's damping, a fraction of mean(diag XᵀX/N) (also the weighted MSE search's floor);
        None: qhead.quantize's default (0.1). Only with a quantizer that reads ``calibration``.
    untie: for a tied model, two tables instead of one: the head with ``head``'s scheme and
        quantizer, the embedding with ``embedding``'s scheme (None: the dense Parameter stays,
        as a plain nn.Embedding that the rescoring head reads its rows from). The model's
        ``tie_word_embeddings`` becomes False, so a saved model loads as two roles. It costs the
        second table's bytes; it buys an embedding that the head's quantizer does not choose
        (docs/accuracy.md measures it). No effect on an untied model.
    tied: filled in when the model is quantized: whether one table serves both roles.
    exact_embedding: filled in when the model is quantized: True for a tied model whose head
        rescores (rescore > 0) and whose embedding was not given a scheme: the embedding then
        reads the full-precision rows the head keeps for rescoring (exact, no extra memory) and
        the packed table serves the head.
    """

    def __init__(self, head: Optional[str] = "w4g64", embedding: Optional[str] = None, rescore: int = 0,
                 dense_rows: Optional[str] = "cpu", scale_dtype: Optional[str] = None,
                 tied: Optional[bool] = None, threads: int = 0, exact_embedding: Optional[bool] = None,
                 quantizer: str = "rtn", calibration: Optional[str] = None, untie: bool = False,
                 damp: Optional[float] = None, **kwargs: Any):
        self.quant_method = QUANT_METHOD
        self.head = head
        self.embedding = embedding
        self.rescore = int(rescore)
        self.dense_rows = None if dense_rows is None else os.fspath(dense_rows)
        self.scale_dtype = scale_dtype
        self.tied = tied
        self.threads = int(threads)
        self.exact_embedding = exact_embedding
        self.quantizer = quantizer
        self.calibration = None if calibration is None else os.fspath(calibration)
        self.untie = bool(untie)
        self.damp = damp
        # Keys a later version may add are kept (and saved back) rather than dropped.
        for k, v in kwargs.items():
            if k != "quant_method":
                setattr(self, k, v)
        self.post_init()

    def post_init(self) -> None:
        """Checks the values (scheme names through qhead.Scheme: qhead.InvalidArgumentError)."""
        for role in ("head", "embedding"):
            s = getattr(self, role)
            if s is None:
                continue
            if not isinstance(s, str):
                raise qhead.InvalidArgumentError(f"QHeadConfig: {role} must be a scheme name or None, got {s!r}")
            qhead.Scheme(s)  # raises InvalidArgumentError naming the bad scheme
        if self.head is None and self.embedding is None:
            raise qhead.InvalidArgumentError("QHeadConfig: head and embedding are both None: nothing to quantize")
        if self.rescore < 0:
            raise qhead.InvalidArgumentError(f"QHeadConfig: rescore = {self.rescore} must be >= 0")
        if self.scale_dtype not in (None, "f16", "bf16", "f32"):
            raise qhead.InvalidArgumentError(
                f"QHeadConfig: scale_dtype must be 'f16', 'bf16', 'f32' or None, got {self.scale_dtype!r}")
        if self.rescore and self.dense_rows is None:
            raise qhead.InvalidArgumentError(
                f"QHeadConfig: rescore = {self.rescore} needs dense_rows ('cpu', 'device' or a safetensors path)")
        if self.rescore and self.head is None and self.tied is False:
            raise qhead.InvalidArgumentError("QHeadConfig: rescore applies to a quantized head; head is None")
        if self.quantizer not in _QUANTIZERS:
            raise qhead.InvalidArgumentError(
                f"QHeadConfig: quantizer must be one of {', '.join(_QUANTIZERS)}, got {self.quantizer!r}")
        if self.untie and self.head is None:
            raise qhead.InvalidArgumentError("QHeadConfig: untie = True needs a head scheme (head is None)")
        if self.damp is not None:
            if isinstance(self.damp, bool) or not isinstance(self.damp, (int, float)) or not math.isfinite(self.damp) \
                    or self.damp < 0:
                raise qhead.InvalidArgumentError(f"QHeadConfig: damp must be a finite number >= 0, got {self.damp!r}")
            if self.quantizer == "rtn":
                raise qhead.InvalidArgumentError(
                    "QHeadConfig: damp applies to a quantizer that reads calibration (mse, gptq, gptq-mse); "
                    "quantizer is 'rtn'")

    def to_dict(self) -> Dict[str, Any]:
        d = dict(self.__dict__)
        d["quant_method"] = QUANT_METHOD
        return d

    def get_loading_attributes(self) -> Dict[str, Any]:
        return {}


# ---- helpers --------------------------------------------------------------------------------


def _module_name(model: nn.Module, module: nn.Module) -> str:
    for name, m in model.named_modules():
        if m is module:
            return name
    raise qhead.InternalError(f"qhead.hf: {type(module).__name__} is not a submodule of {type(model).__name__}")


def _check_model(model: Any, op: str) -> None:
    if not isinstance(model, PreTrainedModel):
        raise qhead.InvalidArgumentError(
            f"{op}: model must be a transformers PreTrainedModel, got {type(model).__name__}")


def _roles(model: PreTrainedModel, op: str) -> Tuple[nn.Module, nn.Module]:
    """(input embedding, output embedding) modules, checked to be an nn.Embedding (plain, or
    scaled as Gemma's) and a bias-free nn.Linear."""
    emb = model.get_input_embeddings()
    head = model.get_output_embeddings()
    cls = type(model).__name__
    if head is None:
        raise qhead.InvalidArgumentError(
            f"{op}: {cls} has no output embedding (get_output_embeddings() is None): qhead quantizes the "
            "token tables of a causal LM with an lm_head (load it with AutoModelForCausalLM)")
    if isinstance(emb, QuantEmbedding) or isinstance(head, QuantLMHead):
        raise qhead.InvalidArgumentError(f"{op}: {cls} is already quantized by qhead")
    if not isinstance(emb, nn.Embedding):
        raise qhead.UnsupportedError(
            f"{op}: {cls}'s input embedding is a {type(emb).__name__}, not an nn.Embedding")
    if emb.max_norm is not None:
        raise qhead.UnsupportedError(f"{op}: {cls}'s input embedding renormalizes rows (max_norm); qhead's does not")
    if type(emb).forward is not nn.Embedding.forward and not hasattr(emb, "embed_scale") and \
            not hasattr(emb, "scalar_embed_scale"):
        raise qhead.UnsupportedError(
            f"{op}: {cls}'s input embedding {type(emb).__name__} has its own forward; qhead reproduces "
            "nn.Embedding and the scaled embedding (embed_scale) only")
    if not isinstance(head, nn.Linear):
        raise qhead.UnsupportedError(f"{op}: {cls}'s output embedding is a {type(head).__name__}, not an nn.Linear")
    if head.bias is not None:
        raise qhead.UnsupportedError(f"{op}: {cls}'s lm_head has a bias; qhead's head has none")
    return emb, head


def _embed_scale(emb: nn.Module) -> Optional[float]:
    """The multiplier a scaled embedding (Gemma's sqrt(H)) applies to its rows, or None."""
    s = getattr(emb, "scalar_embed_scale", None)
    if s is None:
        s = getattr(emb, "embed_scale", None)
    if s is None:
        return None
    if isinstance(s, torch.Tensor):
        if s.device.type == "meta":
            raise qhead.UnsupportedError(
                f"qhead.hf: {type(emb).__name__}.embed_scale is not materialised (a meta tensor) and the module "
                "has no scalar_embed_scale: its scale is unknown before the weights load")
        s = float(s)
    return float(s)


def _scale_dtype(weight: torch.Tensor, requested: Optional[str]) -> str:
    if requested is not None:
        return requested
    return _SCALE_DTYPES.get(weight.dtype, "f32")


def _calibration(spec: Any, quantizer: str, hidden: int, op: str) -> Optional[torch.Tensor]:
    """The calibration rows [N, H] (CPU) from a tensor or a safetensors ``PATH[:TENSOR]``; None
    when the quantizer reads none. Errors name the op, the file and the shape."""
    if quantizer == "rtn":
        return None
    if spec is None:
        if quantizer in _CALIBRATED:
            raise qhead.InvalidArgumentError(
                f"{op}: quantizer {quantizer!r} needs calibration: the head's inputs [N, {hidden}] (a tensor, or a "
                "safetensors file such as qhead agree's states file)")
        return None
    if isinstance(spec, torch.Tensor):
        c, what = spec, "calibration"
    else:
        from safetensors import safe_open

        path, tensor = os.fspath(spec), None
        if not os.path.isfile(path) and ":" in path:
            path, tensor = path.rsplit(":", 1)
        if not os.path.isfile(path):
            raise qhead.IoError(f"{op}: calibration file {path} does not exist")
        try:
            with safe_open(path, framework="pt") as f:
                names = list(f.keys())
                if tensor is None:
                    two_d = [n for n in names if len(f.get_slice(n).get_shape()) == 2]
                    tensor = "hidden" if "hidden" in names else (two_d[0] if len(two_d) == 1 else None)
                    if tensor is None:
                        raise qhead.InvalidArgumentError(
                            f"{op}: calibration {path}: no tensor 'hidden' and {len(two_d)} 2-D tensors; name one "
                            "as PATH:TENSOR")
                if tensor not in names:
                    raise qhead.InvalidArgumentError(f"{op}: calibration {path}: no tensor named {tensor!r}")
                c = f.get_tensor(tensor)
        except (OSError, RuntimeError) as e:  # safetensors' own errors for a damaged file
            if isinstance(e, qhead.Error):
                raise
            raise qhead.InvalidFileError(f"{op}: calibration {path}: {e}") from e
        what = f"calibration {path}:{tensor}"
    if c.dim() != 2 or c.shape[1] != hidden or c.shape[0] < 1 or c.dtype not in _SCALE_DTYPES:
        raise qhead.InvalidArgumentError(
            f"{op}: {what} must be [N >= 1, {hidden}] f32/f16/bf16 (the head's inputs), got "
            f"{str(c.dtype).replace('torch.', '')} {list(c.shape)}")
    return c.detach().to("cpu").contiguous()


def _quantize_role(weight: torch.Tensor, scheme: str, config: "QHeadConfig", quantizer: str,
                   calibration: Optional[torch.Tensor]) -> QuantTable:
    return QuantTable.from_dense(weight.detach(), scheme, scale_dtype=_scale_dtype(weight, config.scale_dtype),
                                 threads=config.threads, quantizer=quantizer, calibration=calibration,
                                 damp=config.damp if calibration is not None else None)


def _set_untied(model: PreTrainedModel) -> None:
    """tie_word_embeddings = False on the model's config and its text config, so that a saved
    model (and any loader reading its config.json) sees two tables."""
    for c in {id(model.config): model.config, id(model.config.get_text_config()): model.config.get_text_config()}.values():
        if hasattr(c, "tie_word_embeddings"):
            c.tie_word_embeddings = False


def _untie(model: PreTrainedModel, names: List[str]) -> None:
    """Drops the tie entries that name a replaced role's weight, on the model and every
    PreTrainedModel inside it, so that transformers never re-ties (or re-materialises) a table
    that qhead now holds once."""
    keys = {f"{n}.weight" for n in names}
    for prefix, m in model.named_modules():
        if not isinstance(m, PreTrainedModel):
            continue
        local = {k[len(prefix) + 1:] if prefix and k.startswith(prefix + ".") else k for k in keys}
        for attr in ("all_tied_weights_keys", "_tied_weights_keys"):
            mapping = getattr(m, attr, None)
            if not mapping:
                continue
            kept = {t: s for t, s in mapping.items() if t not in local and s not in local
                    and t not in keys and s not in keys}
            setattr(m, attr, kept)  # an instance attribute: the class's mapping is left alone


def _attach(model: PreTrainedModel, config: QHeadConfig) -> None:
    """Marks the model quantized by qhead, so that save_pretrained writes the packed tables and
    the config (and from_pretrained of the saved directory finds this quantizer)."""
    model.config.quantization_config = config
    if not isinstance(getattr(model, "hf_quantizer", None), QHeadHfQuantizer):
        model.hf_quantizer = QHeadHfQuantizer(config, pre_quantized=False)
    model.hf_quantizer.quantization_config = config
    model.is_quantized = True
    model.quantization_method = QUANT_METHOD
    for m in model.modules():
        if isinstance(m, PreTrainedModel):
            m.config._is_quantized = True


def _install(model: PreTrainedModel, emb_name: str, head_name: str, emb_old: Optional[nn.Module],
             emb_table: Optional[QuantTable], head_table: Optional[QuantTable], config: QHeadConfig,
             dtype: torch.dtype, dense_weight: Optional[torch.Tensor] = None, dense_file: Optional[str] = None,
             embed_scale: Optional[float] = None, padding_idx: Optional[int] = None) -> None:
    """Puts QuantEmbedding / QuantLMHead over the given tables into the model."""
    if emb_table is not None:
        if emb_old is not None:
            embed_scale = _embed_scale(emb_old)
            padding_idx = getattr(emb_old, "padding_idx", None)
        model.set_input_embeddings(QuantEmbedding(emb_table, dtype=dtype, embed_scale=embed_scale,
                                                  padding_idx=padding_idx))
    if head_table is not None:
        rescore = config.rescore
        if rescore and dense_file is not None:
            if config.dense_rows == "device":
                from qhead.torch import mmap_safetensors_tensor

                w = mmap_safetensors_tensor(dense_file, head_name + _DENSE_SUFFIX, head_table.shape)
                lm = QuantLMHead(head_table, rescore, "device", dense_weight=w)
            else:
                lm = QuantLMHead(head_table, rescore, dense_file, dense_tensor=head_name + _DENSE_SUFFIX)
        elif rescore:
            dr = config.dense_rows
            if dr in ("cpu", "device"):
                lm = QuantLMHead(head_table, rescore, dr, dense_weight=dense_weight)
            else:
                lm = QuantLMHead(head_table, rescore, dr)
        else:
            lm = QuantLMHead(head_table)
        model.set_output_embeddings(lm)
        if rescore and config.exact_embedding and emb_table is head_table:
            model.get_input_embeddings().use_dense_rows(lm._dense)
    _untie(model, [n for n, t in ((emb_name, emb_table), (head_name, head_table)) if t is not None])


def _quantize_loaded(model: PreTrainedModel, config: QHeadConfig, op: str,
                     calibration: Optional[torch.Tensor] = None) -> PreTrainedModel:
    emb, head = _roles(model, op)
    emb_name, head_name = _module_name(model, emb), _module_name(model, head)
    tied = head.weight is emb.weight or (
        head.weight.device == emb.weight.device and head.weight.shape == emb.weight.shape
        and head.weight.data_ptr() == emb.weight.data_ptr())
    if tuple(emb.weight.shape) != tuple(head.weight.shape) and tied:
        tied = False
    dtype = emb.weight.dtype
    hq = config.quantizer
    eq = _EMBEDDING_QUANTIZER[hq]
    hidden = int(head.weight.shape[1])
    calib = None
    if config.head is not None or (tied and not config.untie):
        calib = _calibration(calibration if calibration is not None else config.calibration, hq, hidden, op)
    config.calibration_rows = None if calib is None else int(calib.shape[0])
    if tied and not config.untie:
        if config.head is not None and config.embedding is not None and config.head != config.embedding:
            raise qhead.InvalidArgumentError(
                f"{op}: {type(model).__name__} has a tied table (one Parameter for both roles) and a tied table "
                f"has one scheme: got head={config.head!r}, embedding={config.embedding!r} (untie=True gives "
                "each role its own table)")
        scheme = config.head if config.head is not None else config.embedding
        w = emb.weight
        table = _quantize_role(w, scheme, config, hq, calib)
        # The rows kept for rescoring serve the embedding too, unless it was given a scheme.
        config.exact_embedding = bool(config.rescore) and config.embedding is None
        config.head = config.embedding = table.scheme
        config.tied = True
        dense = w.detach() if config.rescore else None
        _install(model, emb_name, head_name, emb, table, table, config, dtype, dense_weight=dense)
        del w, dense
    elif tied:
        # untie: the head gets its own table; the embedding its own (or keeps the dense Parameter).
        w = emb.weight
        ht = _quantize_role(w, config.head, config, hq, calib)
        et = _quantize_role(w, config.embedding, config, eq, None) if config.embedding is not None else None
        config.head = ht.scheme
        if et is not None:
            config.embedding = et.scheme
        config.tied = False
        config.exact_embedding = False
        # A dense embedding's Parameter is the rescoring rows too: no second dense copy.
        dense = w.detach() if config.rescore else None
        _install(model, emb_name, head_name, emb if et is not None else None, et, ht, config, dtype,
                 dense_weight=dense)
        _set_untied(model)
        del w, dense
    else:
        if config.rescore and config.head is None:
            raise qhead.InvalidArgumentError(f"{op}: rescore = {config.rescore} needs a quantized head (head is None)")
        et = ht = None
        if config.embedding is not None:
            et = _quantize_role(emb.weight, config.embedding, config, eq, None)
        if config.head is not None:
            ht = _quantize_role(head.weight, config.head, config, hq, calib)
        config.tied = False
        dense = head.weight.detach() if config.rescore else None
        _install(model, emb_name, head_name, emb if et is not None else None, et, ht, config,
                 dtype, dense_weight=dense)
        del dense
    del emb, head, calib
    _attach(model, config)
    return model


def quantize_model(model: PreTrainedModel, head: Optional[str] = "w4g64", embedding: Optional[str] = None,
                   rescore: int = 0, dense_rows: Optional[str] = "cpu", *, scale_dtype: Optional[str] = None,
                   threads: int = 0, quantizer: str = "rtn", calibration: Any = None,
                   untie: bool = False, damp: Optional[float] = None) -> PreTrainedModel:
    """Replaces the model's token tables by qhead modules, in place; returns the model.

    head / embedding: scheme names or None (keep dense). A tied model (one Parameter for both
    roles) gets one packed table for both roles, with ``head``'s scheme (``embedding``'s when
    ``head`` is None); its dense Parameter is released unless ``rescore > 0`` keeps it as the
    rescoring rows (``dense_rows="cpu"``: in CPU memory, ``"device"``: on the model's device, a
    path: a safetensors file mapped instead). Those kept rows then also serve the embedding when
    ``embedding`` is None (exact embeddings at no extra memory; the packed table serves the head),
    so that rescoring gives the dense model's greedy tokens. The embedding keeps the model's scale (Gemma's
    sqrt(H)) and the model's dtype.

    quantizer: ``"rtn"`` (default), ``"mse"``, ``"gptq"`` or ``"gptq-mse"``, for the head (or the
    tied table); ``calibration`` the head's inputs [N, H] (a tensor, or a safetensors path as
    QHeadConfig takes it), required by the GPTQ quantizers. ``untie=True`` gives a tied model two
    tables (QHeadConfig.untie): the head with ``head``'s scheme and quantizer, the embedding with
    ``embedding``'s (None: it keeps the dense Parameter). ``damp``: GPTQ's damping
    (QHeadConfig.damp).

    Raises qhead.InvalidArgumentError for a bad scheme or quantizer name, missing or misshapen
    calibration, a model without an output embedding or one already quantized;
    qhead.UnsupportedError for roles that are not an nn.Embedding / bias-free nn.Linear.
    """
    _check_model(model, "quantize_model")
    path = None if calibration is None or isinstance(calibration, torch.Tensor) else calibration
    config = QHeadConfig(head=head, embedding=embedding, rescore=rescore, dense_rows=dense_rows,
                         scale_dtype=scale_dtype, threads=threads, quantizer=quantizer, calibration=path,
                         untie=untie, damp=damp)
    return _quantize_loaded(model, config, "quantize_model",
                            calibration=calibration if isinstance(calibration, torch.Tensor) else None)


def token_table_bytes(model: nn.Module) -> int:
    """Bytes of the distinct storages behind the model's input and output embeddings (a tied
    table counted once; a QuantLMHead's rescoring rows included)."""
    tensors: List[torch.Tensor] = []
    for m in (model.get_input_embeddings(), model.get_output_embeddings()):
        if m is None:
            continue
        tensors.extend(m.parameters())
        tensors.extend(b for b in m.buffers() if b is not None)
        dense = getattr(m, "_dense_cpu", None)
        if isinstance(dense, torch.Tensor):
            tensors.append(dense)
    return unique_storage_bytes(tensors)


# ---- reading packed roles from checkpoint files ---------------------------------------------


def _file_keys(path: str) -> List[str]:
    from safetensors import safe_open

    with safe_open(path, framework="pt") as f:
        return list(f.keys())


def _index_checkpoint(files: List[str]) -> Dict[str, str]:
    """{tensor name: file} over safetensors checkpoint files."""
    index: Dict[str, str] = {}
    for f in files or []:
        if f.endswith(".safetensors"):
            for k in _file_keys(f):
                index[k] = f
    return index


def _load_packed_role(index: Dict[str, str], prefix: str, scheme: Optional[str], dtype: torch.dtype) -> QuantTable:
    """The packed table stored under prefix: mapped from its file (zero copy) when its tensors
    share one file, else read into memory."""
    files = {index[prefix + p] for p in _PACKED_PARTS if prefix + p in index}
    if len(files) == 1:
        return QuantTable.from_compressed_tensors(files.pop(), prefix, scheme=scheme, dtype=dtype)
    from safetensors import safe_open

    sd = {}
    for p in _PACKED_PARTS:
        if prefix + p in index:
            with safe_open(index[prefix + p], framework="pt") as f:
                sd[prefix + p] = f.get_tensor(prefix + p)
    return QuantTable.from_compressed_tensors(sd, prefix, scheme=scheme, dtype=dtype)


class _Pending(nn.Module):
    """Stands in for a role whose packed table is mapped after transformers has loaded the
    other weights (it has no parameters, so the loader allocates nothing for it)."""

    def __init__(self, role: str, name: str):
        super().__init__()
        self.role, self.name = role, name

    def forward(self, *args, **kwargs):
        raise qhead.InternalError(f"qhead.hf: the {self.role} {self.name} was not loaded")


# ---- the transformers quantizer -------------------------------------------------------------


class QHeadHfQuantizer(HfQuantizer):
    """transformers' side of QHeadConfig.

    Before weight loading, each role whose packed tensors the checkpoint holds (under the
    role module's name) is replaced by a placeholder, so transformers neither allocates nor
    loads a dense table for it; after loading, the packed tensors are mapped from the file into
    a QuantTable (zero copy on the CPU, one copy to a GPU) and the qhead modules installed. Roles
    the checkpoint holds dense are loaded by transformers and quantized (RTN) after loading.
    """

    requires_calibration = False

    def __init__(self, quantization_config: QHeadConfig, **kwargs: Any):
        super().__init__(quantization_config, **kwargs)
        self._index: Dict[str, str] = {}
        self._packed: Dict[str, str] = {}  # role -> module name, for roles loaded packed
        self._dtype: Optional[torch.dtype] = None
        self._emb_extra: Dict[str, Any] = {}
        self._tied = False

    def validate_environment(self, *args: Any, **kwargs: Any) -> None:
        return None

    def update_dtype(self, dtype: torch.dtype) -> torch.dtype:
        return dtype

    def param_needs_quantization(self, model, param_name: str, **kwargs: Any) -> bool:
        return False

    def preprocess_model(self, model: PreTrainedModel, dtype: Optional[torch.dtype] = None, **kwargs: Any):
        self._dtype = dtype  # the dtype from_pretrained loads in: the embedding's output dtype
        return super().preprocess_model(model, dtype=dtype, **kwargs)

    def _process_model_before_weight_loading(self, model: PreTrainedModel, **kwargs: Any) -> PreTrainedModel:
        self._index = _index_checkpoint(kwargs.get("checkpoint_files") or [])
        emb, head = _roles(model, "from_pretrained")
        names = {"embedding": _module_name(model, emb), "head": _module_name(model, head)}
        self._packed = {r: n for r, n in names.items() if n + ".weight_packed" in self._index}
        if not self._packed:
            return model
        tied = bool(getattr(model.config.get_text_config(), "tie_word_embeddings", False))
        self._tied = tied
        if "embedding" in self._packed and "head" not in self._packed and tied:
            self._packed["head"] = names["embedding"]  # one table, stored under the embedding's name
        elif "head" in self._packed and "embedding" not in self._packed and tied:
            self._packed["embedding"] = names["head"]
        self._emb_extra = {"embed_scale": _embed_scale(emb) if "embedding" in self._packed else None,
                           "padding_idx": getattr(emb, "padding_idx", None)}
        if "embedding" in self._packed:
            model.set_input_embeddings(_Pending("embedding", names["embedding"]))
        if "head" in self._packed:
            model.set_output_embeddings(_Pending("head", names["head"]))
        _untie(model, [names[r] for r in self._packed])
        # The packed tensors (and saved rescoring rows) are read here, not by transformers' loader.
        stored = {n for n in self._packed.values()}
        patterns = [rf"^{_re_escape(n)}\.(weight_packed|weight_scale|weight_zero_point|weight_shape|dense_weight)$"
                    for n in stored | {names["head"]}]
        ign = set(getattr(model, "_keys_to_ignore_on_load_unexpected", None) or [])
        model._keys_to_ignore_on_load_unexpected = ign | set(patterns)
        self._names = names
        return model

    def _process_model_after_weight_loading(self, model: PreTrainedModel, **kwargs: Any) -> PreTrainedModel:
        # The model's own copy: the caller's QHeadConfig is not filled in with this model's roles.
        cfg = self.quantization_config = copy.deepcopy(self.quantization_config)
        names = getattr(self, "_names", None)
        if not self._packed:
            # A dense checkpoint: quantize after loading.
            return _quantize_loaded(model, cfg, "from_pretrained")
        device = _model_device(model)
        dtype = self._dtype if isinstance(self._dtype, torch.dtype) else _model_dtype(model)
        tables: Dict[str, QuantTable] = {}
        for role in ("embedding", "head"):
            if role not in self._packed:
                continue
            stored = self._packed[role]
            if stored in tables:
                tables[role] = tables[stored]
                continue
            # The config's scheme name (a group as wide as the row reads back as that name,
            # not as the per-row one it equals); the tensors are validated against it.
            t = _load_packed_role(self._index, stored, getattr(cfg, role), dtype)
            if device.type != "cpu":
                t = t.to(device)
            tables[role] = tables[stored] = t
        et, ht = tables.get("embedding"), tables.get("head")
        if (et is not None and ht is not None and et is not ht and self._tied
                and _same_table(et, ht)):
            ht = et  # a tied table stored twice: one copy serves both roles
        tied = et is not None and et is ht
        # Roles the checkpoint holds dense but the config quantizes.
        emb_mod, head_mod = model.get_input_embeddings(), model.get_output_embeddings()
        if et is None and cfg.embedding is not None and isinstance(emb_mod, nn.Embedding):
            et = _quantize_role(emb_mod.weight, cfg.embedding, cfg, _EMBEDDING_QUANTIZER[cfg.quantizer], None)
        if ht is None and cfg.head is not None and isinstance(head_mod, nn.Linear):
            ht = _quantize_role(head_mod.weight, cfg.head, cfg, cfg.quantizer,
                                _calibration(cfg.calibration, cfg.quantizer, int(head_mod.weight.shape[1]),
                                             "from_pretrained"))
        dense_file = self._index.get(names["head"] + _DENSE_SUFFIX) if cfg.rescore else None
        dense_weight = None
        if cfg.rescore and dense_file is None:
            if isinstance(head_mod, nn.Linear):
                dense_weight = head_mod.weight.detach()
            elif (getattr(cfg, "untie", False) and et is None and isinstance(emb_mod, nn.Embedding)
                  and ht is not None and tuple(emb_mod.weight.shape) == tuple(ht.shape)):
                dense_weight = emb_mod.weight.detach()  # an untied pair's dense embedding holds the rows
            elif cfg.dense_rows in ("cpu", "device"):
                raise qhead.InvalidFileError(
                    f"from_pretrained: rescore = {cfg.rescore} needs the head's full-precision rows, and the "
                    f"checkpoint has no {names['head'] + _DENSE_SUFFIX} (pass dense_rows=a safetensors path, or "
                    "rescore=0)")
        cfg.tied = tied
        if et is not None:
            cfg.embedding = et.scheme
        if ht is not None:
            cfg.head = ht.scheme
        _install(model, names["embedding"], names["head"],
                 emb_mod if isinstance(emb_mod, nn.Embedding) and et is not None else None,
                 et, ht, cfg, dtype, dense_weight=dense_weight, dense_file=dense_file,
                 embed_scale=self._emb_extra.get("embed_scale"), padding_idx=self._emb_extra.get("padding_idx"))
        _attach(model, cfg)
        return model

    def get_state_dict_and_metadata(self, model: PreTrainedModel):
        """The model's state dict with each qhead role in the compressed-tensors layout, under the
        role module's name (a tied table once, under the embedding's)."""
        emb, head = model.get_input_embeddings(), model.get_output_embeddings()
        sd = model.state_dict()
        roles: List[Tuple[nn.Module, QuantTable]] = []
        for m in (emb, head):
            if isinstance(m, (QuantEmbedding, QuantLMHead)):
                name = _module_name(model, m)
                for k in [k for k in sd if k.startswith(name + ".")]:
                    del sd[k]
                roles.append((name, m))
        written: Dict[int, str] = {}
        for name, m in roles:
            if isinstance(m, QuantLMHead) and m.rescore:
                dense = m._dense()
                if (dense is not None and isinstance(emb, nn.Embedding) and not isinstance(emb, QuantEmbedding)
                        and dense.data_ptr() == emb.weight.data_ptr() and dense.shape == emb.weight.shape):
                    dense = None  # an untied pair's dense embedding: its weight is the rows, saved once
                if dense is not None:
                    sd[name + _DENSE_SUFFIX] = dense.clone() if m.dense_rows not in ("cpu", "device") else dense
            t = m.table
            if id(t) in written:
                continue  # a tied table: once, under the embedding's name
            written[id(t)] = name
            if t.col_perm is not None:
                raise qhead.UnsupportedError(
                    f"save_pretrained: {name} is a GPTQ act-order table (col_perm); the compressed-tensors layout "
                    "qhead saves has no column permutation")
            # A table mapped from a checkpoint file is copied: the save may overwrite that file.
            own = (lambda x: x.clone()) if getattr(t, "_mapped", False) else (lambda x: x)
            sd[name + ".weight_packed"] = own(t.weight_packed)
            sd[name + ".weight_scale"] = own(t.weight_scale)
            if t.weight_zero_point is not None:
                sd[name + ".weight_zero_point"] = own(t.weight_zero_point)
            sd[name + ".weight_shape"] = torch.tensor([t.vocab, t.hidden], dtype=torch.int64)
        for k, v in list(sd.items()):
            if isinstance(v, torch.Tensor) and v.device.type != "cpu":
                sd[k] = v.detach().to("cpu")
            elif isinstance(v, torch.Tensor) and not v.is_contiguous():
                sd[k] = v.contiguous()
        return sd, {}

    def is_serializable(self, safe_serialization: bool = True) -> bool:
        return True

    @property
    def is_trainable(self) -> bool:
        return False


def _same_table(a: QuantTable, b: QuantTable) -> bool:
    if a.shape != b.shape or a.scheme != b.scheme:
        return False
    for x, y in zip(a._table_buffers(), b._table_buffers()):
        if (x is None) != (y is None):
            return False
        if x is not None and (x.dtype != y.dtype or not torch.equal(x, y)):
            return False
    return True


def _re_escape(s: str) -> str:
    import re

    return re.escape(s)


def _model_device(model: nn.Module) -> torch.device:
    for p in model.parameters():
        if p.device.type != "meta":
            return p.device
    for b in model.buffers():
        if b is not None and b.device.type != "meta":
            return b.device
    return torch.device("cpu")


def _model_dtype(model: nn.Module) -> torch.dtype:
    for p in model.parameters():
        if p.is_floating_point():
            return p.dtype
    return torch.float32


# ---- compressed-tensors model directories ---------------------------------------------------


def _ct_scheme(weights: Dict[str, Any]) -> Optional[str]:
    """A qhead scheme name from a compressed-tensors group's weights args, or None."""
    if not isinstance(weights, dict):
        return None
    bits = weights.get("num_bits")
    strategy = weights.get("strategy")
    name = f"w{bits}"
    if strategy == "group":
        name += f"g{weights.get('group_size')}"
    elif strategy != "channel":
        return None
    if weights.get("symmetric") is False:
        name += "a"
    return name


def load_quantized(model_dir: Union[str, os.PathLike], *, rescore: int = 0, dense_rows: Optional[str] = None,
                   **from_pretrained_kwargs: Any) -> PreTrainedModel:
    """Loads a model directory whose token tables are packed in the compressed-tensors layout
    (``qhead quantize MODEL_DIR ...`` writes them) with the packed roles mapped into qhead modules
    (no dense copy) and every other weight loaded by transformers.

    The checkpoint's packed modules must be token tables only; any other packed module is
    refused (qhead.UnsupportedError): transformers would need compressed-tensors for those. A
    tied model stored with two identical packed copies gets one table. rescore > 0
    needs ``dense_rows``: a safetensors file holding the head's full-precision [V, H] rows.
    A directory saved by ``save_pretrained`` of a qhead model loads with plain
    ``from_pretrained(dir)``; this function takes those too.
    """
    d = os.fspath(model_dir)
    config = AutoConfig.from_pretrained(d, **{k: v for k, v in from_pretrained_kwargs.items()
                                               if k in ("trust_remote_code", "revision")})
    qc = getattr(config, "quantization_config", None)
    if isinstance(qc, QuantizationConfigMixin):
        qc = qc.to_dict()
    if isinstance(qc, dict) and qc.get("quant_method") == QUANT_METHOD:
        return AutoModelForCausalLM.from_pretrained(d, **from_pretrained_kwargs)
    if isinstance(qc, dict) and qc.get("quant_method") != "compressed-tensors":
        raise qhead.UnsupportedError(
            f"load_quantized: {d}: quantization_config has quant_method {qc.get('quant_method')!r}; "
            "qhead loads compressed-tensors token tables")
    info = qhead.inspect_model(d)
    # Every packed module of the checkpoint must be a token table: transformers would need
    # compressed-tensors for any other.
    roles = {r.tensor[: -len(".weight")] if r.tensor.endswith(".weight") else r.tensor
             for r in (info.embedding, info.head) if r is not None and r.tensor}
    files = sorted(os.path.join(d, f) for f in os.listdir(d) if f.endswith(".safetensors"))
    for f in files:
        for k in _file_keys(f):
            if k.endswith(".weight_packed") and k[: -len(".weight_packed")] not in roles:
                raise qhead.UnsupportedError(
                    f"load_quantized: {d}: {os.path.basename(f)} holds the packed module {k[: -len('.weight_packed')]!r}, "
                    f"which is not a token table ({', '.join(sorted(roles))}); transformers loads such "
                    "checkpoints through compressed-tensors")
    head_scheme = emb_scheme = None
    if info.embedding is not None and info.embedding.packed:
        emb_scheme = info.embedding.scheme.name
    if info.head is not None and info.head.packed:
        head_scheme = info.head.scheme.name
    if info.tied and (emb_scheme or head_scheme):
        emb_scheme = head_scheme = emb_scheme or head_scheme
    if emb_scheme is None and head_scheme is None:
        raise qhead.InvalidFileError(f"load_quantized: {d}: neither token table is packed")
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    qconfig = QHeadConfig(head=head_scheme, embedding=emb_scheme, rescore=rescore,
                          dense_rows=dense_rows if rescore else "cpu")
    return AutoModelForCausalLM.from_pretrained(d, config=config, quantization_config=qconfig,
                                                **from_pretrained_kwargs)


# ---- registration ---------------------------------------------------------------------------


def _register() -> None:
    if AUTO_QUANTIZATION_CONFIG_MAPPING.get(QUANT_METHOD) is not QHeadConfig:
        AUTO_QUANTIZATION_CONFIG_MAPPING.pop(QUANT_METHOD, None)  # a reload of this module
        register_quantization_config(QUANT_METHOD)(QHeadConfig)
    if AUTO_QUANTIZER_MAPPING.get(QUANT_METHOD) is not QHeadHfQuantizer:
        AUTO_QUANTIZER_MAPPING.pop(QUANT_METHOD, None)
        register_quantizer(QUANT_METHOD)(QHeadHfQuantizer)


_register()
