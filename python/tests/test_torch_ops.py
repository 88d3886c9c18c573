"""torch.ops.qhead.{embed, logits, topk, rescore} against a float64 oracle on the dequantized
weights (torch_oracle.py derives the bounds), every output poisoned first; opcheck; bad inputs;
the table cache."""

from __future__ import annotations

import gc

import pytest
import torch

import qhead
import qhead.torch as qt
from torch_oracle import (assert_close_bound, check_topk, cuda_bound, dequantize, oracle_logits, poison_empty,
                          random_weight, random_x)

CUDA = torch.cuda.is_available() and qhead.cuda_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU and a CUDA build of qhead")
ACT = [torch.float32, torch.float16, torch.bfloat16]


@pytest.fixture(autouse=True)
def poisoned(monkeypatch):
    """Every output the ops allocate starts as NaN / INT_MIN (the Python kernels allocate through
    qt._empty, the C++ kernels poison when asked)."""
    monkeypatch.setattr(qt, "_empty", poison_empty)
    qt._poison_outputs(True)
    yield
    qt._poison_outputs(False)


_tables = {}


def table(scheme: str, v: int, h: int, scale_dtype="f16", seed=1) -> qt.QuantTable:
    key = (scheme, v, h, scale_dtype, seed)
    if key not in _tables:
        _tables[key] = qt.QuantTable.from_dense(random_weight(v, h, seed), scheme, scale_dtype=scale_dtype)
    return _tables[key]


def call(op, t: qt.QuantTable, *args, **kw):
    tensors, kws = t.op_args()
    return getattr(torch.ops.qhead, op)(*tensors, *args, **kws, **kw)


