"""Tests of the qhead core package (qhead._C and python/qhead/__init__.py).

Every op runs against a float64 numpy oracle on the table's dequantized
weights (Table.dequantize(), itself checked against compressed-tensors'
decompression of the fixtures), with outputs poisoned with NaN (or an
impossible id) before each call. Error bounds, as tests/test_ops.cc derives
them: a logit is a length-H dot product accumulated in f32, so for any
summation order

    |computed - exact| <= (gamma_H(2^-24) + gamma_{H+4}(2^-53)) * sum_j |x_j w_j|,
    gamma_n(u) = n u / (1 - n u)

(Higham §3.1; the second term covers the oracle's own float64 rounding), with
x_j the activations as converted to f32 (f16 and bf16 widen exactly) and w_j
the dequantized weights. Embedded rows are exact: (q - z) * s is one f32
product, then rounded to the output dtype.
"""

import gc
import importlib.util
import math
import subprocess
import sys
import threading
import weakref

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

import qhead
from conftest import requires_cuda

U32 = 2.0**-24
U64 = 2.0**-53


def gamma(n, u):
    return n * u / (1 - n * u)


# ---- oracle ------------------------------------------------------------------------------------


def as_f64(a):
    """float64 numpy copy of a numpy array or torch tensor (bf16 widened exactly)."""
    if isinstance(a, torch.Tensor):
        return a.detach().to(torch.float64).cpu().numpy()
    return np.asarray(a, dtype=np.float64)


def oracle(table, x):
    """Oracle logits [M, V] and their bounds from the dequantized table."""
    w = table.dequantize().astype(np.float64) if table.is_packed else as_f64(table.dense_weight)
    xd = as_f64(x)
    h = w.shape[1]
    value = xd @ w.T
    tol = (gamma(h, U32) + gamma(h + 4, U64)) * (np.abs(xd) @ np.abs(w).T)
    return value, tol


def lse_tol(v, lse, max_tau):
    """Bound on a computed log-sum-exp (tests/test_ops.cc lse_tol, the fused path's, the looser)."""
    e = 2.0**-22 + 88 * U32
    delta = e + gamma(v, U32) * (1 + e)
    ev = -math.log1p(-delta) + 2 * (4.0 * (v + 2) * U64)
    return max_tau + ev + (abs(lse) + max_tau) * U32


def np_of(a):
    return a.detach().cpu().numpy() if isinstance(a, torch.Tensor) else np.asarray(a)


