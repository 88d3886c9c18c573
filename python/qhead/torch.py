"""qhead.torch: qhead's token-table ops as torch.library ops, and drop-in modules.

Ops (namespace ``qhead``; CPU and CUDA kernels, fake kernels for torch.compile):

    torch.ops.qhead.embed(weight_packed, weight_scale, weight_zero_point, col_perm, ids,
                          scheme, vocab, hidden, out_dtype) -> Tensor [N, H]
    torch.ops.qhead.logits(weight_packed, weight_scale, weight_zero_point, col_perm, x,
                           scheme, vocab, hidden, out_dtype=None) -> Tensor [M, V]
                           (f32, or out_dtype f16/bf16: the f32 logits rounded to nearest even)
    torch.ops.qhead.topk(weight_packed, weight_scale, weight_zero_point, col_perm, x, k,
                         scheme, vocab, hidden) -> (values f32 [M, k], ids i32 [M, k], lse f32 [M])
    torch.ops.qhead.rescore(dense, x, candidates) -> (values f32 [M, k], ids i32 [M, k])

A table is passed as its compressed-tensors tensors (``weight_zero_point`` and
``col_perm`` may be None) plus the scheme name ("w4g64", "w8", "w4g128a", ...;
the scale dtype is weight_scale's) and its shape, so that torch.compile and fake
tensors see every tensor an op reads. ``ids`` and ``x`` are 2-D / 1-D and
contiguous as the C++ ops take them; the modules below reshape. Every call goes
into the C++ library through ``qhead._C``; on CUDA it runs on torch's current
stream.

Building a ``qhead.Table`` validates it (on CPU it reads every scale), so built
tables are cached, keyed by the identity of the tensors (data pointer, device,
dtype, shape, version counter): an in-place change of a buffer rebuilds it, a
tensor that is garbage-collected drops its entry.

Modules:

    QuantTable       the packed tensors as buffers (one copy; a tied embedding and
                     head share one QuantTable)
    QuantEmbedding   forward(ids) like nn.Embedding
    QuantLMHead      forward(x) like nn.Linear(bias=False); .topk(x, k); optional
                     exact rescoring of the top candidates from full-precision rows
"""

from __future__ import annotations

import os
import weakref
from collections import OrderedDict
from typing import Any, Callable, Mapping, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor, nn

import qhead
from qhead._safetensors import safetensors_header
from qhead import _C

__all__ = [
    "QuantTable",
    "QuantEmbedding",
    "QuantLMHead",
    "table_from_tensors",
    "dense_table",
    "clear_table_cache",
    "mmap_safetensors_tensor",
]

_SCALE_DTYPE_NAMES = {torch.float16: "f16", torch.bfloat16: "bf16", torch.float32: "f32"}
_DTYPE_FROM_NAME = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}
_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _torch_dtype(d: Union[str, torch.dtype, None], what: str) -> torch.dtype:
    """A float dtype from a torch dtype or "f32" / "f16" / "bf16"."""
    if isinstance(d, torch.dtype):
        if d not in _FLOAT_DTYPES:
            raise qhead.InvalidArgumentError(f"{what} must be float32, float16 or bfloat16, got {d}")
        return d
    if isinstance(d, str) and d in _DTYPE_FROM_NAME:
        return _DTYPE_FROM_NAME[d]
    raise qhead.InvalidArgumentError(f"{what} must be a torch float dtype or one of f32/f16/bf16, got {d!r}")


def _scale_dtype_name(d: torch.dtype) -> str:
    name = _SCALE_DTYPE_NAMES.get(d)
    if name is None:
        raise qhead.InvalidArgumentError(f"weight_scale must be float16, bfloat16 or float32, got {d}")
    return name


# ---- the cache of built qhead.Tables ---------------------------------------------------------------
#
# One entry per storage (slot = the data pointer of weight_packed, or of a dense weight). An
# entry holds the full key it was built for (data pointer, dtype, shape and version counter of
# every tensor, the scheme and shape) and the Table, which keeps the tensors' storage alive, so
# the data pointer cannot be reused by another allocation while the entry exists. A lookup whose
# key differs (another scheme, a buffer changed in place, another scale tensor) rebuilds. The
# entry is dropped when the tensor object it was built from is garbage-collected; at most
# _CACHE_MAX entries are kept (least recently built first out).

_CACHE_MAX = 64
_cache: "OrderedDict[tuple, tuple]" = OrderedDict()


def _version(t: Tensor) -> int:
    try:
        return t._version
    except RuntimeError:  # an inference tensor: no version counter (not writable outside inference mode)
        return -1


def _tkey(t: Optional[Tensor]) -> tuple:
    if t is None:
        return ()
    # Views of one storage share its version counter, so an alias of a tensor (detach(), the
    # tensors torch.compile passes) has the same key.
    return (t.data_ptr(), t.dtype, t.shape, _version(t))


def _evict(slot: int, token: object) -> None:
    entry = _cache.get(slot)
    if entry is not None and entry[2] is token:
        del _cache[slot]


def _remember(slot: int, key: tuple, table: Any, owner: Tensor) -> None:
    token = object()
    _cache[slot] = (key, table, token)
    _cache.move_to_end(slot)
    try:
        weakref.finalize(owner, _evict, slot, token)
    except TypeError:  # no weak references to it: bounded by _CACHE_MAX only
        pass
    while len(_cache) > _CACHE_MAX:
        _cache.popitem(last=False)


def clear_table_cache() -> None:
    """Drops every cached qhead.Table (their storage is then released with the tensors), the C++
    ops' cache included."""
    _cache.clear()
    if OPS == "cpp":
        torch.ops.qhead._table_cache(True)


def table_cache_info() -> Tuple[int, int]:
    """(live entries, tables built so far) of the cache the torch ops use: the C++ kernels' when
    OPS == "cpp", else this module's (whose build count is not kept: -1)."""
    if OPS == "cpp":
        n, builds = torch.ops.qhead._table_cache(False)
        return int(n), int(builds)
    return len(_cache), -1


def _poison_outputs(on: bool) -> None:
    """Tests: the C++ kernels fill every output they allocate with NaN / INT_MIN first (the
    Python kernels allocate through _empty, which tests replace)."""
    if OPS == "cpp":
        torch.ops.qhead._poison_outputs(bool(on))


