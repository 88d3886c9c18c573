"""QuantTable / QuantEmbedding / QuantLMHead: shapes and dtypes like nn.Embedding / nn.Linear,
the float64 oracle, one copy of a tied table, .to() and state_dict round trips, exact rescoring,
the checkpoint constructors, and torch.compile(fullgraph=True) on a tiny Llama."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from torch import nn

import qhead
import qhead.torch as qt
from torch_oracle import (assert_close_bound, check_topk, cuda_bound, dequantize, oracle_logits, poison_empty,
                          random_weight, random_x)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
FIXTURES = Path(__file__).resolve().parents[2] / "tests" / "fixtures"
CUDA = torch.cuda.is_available() and qhead.cuda_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU and a CUDA build of qhead")


@pytest.fixture(autouse=True)
def poisoned(monkeypatch):
    monkeypatch.setattr(qt, "_empty", poison_empty)
    qt._poison_outputs(True)  # the C++ kernels' outputs too
    yield
    qt._poison_outputs(False)


def make(v=61, h=64, scheme="w4g32", seed=1, dtype=torch.float32):
    w = random_weight(v, h, seed, dtype)
    return w, qt.QuantTable.from_dense(w, scheme)


# ---- QuantTable -------------------------------------------------------------------------------------

def test_quant_table_basics():
    w, t = make(61, 64, "w4g32a", dtype=torch.bfloat16)
    assert (t.scheme, t.vocab, t.hidden, t.dtype) == ("w4g32a", 61, 64, torch.bfloat16)
    assert t.weight_packed.shape == (61, 8) and t.weight_packed.dtype == torch.int32
    assert t.weight_scale.shape == (61, 2) and t.weight_scale.dtype == torch.float16
    assert t.weight_zero_point.shape == (8, 2) and t.col_perm is None
    assert t.nbytes == 61 * 8 * 4 + 61 * 2 * 2 + 8 * 2 * 4 == t.table().nbytes
    assert t.table().scheme == qhead.Scheme("w4g32a")
    # the dequantized table against qhead's own dequantization, and close to the dense weight
    assert torch.equal(dequantize(t).to(torch.float32), torch.from_numpy(t.table().dequantize()))
    assert (dequantize(t) - w.double()).abs().max() < 0.1
    assert "w4g32a" in repr(t)


def test_quant_table_schemes_and_scale_dtypes():
    w = random_weight(5, 256, 3)
    for scheme, sd in (("w8", torch.bfloat16), ("w4g128", "f32"), ("w8g256a", "f16"), ("w3g32", "bf16")):
        t = qt.QuantTable.from_dense(w, scheme, scale_dtype=sd)
        assert t.scheme == scheme
        assert t.weight_scale.dtype == qt._torch_dtype(sd, "sd")
        qd = torch.from_numpy(t.table().dequantize())
        assert qd.shape == (5, 256) and (qd.double() - w.double()).abs().max() < 0.3
        if scheme != "w3g32":  # the oracle's unpacker takes bit widths that divide 32
            assert torch.equal(dequantize(t).to(torch.float32), qd)


def test_state_dict_round_trip():
    for scheme, sd in (("w4g32", "f16"), ("w8g64a", "bf16"), ("w4a", "f32")):
        _, t = make(37, 128, scheme, seed=4)
        t.weight_scale.data = t.weight_scale.to(qt._torch_dtype(sd, "sd")) if sd != "f16" else t.weight_scale
        fresh = qt.QuantTable(scheme, 37, 128, scale_dtype=sd)
        assert set(fresh.state_dict()) == set(t.state_dict())
        fresh.load_state_dict(t.state_dict())
        x = random_x((3, 128), 2)
        assert torch.equal(qt.QuantLMHead(fresh)(x), qt.QuantLMHead(t)(x))
        ids = torch.tensor([[0, 36], [5, 7]])
        assert torch.equal(qt.QuantEmbedding(fresh)(ids), qt.QuantEmbedding(t)(ids))


def test_state_dict_col_perm_round_trip():
    _, base = make(37, 128, "w4g32a", seed=4)
    perm = torch.randperm(128, generator=torch.Generator().manual_seed(1)).to(torch.int32)
    t = qt.QuantTable.from_tensors(base.weight_packed, base.weight_scale, base.weight_zero_point, scheme="w4g32a",
                                   shape=(37, 128), col_perm=perm)
    fresh = qt.QuantTable("w4g32a", 37, 128, col_perm=True)
    fresh.load_state_dict(t.state_dict())
    x = random_x((2, 128), 2)
    assert torch.equal(qt.QuantLMHead(fresh)(x), qt.QuantLMHead(t)(x))


def test_model_dtype_conversion_keeps_scales():
    _, t = make(37, 64, "w4g32")
    scale = t.weight_scale.clone()
    emb = qt.QuantEmbedding(t)
    m = nn.Sequential(emb, nn.Linear(64, 64))
    m.to(torch.bfloat16)
    assert t.weight_scale.dtype == torch.float16 and torch.equal(t.weight_scale, scale)
    assert emb(torch.tensor([1, 2])).dtype == torch.bfloat16
    m.float()
    assert emb(torch.tensor([1, 2])).dtype == torch.float32 and t.weight_scale.dtype == torch.float16


def test_bad_constructor_args():
    with pytest.raises(qhead.InvalidArgumentError):
        qt.QuantTable.from_dense(random_weight(5, 60, 1), "w4g32")  # H not a multiple of the group
    with pytest.raises(qhead.InvalidArgumentError):
        qt.QuantTable.from_dense(random_weight(5, 64, 1), "w4g33")
    with pytest.raises(qhead.InvalidArgumentError):
        qt.QuantTable("w4g32", 5, 60)
    with pytest.raises(qhead.InvalidArgumentError):
        qt.QuantEmbedding(nn.Linear(2, 2))
    with pytest.raises(qhead.InvalidArgumentError, match="dense_weight"):
        qt.QuantLMHead(make()[1], rescore=4)
    with pytest.raises(qhead.InvalidArgumentError, match="dense_weight must be"):
        qt.QuantLMHead(make()[1], rescore=4, dense_weight=torch.zeros(3, 3))


# ---- QuantEmbedding ---------------------------------------------------------------------------------

def test_embedding_like_nn_embedding():
    w, t = make(61, 64, "w8", dtype=torch.float16)
    emb = qt.QuantEmbedding(t)
    ref = nn.Embedding.from_pretrained(dequantize(t).to(torch.float16))
    for ids in (torch.tensor(5), torch.tensor([0, 60]), torch.randint(0, 61, (2, 3)), torch.randint(0, 61, (2, 1, 4)),
                torch.randint(0, 61, (3, 5), dtype=torch.int32)):
        out = emb(ids)
        assert out.shape == (*ids.shape, 64) and out.dtype == torch.float16  # the dtype it was built with
        assert torch.equal(out, ref(ids.long()))
    assert qt.QuantEmbedding(t, dtype=torch.float32)(torch.tensor([3])).dtype == torch.float32
    assert emb(torch.zeros((0,), dtype=torch.int64)).shape == (0, 64)
    with pytest.raises(qhead.InvalidArgumentError, match="out of range"):
        emb(torch.tensor([[1, 61]]))


def test_embedding_scale():
    _, t = make(61, 64, "w4g32", dtype=torch.bfloat16)
    scale = 64 ** 0.5
    emb = qt.QuantEmbedding(t, embed_scale=scale)
    ids = torch.tensor([[1, 2, 3]])
    plain = qt.QuantEmbedding(t)(ids)
    # as transformers' scaled embeddings do: the scale rounded to the output dtype, then multiplied
    assert torch.equal(emb(ids), plain * torch.tensor(scale).to(torch.bfloat16))


# ---- QuantLMHead ------------------------------------------------------------------------------------

@pytest.mark.parametrize("act", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_lm_head_like_linear(act):
    w, t = make(61, 64, "w4g32a")
    head = qt.QuantLMHead(t)
    wd = dequantize(t)
    for shape in ((64,), (1, 64), (3, 64), (2, 3, 64), (17, 64)):
        x = random_x(shape, len(shape), act)
        out = head(x)
        assert out.shape == (*shape[:-1], 61) and out.dtype == act
        want, tol = oracle_logits(wd, x.reshape(-1, 64))
        # computed in f32, rounded once to x's dtype
        unit = {torch.float32: 0.0, torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8}[act]
        tol = tol * (1 + unit) + unit * want.abs() + (2.0 ** -24 if act == torch.float16 else 0)
        assert_close_bound(out.reshape(-1, 61), want, tol, f"QuantLMHead {shape} {act}")
    # a non-contiguous x is fine for the module (it makes it contiguous)
    x = random_x((64, 3), 5, act).T
    assert torch.equal(head(x), head(x.contiguous()))
    with pytest.raises(qhead.InvalidArgumentError, match="last dim must be H"):
        head(torch.zeros(2, 63))


def test_lm_head_topk():
    w, t = make(61, 64, "w4g32")
    head = qt.QuantLMHead(t)
    x = random_x((2, 3, 64), 7)
    values, ids, lse = head.topk(x, 5)
    assert values.shape == (2, 3, 5) and ids.shape == (2, 3, 5) and lse.shape == (2, 3)
    want, tol = oracle_logits(dequantize(t), x.reshape(-1, 64))
    check_topk(values.reshape(-1, 5), ids.reshape(-1, 5), lse.reshape(-1), want, tol, 5, "QuantLMHead.topk")


def test_eager_fast_path_matches_op():
    _, t = make(61, 64, "w8g32a")
    x = random_x((3, 64), 1, torch.bfloat16)
    tensors, kw = t.op_args()
    assert torch.equal(qt.QuantLMHead(t)(x), torch.ops.qhead.logits(*tensors, x, **kw).to(torch.bfloat16))
    ids = torch.tensor([4, 5, 60])
    assert torch.equal(qt.QuantEmbedding(t)(ids), torch.ops.qhead.embed(*tensors, ids, **kw, out_dtype=torch.float32))
    v, i, l = qt.QuantLMHead(t).topk(x, 4)
    v2, i2, l2 = torch.ops.qhead.topk(*tensors, x, 4, **kw)
    assert torch.equal(v, v2) and torch.equal(i, i2) and torch.equal(l, l2)


# ---- rescoring --------------------------------------------------------------------------------------

def _rescore_case(tmp_path, dense_rows, dtype=torch.bfloat16):
    v, h, k = 501, 64, 8
    w = random_weight(v, h, 31, dtype)
    t = qt.QuantTable.from_dense(w, "w4g64")
    kw = {}
    if dense_rows in ("cpu", "device"):
        kw = {"dense_weight": w}
    else:
        from safetensors.torch import save_file
        path = tmp_path / "dense.safetensors"
        save_file({"other": torch.zeros(3), "lm_head.weight": w}, str(path))
        dense_rows = path
        kw = {"dense_tensor": "lm_head.weight"}
    return w, t, qt.QuantLMHead(t, rescore=k, dense_rows=dense_rows, **kw), k


@pytest.mark.parametrize("dense_rows", ["cpu", "device", "path"])
def test_rescore_exact(tmp_path, dense_rows):
    w, t, head, k = _rescore_case(tmp_path, dense_rows)
    x = random_x((5, 64), 3)
    out = head(x)
    quant = qt.QuantLMHead(t)(x)
    want_dense, tol_dense = oracle_logits(w.to(torch.float64), x)
    cand = quant.topk(k, dim=1).indices
    # the top-K quantized candidates now hold the dense logits (the exact f32 dot products of rescore)
    exact_v, exact_i = torch.ops.qhead.rescore(w, x, cand)
    assert torch.equal(out.gather(1, exact_i.long()), exact_v)
    assert_close_bound(out.gather(1, cand), want_dense.gather(1, cand), tol_dense.gather(1, cand), "rescored")
    # every other entry is the quantized logit
    mask = torch.ones_like(out, dtype=torch.bool).scatter_(1, cand, False)
    assert torch.equal(out[mask], quant[mask])
    # the quantization error is far above the f32 bound: the rescored entries really changed
    assert (out.gather(1, cand) != quant.gather(1, cand)).any()
    # argmax: the dense argmax whenever it is among the candidates
    dense_top = want_dense.argmax(dim=1)
    for m in range(5):
        if dense_top[m] in cand[m]:
            assert out[m].argmax() == dense_top[m]
    # topk: values from the dense rows, sorted
    values, ids, _ = head.topk(x, 3)
    assert_close_bound(values, want_dense.gather(1, ids.long()), tol_dense.gather(1, ids.long()), "rescored topk")
    assert torch.equal(ids, exact_i[:, :3])


def test_rescore_rows_stay_where_asked():
    w = random_weight(61, 64, 1, torch.float32)
    t = qt.QuantTable.from_dense(w, "w4g32")
    h = qt.QuantLMHead(t, rescore=4, dense_rows="cpu", dense_weight=w)
    assert "dense_weight" not in h.state_dict() and h._dense().device.type == "cpu"
    assert h._dense().data_ptr() == w.data_ptr()  # a contiguous CPU weight is kept, not copied
    d = qt.QuantLMHead(t, rescore=4, dense_rows="device", dense_weight=w)
    assert "dense_weight" not in d.state_dict()
    d.half()  # a float conversion of the model leaves the dense rows (and the scales) alone
    assert d._dense().dtype == torch.float32 and torch.equal(d._dense(), w)
    x = random_x((2, 64), 1, torch.float16)
    assert torch.equal(d(x), h(x))


def test_rescore_mapped_rows_are_not_copied(tmp_path):
    w, t, head, _ = _rescore_case(tmp_path, "path")
    d = head._dense()
    assert d.dtype == torch.bfloat16 and d.shape == (501, 64) and torch.equal(d, w)
    path = str(tmp_path / "dense.safetensors")
    # the tensor's memory is inside the mapping of the file, not a heap copy
    assert d.untyped_storage().nbytes() == os.path.getsize(path)
    with pytest.raises(qhead.InvalidArgumentError, match="no tensor named"):
        qt.QuantLMHead(t, rescore=2, dense_rows=path, dense_tensor="nope")
    with pytest.raises(qhead.InvalidArgumentError, match="shape"):
        qt.QuantLMHead(t, rescore=2, dense_rows=path, dense_tensor="other")
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\xff" * 4)
    with pytest.raises(qhead.InvalidFileError):
        qt.QuantLMHead(t, rescore=2, dense_rows=str(bad))


def test_inference_mode_tables():
    with torch.inference_mode():
        w = random_weight(61, 64, 5)
        t = qt.QuantTable.from_dense(w, "w4g32")
        head = qt.QuantLMHead(t)
        x = random_x((2, 64), 1)
        first = head(x)
        n = len(qt._cache)
        assert torch.equal(head(x), first) and len(qt._cache) == n  # no version counters, still cached
    want, tol = oracle_logits(dequantize(t), x)
    assert_close_bound(first, want, tol, "inference-mode table")


# ---- tied pairs -------------------------------------------------------------------------------------

def _storages(module: nn.Module):
    seen = {}
    for name, b in module.named_buffers(remove_duplicate=False):
        seen.setdefault(b.untyped_storage().data_ptr(), b.untyped_storage().nbytes())
    return seen


def test_tied_pair_is_one_copy():
    w = random_weight(61, 64, 2)
    t_e, t_h = qt.QuantTable.from_roles(w)
    assert t_e is t_h
    model = nn.ModuleDict({"embed": qt.QuantEmbedding(t_e), "head": qt.QuantLMHead(t_h)})
    sd = model.state_dict()
    assert sd["embed.table.weight_packed"].data_ptr() == sd["head.table.weight_packed"].data_ptr()
    assert sum(_storages(model).values()) == t_e.nbytes
    model.to(torch.float16)
    assert model["embed"].table is model["head"].table and sum(_storages(model).values()) == t_e.nbytes
    # an untied pair is two tables
    e, h = qt.QuantTable.from_roles(w, random_weight(61, 64, 3), head_scheme="w8g32")
    assert e is not h and e.weight_packed.data_ptr() != h.weight_packed.data_ptr()
    assert (e.scheme, h.scheme) == ("w4g64", "w8g32")
    with pytest.raises(qhead.InvalidArgumentError, match="tied"):
        qt.QuantTable.from_roles(w, embedding_scheme="w4g32", head_scheme="w8")


@needs_cuda
def test_to_cuda_moves_one_copy():
    w = random_weight(61, 64, 2)
    t, _ = qt.QuantTable.from_roles(w)
    model = nn.ModuleDict({"embed": qt.QuantEmbedding(t), "head": qt.QuantLMHead(t)})
    x = random_x((3, 64), 1, torch.float16)
    ids = torch.tensor([1, 2, 60])
    want_e = model["embed"](ids)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    model.to("cuda")
    grown = torch.cuda.memory_allocated() - before
    assert t.nbytes <= grown <= t.nbytes + 4 * 512  # one copy of the buffers (allocator blocks of 512 B)
    assert model["embed"].table.weight_packed.is_cuda and sum(_storages(model).values()) == t.nbytes
    out = model["head"](x.cuda())
    assert out.is_cuda and out.dtype == torch.float16 and out.shape == (3, 61)
    assert torch.equal(model["embed"](ids.cuda()).cpu(), want_e)
    wd = dequantize(t)
    want, tol = cuda_bound(wd, x, 64 // 32)
    unit = 2.0 ** -11  # the f16 output
    assert_close_bound(out.float(), want, tol * (1 + unit) + unit * want.abs(), "QuantLMHead on CUDA")
    # f32 x: the kernels take it rounded to bf16
    x32 = random_x((2, 5, 64), 3, torch.float32)
    out32 = model["head"](x32.cuda())
    assert out32.dtype == torch.float32 and out32.shape == (2, 5, 61)
    want, tol = cuda_bound(wd, x32.reshape(-1, 64).to(torch.bfloat16), 64 // 32)
    assert_close_bound(out32.reshape(-1, 61), want, tol, "QuantLMHead on CUDA, f32 x")
    v, i, l = model["head"].topk(x32.cuda(), 4)
    assert v.is_cuda and v.shape == (2, 5, 4) and l.shape == (2, 5)
    check_topk(v.reshape(-1, 4), i.reshape(-1, 4), l.reshape(-1), want, tol, 4, "QuantLMHead.topk on CUDA")
    model.to("cpu")
    assert not model["head"].table.weight_packed.is_cuda


@needs_cuda
@pytest.mark.parametrize("dense_rows", ["cpu", "device"])
def test_rescore_exact_cuda(dense_rows):
    w = random_weight(501, 64, 31, torch.bfloat16)
    t = qt.QuantTable.from_dense(w, "w4g64")
    head = qt.QuantLMHead(t, rescore=8, dense_rows=dense_rows, dense_weight=w).to("cuda")
    assert head._dense().is_cuda == (dense_rows == "device")
    x = random_x((3, 64), 3, torch.bfloat16)
    out = head(x.cuda())
    cand = head._logits_f32(x.cuda()).topk(8, dim=1).indices.cpu()
    want, tol = oracle_logits(w.to(torch.float64), x)
    got = out.float().cpu().gather(1, cand)
    unit = 2.0 ** -8  # the bf16 output
    assert_close_bound(got, want.gather(1, cand), tol.gather(1, cand) + unit * want.gather(1, cand).abs(), "rescored")


# ---- constructors from checkpoints ------------------------------------------------------------------

def test_from_compressed_tensors_file_and_state_dict():
    from safetensors.torch import load_file
    path = FIXTURES / "ct" / "w4g64_bf16.safetensors"
    t = qt.QuantTable.from_compressed_tensors(path, "model.embed_tokens")
    assert (t.scheme, t.vocab, t.hidden, t.weight_scale.dtype) == ("w4g64", 37, 256, torch.bfloat16)
    ref = load_file(str(path))
    assert torch.equal(dequantize(t).to(torch.bfloat16), ref["decompressed.weight"])
    s = qt.QuantTable.from_compressed_tensors(ref, "model.embed_tokens.weight")
    assert s.scheme == "w4g64" and s.weight_packed.data_ptr() == ref["model.embed_tokens.weight_packed"].data_ptr()
    x = random_x((2, 256), 1)
    assert torch.equal(qt.QuantLMHead(s)(x), qt.QuantLMHead(t)(x))
    # loading a state dict into a table mapped from a file replaces the (read-only) mapped buffers
    t.load_state_dict(s.state_dict())
    assert torch.equal(qt.QuantLMHead(t)(x), qt.QuantLMHead(s)(x))
    for name, prefix, scheme in (("w4g32a_f16", "lm_head", "w4g32a"), ("w8_f32", "lm_head", "w8"),
                                 ("w8g128a_bf16", "model.embed_tokens", "w8g128a")):
        f = FIXTURES / "ct" / f"{name}.safetensors"
        a = qt.QuantTable.from_compressed_tensors(f, prefix)
        b = qt.QuantTable.from_compressed_tensors(load_file(str(f)), prefix)
        assert a.scheme == b.scheme == scheme
        assert torch.equal(dequantize(a), dequantize(b))
        assert torch.equal(dequantize(a).to(a.weight_scale.dtype), load_file(str(f))["decompressed.weight"])
    with pytest.raises(qhead.InvalidArgumentError, match="no 'nope.weight_packed'"):
        qt.QuantTable.from_compressed_tensors({}, "nope")
    with pytest.raises(qhead.Error):
        qt.QuantTable.from_compressed_tensors(path, "nope")


def test_from_gptq_act_order():
    from safetensors.torch import load_file
    d = FIXTURES / "gptq" / "gptqmodel_w4g32_actorder_asym"
    t = qt.QuantTable.from_gptq(d)
    assert t.col_perm is not None and (t.vocab, t.hidden) == (320, 128)
    want = load_file(str(d / "expected.safetensors"))["lm_head.dequant_numpy"]
    assert torch.equal(dequantize(t).to(torch.float32), want)
    x = random_x((3, 128), 1, torch.float16)
    wl, tol = oracle_logits(want.double(), x)
    assert_close_bound(qt.QuantLMHead(t)(x).float(), wl, tol + 2 ** -11 * wl.abs(), "gptq head")
    with pytest.raises(qhead.InvalidArgumentError, match="not quantized"):
        qt.QuantTable.from_gptq(d, "embedding")
    for name in ("autoround_w4g32_asym", "autoround_w8pc_sym", "gptqmodel_w8g64_sym_v2"):
        d = FIXTURES / "gptq" / name
        t = qt.QuantTable.from_gptq(d, "lm_head")
        want = load_file(str(d / "expected.safetensors"))["lm_head.dequant_numpy"]
        assert torch.equal(dequantize(t).to(torch.float32), want), name


def test_from_gguf():
    from safetensors.torch import load_file
    path = FIXTURES / "gguf" / "smollm2_slice.gguf"
    e = qt.QuantTable.from_gguf(path, "embedding", scheme="w8g32")
    assert (e.vocab, e.hidden) == (24, 576)
    ref = load_file(str(FIXTURES / "gguf" / "smollm2_slice.ref.safetensors"))["token_embd.weight"].double()
    got = dequantize(e)
    # requantized from Q8_0: within half a step of the scheme's scales of the GGUF values
    step = e.weight_scale.double().abs().max().item()
    assert (got - ref).abs().max().item() <= 0.5 * step + 1e-6
    assert e.scheme == "w8g32"
    h = qt.QuantTable.from_gguf(path, "head", scheme="w8g32")  # a tied model: the same table
    assert torch.equal(h.weight_packed, e.weight_packed)
    with pytest.raises(qhead.InvalidArgumentError, match="role"):
        qt.QuantTable.from_gguf(path, "mlp")


# ---- torch.compile ----------------------------------------------------------------------------------

def test_compile_tiny_llama_fullgraph(monkeypatch):
    import torch._dynamo
    from torch._dynamo.testing import CompileCounterWithBackend
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=301, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
                      max_position_embeddings=64)
    model = LlamaForCausalLM(cfg).eval()
    emb_t, head_t = qt.QuantTable.from_roles(model.model.embed_tokens.weight.detach(), None, scheme="w4g32")
    assert emb_t is head_t
    model.model.embed_tokens = qt.QuantEmbedding(emb_t)
    model.lm_head = qt.QuantLMHead(head_t)
    ids = torch.randint(0, 301, (2, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        eager = model(input_ids=ids).logits
        torch._dynamo.reset()
        # aot_eager: dynamo's whole-graph capture and AOTAutograd over fake tensors (the fake
        # kernels), run eagerly; inductor's code generation takes a minute on 2 cores.
        backend = CompileCounterWithBackend("aot_eager")
        compiled = torch.compile(model, fullgraph=True, backend=backend)
        got = compiled(input_ids=ids).logits
        builds = []
        remember = qt._remember
        monkeypatch.setattr(qt, "_remember", lambda *a: (builds.append(a[0]), remember(*a))[1])
        cpp_builds = qt.table_cache_info()[1]
        again = compiled(input_ids=ids).logits
    assert builds == []  # the compiled graph's calls find the cached table
    assert qt.table_cache_info()[1] == cpp_builds  # (the C++ kernels' cache too)
    assert torch.equal(again, got)
    assert backend.frame_count == 1
    code = backend.graphs[0].code
    assert "qhead.embed" in code and "qhead.logits" in code  # the ops are in the graph, not a fast path
    assert got.shape == (2, 7, 301)
    assert torch.allclose(got, eager, rtol=1e-5, atol=1e-5)


def test_compile_dynamic_rows():
    import torch._dynamo
    from torch._dynamo.testing import CompileCounterWithBackend
    w, t = make(61, 64, "w4g32")
    emb, head = qt.QuantEmbedding(t), qt.QuantLMHead(t)

    def step(ids, x):
        v, i, l = head.topk(x, 3)
        return emb(ids), head(x), v, i, l

    torch._dynamo.reset()
    backend = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(step, fullgraph=True, dynamic=True, backend=backend)
    for n in (2, 5, 9):
        ids = torch.randint(0, 61, (n,), generator=torch.Generator().manual_seed(n))
        x = random_x((n, 64), n, torch.bfloat16)
        got = compiled(ids, x)
        want = step(ids, x)
        for g, e in zip(got, want):
            assert torch.equal(g, e)
    assert backend.frame_count == 1  # one graph for every number of rows