def rand_x(rng, m, h, dtype, framework):
    """Activations in [-1, 1), never zero, rounded into dtype, as a numpy array or torch tensor."""
    x = rng.uniform(-1, 1, size=(m, h)).astype(np.float32)
    x[x == 0] = 0.5
    if framework == "torch":
        return torch.from_numpy(x).to({"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}[dtype])
    assert dtype != "bf16", "numpy has no bf16"
    return x.astype({"f32": np.float32, "f16": np.float16}[dtype])


def rand_weight(rng, v, h):
    w = rng.standard_normal((v, h)).astype(np.float32)
    w[w == 0] = 0.25
    return w


def poisoned(like, shape, dtype):
    """An output array filled with NaN (floats) or an impossible id (ints)."""
    if isinstance(like, torch.Tensor):
        t = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16, "i32": torch.int32}[dtype]
        return torch.full(shape, -7 if dtype == "i32" else float("nan"), dtype=t)
    return np.full(shape, -7 if dtype == "i32" else np.nan, dtype={"f32": np.float32, "f16": np.float16,
                                                                   "i32": np.int32}[dtype])


# ---- checks ------------------------------------------------------------------------------------


def check_logits(table, x, value, tol):
    out = poisoned(x, (x.shape[0], table.vocab), "f32")
    got = qhead.logits(table, x, out)
    assert got is out
    g = np_of(out).astype(np.float64)
    assert np.all(np.isfinite(g)), "logits left entries unwritten"
    err = np.abs(g - value)
    assert np.all(err <= tol), f"logit error {err.max()} > bound {tol[np.unravel_index(err.argmax(), err.shape)]}"
    # The allocating form: same framework as x, same values.
    alloc = qhead.logits(table, x)
    assert type(alloc) is type(x)
    np.testing.assert_array_equal(np_of(alloc), np_of(out))
    # A 16-bit out: the same f32 logits rounded to nearest even, every entry written.
    o16 = poisoned(x, (x.shape[0], table.vocab), "f16")
    assert qhead.logits(table, x, o16) is o16
    np.testing.assert_array_equal(np_of(o16), np_of(out).astype(np.float16))
    np.testing.assert_array_equal(np_of(qhead.logits(table, x, dtype="f16")), np_of(o16))


def check_topk(table, x, k, value, tol):
    m = x.shape[0]
    vals, ids, lse = poisoned(x, (m, k), "f32"), poisoned(x, (m, k), "i32"), poisoned(x, (m,), "f32")
    r = qhead.topk(table, x, k, vals, ids, lse)
    assert r[0] is vals and r[1] is ids and r[2] is lse
    vals, ids, lse = np_of(vals).astype(np.float64), np_of(ids), np_of(lse).astype(np.float64)
    assert ids.dtype == np.int32
    for mi in range(m):
        row_ids = ids[mi]
        assert np.all((row_ids >= 0) & (row_ids < table.vocab)), row_ids
        assert len(set(row_ids.tolist())) == k, "ids repeat"
        v = vals[mi]
        assert np.all(np.isfinite(v))
        # sorted descending; equal values: lower id first
        for a in range(k - 1):
            assert v[a] > v[a + 1] or (v[a] == v[a + 1] and row_ids[a] < row_ids[a + 1])
        # each value within its bound of the oracle logit of its id
        assert np.all(np.abs(v - value[mi, row_ids]) <= tol[mi, row_ids])
        # no id left out beats a returned one by more than the two bounds
        out_mask = np.ones(table.vocab, bool)
        out_mask[row_ids] = False
        if out_mask.any():
            worst_in = np.min(value[mi, row_ids] + tol[mi, row_ids])
            best_out = np.max(value[mi, out_mask] - tol[mi, out_mask])
            assert best_out <= worst_in
        mx = value[mi].max()
        want = mx + math.log(np.exp(value[mi] - mx).sum())
        assert abs(lse[mi] - want) <= lse_tol(table.vocab, want, tol[mi].max())


def check_embed(table, w_deq, ids_np, framework, dtype):
    ids = torch.from_numpy(ids_np) if framework == "torch" else ids_np
    out = poisoned(ids if framework == "torch" else np.zeros(1), (len(ids_np), table.hidden), dtype)
    assert qhead.embed(table, ids, out) is out
    want = torch.from_numpy(w_deq[ids_np.astype(np.int64)])
    want = want.to({"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}[dtype])
    got = out if isinstance(out, torch.Tensor) else torch.from_numpy(out)
    assert torch.equal(got, want), "embedded rows differ from the dequantized rows"
    alloc = qhead.embed(table, ids, dtype=dtype) if (framework == "torch" or dtype != "bf16") else None
    if alloc is not None:
        assert type(alloc) is type(ids)
        assert torch.equal(alloc if isinstance(alloc, torch.Tensor) else torch.from_numpy(alloc), want)


# ---- op sweeps ---------------------------------------------------------------------------------

# (scheme, scale dtype): symmetric / asymmetric, grouped / per row, 4- and 8-bit.
SCHEMES = [("w4g32", "f16"), ("w4g64a", "bf16"), ("w8", "f32"), ("w8g32a", "f16"), ("w4", "bf16"), ("w8a", "f16"),
           ("w4g64", "f32"), ("w4a", "f16")]
# (V, H, M, activation dtype, framework); the scheme rotates through SCHEMES.
SHAPES = [
    (1, 64, 1, "f32", "numpy"), (1, 64, 3, "bf16", "torch"), (3, 64, 17, "f16", "numpy"), (3, 64, 1, "f32", "torch"),
    (37, 128, 3, "bf16", "torch"), (37, 128, 17, "f16", "torch"), (50257, 64, 1, "f32", "numpy"),
    (50257, 64, 3, "bf16", "torch"), (50257, 64, 17, "f16", "torch"), (3, 64, 3, "f16", "numpy"),
    (37, 128, 1, "f32", "numpy"), (1, 64, 17, "f32", "torch"),
]
CASES = [SHAPES[i] + SCHEMES[i % len(SCHEMES)] for i in range(len(SHAPES))]
_tables = {}


def table_for(v, h, scheme, scale_dtype):
    key = (v, h, scheme, scale_dtype)
    if key not in _tables:
        rng = np.random.default_rng(hash(key) % 2**32)
        w = rand_weight(rng, v, h)
        t = qhead.quantize(w, scheme, scale_dtype=scale_dtype)
        _tables[key] = (t, t.dequantize())
    return _tables[key]


@pytest.mark.parametrize("v,h,m,xdtype,framework,scheme,scale_dtype", CASES,
                         ids=[f"V{c[0]}-H{c[1]}-M{c[2]}-{c[3]}-{c[4]}-{c[5]}-{c[6]}" for c in CASES])
def test_ops_against_oracle(v, h, m, xdtype, framework, scheme, scale_dtype):
    table, w_deq = table_for(v, h, scheme, scale_dtype)
    assert table.scheme == qhead.Scheme(scheme, scale_dtype)
    assert table.shape == (v, h) and table.is_packed and table.device == "cpu"
    rng = np.random.default_rng(v * 131 + m)
    x = rand_x(rng, m, h, xdtype, framework)
    value, tol = oracle(table, x)
    check_logits(table, x, value, tol)
    for k in sorted({1, min(5, v), v if v <= 50 else 50}):
        check_topk(table, x, k, value, tol)
    ids = rng.integers(0, v, size=max(m, 2)).astype(np.int32 if m % 2 else np.int64)
    ids[0] = v - 1
    check_embed(table, w_deq, ids, framework, "f32")
    check_embed(table, w_deq, ids, framework, "f16")
    if framework == "torch":
        check_embed(table, w_deq, ids, framework, "bf16")


@pytest.mark.parametrize("wdtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("v,m", [(1, 1), (3, 17), (50257, 3)])
def test_dense_table_and_rescore(wdtype, v, m):
    rng = np.random.default_rng(v + m)
    h = 64
    w = torch.from_numpy(rand_weight(rng, v, h)).to({"f32": torch.float32, "f16": torch.float16,
                                                     "bf16": torch.bfloat16}[wdtype])
    dense = qhead.Table.dense(w)
    assert not dense.is_packed and dense.scheme is None and dense.dense_weight is w
    x = rand_x(rng, m, h, "bf16" if wdtype == "bf16" else "f32", "torch")
    value, tol = oracle(dense, x)
    check_logits(dense, x, value, tol)
    k = min(v, 4)
    check_topk(dense, x, k, value, tol)
    # rescore candidates (in scrambled order, as I64) from a quantized head's top-k
    q = qhead.quantize(w, "w4g32")
    _, cand, _ = qhead.topk(q, x, k)
    cand = cand.flip(1).to(torch.int64).contiguous()
    vals, ids = poisoned(x, (m, k), "f32"), poisoned(x, (m, k), "i32")
    assert qhead.rescore(dense, x, cand, vals, ids)[0] is vals
    for mi in range(m):
        assert sorted(ids[mi].tolist()) == sorted(cand[mi].tolist())
        r = ids[mi].numpy()
        assert np.all(np.abs(vals[mi].double().numpy() - value[mi, r]) <= tol[mi, r])
        vv = vals[mi].tolist()
        assert all(vv[a] > vv[a + 1] or (vv[a] == vv[a + 1] and r[a] < r[a + 1]) for a in range(k - 1))
    va, ia = qhead.rescore(dense, x, cand)
    assert torch.equal(va, vals) and torch.equal(ia, ids)


def test_numpy_in_numpy_out():
    rng = np.random.default_rng(5)
    t = qhead.quantize(rand_weight(rng, 40, 64), "w4g64")
    x = rand_x(rng, 2, 64, "f32", "numpy")
    lg = qhead.logits(t, x)
    v, i, lse = qhead.topk(t, x, 3)
    e = qhead.embed(t, np.array([0, 39], dtype=np.int64), dtype="f16")
    assert isinstance(lg, np.ndarray) and lg.dtype == np.float32 and lg.shape == (2, 40)
    assert v.dtype == np.float32 and i.dtype == np.int32 and lse.shape == (2,)
    assert isinstance(e, np.ndarray) and e.dtype == np.float16
    np.testing.assert_array_equal(i[:, 0], lg.argmax(1))
    with pytest.raises(qhead.UnsupportedError, match="embed: numpy has no bf16"):
        qhead.embed(t, np.array([1]), dtype="bf16")
    # _C takes every output; a stream is ignored for CPU tables
    out = poisoned(x, (2, 40), "f32")
    assert qhead._C.logits(t, x, out, stream=0) is None
    np.testing.assert_array_equal(out, lg)


# ---- tables: zero copy, lifetime, storage --------------------------------------------------------


def test_packed_table_zero_copy_and_lifetime():
    rng = np.random.default_rng(7)
    src = qhead.quantize(rand_weight(rng, 41, 64), "w4g32a", scale_dtype="f16")
    packed, scale, zp = (np.array(a) for a in (src.weight_packed, src.weight_scale, src.weight_zero_point))
    refs = [weakref.ref(a) for a in (packed, scale, zp)]
    t = qhead.Table.packed(packed, scale, zp, scheme="w4g32a", shape=(41, 64))
    assert t.scheme == qhead.Scheme("w4g32a", "f16")
    assert t.weight_packed is packed and t.weight_scale is scale and t.weight_zero_point is zp
    assert t.col_perm is None and t.dense_weight is None
    assert t.nbytes == packed.nbytes + scale.nbytes + zp.nbytes
    x = rand_x(rng, 3, 64, "f32", "numpy")
    before = qhead.logits(t, x)
    packed_copy = packed.copy()
    del packed, scale, zp
    gc.collect()
    assert all(r() is not None for r in refs), "the table must keep its arrays alive"
    np.testing.assert_array_equal(qhead.logits(t, x), before)
    np.testing.assert_array_equal(t.weight_packed, packed_copy)
    del t
    gc.collect()
    assert all(r() is None for r in refs), "a dropped table must release its arrays"


def test_torch_tables_zero_copy():
    rng = np.random.default_rng(8)
    q = qhead.quantize(rand_weight(rng, 33, 128), "w8g32a", scale_dtype="bf16")
    wp = torch.from_dlpack(q.weight_packed)
    ws = torch.from_dlpack(q.weight_scale)  # bf16: a DLPack array, numpy has no bf16
    wz = torch.from_dlpack(q.weight_zero_point)
    assert ws.dtype == torch.bfloat16
    t = qhead.Table.packed(wp, ws, wz, scheme=q.scheme, shape=q.shape)
    assert t.weight_packed is wp and t.weight_packed.data_ptr() == q.weight_packed.__array_interface__["data"][0]
    np.testing.assert_array_equal(t.dequantize(), q.dequantize())
    # Parameters (requires_grad) are tables too, read in place.
    p = torch.nn.Parameter(torch.from_numpy(rand_weight(rng, 5, 64)))
    d = qhead.Table.dense(p)
    assert d.dense_weight is p
    np.testing.assert_array_equal(d.dequantize(), p.detach().numpy())
    ref = weakref.ref(p)
    del p
    gc.collect()
    assert ref() is not None
    del d
    gc.collect()
    assert ref() is None


def test_exported_storage_is_zero_copy_and_outlives_the_table():
    rng = np.random.default_rng(9)
    w = rand_weight(rng, 20, 64)
    t = qhead.quantize(w, "w4g64")
    a, b = t.weight_packed, t.weight_packed
    assert isinstance(a, np.ndarray) and a.dtype == np.int32 and a.shape == (20, 8)
    assert np.shares_memory(a, b), "each access is a view of the one storage"
    assert t.weight_zero_point is None
    d = t.dequantize()
    del t
    gc.collect()
    t2 = qhead.Table.packed(a, qhead.quantize(w, "w4g64").weight_scale, scheme="w4g64", shape=(20, 64))
    np.testing.assert_array_equal(t2.dequantize(), d)
    dense = qhead.Table.dense(w)
    assert dense.dense_weight is w
    assert np.shares_memory(qhead.Table.dense(w[2:5]).dense_weight, w)


def test_dense_table_keeps_weight_alive():
    w = rand_weight(np.random.default_rng(10), 6, 64)
    ref = weakref.ref(w)
    t = qhead.Table.dense(w)
    x = np.ones((1, 64), np.float32)
    before = qhead.logits(t, x)
    del w
    gc.collect()
    assert ref() is not None
    np.testing.assert_array_equal(qhead.logits(t, x), before)
    del t
    gc.collect()
    assert ref() is None


def test_tables_released_from_other_threads():
    # Ops run with the GIL released; tables built from Python arrays are used
    # and dropped on several threads at once (the owner is released with the GIL).
    rng = np.random.default_rng(11)
    w = rand_weight(rng, 300, 64)
    x = rand_x(rng, 4, 64, "f32", "numpy")
    want = qhead.logits(qhead.Table.dense(w.copy()), x)
    errors = []

    def work():
        try:
            for _ in range(20):
                t = qhead.Table.dense(w.copy())
                np.testing.assert_array_equal(qhead.logits(t, x), want)
                del t
        except Exception as e:  # noqa: BLE001  (reported below)
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors


def test_same_storage_and_quantize_roles():
    rng = np.random.default_rng(12)
    emb = rand_weight(rng, 30, 64)
    tied = qhead.quantize_roles(emb, embedding_scheme="w4g32")
    assert tied.tied and tied.embedding.same_storage(tied.head)
    assert tied.embedding.scheme == qhead.Scheme("w4g32")
    head = rand_weight(rng, 30, 64)
    untied = qhead.quantize_roles(emb, head, embedding_scheme="w8", head_scheme=qhead.Scheme("w4g64a", "bf16"))
    assert not untied.tied and not untied.embedding.same_storage(untied.head)
    assert untied.head.scheme == qhead.Scheme("w4g64a", "bf16") and untied.embedding.scheme.name == "w8"
    np.testing.assert_array_equal(untied.head.dequantize(),
                                  qhead.quantize(head, "w4g64a", scale_dtype="bf16").dequantize())
    dense_head = qhead.quantize_roles(emb, head, embedding_scheme="w8")
    assert not dense_head.head.is_packed and np.shares_memory(dense_head.head.dense_weight, head)
    with pytest.raises(qhead.InvalidArgumentError, match="quantize_roles: tied table"):
        qhead.quantize_roles(emb, embedding_scheme="w4g32", head_scheme="w8")


def test_scheme():
    s = qhead.Scheme("w4g128a", "bf16")
    assert (s.bits, s.group_size, s.symmetric, s.scale_dtype, s.name) == (4, 128, False, "bf16", "w4g128a")
    assert qhead.Scheme("w8").group_size == -1 and qhead.Scheme("w8").scale_dtype == "f16"
    assert s == qhead.Scheme("w4g128a", "bfloat16") and s != qhead.Scheme("w4g128a")
    assert hash(s) == hash(qhead.Scheme("w4g128a", "bf16"))
    for bad in ("w9", "w4g48", "x4", ""):
        with pytest.raises(qhead.InvalidArgumentError, match="QuantScheme::parse"):
            qhead.Scheme(bad)
    with pytest.raises(qhead.InvalidArgumentError, match="scale_dtype"):
        qhead.Scheme("w4", "f64")


# ---- files -------------------------------------------------------------------------------------

CT_FIXTURES = [("w4g64_bf16", "model.embed_tokens", "w4g64", "bf16"), ("w4g32a_f16", "lm_head", "w4g32a", "f16"),
               ("w8_f32", "lm_head", "w8", "f32"), ("w8g128a_bf16", "model.embed_tokens", "w8g128a", "bf16"),
               ("w4a_f16", "lm_head", "w4a", "f16"), ("w3g32_bf16", "lm_head", "w3g32", "bf16")]


@pytest.mark.parametrize("name,prefix,scheme,scale_dtype", CT_FIXTURES, ids=[c[0] for c in CT_FIXTURES])
def test_load_packed_matches_compressed_tensors(fixtures_dir, name, prefix, scheme, scale_dtype):
    path = fixtures_dir / "ct" / f"{name}.safetensors"
    t = qhead.load_packed(str(path), prefix)
    assert t.scheme == qhead.Scheme(scheme, scale_dtype)
    ref = load_file(str(path))
    dec = ref["decompressed.weight"]
    assert t.shape == tuple(dec.shape)
    # compressed-tensors decompresses into the dense dtype: compare after the same rounding
    assert torch.equal(torch.from_numpy(t.dequantize()).to(dec.dtype), dec)
    # zero copy into the mapping: the arrays are read-only views of the file's tensors
    wp = t.weight_packed
    assert not wp.flags.writeable
    np.testing.assert_array_equal(wp, ref[f"{prefix}.weight_packed"].numpy())
    with pytest.raises(ValueError):
        wp[0, 0] = 1
    # the table keeps the mapping alive
    x = np.ones((1, t.hidden), np.float32)
    before = qhead.logits(t, x)
    del ref, wp
    gc.collect()
    np.testing.assert_array_equal(qhead.logits(t, x), before)
    # the scheme may be overridden (and is checked against the tensors)
    assert qhead.load_packed(str(path), prefix, scheme).scheme.name == scheme


def test_model_dirs(fixtures_dir):
    d = fixtures_dir / "ct_models"
    info = qhead.inspect_model(str(d / "tied"))
    assert (info.architecture, info.model_type, info.vocab, info.hidden, info.tied) == ("llama", "llama", 67, 64, True)
    assert info.quant_method == "compressed-tensors" and info.compressed_tensors
    assert info.embedding.tensor == "model.embed_tokens.weight" and info.embedding.format == "pack-quantized"
    assert info.embedding.packed and info.embedding.scheme == qhead.Scheme("w4g32", "bf16")
    assert info.head.tensor == "lm_head.weight" and info.table_bytes == info.embedding.bytes
    tt = qhead.load_model_tables(str(d / "tied"))
    assert tt.tied and tt.embedding.same_storage(tt.head)
    ref = load_file(str(d / "tied" / "reference.safetensors"))
    emb_ref = ref["embedding"]
    assert torch.equal(torch.from_numpy(tt.embedding.dequantize()).to(emb_ref.dtype), emb_ref)
    assert torch.equal(torch.from_numpy(tt.head.dequantize()).to(emb_ref.dtype), ref["head"])

    for name in ("untied", "sharded_untied", "ignore_re"):
        info = qhead.inspect_model(str(d / name))
        tt = qhead.load_model_tables(str(d / name))
        assert not info.tied and not tt.tied
        assert tt.head.scheme == info.head.scheme and tt.embedding.scheme == info.embedding.scheme
        assert info.table_bytes == info.embedding.bytes + info.head.bytes
    sharded = qhead.inspect_model(str(d / "sharded_untied"))
    assert sharded.embedding.file != sharded.head.file
    # explicit tensor names
    info = qhead.inspect_model(str(d / "untied"), embedding_tensor="model.embed_tokens.weight",
                               head_tensor="lm_head.weight")
    assert info.head.scheme.name == "w8a"
    with pytest.raises(qhead.Error) as e:
        qhead.inspect_model(str(d / "untied"), head_tensor="no.such.weight")
    assert "no.such" in str(e.value)


def test_gptq_model_dir(fixtures_dir):
    d = fixtures_dir / "gptq" / "gptqmodel_w4g32_actorder_asym"
    info = qhead.inspect_model(str(d))
    assert info.quant_method == "gptq" and info.head.format == "gptq" and info.head.act_order
    tt = qhead.load_model_tables(str(d))
    head = tt.head
    assert head.is_packed and head.col_perm is not None and head.col_perm.shape == (head.hidden,)
    # act-order tables run on permuted columns: the ops still match the oracle on the dequantized rows
    x = rand_x(np.random.default_rng(3), 3, head.hidden, "f32", "numpy")
    value, tol = oracle(head, x)
    check_logits(head, x, value, tol)
    check_topk(head, x, 4, value, tol)
    ids = np.array([0, head.vocab - 1, 5], np.int64)
    check_embed(head, head.dequantize(), ids, "numpy", "f32")


def test_gguf(fixtures_dir):
    g = qhead.GgufFile(str(fixtures_dir / "gguf" / "smollm2_slice.gguf"))
    assert g.version == 3
    assert g.names == ["token_embd.weight", "blk.0.ffn_gate.weight", "blk.0.attn_norm.weight"]
    assert "token_embd.weight" in g and "output.weight" not in g
    info = g.info("token_embd.weight")
    assert info["type"] == "Q8_0" and info["shape"] == (24, 576)
    assert g.get("general.architecture") == "llama" and g.get("no.such.key") is None
    assert g.keys[0] == "general.architecture"
    ref = load_file(str(fixtures_dir / "gguf" / "smollm2_slice.ref.safetensors"))
    tt = qhead.load_gguf_tables(str(fixtures_dir / "gguf" / "smollm2_slice.gguf"))
    assert tt.tied and not tt.embedding.is_packed
    np.testing.assert_array_equal(tt.embedding.dequantize(), ref["token_embd.weight"].numpy())
    q = qhead.load_gguf_tables(str(fixtures_dir / "gguf" / "smollm2_slice.gguf"), "w8")
    assert q.tied and q.embedding.scheme.name == "w8"
    np.testing.assert_array_equal(q.embedding.dequantize(),
                                  qhead.quantize(ref["token_embd.weight"], "w8").dequantize())
    with pytest.raises(qhead.InvalidArgumentError, match="no.such"):
        g.info("no.such")


def test_file_errors(fixtures_dir, tmp_path):
    with pytest.raises(qhead.IoError) as e:
        qhead.load_packed(str(tmp_path / "missing.safetensors"), "lm_head")
    assert isinstance(e.value, OSError) and e.value.code == "io" and "missing.safetensors" in str(e.value)
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUX" + b"\0" * 60)
    with pytest.raises(qhead.InvalidFileError) as e:
        qhead.GgufFile(str(bad))
    assert isinstance(e.value, ValueError) and e.value.code == "invalid_file" and "bad.gguf" in str(e.value)
    with pytest.raises(qhead.Error, match="lm_head"):
        qhead.load_packed(str(fixtures_dir / "ct" / "w4g64_bf16.safetensors"), "lm_head")
    with pytest.raises(qhead.InvalidFileError, match="config.json"):
        qhead.inspect_model(str(tmp_path))


# ---- bad inputs: the right exception, naming the op and the tensor, never a crash ---------------


@pytest.fixture(scope="module")
def small():
    rng = np.random.default_rng(13)
    w = rand_weight(rng, 50, 64)
    return qhead.quantize(w, "w4g32"), qhead.Table.dense(w)


def f32(*shape):
    return np.ones(shape, np.float32)


BAD_CALLS = [
    # (name, call(table, dense), exception, message fragment)
    ("x wrong dtype", lambda t, d: qhead.logits(t, np.ones((1, 64), np.int32)), qhead.InvalidArgumentError,
     "logits: x must be F32/F16/BF16"),
    ("x wrong ndim", lambda t, d: qhead.logits(t, f32(64)), qhead.InvalidArgumentError, "logits: x must have 2 dims"),
    ("x wrong H", lambda t, d: qhead.logits(t, f32(1, 63)), qhead.InvalidArgumentError, "logits: x has shape [1, 63]"),
    ("x None", lambda t, d: qhead.logits(t, None), qhead.InvalidArgumentError, "logits: x is None"),
    ("x not an array", lambda t, d: qhead.logits(t, [[1.0] * 64]), qhead.InvalidArgumentError,
     "logits: x must be an array"),
    ("x non-contiguous", lambda t, d: qhead.logits(t, f32(2, 128)[:, ::2]), qhead.InvalidArgumentError,
     "logits: x must be contiguous"),
    ("x non-contiguous torch", lambda t, d: qhead.logits(t, torch.ones(64, 2).t()), qhead.InvalidArgumentError,
     "logits: x must be contiguous"),
    ("x complex", lambda t, d: qhead.logits(t, np.ones((1, 64), np.complex64)), qhead.InvalidArgumentError,
     "logits: x has DLPack dtype"),
    ("x meta device", lambda t, d: qhead.logits(t, torch.ones(1, 64, device="meta")), qhead.InvalidArgumentError,
     "logits: x (torch.Tensor) could not be taken as an array through DLPack"),
    ("out None", lambda t, d: qhead._C.logits(t, f32(1, 64), None), qhead.InvalidArgumentError, "logits: out is None"),
    ("out wrong dtype", lambda t, d: qhead.logits(t, f32(1, 64), np.ones((1, 50), np.int32)),
     qhead.InvalidArgumentError, "logits: out must be F32/F16/BF16"),
    ("dtype not a float", lambda t, d: qhead.logits(t, f32(1, 64), dtype="i32"), qhead.InvalidArgumentError,
     "logits: dtype must be f32, f16 or bf16"),
    ("out wrong shape", lambda t, d: qhead.logits(t, f32(2, 64), f32(1, 50)), qhead.InvalidArgumentError,
     "logits: out must have shape [2, 50]"),
    ("out non-contiguous", lambda t, d: qhead.logits(t, f32(1, 64), f32(1, 100)[:, ::2]), qhead.InvalidArgumentError,
     "logits: out must be contiguous"),
    ("out read-only", lambda t, d: qhead.logits(t, f32(1, 64), np.broadcast_to(np.float32(0), (1, 50))),
     qhead.InvalidArgumentError, "logits: out (ndarray) is read-only"),
    ("ids out of range", lambda t, d: qhead.embed(t, np.array([3, 50])), qhead.InvalidArgumentError,
     "embed: ids[1] = 50 is out of range"),
    ("ids negative torch", lambda t, d: qhead.embed(t, torch.tensor([-1], dtype=torch.int32)),
     qhead.InvalidArgumentError, "embed: ids[0] = -1 is out of range"),
    ("ids float", lambda t, d: qhead.embed(t, np.array([1.0])), qhead.InvalidArgumentError,
     "embed: ids must be I32 or I64"),
    ("ids 2-D", lambda t, d: qhead.embed(t, np.array([[1]])), qhead.InvalidArgumentError, "embed: ids must have 1 dims"),
    ("ids None", lambda t, d: qhead.embed(t, None), qhead.InvalidArgumentError, "embed: ids is None"),
    ("embed out dtype", lambda t, d: qhead.embed(t, np.array([1]), np.ones((1, 64), np.int32)),
     qhead.InvalidArgumentError, "embed: out must be F32/F16/BF16"),
    ("embed bad dtype name", lambda t, d: qhead.embed(t, np.array([1]), dtype="f8"), qhead.InvalidArgumentError,
     "embed: dtype"),
    ("k zero", lambda t, d: qhead.topk(t, f32(1, 64), 0), qhead.InvalidArgumentError, "topk: k = 0"),
    ("k above V", lambda t, d: qhead.topk(t, f32(1, 64), 51), qhead.InvalidArgumentError, "topk: k = 51"),
    ("k negative", lambda t, d: qhead.topk(t, f32(1, 64), -1), qhead.InvalidArgumentError, "topk: k = -1"),
    ("k huge", lambda t, d: qhead.topk(t, torch.ones(1, 64), 10**12), qhead.InvalidArgumentError,
     "topk: k = 1000000000000"),
    ("topk ids dtype", lambda t, d: qhead.topk(t, f32(1, 64), 2, ids=np.zeros((1, 2), np.int64)),
     qhead.InvalidArgumentError, "topk: ids must be I32"),
    ("topk lse None", lambda t, d: qhead._C.topk(t, f32(1, 64), 2, f32(1, 2), np.zeros((1, 2), np.int32), None),
     qhead.InvalidArgumentError, "topk: lse is None"),
    ("rescore packed", lambda t, d: qhead.rescore(t, f32(1, 64), np.array([[1, 2]])), qhead.InvalidArgumentError,
     "rescore"),
    ("candidates out of range", lambda t, d: qhead.rescore(d, f32(1, 64), np.array([[1, 50]])),
     qhead.InvalidArgumentError, "rescore: candidates[1] = 50"),
    ("candidates 1-D", lambda t, d: qhead.rescore(d, f32(1, 64), np.array([1, 2])), qhead.InvalidArgumentError,
     "rescore: candidates must have 2 dims"),
    ("dense non-contiguous", lambda t, d: qhead.Table.dense(f32(4, 128)[:, ::2]), qhead.InvalidArgumentError,
     "Table::dense: weight must be contiguous"),
    ("dense int", lambda t, d: qhead.Table.dense(np.ones((4, 64), np.int32)), qhead.InvalidArgumentError,
     "Table::dense: weight must be F32/F16/BF16"),
    ("dense None", lambda t, d: qhead.Table.dense(None), qhead.InvalidArgumentError, "Table.dense: weight is None"),
    ("packed wrong shape", lambda t, d: qhead.Table.packed(t.weight_packed, t.weight_scale, scheme="w4g32",
                                                          shape=(51, 64)),
     qhead.InvalidArgumentError, "Table.packed: weight_packed: expected shape [51, 8]"),
    ("packed missing zero point", lambda t, d: qhead.Table.packed(t.weight_packed, t.weight_scale, scheme="w4g32a",
                                                                 shape=(50, 64)),
     qhead.InvalidArgumentError, "Table.packed: scheme w4g32a is asymmetric: weight_zero_point is required"),
    ("packed non-contiguous", lambda t, d: qhead.Table.packed(np.repeat(t.weight_packed, 2, 1)[:, ::2],
                                                             t.weight_scale, scheme="w4g32", shape=(50, 64)),
     qhead.InvalidArgumentError, "Table.packed: weight_packed must be contiguous"),
    ("packed NaN scale", lambda t, d: qhead.Table.packed(t.weight_packed, np.full((50, 2), np.nan, np.float16),
                                                        scheme="w4g32", shape=(50, 64)),
     qhead.InvalidArgumentError, "weight_scale[0, 0] is nan"),
    ("packed scheme type", lambda t, d: qhead.Table.packed(t.weight_packed, t.weight_scale, scheme=4, shape=(50, 64)),
     qhead.InvalidArgumentError, "Table.packed: scheme must be"),
    ("quantize CUDA-less dtype", lambda t, d: qhead.quantize(np.ones((4, 64), np.int64)), qhead.InvalidArgumentError,
     "quantize"),
    ("quantize group", lambda t, d: qhead.quantize(f32(4, 96), "w4g64"), qhead.InvalidArgumentError, "64"),
    ("dequantize-free to_device", lambda t, d: t.to_device("tpu"), qhead.InvalidArgumentError,
     "Table.to_device: device must be"),
]


@pytest.mark.parametrize("call,exc,msg", [c[1:] for c in BAD_CALLS], ids=[c[0] for c in BAD_CALLS])
def test_bad_inputs_raise(small, call, exc, msg):
    t, d = small
    with pytest.raises(exc) as e:
        call(t, d)
    assert msg in str(e.value), str(e.value)
    assert isinstance(e.value, qhead.Error) and e.value.code == exc.code


def test_exception_classes():
    assert issubclass(qhead.InvalidArgumentError, ValueError) and issubclass(qhead.InvalidFileError, ValueError)
    assert issubclass(qhead.IoError, OSError) and issubclass(qhead.UnsupportedError, NotImplementedError)
    assert issubclass(qhead.InternalError, RuntimeError)
    for c in (qhead.InvalidArgumentError, qhead.InvalidFileError, qhead.IoError, qhead.UnsupportedError,
              qhead.InternalError):
        assert issubclass(c, qhead.Error)
    assert [c.code for c in (qhead.InvalidArgumentError, qhead.InvalidFileError, qhead.IoError,
                             qhead.UnsupportedError, qhead.InternalError)] == \
        ["invalid_argument", "invalid_file", "io", "unsupported", "internal"]


def test_import_imports_torch_only_for_the_cuda_libraries():
    # A CPU build never imports torch; a CUDA build imports it first when it is installed (the
    # libcublas / libnccl sonames both load must be torch's). transformers is never imported.
    code = "import sys, qhead; print(qhead.__version__, 'torch' in sys.modules, 'transformers' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    import importlib.util

    try:
        from qhead._build import CUDA as cuda_build
    except ImportError:
        cuda_build = False
    want = cuda_build and importlib.util.find_spec("torch") is not None
    assert r.stdout.split() == ["0.1.0", str(want), "False"]


def test_torch_after_qhead_imports_cleanly():
    # The order that aborted a CUDA build (qhead first, torch second) exits normally.
    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed")
    code = "import qhead; import torch; print(torch.zeros(2).sum().item())"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "0.0"


def test_threads_and_cuda_queries():
    n = qhead.num_threads()
    assert n >= 1
    qhead.set_num_threads(1)
    try:
        assert qhead.num_threads() == 1
        t = qhead.quantize(rand_weight(np.random.default_rng(1), 300, 64), "w8", threads=1)
        assert qhead.logits(t, f32(2, 64)).shape == (2, 300)
    finally:
        qhead.set_num_threads(n)
    assert isinstance(qhead.cuda_available(), bool)
    assert qhead.cuda_allocated_bytes() >= 0
    qhead.cuda_synchronize()  # a no-op without a device
    if not qhead.cuda_available():
        with pytest.raises(qhead.UnsupportedError) as e:
            qhead.quantize(f32(2, 64), "w8").to_device("cuda")
        assert ("no CUDA device is visible" if qhead._C.built_with_cuda else "built without CUDA") in str(e.value)


# ---- CUDA ----------------------------------------------------------------------------------------


def cuda_tol(table, x, value, tol):
    """Bound of the CUDA logits (tests/test_cuda.cc): tensor-core f32 accumulation taken at u = 2^-23 over
    H + groups + 1 additions, plus the rounding of each weight to the activation dtype that the cuBLAS
    fallback does (u = 2^-8 for bf16, 2^-11 for f16)."""
    h = table.hidden
    groups = 1 if table.scheme.group_size < 0 else h // table.scheme.group_size
    u_t = 2.0**-8 if x.dtype == torch.bfloat16 else 2.0**-11
    abs_sum = tol / (gamma(h, U32) + gamma(h + 4, U64))
    return (gamma(h + groups + 1, 2.0**-23) + u_t + gamma(h + 4, U64)) * abs_sum + 1e-30


@requires_cuda
@pytest.mark.parametrize("scheme", ["w4g64", "w8g32a", "w4"])
def test_cuda_ops_match_the_oracle(scheme):
    rng = np.random.default_rng(21)
    w = rand_weight(rng, 50257, 64)
    host = qhead.quantize(w, scheme)
    before = qhead.cuda_allocated_bytes()
    dev = qhead.to_device(host, "cuda")
    assert dev.device == "cuda" and dev.scheme == host.scheme and dev.shape == host.shape
    assert qhead.cuda_allocated_bytes() - before >= host.nbytes
    assert dev.to_device("cuda").same_storage(dev)
    back = dev.to_device("cpu")
    assert back.device == "cpu"
    np.testing.assert_array_equal(back.dequantize(), host.dequantize())
    wp = torch.from_dlpack(dev.weight_packed)
    assert wp.is_cuda and tuple(wp.shape) == host.weight_packed.shape
    for xdtype in ("f16", "bf16"):
        x = rand_x(rng, 3, 64, xdtype, "torch")
        value, tol = oracle(host, x)
        tol = cuda_tol(host, x, value, tol)
        xc = x.cuda()
        out = torch.full((3, 50257), float("nan"), device="cuda")
        assert qhead.logits(dev, xc, out) is out
        lg = qhead.logits(dev, xc)
        assert lg.is_cuda and lg.dtype == torch.float32
        assert torch.equal(lg, out)
        assert np.all(np.abs(out.cpu().double().numpy() - value) <= tol)
        v, i, lse = qhead.topk(dev, xc, 5)
        assert v.is_cuda and i.dtype == torch.int32 and tuple(lse.shape) == (3,)
        iv = i.cpu().numpy()
        for mi in range(3):
            r = iv[mi]
            assert len(set(r.tolist())) == 5
            assert np.all(np.abs(v[mi].cpu().double().numpy() - value[mi, r]) <= tol[mi, r])
            assert value[mi].max() - tol[mi].max() <= value[mi, r[0]] + tol[mi, r[0]]
    with pytest.raises(qhead.InvalidArgumentError, match="CUDA ops take F16 or BF16 activations"):
        qhead.logits(dev, torch.ones(1, 64, device="cuda"))
    ids = torch.tensor([0, 50256, 7], device="cuda")
    for dt in (torch.float32, torch.float16, torch.bfloat16):
        e = qhead.embed(dev, ids, dtype=dt)
        assert e.is_cuda and e.dtype == dt
        assert torch.equal(e.cpu(), torch.from_numpy(host.dequantize()[[0, 50256, 7]]).to(dt))
    x = torch.ones(1, 64, dtype=torch.float16)
    with pytest.raises(qhead.InvalidArgumentError, match="logits: x is on cpu but the table is on cuda"):
        qhead.logits(dev, x, torch.empty(1, 50257, device="cuda"))
    with pytest.raises(qhead.InvalidArgumentError, match="logits: x is on cuda but the table is on cpu"):
        qhead.logits(host, x.cuda(), torch.empty(1, 50257))
    with pytest.raises(qhead.InvalidArgumentError, match="Table.dequantize"):
        dev.dequantize()


@requires_cuda
def test_cuda_tables_from_torch_tensors_and_streams():
    rng = np.random.default_rng(22)
    host = qhead.quantize(rand_weight(rng, 4099, 128), "w4g32a")
    # a table over torch CUDA tensors, used in place
    wp, ws, wz = (torch.from_dlpack(a).cuda() for a in (host.weight_packed, host.weight_scale,
                                                         host.weight_zero_point))
    dev = qhead.Table.packed(wp, ws, wz, scheme=host.scheme, shape=host.shape)
    assert dev.device == "cuda" and dev.weight_packed is wp
    x = rand_x(rng, 17, 128, "f16", "torch").cuda()
    want = qhead.logits(dev, x)
    ref = qhead.logits(host.to_device("cuda"), x)
    torch.cuda.synchronize()
    assert torch.equal(want, ref)
    s = torch.cuda.Stream()
    out = torch.full((17, 4099), float("nan"), device="cuda")
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        qhead.logits(dev, x, out)  # on torch's current stream, s
    s.synchronize()
    assert torch.equal(out, want)
    out2 = torch.full_like(out, float("nan"))
    qhead._C.logits(dev, x, out2, stream=s.cuda_stream)
    s.synchronize()
    assert torch.equal(out2, want)
    dense = qhead.Table.dense(torch.from_numpy(host.dequantize()).cuda())
    cand = torch.topk(want, 4).indices
    vals, ids = qhead.rescore(dense, x, cand, stream=s.cuda_stream)
    s.synchronize()
    for mi in range(17):
        assert sorted(ids[mi].tolist()) == sorted(cand[mi].tolist())
        assert torch.all(vals[mi][:-1] >= vals[mi][1:])
    qhead.cuda_synchronize()