def _check_table_tensors(weight_packed, weight_scale, weight_zero_point, col_perm, op: str) -> None:
    for name, t in (("weight_packed", weight_packed), ("weight_scale", weight_scale),
                    ("weight_zero_point", weight_zero_point), ("col_perm", col_perm)):
        if t is not None and not isinstance(t, Tensor):
            raise qhead.InvalidArgumentError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
    dev = weight_packed.device
    for name, t in (("weight_scale", weight_scale), ("weight_zero_point", weight_zero_point),
                    ("col_perm", col_perm)):
        if t is not None and t.device != dev:
            raise qhead.InvalidArgumentError(
                f"{op}: {name} is on {t.device} but weight_packed is on {dev}: a table's tensors share one device")


def table_from_tensors(weight_packed: Tensor, weight_scale: Tensor, weight_zero_point: Optional[Tensor],
                       col_perm: Optional[Tensor], scheme: str, vocab: int, hidden: int) -> "qhead.Table":
    """The qhead.Table over these compressed-tensors tensors (zero copy), built once and cached."""
    try:
        key = (scheme, vocab, hidden, _tkey(weight_packed), _tkey(weight_scale), _tkey(weight_zero_point),
               _tkey(col_perm))
    except AttributeError:  # not tensors: say which
        _check_table_tensors(weight_packed, weight_scale, weight_zero_point, col_perm, "qhead.torch")
        raise
    slot = key[3][0]  # weight_packed's data pointer (CPU and CUDA addresses do not overlap)
    entry = _cache.get(slot)
    if entry is not None and entry[0] == key:
        return entry[1]
    _check_table_tensors(weight_packed, weight_scale, weight_zero_point, col_perm, "qhead.torch")
    s = qhead.Scheme(scheme, _scale_dtype_name(weight_scale.dtype))
    table = qhead.Table.packed(weight_packed.detach(), weight_scale.detach(),
                               None if weight_zero_point is None else weight_zero_point.detach(),
                               scheme=s, shape=(vocab, hidden),
                               col_perm=None if col_perm is None else col_perm.detach())
    _remember(slot, key, table, weight_packed)
    return table


def dense_table(weight: Tensor) -> "qhead.Table":
    """The dense qhead.Table over a [V, H] float tensor (zero copy), built once and cached."""
    if not isinstance(weight, Tensor):
        raise qhead.InvalidArgumentError(f"qhead.torch: the dense weight must be a torch.Tensor, got {type(weight).__name__}")
    key = ("dense", _tkey(weight))
    slot = key[1][0]
    entry = _cache.get(slot)
    if entry is not None and entry[0] == key:
        return entry[1]
    table = qhead.Table.dense(weight.detach())
    _remember(slot, key, table, weight)
    return table


def _need_contiguous(t: Tensor, op: str, name: str) -> None:
    if not t.is_contiguous():
        raise qhead.InvalidArgumentError(
            f"qhead::{op}: {name} must be contiguous (shape {list(t.shape)}, strides {list(t.stride())}); "
            f"call .contiguous() first")


# Every output is allocated through this one function (tests replace it to poison outputs).
# Sizes go as separate ints: torch.empty parses them about twice as fast as a tuple.
_empty = torch.empty


def _stream(t: Tensor) -> Optional[int]:
    """torch's current CUDA stream on t's device as an integer (None on CPU)."""
    if not t.is_cuda:
        return None
    return torch._C._cuda_getCurrentRawStream(t.get_device())


# ---- the ops -----------------------------------------------------------------------------------------
#
# Registered in C++ when the package was built with torch importable (qhead/_torch_ops, from
# python/src/torch_ops.cc: TORCH_LIBRARY kernels for CPU, CUDA and Meta, with their own table
# cache; the dispatcher calls C++ directly). Otherwise, or with QHEAD_TORCH_OPS=python in the
# environment, the same schemas are registered here through torch.library.Library.define + impl
# (the dispatcher calls the Python kernel directly; torch.library.custom_op adds a Python layer
# per call that scripts/bench_binding.py measures). One kernel for CPU and CUDA: the C++ op
# dispatches on the table's device. OPS says which registration runs: "cpp" or "python".

_OPS_LIBRARY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_torch_ops.so")
OPS = "python"
if os.environ.get("QHEAD_TORCH_OPS", "").lower() != "python" and os.path.exists(_OPS_LIBRARY):
    try:
        torch.ops.load_library(_OPS_LIBRARY)
        OPS = "cpp"
    except OSError as e:  # built against another torch (a symbol it lacks): the Python kernels serve
        import warnings
        warnings.warn(f"qhead.torch: cannot load {os.path.basename(_OPS_LIBRARY)} ({e}); registering the ops "
                      f"from Python (reinstall qhead with --no-build-isolation against this torch for the C++ "
                      f"kernels)", RuntimeWarning, stacklevel=2)

# qhead::Error code (ErrorCode's order) → the Python class _C raises for it.
_ERROR_CLASSES = (qhead.InvalidArgumentError, qhead.InvalidFileError, qhead.IoError, qhead.UnsupportedError,
                  qhead.InternalError)


def _raise_impl(code: int, message: str) -> None:
    """The C++ kernels' errors: raises the qhead.Error subclass of a qhead::ErrorCode."""
    cls = _ERROR_CLASSES[code] if 0 <= code < len(_ERROR_CLASSES) else qhead.InternalError
    raise cls(message)


if OPS == "cpp":
    _lib = torch.library.Library("qhead", "IMPL")
    _lib.impl("_raise", _raise_impl, "CPU")
    torch.ops.qhead._bind(_C._torch_api())  # the C++ kernels run the ops through _C (torch_api.h)
else:
    _lib = torch.library.Library("qhead", "DEF")

    _TABLE_ARGS = "Tensor weight_packed, Tensor weight_scale, Tensor? weight_zero_point, Tensor? col_perm"
    # scheme, vocab and hidden are positional in the schemas (they may still be passed by name):
    # the dispatcher hands keyword-only arguments to a Python kernel through a dict, which costs
    # several µs per call (scripts/bench_binding.py).
    _TABLE_KW = "str scheme, int vocab, int hidden"
    _lib.define(f"embed({_TABLE_ARGS}, Tensor ids, {_TABLE_KW}, ScalarType out_dtype) -> Tensor")
    _lib.define(f"logits({_TABLE_ARGS}, Tensor x, {_TABLE_KW}, ScalarType? out_dtype=None) -> Tensor")
    _lib.define(f"topk({_TABLE_ARGS}, Tensor x, int k, {_TABLE_KW}) -> (Tensor, Tensor, Tensor)")
    _lib.define(f"sample({_TABLE_ARGS}, Tensor x, float temperature, int top_k, float top_p, float min_p, "
                f"int seed, int offset, {_TABLE_KW}) -> Tensor")
    _lib.define("rescore(Tensor dense, Tensor x, Tensor candidates) -> (Tensor, Tensor)")


