"""qhead: quantized LLM token tables (embedding / lm_head).

A table is stored in the compressed-tensors pack-quantized layout (int4 / int8,
per group or per row, symmetric or with zero points) and the ops run on it
directly: ``embed`` (gather rows), ``logits`` (x @ W^T), ``topk`` (top-k and
log-sum-exp without the [M, V] logits) and ``rescore`` (exact logits of
candidates from full-precision rows).

Arrays are anything with ``__dlpack__`` (numpy arrays, torch tensors on the CPU
or CUDA) and are used without copies. Outputs are written into the arrays given
as ``out`` / ``values`` / ``ids`` / ``lse``, or allocated in the framework of the
input: torch tensors in, torch tensors out on the same device; numpy in, numpy
out. ``import qhead`` does not import torch (except in a CUDA build with torch installed, which
imports torch first so that both use torch's CUDA libraries).

On CUDA tables the ops run on the ``stream`` given (a ``cudaStream_t`` as an
integer), else on torch's current stream for torch tensors.

Errors are :class:`qhead.Error` subclasses carrying the C++ message, which
names the op, the tensor and what was expected.
"""

from __future__ import annotations

import importlib.util as _ilu
import sys as _sys

# A CUDA build of _C needs libcublas and libnccl by soname, and torch's wheels bring their own
# copies under the same sonames. The process keeps whichever copy loads first: were _C to load
# the system's before torch, torch would run on libraries it was not built against (and abort
# while importing). So a CUDA build imports torch first when torch is installed; a CPU build
# never imports it.
try:
    from ._build import CUDA as _CUDA_BUILD
except ImportError:  # a source tree without the generated file
    _CUDA_BUILD = False
if _CUDA_BUILD and "torch" not in _sys.modules and _ilu.find_spec("torch") is not None:
    import torch as _torch  # noqa: F401

from . import _C
from ._C import (  # noqa: F401  (re-exported)
    Error,
    GgufFile,
    InternalError,
    InvalidArgumentError,
    InvalidFileError,
    IoError,
    ModelInfo,
    Role,
    Scheme,
    Table,
    TokenTables,
    UnsupportedError,
    cuda_allocated_bytes,
    cuda_available,
    cuda_synchronize,
    inspect_model,
    load_gguf_tables,
    load_model_tables,
    load_packed,
    num_threads,
    quantize,
    quantize_roles,
    set_num_threads,
    set_cpu_activations,
    cpu_activations,
    cpu_int8_available,
)

__version__ = _C.__version__

__all__ = [
    "Error", "InvalidArgumentError", "InvalidFileError", "IoError", "UnsupportedError", "InternalError",
    "Scheme", "Table", "TokenTables", "ModelInfo", "Role", "GgufFile",
    "quantize", "quantize_roles", "load_packed", "inspect_model", "load_model_tables", "load_gguf_tables",
    "embed", "logits", "topk", "sample", "rescore", "to_device",
    "set_num_threads", "num_threads", "set_cpu_activations", "cpu_activations", "cpu_int8_available",
    "cuda_available", "cuda_synchronize", "cuda_allocated_bytes",
    "__version__",
]

# ---- output allocation in the input's framework ----------------------------------------------

_NUMPY_DTYPES = {"f32": "float32", "f16": "float16", "i32": "int32"}


def _torch_of(a):
    """torch, when `a` is a torch tensor (torch is only looked up, never imported here)."""
    torch = _sys.modules.get("torch")
    if torch is not None and isinstance(a, torch.Tensor):
        return torch
    return None


def _dtype_name(dtype, op):
    """'f32' / 'f16' / 'bf16' from a string, a numpy dtype or a torch dtype."""
    if dtype is None:
        return "f32"
    if isinstance(dtype, str):
        s = dtype.lower()
    else:
        s = str(dtype).lower()
        s = s.rsplit(".", 1)[-1]  # torch.float16 -> float16
        s = s.replace("<class 'numpy.", "").rstrip("'>")
    names = {"f32": "f32", "float32": "f32", "float": "f32", "f16": "f16", "float16": "f16", "half": "f16",
             "bf16": "bf16", "bfloat16": "bf16"}
    if s not in names:
        raise InvalidArgumentError(f"{op}: dtype must be f32, f16 or bf16, got {dtype!r}")
    return names[s]


def _empty(like, shape, dtype, op):
    """A new array of `shape` and dtype name `dtype` in the framework (and on the device) of `like`,
    or None when `like` is not a numpy array or a torch tensor (the op then reports the bad argument)."""
    torch = _torch_of(like)
    if torch is not None:
        t = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16, "i32": torch.int32}[dtype]
        return like.new_empty(shape, dtype=t)  # torch, on like's device
    np = _sys.modules.get("numpy")
    if np is not None and isinstance(like, np.ndarray):
        if dtype not in _NUMPY_DTYPES:
            raise UnsupportedError(f"{op}: numpy has no {dtype} arrays; pass torch tensors or an out array")
        return np.empty(shape, dtype=_NUMPY_DTYPES[dtype])
    return None


def _rows(a):
    """Leading dim of an array (1 for anything without a shape), for sizing outputs only."""
    shape = getattr(a, "shape", None)
    return int(shape[0]) if shape is not None and len(shape) >= 1 else 1


