"""qhead.vllm.table: a token table's weights on a vLLM embedding / head layer (torch, no vLLM).

The vLLM plugin's quantization method is a thin shell over these functions, which act on any
``nn.Module`` standing for a vocab-parallel layer (a vLLM ``VocabParallelEmbedding`` /
``ParallelLMHead``; the tests use a plain module):

``create_table_weights(layer, spec, rows, hidden, row_range, ...)``
    registers the Parameters a role's checkpoint tensors load into. Packed: ``weight_packed``
    I32 [rows, ceil(H·b/32)], ``weight_scale`` [rows, G], ``weight_zero_point`` I32
    [ceil(rows·b/32), G] (asymmetric schemes), ``weight_shape`` I64 [2]. Dense: ``weight``
    [rows, H] (RTN-quantized by ``finish_table``). ``rows`` is the layer's partition of the
    (padded) vocabulary; ``row_range`` = [start, stop) the checkpoint rows it holds. Each
    Parameter carries its ``weight_loader`` (vLLM's loader calls ``weight_loader(param, w)``).

``tie_tables(head, embedding)``
    a tied head shares the embedding's Parameters (the same objects: one copy; vLLM's loader
    and ``named_parameters`` see them once).

``finish_table(layer, ...)``
    once loaded: checks the packed tensors (or RTN-quantizes the dense weight and drops it),
    keeps the full-precision rows when the head rescores, and returns the :class:`TableState`
    that serves ``embedding(ids)`` and ``logits(x, bias)`` through qhead's torch ops.
"""
from __future__ import annotations

from typing import Callable, Dict, Optional, Tuple

import torch
from torch import Tensor, nn

import qhead
from qhead.torch import QuantEmbedding, QuantLMHead, QuantTable, _torch_dtype, unique_storage_bytes

from .config import PluginConfig, RoleSpec

__all__ = ["PACKED_NAMES", "create_table_weights", "tie_tables", "finish_table", "TableState",
           "unique_tensor_bytes", "load_packed_rows", "load_dense_rows"]

PACKED_NAMES = ("weight_packed", "weight_scale", "weight_zero_point", "weight_shape")
_STATE = "_qhead_table_state"  # layer.__dict__ key of the TableState (kept out of the module tree)
_TIED = "_qhead_tied_to"       # layer.__dict__ key: the embedding layer a tied head shares


def _words(n: int, bits: int) -> int:
    return (n * bits + 31) // 32


def _param(t: Tensor) -> nn.Parameter:
    return nn.Parameter(t, requires_grad=False)


def load_packed_rows(param: nn.Parameter, loaded: Tensor, *, name: str, row_range: Tuple[int, int],
                     vocab: int, hidden: int, bits: int, where: str) -> None:
    """Copies the checkpoint tensor `loaded` (`name` of a [vocab, hidden] packed table) into the
    layer's `param`: rows [start, stop) of the vocabulary (a tensor-parallel shard), the layer's
    padding rows after them zero. A scale tensor of another float dtype than the Parameter's
    replaces the Parameter's data in its own dtype (scales are the format's, never rounded)."""
    start, stop = row_range
    loaded = loaded.detach()
    if name == "weight_shape":
        vals = [int(v) for v in loaded.reshape(-1).tolist()]
        if vals != [vocab, hidden]:
            raise qhead.InvalidFileError(
                f"{where}.weight_shape is {vals}, expected [{vocab}, {hidden}] (the model's vocab and hidden size)")
        param.data.copy_(loaded.reshape(-1).to(param.dtype))
        return
    if loaded.dim() != 2:
        raise qhead.InvalidFileError(f"{where}.{name} must be 2-D, got shape {list(loaded.shape)}")
    if name == "weight_zero_point":
        # Packed along the vocabulary: bits/32 rows per int32 word.
        if (start * bits) % 32:
            raise qhead.UnsupportedError(
                f"{where}.weight_zero_point: the shard starting at row {start} does not begin on a packed word "
                f"({32 // bits if 32 % bits == 0 else '?'} rows per word of {bits}-bit zero points)")
        want0 = _words(vocab, bits)
        lo, hi = (start * bits) // 32, _words(stop, bits)
    else:
        want0 = vocab
        lo, hi = start, stop
    if loaded.shape[0] != want0 or loaded.shape[1] != param.shape[1]:
        raise qhead.InvalidFileError(
            f"{where}.{name} has shape {list(loaded.shape)}, expected [{want0}, {param.shape[1]}] for a "
            f"[{vocab}, {hidden}] table")
    if name == "weight_scale":
        if loaded.dtype not in (torch.float16, torch.bfloat16, torch.float32):
            raise qhead.InvalidFileError(f"{where}.weight_scale has dtype {loaded.dtype}; expected f16/bf16/f32")
        if loaded.dtype != param.dtype:
            param.data = torch.zeros(param.shape, dtype=loaded.dtype, device=param.device)
    elif loaded.dtype != torch.int32:
        raise qhead.InvalidFileError(f"{where}.{name} has dtype {loaded.dtype}; expected int32")
    part = loaded[lo:hi]
    param.data[: part.shape[0]].copy_(part)
    param.data[part.shape[0]:].zero_()