def _embed_impl(weight_packed, weight_scale, weight_zero_point, col_perm, ids, scheme, vocab, hidden, out_dtype):
    table = table_from_tensors(weight_packed, weight_scale, weight_zero_point, col_perm, scheme, vocab, hidden)
    if ids.dim() != 1:
        raise qhead.InvalidArgumentError(f"qhead::embed: ids must be 1-D [N], got shape {tuple(ids.shape)}")
    _need_contiguous(ids, "embed", "ids")
    out = _empty(ids.shape[0], hidden, dtype=out_dtype, device=weight_packed.device)
    _C.embed(table, ids, out, stream=_stream(out))
    return out


def _logits_impl(weight_packed, weight_scale, weight_zero_point, col_perm, x, scheme, vocab, hidden, out_dtype=None):
    table = table_from_tensors(weight_packed, weight_scale, weight_zero_point, col_perm, scheme, vocab, hidden)
    if x.dim() != 2:
        raise qhead.InvalidArgumentError(f"qhead::logits: x must be 2-D [M, H], got shape {tuple(x.shape)}")
    _need_contiguous(x, "logits", "x")
    out = _empty(x.shape[0], vocab, dtype=out_dtype or torch.float32, device=weight_packed.device)
    _C.logits(table, x, out, stream=_stream(out))
    return out


def _topk_impl(weight_packed, weight_scale, weight_zero_point, col_perm, x, k, scheme, vocab, hidden):
    table = table_from_tensors(weight_packed, weight_scale, weight_zero_point, col_perm, scheme, vocab, hidden)
    if x.dim() != 2:
        raise qhead.InvalidArgumentError(f"qhead::topk: x must be 2-D [M, H], got shape {tuple(x.shape)}")
    _need_contiguous(x, "topk", "x")
    m, dev = x.shape[0], weight_packed.device
    values = _empty(m, k, dtype=torch.float32, device=dev)
    ids = _empty(m, k, dtype=torch.int32, device=dev)
    lse = _empty(m, dtype=torch.float32, device=dev)
    _C.topk(table, x, k, values, ids, lse, stream=_stream(values))
    return values, ids, lse


def _sample_impl(weight_packed, weight_scale, weight_zero_point, col_perm, x, temperature, top_k, top_p, min_p,
                 seed, offset, scheme, vocab, hidden):
    table = table_from_tensors(weight_packed, weight_scale, weight_zero_point, col_perm, scheme, vocab, hidden)
    if x.dim() != 2:
        raise qhead.InvalidArgumentError(f"qhead::sample: x must be 2-D [M, H], got shape {tuple(x.shape)}")
    _need_contiguous(x, "sample", "x")
    if seed < 0 or offset < 0:
        raise qhead.InvalidArgumentError(f"qhead::sample: seed = {seed} and offset = {offset} must be >= 0")
    ids = _empty(x.shape[0], dtype=torch.int32, device=weight_packed.device)
    _C.sample(table, x, ids, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, seed=seed,
              offset=offset, stream=_stream(ids))
    return ids


def _rescore_impl(dense, x, candidates):
    table = dense_table(dense)
    if candidates.dim() != 2:
        raise qhead.InvalidArgumentError(
            f"qhead::rescore: candidates must be 2-D [M, k], got shape {tuple(candidates.shape)}")
    _need_contiguous(x, "rescore", "x")
    _need_contiguous(candidates, "rescore", "candidates")
    values = _empty(*candidates.shape, dtype=torch.float32, device=dense.device)
    ids = _empty(*candidates.shape, dtype=torch.int32, device=dense.device)
    _C.rescore(table, x, candidates, values, ids, stream=_stream(values))
    return values, ids


if OPS == "python":
    for _name, _fn in (("embed", _embed_impl), ("logits", _logits_impl), ("topk", _topk_impl),
                       ("sample", _sample_impl), ("rescore", _rescore_impl)):
        _lib.impl(_name, _fn, "CPU")
        _lib.impl(_name, _fn, "CUDA")


def _register_fakes() -> None:
    # Fake kernels: output shapes and dtypes only (torch.compile, FakeTensorMode, meta tensors).

    @torch.library.register_fake("qhead::embed", lib=_lib)
    def _embed_fake(weight_packed, weight_scale, weight_zero_point, col_perm, ids, scheme, vocab, hidden, out_dtype):
        torch._check(ids.dim() == 1, lambda: f"qhead::embed: ids must be 1-D [N], got {ids.dim()}-D")
        return weight_packed.new_empty((ids.shape[0], hidden), dtype=out_dtype)


    @torch.library.register_fake("qhead::logits", lib=_lib)
    def _logits_fake(weight_packed, weight_scale, weight_zero_point, col_perm, x, scheme, vocab, hidden,
                     out_dtype=None):
        torch._check(x.dim() == 2, lambda: f"qhead::logits: x must be 2-D [M, H], got {x.dim()}-D")
        return weight_packed.new_empty((x.shape[0], vocab), dtype=out_dtype or torch.float32)


    @torch.library.register_fake("qhead::topk", lib=_lib)
    def _topk_fake(weight_packed, weight_scale, weight_zero_point, col_perm, x, k, scheme, vocab, hidden):
        torch._check(x.dim() == 2, lambda: f"qhead::topk: x must be 2-D [M, H], got {x.dim()}-D")
        m = x.shape[0]
        return (weight_packed.new_empty((m, k), dtype=torch.float32),
                weight_packed.new_empty((m, k), dtype=torch.int32),
                weight_packed.new_empty((m,), dtype=torch.float32))


    @torch.library.register_fake("qhead::sample", lib=_lib)
    def _sample_fake(weight_packed, weight_scale, weight_zero_point, col_perm, x, temperature, top_k, top_p, min_p,
                     seed, offset, scheme, vocab, hidden):
        torch._check(x.dim() == 2, lambda: f"qhead::sample: x must be 2-D [M, H], got {x.dim()}-D")
        return weight_packed.new_empty((x.shape[0],), dtype=torch.int32)


    @torch.library.register_fake("qhead::rescore", lib=_lib)
    def _rescore_fake(dense, x, candidates):
        torch._check(candidates.dim() == 2, lambda: f"qhead::rescore: candidates must be 2-D [M, k]")
        return (dense.new_empty(candidates.shape, dtype=torch.float32),
                dense.new_empty(candidates.shape, dtype=torch.int32))


if OPS == "python":
    _register_fakes()


# ---- modules -----------------------------------------------------------------------------------------

def _eager(x: Tensor, table_tensor: Tensor) -> bool:
    """True when the modules may call qhead._C directly: not tracing, and plain tensors (not fake
    or other subclasses). The result is the same as through the torch.ops path."""
    return type(x) is Tensor and type(table_tensor) is Tensor and not torch.compiler.is_compiling()