def check_all_ops(t: qt.QuantTable, m: int, act: torch.dtype, seed: int, ks=(1, 5), device="cpu"):
    w = dequantize(t)
    x = random_x((m, t.hidden), seed, act)
    want, tol = oracle_logits(w, x) if device == "cpu" else cuda_bound(w, x, w.shape[1] // _glen(t))
    xd = x.to(device)
    what = f"{t.scheme}/{t.weight_scale.dtype} V={t.vocab} H={t.hidden} M={m} x={act} {device}"
    # logits
    out = call("logits", t, xd)
    assert out.dtype == torch.float32 and out.device.type == device
    assert_close_bound(out, want, tol, "logits " + what)
    # logits stored in 16 bits: the same f32 logits, rounded to nearest even (bit for bit)
    for out_dtype in (torch.float16, torch.bfloat16):
        o16 = call("logits", t, xd, out_dtype=out_dtype)
        assert o16.dtype == out_dtype and o16.shape == out.shape and o16.device.type == device
        assert torch.equal(o16, out.to(out_dtype)), f"logits {what} out={out_dtype}"
    # topk
    for k in ks:
        k = min(k, t.vocab)
        values, ids, lse = call("topk", t, xd, k)
        assert values.dtype == torch.float32 and ids.dtype == torch.int32 and lse.dtype == torch.float32
        check_topk(values, ids, lse, want, tol, k, f"topk k={k} " + what)
    # embed: exact dequantized rows, rounded once to the output dtype
    g = torch.Generator().manual_seed(seed + 7)
    ids = torch.cat([torch.tensor([0, t.vocab - 1]), torch.randint(0, t.vocab, (5,), generator=g)])
    for id_dtype, out_dtype in ((torch.int64, torch.float32), (torch.int32, torch.float16), (torch.int64, torch.bfloat16)):
        rows = call("embed", t, ids.to(id_dtype).to(device), out_dtype=out_dtype)
        assert rows.dtype == out_dtype and rows.shape == (ids.numel(), t.hidden)
        assert torch.equal(rows.cpu(), w[ids].to(out_dtype)), f"embed {what} out={out_dtype}"


def _glen(t):
    from torch_oracle import parse_scheme
    _, gs, _ = parse_scheme(t.scheme)
    return t.hidden if gs < 0 else gs


SCHEMES = ["w4g32", "w4g64", "w4g128a", "w8", "w8g64a", "w4a"]


@pytest.mark.parametrize("act", ACT, ids=str)
@pytest.mark.parametrize("scheme,scale_dtype", list(zip(SCHEMES, ["f16", "bf16", "f32", "f16", "bf16", "f32"])))
def test_ops_small(scheme, scale_dtype, act):
    check_all_ops(table(scheme, 37, 128, scale_dtype), 3, act, seed=11)


@pytest.mark.parametrize("v,h,m", [(1, 64, 1), (3, 64, 3), (3, 96, 17), (50257, 64, 1), (50257, 64, 17)])
def test_ops_shapes(v, h, m):
    scheme = {1: "w4g32", 3: "w8", 17: "w4g32a"}[m] if v < 100 else ("w4g64" if m == 1 else "w8g32a")
    act = {1: torch.float32, 3: torch.bfloat16, 17: torch.float16}[m]
    check_all_ops(table(scheme, v, h, "bf16" if m == 3 else "f16"), m, act, seed=v + m, ks=(1, 50) if v > 50 else (1,))


def test_ops_col_perm():
    # A GPTQ act-order style table: same codes, columns stored permuted.
    base = table("w4g32a", 37, 128)
    perm = torch.randperm(128, generator=torch.Generator().manual_seed(3)).to(torch.int32)
    t = qt.QuantTable.from_tensors(base.weight_packed, base.weight_scale, base.weight_zero_point, scheme="w4g32a",
                                   shape=(37, 128), col_perm=perm)
    w = dequantize(t)
    assert torch.equal(w[:, perm.long()], dequantize(base))
    check_all_ops(t, 3, torch.float32, seed=5)


def test_rescore_op():
    w = random_weight(50, 96, 21, torch.bfloat16).contiguous()
    x = random_x((4, 96), 22, torch.float32)
    cand = torch.tensor([[3, 7, 49, 0], [1, 1, 2, 3], [10, 20, 30, 40], [49, 48, 47, 46]], dtype=torch.int64)
    want, tol = oracle_logits(w.to(torch.float64), x)
    values, ids = torch.ops.qhead.rescore(w, x, cand)
    assert values.dtype == torch.float32 and ids.dtype == torch.int32
    assert_close_bound(values, want.gather(1, ids.long()), tol.gather(1, ids.long()), "rescore values")
    assert (values[:, :-1] >= values[:, 1:]).all()
    for m in range(4):
        assert sorted(ids[m].tolist()) == sorted(cand[m].tolist())
    v32, i32 = torch.ops.qhead.rescore(w, x, cand.to(torch.int32))
    assert torch.equal(v32, values) and torch.equal(i32, ids)


# ---- opcheck ----------------------------------------------------------------------------------------

def test_opcheck():
    t = table("w4g32a", 37, 64)
    tensors, kw = t.op_args()
    x = random_x((3, 64), 1, torch.float16)
    ids = torch.tensor([0, 36, 5], dtype=torch.int64)
    torch.library.opcheck(torch.ops.qhead.embed.default, (*tensors, ids), dict(kw, out_dtype=torch.bfloat16))
    torch.library.opcheck(torch.ops.qhead.logits.default, (*tensors, x), kw)
    torch.library.opcheck(torch.ops.qhead.logits.default, (*tensors, x), dict(kw, out_dtype=torch.float16))
    torch.library.opcheck(torch.ops.qhead.topk.default, (*tensors, x, 4), kw)
    dense = random_weight(37, 64, 2)
    cand = torch.tensor([[0, 1], [2, 3], [36, 4]], dtype=torch.int64)
    torch.library.opcheck(torch.ops.qhead.rescore.default, (dense, x.float(), cand), {})


def test_fake_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode
    t = table("w8", 37, 64)
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        tensors = [None if a is None else mode.from_tensor(a) for a in t.op_args()[0]]
        kw = t.op_args()[1]
        x = torch.empty((5, 64), dtype=torch.bfloat16)
        assert call_fake("logits", tensors, kw, x).shape == (5, 37)
        l16 = call_fake("logits", tensors, kw, x, out_dtype=torch.bfloat16)
        assert l16.shape == (5, 37) and l16.dtype == torch.bfloat16
        v, i, l = call_fake("topk", tensors, kw, x, 3)
        assert (v.shape, i.shape, l.shape, i.dtype) == ((5, 3), (5, 3), (5,), torch.int32)
        e = call_fake("embed", tensors, kw, torch.empty((7,), dtype=torch.int64), out_dtype=torch.float16)
        assert e.shape == (7, 64) and e.dtype == torch.float16


def call_fake(op, tensors, kw, *args, **more):
    return getattr(torch.ops.qhead, op)(*tensors, *args, **kw, **more)


# ---- bad inputs -------------------------------------------------------------------------------------

def test_ids_out_of_range():
    t = table("w4g32", 37, 64)
    for bad in ([0, 37], [-1], [2**40]):
        with pytest.raises(qhead.InvalidArgumentError, match="out of range"):
            call("embed", t, torch.tensor(bad, dtype=torch.int64), out_dtype=torch.float32)


def test_wrong_dtypes():
    t = table("w4g32", 37, 64)
    with pytest.raises(qhead.InvalidArgumentError, match="x must be F32/F16/BF16"):
        call("logits", t, torch.zeros((2, 64), dtype=torch.float64))
    with pytest.raises(qhead.InvalidArgumentError, match="x must be F32/F16/BF16"):
        call("topk", t, torch.zeros((2, 64), dtype=torch.int32), 2)
    with pytest.raises(qhead.InvalidArgumentError, match="ids must be I32 or I64"):
        call("embed", t, torch.zeros((2,), dtype=torch.float32), out_dtype=torch.float32)
    with pytest.raises(qhead.InvalidArgumentError, match="out must be F32/F16/BF16"):
        call("embed", t, torch.zeros((2,), dtype=torch.int64), out_dtype=torch.float64)
    tensors, kw = t.op_args()
    with pytest.raises(qhead.InvalidArgumentError, match="weight_scale"):
        torch.ops.qhead.logits(tensors[0], tensors[1].to(torch.int32), None, None, torch.zeros((1, 64)), **kw)
    with pytest.raises(qhead.InvalidArgumentError, match="[Ss]cheme|w9"):
        torch.ops.qhead.logits(*tensors, torch.zeros((1, 64)), scheme="w9g32", vocab=37, hidden=64)


def test_wrong_shapes():
    t = table("w4g32", 37, 64)
    with pytest.raises(qhead.InvalidArgumentError, match="last dim must equal H"):
        call("logits", t, torch.zeros((2, 65)))
    with pytest.raises(qhead.InvalidArgumentError, match="x must be 2-D"):
        call("logits", t, torch.zeros((2, 1, 64)))
    with pytest.raises(qhead.InvalidArgumentError, match="k = 38"):
        call("topk", t, torch.zeros((1, 64)), 38)
    with pytest.raises(qhead.InvalidArgumentError, match="k = 0"):
        call("topk", t, torch.zeros((1, 64)), 0)
    tensors, kw = t.op_args()
    with pytest.raises(qhead.Error, match=r"expected shape \[36, 8\]"):  # the shape does not match the tensors
        torch.ops.qhead.logits(*tensors, torch.zeros((1, 64)), scheme="w4g32", vocab=36, hidden=64)


def test_non_contiguous():
    t = table("w4g32", 37, 64)
    x = torch.zeros((64, 3)).T
    with pytest.raises(qhead.InvalidArgumentError, match="x must be contiguous"):
        call("logits", t, x)
    with pytest.raises(qhead.InvalidArgumentError, match="x must be contiguous"):
        call("topk", t, x, 2)
    with pytest.raises(qhead.InvalidArgumentError, match="ids must be contiguous"):
        call("embed", t, torch.zeros((4,), dtype=torch.int64)[::2], out_dtype=torch.float32)
    wp, ws = t.weight_packed, t.weight_scale
    with pytest.raises(qhead.InvalidArgumentError, match="weight_scale"):  # a table's tensors must be contiguous too
        torch.ops.qhead.logits(wp, ws.T.contiguous().T, None, None, torch.zeros((1, 64)),
                               scheme="w4g32", vocab=37, hidden=64)


def test_table_tensors_must_be_tensors():
    t = table("w4g32", 37, 64)
    with pytest.raises(qhead.InvalidArgumentError, match="weight_scale must be a torch.Tensor"):
        qt.table_from_tensors(t.weight_packed, t.weight_scale.numpy(), None, None, "w4g32", 37, 64)


def test_nan_scale_rejected():
    t = table("w4g32", 37, 64)
    ws = t.weight_scale.clone()
    ws[5, 1] = float("nan")
    with pytest.raises(qhead.Error, match=r"weight_scale\[5, 1\] is nan"):
        torch.ops.qhead.logits(t.weight_packed, ws, None, None, torch.zeros((1, 64)), scheme="w4g32",
                               vocab=37, hidden=64)


@needs_cuda
def test_wrong_device():
    t = table("w4g32", 37, 64)
    tc = qt.QuantTable.from_dense(random_weight(37, 64, 1), "w4g32").to("cuda")
    with pytest.raises(qhead.InvalidArgumentError, match="cpu|CPU"):
        call("logits", tc, torch.zeros((1, 64), dtype=torch.float16))
    with pytest.raises(qhead.InvalidArgumentError, match="F16 or BF16"):  # the CUDA kernels' activations
        call("logits", tc, torch.zeros((1, 64), device="cuda"))
    with pytest.raises(qhead.InvalidArgumentError, match="cuda|CUDA"):
        call("logits", t, torch.zeros((1, 64), device="cuda"))
    with pytest.raises(qhead.InvalidArgumentError, match="share one device"):
        torch.ops.qhead.logits(t.weight_packed, t.weight_scale.cuda(), None, None, torch.zeros((1, 64)),
                               scheme="w4g32", vocab=37, hidden=64)


# ---- the cache --------------------------------------------------------------------------------------

def test_cache_reuses_and_rebuilds():
    t = qt.QuantTable.from_dense(random_weight(37, 64, 9), "w4g32")
    a, b = t.table(), t.table()
    assert a is b  # built once
    x = random_x((1, 64), 3)
    before = call("logits", t, x)
    with torch.no_grad():
        t.weight_scale.mul_(2)  # in place: the version counter moves, the table is rebuilt
    c = t.table()
    assert c is not a
    after = call("logits", t, x)
    assert torch.allclose(after, 2 * before, rtol=1e-6, atol=1e-6)
    t.weight_scale[0, 0] = float("inf")  # an in-place change is validated again
    with pytest.raises(qhead.Error, match=r"weight_scale\[0, 0\] is inf"):
        call("logits", t, x)


def test_cache_drops_collected_tensors():
    qt.clear_table_cache()
    t = qt.QuantTable.from_dense(random_weight(37, 64, 10), "w4g32")
    call("logits", t, random_x((1, 64), 3))
    assert qt.table_cache_info()[0] == 1
    del t
    gc.collect()
    assert qt.table_cache_info()[0] == 0


@pytest.mark.skipif(qt.OPS != "cpp", reason="qhead was built without torch: the ops are registered from Python")
def test_cpp_registration_runs():
    # The kernels of qhead/_torch_ops (TORCH_LIBRARY in torch_ops.cc), not a Python kernel.
    for op in ("embed", "logits", "topk", "rescore"):
        dump = torch._C._dispatch_dump(f"qhead::{op}")
        for key in ("CPU", "CUDA", "Meta"):
            line = next(l for l in dump.splitlines() if l.startswith(key + ":"))
            assert "torch_ops.cc" in line, line
    t = qt.QuantTable.from_dense(random_weight(37, 64, 11), "w4g32")
    x = random_x((2, 64), 3)
    qt.clear_table_cache()
    n0, b0 = qt.table_cache_info()
    first = call("logits", t, x)
    assert qt.table_cache_info() == (n0 + 1, b0 + 1)  # built once in C++ ...
    assert torch.equal(call("logits", t, x), first)
    v, i, _ = call("topk", t, x, 3)
    assert qt.table_cache_info() == (n0 + 1, b0 + 1)  # ... then found by every op
    assert torch.equal(v, torch.topk(first, 3).values)
    with torch.no_grad():
        t.weight_scale.mul_(2)  # in place: rebuilt
    assert torch.allclose(call("logits", t, x), 2 * first, rtol=1e-6, atol=1e-6)
    assert qt.table_cache_info()[1] == b0 + 2
    # A C++ kernel's qhead::Error is the qhead.Error subclass of its code, with its message.
    with pytest.raises(qhead.InvalidArgumentError, match=r"^qhead::logits: x must be 2-D"):
        call("logits", t, torch.zeros((64,)))
    # Meta tensors: shapes and dtypes only.
    meta = [b.to("meta") for b in t.op_args()[0] if b is not None]
    out = torch.ops.qhead.logits(meta[0], meta[1], None, None, torch.empty((5, 64), device="meta"),
                                 scheme="w4g32", vocab=37, hidden=64)
    assert out.shape == (5, 37) and out.dtype == torch.float32 and out.device.type == "meta"


def test_ops_from_several_threads():
    # The ops (the C++ kernels' cache and allocation included) called from threads at once give
    # what they give alone.
    import threading
    tables = [table("w4g32", 37, 64), table("w8", 50, 32, seed=3)]
    xs = [random_x((3, 64), 1), random_x((2, 32), 2)]
    want = [call("logits", t, x) for t, x in zip(tables, xs)]
    errors = []

    def work(i):
        try:
            for j in range(30):
                k = (i + j) % 2
                if j % 3 == 0:
                    qt.clear_table_cache()
                got = call("logits", tables[k], xs[k])
                if not torch.equal(got, want[k]):
                    errors.append((i, j))
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(repr(e))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == []


# ---- CUDA -------------------------------------------------------------------------------------------

@needs_cuda
@pytest.mark.parametrize("act", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("scheme,v,h,m", [("w4g32", 37, 128, 3), ("w8g64a", 50257, 64, 17), ("w4g64", 3, 64, 1),
                                          ("w4g128a", 1, 128, 1)])
def test_ops_cuda(scheme, v, h, m, act):
    t = qt.QuantTable.from_dense(random_weight(v, h, 4), scheme).to("cuda")
    check_all_ops(t, m, act, seed=8, ks=(1, 5) if v > 5 else (1,), device="cuda")


@needs_cuda
def test_ops_cuda_stream():
    t = qt.QuantTable.from_dense(random_weight(257, 128, 4), "w4g32").to("cuda")
    x = random_x((3, 128), 5, torch.float16).cuda()
    ref = call("logits", t, x)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        out = call("logits", t, x)
    s.synchronize()
    assert torch.equal(out, ref)