def _py_stream_of(tp):
    """How the wrappers find the CUDA stream for arrays of type `tp` (cached per type): None when _C finds it
    itself (torch >= 2.10 tells it through the DLPack exchange API) or the type has no CUDA arrays; for an
    older torch, a function returning torch's current stream of a CUDA tensor."""
    f = _STREAM_OF.get(tp)
    if f is None:
        torch = _sys.modules.get("torch")
        if torch is not None and issubclass(tp, torch.Tensor) and \
                getattr(tp, "__dlpack_c_exchange_api__", None) is None:
            def f(a):
                return torch.cuda.current_stream(a.device).cuda_stream if a.is_cuda else None
        else:
            f = False
        _STREAM_OF[tp] = f
    return f


_STREAM_OF = {}


def _stream(a, stream):
    """The stream keyword for _C: the caller's, else torch's current stream where _C cannot ask torch itself."""
    if stream is not None:
        return stream
    f = _STREAM_OF.get(type(a))
    if f is None:
        f = _py_stream_of(type(a))
    return f(a) if f else None


# ---- ops -----------------------------------------------------------------------------------------

def embed(table, ids, out=None, *, dtype=None, stream=None):
    """Rows of the table for token ids, dequantized: out[n, :] = W[ids[n], :].

    table: Table [V, H]; ids: int32/int64 [N], each in [0, V); out: f32/f16/bf16 [N, H], written and
    returned. Without out, one is allocated like ids (torch/numpy, same device) with dtype (f32 unless
    given: "f32", "f16", "bf16" or a numpy/torch dtype).
    """
    if out is None:
        out = _empty(ids, (_rows(ids), table.hidden), _dtype_name(dtype, "embed"), "embed")
    _C.embed(table, ids, out, stream=_stream(ids, stream))
    return out


def logits(table, x, out=None, *, dtype=None, stream=None):
    """out[m, v] = sum_j x[m, j] * W[v, j] (f32 accumulation).

    table: Table [V, H]; x: f32/f16/bf16 [M, H]; out: f32/f16/bf16 [M, V], written and returned (a 16-bit
    out holds the f32 logits rounded to nearest even). Without out, one is allocated like x with dtype
    (f32 unless given: "f32", "f16", "bf16" or a numpy/torch dtype).
    """
    if out is None:
        out = _empty(x, (_rows(x), table.vocab), _dtype_name(dtype, "logits"), "logits")
    _C.logits(table, x, out, stream=_stream(x, stream))
    return out


def topk(table, x, k, values=None, ids=None, lse=None, *, stream=None):
    """The k largest logits of each row of x (sorted descending, ties: lower id first) and the
    log-sum-exp of every row, without storing the [M, V] logits.

    x: f32/f16/bf16 [M, H]; returns (values f32 [M, k], ids int32 [M, k], lse f32 [M]), allocated like x
    where not given. 1 <= k <= V.
    """
    m = _rows(x)
    kk = k if isinstance(k, int) and 1 <= k <= table.vocab else 0  # a bad k: the op reports it
    if values is None:
        values = _empty(x, (m, kk), "f32", "topk")
    if ids is None:
        ids = _empty(x, (m, kk), "i32", "topk")
    if lse is None:
        lse = _empty(x, (m,), "f32", "topk")
    _C.topk(table, x, k, values, ids, lse, stream=_stream(x, stream))
    return values, ids, lse


def sample(table, x, ids=None, *, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=0, offset=0, stream=None):
    """One token id per row of x, drawn exactly from softmax(logits / temperature) truncated by top_k
    (0: none), top_p (1: none) and min_p (0: none), without storing the [M, V] logits; temperature 0:
    the argmax. Reproducible: Philox4x32-10 keyed by seed, counter (row, offset, column); pass the
    decode step as offset.

    x: f32/f16/bf16 [M, H]; returns ids int32 [M], allocated like x where not given.
    """
    if ids is None:
        ids = _empty(x, (_rows(x),), "i32", "sample")
    _C.sample(table, x, ids, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, seed=seed,
              offset=offset, stream=_stream(x, stream))
    return ids


def rescore(dense_table, x, candidates, values=None, ids=None, *, stream=None):
    """Exact logits of candidate ids from a dense (full-precision) table, re-sorted descending
    (ties: lower id first).

    dense_table: a dense Table [V, H]; x: f32/f16/bf16 [M, H]; candidates: int32/int64 [M, k].
    Returns (values f32 [M, k], ids int32 [M, k]), allocated like x where not given.
    """
    shape = tuple(getattr(candidates, "shape", (_rows(x), 1)))
    if len(shape) != 2:
        shape = (_rows(x), 1)  # the op reports the candidates' shape
    if values is None:
        values = _empty(x, shape, "f32", "rescore")
    if ids is None:
        ids = _empty(x, shape, "i32", "rescore")
    _C.rescore(dense_table, x, candidates, values, ids, stream=_stream(x, stream))
    return values, ids


def to_device(table, device="cuda"):
    """The table on "cuda" (one device allocation) or "cpu"; the same storage when it is there already."""
    return table.to_device(device)