def _as_tensor(a: Any) -> Tensor:
    """A torch tensor over a DLPack-capable array, zero copy."""
    return a if isinstance(a, Tensor) else torch.from_dlpack(a)


_ST_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}


def unique_storage_bytes(tensors) -> int:
    """Bytes of the distinct storages behind `tensors` (None and meta tensors skipped): tied or
    aliased tensors count once."""
    seen, total = set(), 0
    for t in tensors:
        if t is None or t.device.type == "meta":
            continue
        st = t.untyped_storage()
        key = (t.device, st.data_ptr())
        if key in seen:
            continue
        seen.add(key)
        total += st.nbytes()
    return total


def mmap_safetensors_tensor(path: str, name: Optional[str] = None, shape: Optional[Sequence[int]] = None) -> Tensor:
    """A float tensor of a safetensors file as a CPU view of the file mapped in memory: no copy,
    pages are read when touched; the mapping is private (copy-on-write), so the file is never
    written. `name` None: the only tensor of `shape`."""
    path = os.fspath(path)
    header, base = safetensors_header(path)
    entries = {k: v for k, v in header.items() if k != "__metadata__" and isinstance(v, dict)}
    if name is None:
        cands = [k for k, v in entries.items() if shape is None or list(v.get("shape", ())) == list(shape)]
        if len(cands) != 1:
            raise qhead.InvalidArgumentError(
                f"{path}: {len(cands)} tensors have shape {list(shape) if shape else '(any)'}; name the dense tensor")
        name = cands[0]
    if name not in entries:
        raise qhead.InvalidArgumentError(f"{path}: no tensor named {name!r}")
    e = entries[name]
    dtype = _ST_DTYPES.get(e.get("dtype"))
    if dtype is None:
        raise qhead.InvalidArgumentError(f"{path}: tensor {name!r} has dtype {e.get('dtype')}, expected F32/F16/BF16")
    tshape = [int(d) for d in e.get("shape", ())]
    if shape is not None and tshape != list(shape):
        raise qhead.InvalidArgumentError(f"{path}: tensor {name!r} has shape {tshape}, expected {list(shape)}")
    b, end = (int(o) for o in e.get("data_offsets", (0, -1)))
    esize = dtype.itemsize
    numel = 1
    for d in tshape:
        numel *= d
    size = os.path.getsize(path)
    if not (0 <= b <= end and base + end <= size and end - b == numel * esize):
        raise qhead.InvalidFileError(f"{path}: tensor {name!r} has data offsets [{b}, {end}) that do not fit "
                                     f"its shape {tshape} or the file ({size} bytes)")
    if (base + b) % esize:
        raise qhead.InvalidFileError(f"{path}: tensor {name!r} is not aligned to its element size")
    whole = torch.from_file(path, shared=False, size=size, dtype=torch.uint8)
    return whole[base + b: base + end].view(dtype).view(tshape)