def load_dense_rows(param: nn.Parameter, loaded: Tensor, *, row_range: Tuple[int, int], vocab: int, hidden: int,
                    where: str) -> None:
    """Copies rows [start, stop) of a dense [vocab, hidden] checkpoint weight into `param` (the
    padding rows after them zero), converting to the Parameter's dtype as vLLM's loader does."""
    start, stop = row_range
    if tuple(loaded.shape) != (vocab, hidden):
        raise qhead.InvalidFileError(f"{where}.weight has shape {list(loaded.shape)}, expected [{vocab}, {hidden}]")
    part = loaded.detach()[start:stop]
    param.data[: part.shape[0]].copy_(part)
    param.data[part.shape[0]:].zero_()


def create_table_weights(layer: nn.Module, spec: RoleSpec, *, rows: int, hidden: int, vocab: int,
                         row_range: Tuple[int, int], params_dtype: torch.dtype, scale_dtype: Optional[str],
                         where: str) -> None:
    """Registers on `layer` the Parameters the role's checkpoint tensors load into (see the module
    docstring), each with its weight_loader. `vocab`: the checkpoint's rows; `rows`: this layer's
    (its partition, padded)."""
    if spec.scheme is None:
        raise qhead.InternalError(f"{where}: create_table_weights for a role without a scheme")
    start, stop = row_range
    if not (0 <= start <= stop <= vocab and stop - start <= rows):
        raise qhead.InvalidArgumentError(
            f"{where}: row range [{start}, {stop}) does not fit a vocab of {vocab} in {rows} layer rows")
    if spec.source == "dense":
        w = _param(torch.zeros(rows, hidden, dtype=params_dtype))
        w.weight_loader = lambda p, t: load_dense_rows(p, t, row_range=row_range, vocab=vocab, hidden=hidden,
                                                       where=where)
        w.output_dim, w.input_dim = 0, 1
        layer.register_parameter("weight", w)
        return
    s = qhead.Scheme(spec.scheme)
    bits, gs = s.bits, s.group_size
    if gs > 0 and hidden % gs:
        raise qhead.InvalidArgumentError(f"{where}: hidden {hidden} is not a multiple of the group size {gs} of "
                                         f"{s.name}")
    groups = 1 if gs < 0 else hidden // gs
    sdt = _torch_dtype(scale_dtype or "f16", "scale_dtype")
    tensors: Dict[str, Tensor] = {
        "weight_packed": torch.zeros(rows, _words(hidden, bits), dtype=torch.int32),
        "weight_scale": torch.zeros(rows, groups, dtype=sdt),
        "weight_shape": torch.tensor([vocab, hidden], dtype=torch.int64),
    }
    if not s.symmetric:
        tensors["weight_zero_point"] = torch.zeros(_words(rows, bits), groups, dtype=torch.int32)
    for name, t in tensors.items():
        p = _param(t)

        def loader(param, loaded, name=name):
            load_packed_rows(param, loaded, name=name, row_range=row_range, vocab=vocab, hidden=hidden, bits=bits,
                             where=where)
        p.weight_loader = loader
        layer.register_parameter(name, p)


def tie_tables(head: nn.Module, embedding: nn.Module) -> None:
    """Makes `head` share `embedding`'s table Parameters (the same objects), dropping its own:
    a tied model keeps one table."""
    names = [n for n in ("weight",) + PACKED_NAMES if n in embedding._parameters]
    if not names:
        raise qhead.InternalError("qhead.vllm: tie_tables: the embedding layer has no table weights")
    for n in list(head._parameters):
        if n in ("weight",) + PACKED_NAMES:
            del head._parameters[n]
    for n in names:
        head.register_parameter(n, embedding._parameters[n])
    head.__dict__[_TIED] = embedding


def unique_tensor_bytes(module: nn.Module) -> int:
    """Bytes of the module's parameters and buffers, each storage counted once (tied or aliased
    tensors are one copy)."""
    return unique_storage_bytes([t for _, t in module.named_parameters(remove_duplicate=False)] +
                                [t for _, t in module.named_buffers(remove_duplicate=False)])