class QuantTable(nn.Module):
    """A [V, H] packed token table: the compressed-tensors tensors as buffers, one copy.

    Buffers: ``weight_packed`` I32 [V, ceil(H·b/32)], ``weight_scale`` [V, G] (f16/bf16/f32),
    ``weight_zero_point`` I32 [ceil(V·b/32), G] (asymmetric schemes), ``col_perm`` I32 [H]
    (GPTQ act-order tables). ``.to(device)`` moves them; dtype conversions of the enclosing
    model (``model.half()``, ``model.to(torch.bfloat16)``) leave them as they are (the scales
    are part of the quantized format). ``dtype`` is the float dtype the table stands for (the
    dense weight it was made from; QuantEmbedding's default output dtype).

    ``QuantTable(scheme, vocab, hidden)`` makes buffers of the right shapes (zero codes, unit
    scales) to ``load_state_dict`` into.
    """

    def __init__(self, scheme: str, vocab: int, hidden: int, *, scale_dtype: Union[str, torch.dtype] = "f16",
                 col_perm: bool = False, dtype: Union[str, torch.dtype] = torch.float32,
                 device: Union[str, torch.device, None] = None):
        super().__init__()
        scale_dtype = _torch_dtype(scale_dtype, "scale_dtype")
        s = qhead.Scheme(scheme, _scale_dtype_name(scale_dtype))
        vocab, hidden = int(vocab), int(hidden)
        if vocab < 1 or hidden < 1:
            raise qhead.InvalidArgumentError(f"QuantTable: shape ({vocab}, {hidden}) must be positive")
        bits, gs = s.bits, s.group_size
        if gs > 0 and hidden % gs:
            raise qhead.InvalidArgumentError(
                f"QuantTable: hidden {hidden} is not a multiple of the group size {gs} of {s.name}")
        groups = 1 if gs < 0 else hidden // gs
        words = lambda n: (n * bits + 31) // 32  # noqa: E731
        self.scheme = s.name
        self.vocab, self.hidden = vocab, hidden
        self.dtype = _torch_dtype(dtype, "dtype")
        self._mapped = False
        self.register_buffer("weight_packed", torch.zeros((vocab, words(hidden)), dtype=torch.int32, device=device))
        self.register_buffer("weight_scale", torch.ones((vocab, groups), dtype=scale_dtype, device=device))
        zp = None if s.symmetric else torch.zeros((words(vocab), groups), dtype=torch.int32, device=device)
        self.register_buffer("weight_zero_point", zp)
        cp = torch.arange(hidden, dtype=torch.int32, device=device) if col_perm else None
        self.register_buffer("col_perm", cp)

    # -- constructors --

    @classmethod
    def from_table(cls, table: "qhead.Table", *, dtype: Union[str, torch.dtype] = torch.float32) -> "QuantTable":
        """Wraps a packed qhead.Table's storage (zero copy: the buffers are views of it)."""
        if not table.is_packed:
            raise qhead.InvalidArgumentError("QuantTable.from_table: the table is dense; QuantTable holds packed tables")
        self = cls.__new__(cls)
        nn.Module.__init__(self)
        s = table.scheme
        self.scheme = s.name
        self.vocab, self.hidden = int(table.vocab), int(table.hidden)
        self.dtype = _torch_dtype(dtype, "dtype")
        self._mapped = False
        zp, cp = table.weight_zero_point, table.col_perm
        self.register_buffer("weight_packed", _as_tensor(table.weight_packed))
        self.register_buffer("weight_scale", _as_tensor(table.weight_scale))
        self.register_buffer("weight_zero_point", None if zp is None else _as_tensor(zp))
        # from_dlpack keeps the C++ storage (a file mapping, a device allocation) alive.
        self.register_buffer("col_perm", None if cp is None else _as_tensor(cp))
        return self

    @classmethod
    def from_dense(cls, weight: Tensor, scheme: str = "w4g64", *, scale_dtype: Union[str, torch.dtype] = "f16",
                   threads: int = 0, quantizer: str = "rtn", calibration: Optional[Tensor] = None,
                   damp: Optional[float] = None) -> "QuantTable":
        """Quantizes a dense [V, H] weight (f32/f16/bf16) with qhead.quantize (``quantizer``: rtn,
        mse, gptq, gptq-mse; ``calibration``: the head's inputs [N, H], required by the GPTQ ones,
        per-column weights for mse; ``damp``: GPTQ's damping, None for qhead.quantize's default);
        the table lands on the weight's device. dtype is the weight's dtype."""
        if not isinstance(weight, Tensor):
            raise qhead.InvalidArgumentError(f"QuantTable.from_dense: weight must be a torch.Tensor, got {type(weight).__name__}")
        sd = _scale_dtype_name(_torch_dtype(scale_dtype, "scale_dtype"))
        w = weight.detach().to("cpu").contiguous()
        c = None
        if calibration is not None:
            if not isinstance(calibration, Tensor):
                raise qhead.InvalidArgumentError(
                    f"QuantTable.from_dense: calibration must be a torch.Tensor [N, H], got {type(calibration).__name__}")
            c = calibration.detach().to("cpu").contiguous()
        extra = {} if damp is None else {"damp": float(damp)}
        t = qhead.quantize(w, scheme, scale_dtype=sd, threads=threads, quantizer=quantizer, calibration=c, **extra)
        qt = cls.from_table(t, dtype=weight.dtype if weight.dtype in _FLOAT_DTYPES else torch.float32)
        return qt.to(weight.device) if weight.device.type != "cpu" else qt

    @classmethod
    def from_roles(cls, embedding: Tensor, head: Optional[Tensor] = None, *, scheme: str = "w4g64",
                   embedding_scheme: Optional[str] = None, head_scheme: Optional[str] = None,
                   scale_dtype: Union[str, torch.dtype] = "f16", threads: int = 0
                   ) -> Tuple["QuantTable", "QuantTable"]:
        """(embedding table, head table) through qhead.quantize_roles. Tied (head None): ONE
        QuantTable, returned twice, quantized once with one scheme (embedding_scheme or
        head_scheme or scheme; two different ones are an error). Untied: each role with its
        scheme (default `scheme`)."""
        sd = _scale_dtype_name(_torch_dtype(scale_dtype, "scale_dtype"))
        e = embedding.detach().to("cpu").contiguous()
        if head is None:
            es = embedding_scheme or head_scheme or scheme
            hs = head_scheme
            h = None
        else:
            es, hs = embedding_scheme or scheme, head_scheme or scheme
            h = head.detach().to("cpu").contiguous()
        tt = qhead.quantize_roles(e, h, embedding_scheme=es, head_scheme=hs, scale_dtype=sd, threads=threads)
        dt = embedding.dtype if embedding.dtype in _FLOAT_DTYPES else torch.float32
        emb = cls.from_table(tt.embedding, dtype=dt).to(embedding.device)
        if tt.tied:
            return emb, emb
        return emb, cls.from_table(tt.head, dtype=dt).to(head.device)

    @classmethod
    def from_compressed_tensors(cls, source: Union[str, os.PathLike, Mapping[str, Tensor]], prefix: str, *,
                                scheme: Optional[str] = None, dtype: Union[str, torch.dtype] = torch.float32
                                ) -> "QuantTable":
        """`<prefix>.weight_packed`, `.weight_scale`[, `.weight_zero_point`] of a safetensors file
        (mapped, zero copy; the buffers are read-only views of the mapping) or of a state dict
        (zero copy of its tensors). `scheme` overrides the scheme inferred from the file (its
        metadata or shapes); for a state dict it is inferred from the shapes when not given."""
        if prefix.endswith(".weight"):
            prefix = prefix[: -len(".weight")]
        if isinstance(source, (str, os.PathLike)):
            t = qhead.load_packed(os.fspath(source), prefix, scheme)
            qt = cls.from_table(t, dtype=dtype)
            qt._mapped = True
            return qt
        sd = source
        try:
            wp, ws = sd[prefix + ".weight_packed"], sd[prefix + ".weight_scale"]
        except KeyError as e:
            raise qhead.InvalidArgumentError(f"QuantTable.from_compressed_tensors: state dict has no {e.args[0]!r}") from None
        wz = sd.get(prefix + ".weight_zero_point")
        shape = sd.get(prefix + ".weight_shape")
        if shape is None:
            raise qhead.InvalidArgumentError(
                f"QuantTable.from_compressed_tensors: state dict has no {prefix + '.weight_shape'!r}")
        vocab, hidden = (int(v) for v in torch.as_tensor(shape).tolist())
        if scheme is None:
            scheme = _infer_scheme(wp, ws, wz, vocab, hidden, prefix)
        return cls.from_tensors(wp, ws, wz, scheme=scheme, shape=(vocab, hidden), dtype=dtype)

    @classmethod
    def from_tensors(cls, weight_packed: Tensor, weight_scale: Tensor, weight_zero_point: Optional[Tensor] = None, *,
                     scheme: str, shape: Tuple[int, int], col_perm: Optional[Tensor] = None,
                     dtype: Union[str, torch.dtype] = torch.float32) -> "QuantTable":
        """A QuantTable over these compressed-tensors tensors (zero copy), validated."""
        vocab, hidden = (int(d) for d in shape)
        table_from_tensors(weight_packed, weight_scale, weight_zero_point, col_perm, scheme, vocab, hidden)  # validates
        self = cls.__new__(cls)
        nn.Module.__init__(self)
        self.scheme = qhead.Scheme(scheme, _scale_dtype_name(weight_scale.dtype)).name
        self.vocab, self.hidden = vocab, hidden
        self.dtype = _torch_dtype(dtype, "dtype")
        self._mapped = False
        self.register_buffer("weight_packed", weight_packed.detach())
        self.register_buffer("weight_scale", weight_scale.detach())
        self.register_buffer("weight_zero_point", None if weight_zero_point is None else weight_zero_point.detach())
        self.register_buffer("col_perm", None if col_perm is None else col_perm.detach())
        return self

    @classmethod
    def from_gptq(cls, model_dir: Union[str, os.PathLike], role: str = "head", *,
                  embedding_tensor: Optional[str] = None, head_tensor: Optional[str] = None,
                  dtype: Union[str, torch.dtype] = torch.float32) -> "QuantTable":
        """The head (or embedding) of a model directory holding a GPTQ / AutoRound /
        compressed-tensors checkpoint, through qhead.load_model_tables (act-order tables keep
        their column order in col_perm)."""
        tt = qhead.load_model_tables(os.fspath(model_dir), embedding_tensor, head_tensor)
        t = _role(tt, role, "QuantTable.from_gptq")
        if not t.is_packed:
            raise qhead.InvalidArgumentError(
                f"QuantTable.from_gptq: the {role} of {os.fspath(model_dir)} is not quantized (a dense table); "
                "use QuantTable.from_dense on it")
        return cls.from_table(t, dtype=dtype)

    @classmethod
    def from_gguf(cls, path: Union[str, os.PathLike], role: str = "head", *, scheme: str = "w4g64",
                  threads: int = 0, dtype: Union[str, torch.dtype] = torch.float32) -> "QuantTable":
        """The head (or embedding) table of a GGUF file through qhead.load_gguf_tables: ggml's
        block formats are not the pack-quantized layout, so the table is dequantized and
        RTN-quantized to `scheme` (for a tied model, head and embedding are the same table)."""
        tt = qhead.load_gguf_tables(os.fspath(path), scheme, threads)
        t = _role(tt, role, "QuantTable.from_gguf")
        if not t.is_packed:
            raise qhead.InvalidArgumentError(f"QuantTable.from_gguf: the {role} table of {os.fspath(path)} is dense")
        return cls.from_table(t, dtype=dtype)

    # -- properties --

    @property
    def nbytes(self) -> int:
        """Bytes of the table's buffers."""
        return sum(b.numel() * b.element_size() for b in self._table_buffers() if b is not None)

    @property
    def scale_dtype(self) -> torch.dtype:
        return self.weight_scale.dtype

    @property
    def device(self) -> torch.device:
        return self.weight_packed.device

    @property
    def shape(self) -> Tuple[int, int]:
        return (self.vocab, self.hidden)

    def qscheme(self) -> "qhead.Scheme":
        """The scheme as a qhead.Scheme (with the scale dtype)."""
        return qhead.Scheme(self.scheme, _scale_dtype_name(self.weight_scale.dtype))

    def _table_buffers(self):
        return (self.weight_packed, self.weight_scale, self.weight_zero_point, self.col_perm)

    def table(self) -> "qhead.Table":
        """The qhead.Table over the current buffers (zero copy, on their device; cached)."""
        # The modules' eager path: the buffer objects and their version counters against the
        # ones the held Table was built from (cheaper than the cache key of table_from_tensors).
        b = self._buffers
        wp, ws, wz, cp = b["weight_packed"], b["weight_scale"], b["weight_zero_point"], b["col_perm"]
        h = self.__dict__.get("_hot")
        try:
            if (h is not None and h[0] is wp and h[1] is ws and h[2] is wz and h[3] is cp
                    and h[4] == wp._version and h[5] == ws._version and h[6] == wp.data_ptr()
                    and h[7] == ws.data_ptr() and (wz is None or h[8] == wz._version)
                    and (cp is None or h[9] == cp._version)):
                return h[10]
        except RuntimeError:  # inference tensors carry no version counter
            pass
        table = table_from_tensors(wp, ws, wz, cp, self.scheme, self.vocab, self.hidden)
        self.__dict__["_hot"] = (wp, ws, wz, cp, _version(wp), _version(ws), wp.data_ptr(), ws.data_ptr(),
                                 None if wz is None else _version(wz), None if cp is None else _version(cp), table)
        return table

    def op_args(self) -> Tuple[tuple, dict]:
        """(positional table tensors, keyword args) as the torch.ops.qhead ops take them."""
        return self._table_buffers(), {"scheme": self.scheme, "vocab": self.vocab, "hidden": self.hidden}

    def extra_repr(self) -> str:
        return (f"scheme={self.scheme}, vocab={self.vocab}, hidden={self.hidden}, "
                f"scale_dtype={self.weight_scale.dtype}, device={self.weight_packed.device}")

    # -- nn.Module hooks --

    def _apply(self, fn, recurse=True):
        # Moves between devices only: a float conversion of the enclosing model must not round the
        # scales (they are f16/bf16/f32 by the format, not by the model's compute dtype).
        for name, buf in list(self._buffers.items()):
            if buf is None:
                continue
            new = fn(buf)
            if new.dtype != buf.dtype:
                new = buf.to(device=new.device)
            self._buffers[name] = new
        if any(b is not None and b.device.type != "cpu" for b in self._buffers.values()):
            self._mapped = False
        self.__dict__.pop("_hot", None)
        return self

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        if self._mapped:  # the buffers are read-only views of a file mapping: load into fresh ones
            for name, buf in list(self._buffers.items()):
                if buf is not None:
                    self._buffers[name] = torch.empty_like(buf)
            self._mapped = False
        self.__dict__.pop("_hot", None)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)


def _role(tt, role: str, op: str):
    if role in ("head", "lm_head"):
        return tt.head
    if role in ("embedding", "embed", "embed_tokens"):
        return tt.embedding
    raise qhead.InvalidArgumentError(f"{op}: role must be 'head' or 'embedding', got {role!r}")


def _infer_scheme(wp: Tensor, ws: Tensor, wz: Optional[Tensor], vocab: int, hidden: int, prefix: str) -> str:
    """The scheme name of compressed-tensors tensors from their shapes (bits from the packed
    width; ambiguous shapes are an error asking for `scheme`)."""
    if wp.dim() != 2 or ws.dim() != 2 or hidden < 1:
        raise qhead.InvalidArgumentError(
            f"QuantTable.from_compressed_tensors: {prefix}: weight_packed / weight_scale must be 2-D")
    cols, groups = int(wp.shape[1]), int(ws.shape[1])
    bits = [b for b in range(2, 9) if (hidden * b + 31) // 32 == cols]
    if len(bits) != 1:
        raise qhead.InvalidArgumentError(
            f"QuantTable.from_compressed_tensors: {prefix}: weight_packed width {cols} for hidden {hidden} "
            f"fits bits {bits}; pass scheme=")
    name = f"w{bits[0]}"
    if groups > 1:
        if hidden % groups:
            raise qhead.InvalidArgumentError(
                f"QuantTable.from_compressed_tensors: {prefix}: {groups} scale groups do not divide hidden {hidden}")
        name += f"g{hidden // groups}"
    if wz is not None:
        name += "a"
    return name


class QuantEmbedding(nn.Module):
    """nn.Embedding over a QuantTable: forward(ids) with ids of any shape → ids.shape + [H].

    dtype: the output dtype (default: the table's dtype, the dense weight's it was made from);
    ``model.to(dtype)`` / ``.half()`` change it as they change a dense embedding's.
    embed_scale: a multiplier applied to the rows (Gemma multiplies its embeddings by
    sqrt(H)), rounded to the output dtype first as transformers does.
    """

    def __init__(self, table: QuantTable, *, dtype: Union[str, torch.dtype, None] = None,
                 embed_scale: Optional[float] = None, padding_idx: Optional[int] = None):
        super().__init__()
        if not isinstance(table, QuantTable):
            raise qhead.InvalidArgumentError(f"QuantEmbedding: table must be a QuantTable, got {type(table).__name__}")
        self.table = table
        self.dtype = table.dtype if dtype is None else _torch_dtype(dtype, "dtype")
        self.num_embeddings, self.embedding_dim = table.vocab, table.hidden
        self.padding_idx = padding_idx
        scale = None if embed_scale is None else torch.tensor(float(embed_scale), dtype=torch.float32,
                                                               device=table.device)
        self.register_buffer("embed_scale", scale, persistent=False)
        self._dense_rows: Optional[Callable[[], Tensor]] = None

    def use_dense_rows(self, rows: Optional[Callable[[], Tensor]]) -> None:
        """Gathers from the full-precision [V, H] rows that ``rows()`` returns instead of the packed
        table (None: back to the packed table). A tied model whose head rescores keeps those rows
        anyway (QuantLMHead's dense rows, on the CPU, the device or mapped from a file), so its
        embedding becomes exact at no extra memory while the packed table serves the head. The
        rows are read where they live and the result moved to the ids' device."""
        self._dense_rows = rows

    def _forward_dense(self, ids: Tensor) -> Tensor:
        rows = self._dense_rows()
        flat = ids.reshape(-1)
        if flat.dtype not in (torch.int32, torch.int64):
            raise qhead.InvalidArgumentError(f"embed: ids must be int32 or int64, got {flat.dtype}")
        if flat.numel() and not torch.compiler.is_compiling():
            lo, hi = (int(v) for v in torch.aminmax(flat))
            if lo < 0 or hi >= rows.shape[0]:
                raise qhead.InvalidArgumentError(
                    f"embed: ids [{flat.numel()}]: id {lo if lo < 0 else hi} is out of range [0, {rows.shape[0]})")
        out = rows.index_select(0, flat.to(rows.device)).to(device=ids.device, dtype=self.dtype)
        scale = self._buffers["embed_scale"]
        if scale is not None:
            out = out * scale.to(device=out.device, dtype=out.dtype)
        return out.view(*ids.shape, rows.shape[1])

    def _apply(self, fn, recurse=True):
        probe = fn(torch.zeros(0, dtype=self.dtype))
        if probe.dtype in _FLOAT_DTYPES:
            self.dtype = probe.dtype
        return super()._apply(fn, recurse)

    def forward(self, ids: Tensor) -> Tensor:
        if self._dense_rows is not None:
            return self._forward_dense(ids)
        t = self._modules["table"]  # (not self.table: nn.Module's __getattr__ costs a µs per call)
        flat = (ids if ids.dim() == 1 else ids.reshape(-1)).contiguous()
        wp = t._buffers["weight_packed"]
        if _eager(flat, wp):
            out = _empty(flat.shape[0], t.hidden, dtype=self.dtype, device=wp.device)
            _C.embed(t.table(), flat, out, stream=_stream(out))
        else:
            out = torch.ops.qhead.embed.default(*t._table_buffers(), flat, t.scheme, t.vocab, t.hidden, self.dtype)
        scale = self._buffers["embed_scale"]
        if scale is not None:
            out = out * scale.to(out.dtype)
        return out if ids.dim() == 1 else out.view(*ids.shape, t.hidden)

    def extra_repr(self) -> str:
        s = f"{self.num_embeddings}, {self.embedding_dim}, dtype={self.dtype}"
        s += "" if self.embed_scale is None else f", embed_scale={float(self.embed_scale):g}"
        return s + (", rows=dense" if self._dense_rows is not None else "")


class QuantLMHead(nn.Module):
    """nn.Linear(H, V, bias=False) over a QuantTable: forward(x) → logits [..., V] in x's dtype
    (computed in f32). .topk(x, k) → (values f32, ids i32, log-sum-exp f32) without the [M, V]
    logits.

    rescore=K > 0 makes the top-K logits of every row exact: the quantized logits' K largest
    entries are recomputed from the full-precision rows (qhead's rescore op) and written back.
    The rows: dense_weight (a [V, H] float tensor) kept in CPU memory (dense_rows="cpu", the
    default) or on the table's device (dense_rows="device", a buffer that follows .to()), or a
    safetensors file mapped in memory (dense_rows=path; dense_tensor names the tensor, default
    the only one of shape [V, H]). The dense rows are not part of the state dict.
    """

    def __init__(self, table: QuantTable, rescore: int = 0, dense_rows: Union[str, os.PathLike, None] = "cpu", *,
                 dense_weight: Optional[Tensor] = None, dense_tensor: Optional[str] = None):
        super().__init__()
        if not isinstance(table, QuantTable):
            raise qhead.InvalidArgumentError(f"QuantLMHead: table must be a QuantTable, got {type(table).__name__}")
        self.table = table
        self.in_features, self.out_features = table.hidden, table.vocab
        self.rescore = int(rescore)
        if self.rescore < 0 or self.rescore > table.vocab:
            raise qhead.InvalidArgumentError(f"QuantLMHead: rescore = {rescore} must be in [0, V = {table.vocab}]")
        self._dense_cpu: Optional[Tensor] = None
        self.register_buffer("dense_weight", None, persistent=False)
        self.dense_rows = None
        if self.rescore == 0:
            return
        shape = (table.vocab, table.hidden)
        if dense_rows in ("cpu", "device"):
            if not isinstance(dense_weight, Tensor):
                raise qhead.InvalidArgumentError(
                    f"QuantLMHead: rescore={rescore} with dense_rows={dense_rows!r} needs dense_weight, the "
                    f"full-precision [V, H] = {list(shape)} weight")
            if tuple(dense_weight.shape) != shape or dense_weight.dtype not in _FLOAT_DTYPES:
                raise qhead.InvalidArgumentError(
                    f"QuantLMHead: dense_weight must be a float32/float16/bfloat16 {list(shape)} tensor, got "
                    f"{dense_weight.dtype} {list(dense_weight.shape)}")
            w = dense_weight.detach()
            if dense_rows == "cpu":
                self._dense_cpu = w.to("cpu").contiguous()
            else:
                self.dense_weight = w.to(table.device).contiguous()
            self.dense_rows = dense_rows
        elif isinstance(dense_rows, (str, os.PathLike)):
            self._dense_cpu = mmap_safetensors_tensor(dense_rows, dense_tensor, shape)
            self.dense_rows = os.fspath(dense_rows)
        else:
            raise qhead.InvalidArgumentError(
                f"QuantLMHead: rescore={rescore} needs dense_rows 'cpu', 'device' or a safetensors path, got "
                f"{dense_rows!r}")

    def _dense(self) -> Tensor:
        return self._dense_cpu if self._dense_cpu is not None else self._buffers["dense_weight"]

    def _apply(self, fn, recurse=True):
        # The dense rows follow device moves only: a float conversion of the model must not
        # round the rows the logits are rescored from.
        dense = self._buffers.pop("dense_weight", None)
        try:
            super()._apply(fn, recurse)
        finally:
            if dense is not None:
                new = fn(dense)
                if new.dtype != dense.dtype:
                    new = dense.to(device=new.device)
                dense = new
            self._buffers["dense_weight"] = dense
        return self

    def _logits(self, x2: Tensor, dtype: torch.dtype) -> Tensor:
        """The logits [M, V] in dtype (f32, or f16/bf16 stored rounded by the kernels)."""
        t = self._modules["table"]
        wp = t._buffers["weight_packed"]
        if _eager(x2, wp):
            out = _empty(x2.shape[0], t.vocab, dtype=dtype, device=wp.device)
            _C.logits(t.table(), x2, out, stream=_stream(out))
            return out
        return torch.ops.qhead.logits.default(*t._table_buffers(), x2, t.scheme, t.vocab, t.hidden,
                                              None if dtype == torch.float32 else dtype)

    def _rescore(self, x2: Tensor, candidates: Tensor) -> Tuple[Tensor, Tensor]:
        """Exact (values, ids) of candidates [M, K], sorted descending, on x2's device."""
        dense = self._dense()
        dev = x2.device
        if dense.device != dev:
            v, i = torch.ops.qhead.rescore.default(dense, x2.to(dense.device), candidates.to(dense.device))
            return v.to(dev), i.to(dev)
        return torch.ops.qhead.rescore.default(dense, x2, candidates)

    def _flat(self, x: Tensor, op: str) -> Tensor:
        """x [..., H] as a contiguous [M, H] (a view when it can be)."""
        h = self.in_features
        if not isinstance(x, Tensor):
            raise qhead.InvalidArgumentError(f"QuantLMHead.{op}: x must be a torch.Tensor, got {type(x).__name__}")
        if x.dim() < 1 or x.size(-1) != h:
            raise qhead.InvalidArgumentError(
                f"QuantLMHead.{op}: x has shape {list(x.shape)}; its last dim must be H = {h}")
        return (x if x.dim() == 2 else x.reshape(-1, h)).contiguous()

    @staticmethod
    def _kernel_x(x2: Tensor) -> Tensor:
        # The CUDA kernels take f16/bf16 activations: f32 x is rounded to bf16 there (the range of
        # f32; the rescored logits use x as given).
        if x2.is_cuda and x2.dtype == torch.float32:
            return x2.to(torch.bfloat16)
        return x2

    def forward(self, x: Tensor) -> Tensor:
        x2 = self._flat(x, "forward")
        if not self.rescore:  # the kernels store the logits in x's dtype: no f32 copy, no conversion
            out = self._logits(self._kernel_x(x2), x.dtype)
        else:  # the candidates from the f32 logits, their exact values scattered, then x's dtype
            out = self._logits(self._kernel_x(x2), torch.float32)
            cand = torch.topk(out, self.rescore, dim=1, sorted=False).indices
            values, ids = self._rescore(x2, cand)
            out.scatter_(1, ids.long(), values)
            if x.dtype != torch.float32:
                out = out.to(x.dtype)
        return out if x.dim() == 2 else out.view(*x.shape[:-1], self.out_features)

    def topk(self, x: Tensor, k: int) -> Tuple[Tensor, Tensor, Tensor]:
        """The k largest logits of every row of x [..., H], sorted descending: values f32 [..., k],
        ids int32 [..., k], log-sum-exp f32 [...] (of the quantized logits). With rescore=K the
        values and order come from the full-precision rows over the top max(k, K) quantized
        candidates."""
        x2 = self._flat(x, "topk")
        xk = self._kernel_x(x2)
        t = self._modules["table"]
        k = int(k)
        kq = max(k, self.rescore) if self.rescore else k
        wp = t._buffers["weight_packed"]
        if _eager(xk, wp):
            dev, m = wp.device, xk.shape[0]
            values = _empty(m, kq, dtype=torch.float32, device=dev)
            ids = _empty(m, kq, dtype=torch.int32, device=dev)
            lse = _empty(m, dtype=torch.float32, device=dev)
            _C.topk(t.table(), xk, kq, values, ids, lse, stream=_stream(values))
        else:
            values, ids, lse = torch.ops.qhead.topk.default(*t._table_buffers(), xk, kq, t.scheme, t.vocab, t.hidden)
        if self.rescore:
            values, ids = self._rescore(x2, ids)
            values, ids = values[:, :k], ids[:, :k]
        if x.dim() == 2:
            return values, ids, lse
        lead = x.shape[:-1]
        return values.reshape(*lead, k), ids.reshape(*lead, k), lse.reshape(lead)

    def sample(self, x: Tensor, *, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
               min_p: float = 0.0, seed: int = 0, offset: int = 0) -> Tensor:
        """One token id (int32 [...]) per row of x [..., H], drawn exactly from softmax(logits /
        temperature) of the quantized head, truncated by top_k (0: none), top_p (1: none) and min_p
        (0: none), without storing [M, V]; temperature 0: the argmax. Reproducible: Philox4x32-10
        keyed by seed, with (row, offset, column) as counter; pass the decode step as offset.
        rescore does not apply: the draw is from the quantized logits."""
        x2 = self._flat(x, "sample")
        xk = self._kernel_x(x2)
        t = self._modules["table"]
        ids = torch.ops.qhead.sample.default(*t._table_buffers(), xk, float(temperature), int(top_k), float(top_p),
                                             float(min_p), int(seed), int(offset), t.scheme, t.vocab, t.hidden)
        return ids if x.dim() == 2 else ids.reshape(x.shape[:-1])

    def extra_repr(self) -> str:
        s = f"in_features={self.in_features}, out_features={self.out_features}, bias=False"
        return s + (f", rescore={self.rescore}, dense_rows={self.dense_rows!r}" if self.rescore else "")