class TableState:
    """What serves a finished layer: the packed QuantTable, the embedding module over it (or over
    the full-precision rows for an exact tied embedding) and the head module (with rescoring).
    Held in the layer's __dict__, outside the module tree, so that the layer's Parameters stay
    the only owners of the table's storage."""

    def __init__(self, table: QuantTable, *, out_dtype: torch.dtype, rescore: int,
                 dense_rows: Optional[Tensor], dense_path: Optional[str], dense_tensor: Optional[str],
                 exact_embedding: bool):
        self.table = table
        self.exact_embedding = exact_embedding
        self.embed = QuantEmbedding(table, dtype=out_dtype)
        if rescore and dense_path is not None:
            self.head = QuantLMHead(table, rescore=rescore, dense_rows=dense_path, dense_tensor=dense_tensor)
        elif rescore:
            self.head = QuantLMHead(table, rescore=rescore, dense_rows="cpu", dense_weight=dense_rows)
        else:
            self.head = QuantLMHead(table)
        if exact_embedding:
            if not rescore:
                raise qhead.InternalError("qhead.vllm: an exact embedding reads the rescoring rows; rescore is 0")
            rows = self.head._dense()  # the kept rows, or the file's mapped (no copy either way)
            self.embed.use_dense_rows(lambda: rows)

    def embedding(self, ids: Tensor) -> Tensor:
        return self.embed(ids)

    def logits(self, x: Tensor, bias: Optional[Tensor] = None) -> Tensor:
        out = self.head(x)
        if bias is not None:
            out = out + bias.to(out.dtype)
        return out


def state_of(layer: nn.Module) -> TableState:
    st = layer.__dict__.get(_STATE)
    if st is None:
        tied = layer.__dict__.get(_TIED)
        st = None if tied is None else tied.__dict__.get(_STATE)
    if st is None:
        raise qhead.InternalError(f"qhead.vllm: {type(layer).__name__} is used before its weights were processed "
                                  "(process_weights_after_loading)")
    return st


def finish_table(layer: nn.Module, spec: RoleSpec, cfg: PluginConfig, *, role: str, rows: int, vocab: int,
                 hidden: int, out_dtype: torch.dtype, tied: bool, where: str,
                 on_params: Optional[Callable[[nn.Module], None]] = None) -> TableState:
    """The layer's weights once loaded → its TableState (see the module docstring). A tied head
    takes its embedding's state (finishing the embedding first when it is not yet)."""
    shared = layer.__dict__.get(_TIED)
    if shared is not None:
        st = shared.__dict__.get(_STATE)
        if st is None:
            st = finish_table(shared, spec, cfg, role="embedding", rows=rows, vocab=vocab,
                              hidden=hidden, out_dtype=out_dtype,
                              tied=True, where=where, on_params=on_params)
        # The embedding's finish may have replaced its Parameters (RTN): share the new ones.
        tie_tables(layer, shared)
        layer.__dict__[_STATE] = st
        return st
    if layer.__dict__.get(_STATE) is not None:
        return layer.__dict__[_STATE]
    rescore = cfg.rescore if (role == "head" or tied) else 0
    exact = cfg.exact_embedding(tied)
    dense_rows: Optional[Tensor] = None
    p = layer._parameters
    # The full-precision rows, when the head rescores (an exact tied embedding reads them too):
    # kept from a dense checkpoint (dense_rows "cpu") or mapped from a safetensors file (a path).
    need_rows = bool(rescore) or exact
    dense_path = cfg.dense_rows if need_rows and cfg.dense_rows not in (None, "cpu") else None
    if dense_path is not None and rows != vocab:
        raise qhead.UnsupportedError(
            f"{where}: the layer pads the vocabulary to {rows} rows; rescoring from the mapped file {dense_path} "
            f"needs an unpadded vocabulary of {vocab} (dense_rows='cpu' with a dense checkpoint pads the rows too)")
    if spec.source == "dense":
        w = p["weight"].data
        sd = cfg.scale_dtype or {torch.float16: "f16", torch.bfloat16: "bf16"}.get(w.dtype, "f32")
        qt = QuantTable.from_dense(w, spec.scheme, scale_dtype=sd, threads=cfg.threads)
        del p["weight"]
        for n in PACKED_NAMES:
            t = getattr(qt, n, None)
            if t is not None:
                layer.register_parameter(n, _param(t))
        layer.register_parameter("weight_shape", _param(torch.tensor([vocab, hidden], dtype=torch.int64)))
        if need_rows and dense_path is None:
            dense_rows = w.to("cpu").contiguous()
    else:
        wz = p.get("weight_zero_point")
        # The QuantTable's buffers are views of the layer's Parameters (one storage).
        qt = QuantTable.from_tensors(p["weight_packed"].data, p["weight_scale"].data,
                                     None if wz is None else wz.data, scheme=spec.scheme, shape=(rows, hidden),
                                     dtype=out_dtype)
        if need_rows and dense_path is None:
            raise qhead.InvalidArgumentError(
                f"{where}: rescore = {cfg.rescore}: the checkpoint stores the {role} packed, so its full-precision "
                "rows are not loaded; give dense_rows as the path of a safetensors file holding them")
    if dense_rows is not None:
        layer.register_buffer("dense_weight", dense_rows, persistent=False)
    st = TableState(qt, out_dtype=out_dtype, rescore=rescore, dense_rows=dense_rows, dense_path=dense_path,
                    dense_tensor=cfg.dense_tensor, exact_embedding=exact)
    layer.__dict__[_STATE] = st
    if on_params is not None:
        on_params(layer)
    return st
