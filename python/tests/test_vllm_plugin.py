"""The vLLM plugin's vLLM-free parts (qhead.vllm.config, qhead.vllm.table) against real
checkpoints: the compressed-tensors fixtures (made by the compressed-tensors library), `qhead
quantize` output, and SmolLM2-135M when it is in the model cache. No vLLM is imported here; the
layer is a plain nn.Module carrying what a vLLM vocab-parallel layer carries (its Parameters
and their weight_loader), loaded the way vLLM's loader loads a module: each checkpoint tensor
into the Parameter of that name, each Parameter once (named_parameters drops aliases)."""
import json
import os
import shutil
import subprocess

import pytest

torch = pytest.importorskip("torch")
from safetensors.torch import load_file, save_file  # noqa: E402
from torch import nn  # noqa: E402

import qhead  # noqa: E402
from qhead.vllm import config as vc  # noqa: E402
from qhead.vllm import table as vt  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CT_MODELS = os.path.join(REPO, "tests", "fixtures", "ct_models")
V, H = 67, 64  # the fixtures' table


def _qcfg(case):
    with open(os.path.join(CT_MODELS, case, "config.json")) as f:
        return json.load(f)["quantization_config"]


def _checkpoint(d):
    sd = {}
    for fn in sorted(os.listdir(d)):
        if fn.endswith(".safetensors") and fn != "reference.safetensors":
            sd.update(load_file(os.path.join(d, fn)))
    return sd


class _Model(nn.Module):
    """The two roles under the names the checkpoint uses (model.embed_tokens, lm_head)."""

    def __init__(self, emb, head):
        super().__init__()
        self.model = nn.Module()
        self.model.embed_tokens = emb
        self.lm_head = head


def _load(module, sd):
    """vLLM's loader for these layers: each Parameter (aliases once) from its checkpoint tensor."""
    loaded = []
    for name, p in module.named_parameters():
        p.weight_loader(p, sd[name])
        loaded.append(name)
    return loaded


def _layer(cfg, spec, *, rows=V, row_range=(0, V), dtype=torch.float32, where="t"):
    layer = nn.Module()
    vt.create_table_weights(layer, spec, rows=rows, hidden=H, vocab=V, row_range=row_range, params_dtype=dtype,
                            scale_dtype=cfg.scale_dtype, where=where)
    return layer


def _x(m, seed=0, dtype=torch.float32):
    return torch.randn(m, H, generator=torch.Generator().manual_seed(seed)).to(dtype)


def _logit_tol(x, w):
    """|x·w - ref| bound of an f32 dot product of length H: H ulps of sum |x||w| (both orders)."""
    return (2 * H * torch.finfo(torch.float32).eps * (x.abs() @ w.abs().T)).max().item()


# ---- config parsing ---------------------------------------------------------------------------------

def test_config_defaults_and_qhead_dict():
    d = vc.parse_config(None)
    assert d.head == vc.RoleSpec("w4g64", "dense") and not d.embedding.quantized and d.source == "default"
    c = vc.parse_config({"quant_method": "qhead", "head": "w8", "rescore": 8, "scale_dtype": "f32",
                         "tied": True, "exact_embedding": True})  # keys hf.QHeadConfig records are accepted
    assert (c.head.scheme, c.rescore, c.scale_dtype, c.source) == ("w8", 8, "f32", "qhead")
    assert c.exact_embedding(tied=True) and not c.exact_embedding(tied=False)
    assert c.tied_role() == vc.RoleSpec("w8", "dense")
    for bad, match in (({"head": "w5g7"}, "w5g7"), ({"heads": "w8"}, "unknown"), ({"rescore": -1}, "rescore"),
                       ({"head": None}, "nothing to quantize"), ({"scale_dtype": "f8"}, "scale_dtype"),
                       ({"head": None, "embedding": "w8", "rescore": 4}, "head is None"),
                       ({"head": "w8", "embedding": "w4g64"}, None)):
        d = {"quant_method": "qhead", **bad}
        if match is None:  # two schemes untied: fine; tied: one table, an error
            with pytest.raises(qhead.InvalidArgumentError, match="two schemes"):
                vc.parse_config(d).tied_role()
            continue
        with pytest.raises(qhead.InvalidArgumentError, match=match):
            vc.parse_config(d)
    with pytest.raises(qhead.UnsupportedError, match="gptq"):
        vc.parse_config({"quant_method": "gptq"})


@pytest.mark.parametrize("case,emb,head", [("untied", "w4g32", "w8a"), ("tied", "w4g32", "w4g32"),
                                           ("ignore_re", "w8", "w4g64a"), ("sharded_untied", "w4g32", "w8a")])
def test_config_from_compressed_tensors_fixture(case, emb, head):
    c = vc.parse_config(_qcfg(case))
    assert c.source == "compressed-tensors"
    assert c.embedding == vc.RoleSpec(emb, "packed") and c.head == vc.RoleSpec(head, "packed")
    # The decoder's Linears are dense in every fixture: the plugin leaves them to vLLM.
    for mod in ("q_proj", "k_proj", "v_proj", "o_proj"):
        c.check_other_module(f"model.layers.0.self_attn.{mod}", "Linear")
    # vLLM's fused module checks the checkpoint modules it fuses.
    c.check_other_module("model.layers.0.self_attn.qkv_proj", "Linear",
                         [f"model.layers.0.self_attn.{m}" for m in ("q_proj", "k_proj", "v_proj")])


def test_config_refuses_other_quantized_modules():
    q = _qcfg("ignore_re")  # targets the class "Linear", with the decoder's Linears ignored
    q["ignore"] = [i for i in q["ignore"] if not i.endswith("up_proj")]
    c = vc.parse_config(q)
    c.check_other_module("model.layers.0.mlp.down_proj", "Linear")
    with pytest.raises(qhead.UnsupportedError, match="up_proj"):
        c.check_other_module("model.layers.0.mlp.gate_up_proj", "Linear",
                             ["model.layers.0.mlp.gate_proj", "model.layers.0.mlp.up_proj"])
    # A regex that selects the embedding and a decoder Linear: the Linear is refused.
    q = _qcfg("tied")
    q["config_groups"]["group_0"]["targets"] = ["re:.*(embed_tokens|up_proj)$"]
    q["ignore"] = []
    c = vc.parse_config(q)
    assert c.embedding == vc.RoleSpec("w4g32", "packed") and not c.head.quantized
    c.check_other_module("model.layers.0.mlp.down_proj", "Linear")
    with pytest.raises(qhead.UnsupportedError, match="up_proj"):
        c.check_other_module("model.layers.0.mlp.up_proj", "Linear")
    for change, err, match in (
            (lambda g: g["weights"].update(type="float"), qhead.UnsupportedError, "int weights"),
            (lambda g: g.update(input_activations={"num_bits": 8}), qhead.UnsupportedError, "activations"),
            (lambda g: g["weights"].update(strategy="tensor"), qhead.UnsupportedError, "strategy"),
            (lambda g: g.update(targets=["model.layers.0.mlp.up_proj"]), qhead.InvalidArgumentError, "nothing")):
        q = _qcfg("tied")
        change(q["config_groups"]["group_0"])
        with pytest.raises(err, match=match):
            vc.parse_config(q)


def test_packed_roles_in_dir():
    assert vc.packed_roles_in_dir(os.path.join(CT_MODELS, "untied")) == {"embedding": "model.embed_tokens",
                                                                         "head": "lm_head"}
    assert vc.packed_roles_in_dir(os.path.join(CT_MODELS, "sharded_untied")) == {"embedding": "model.embed_tokens",
                                                                                 "head": "lm_head"}
    c = vc.with_checkpoint(vc.parse_config({"quant_method": "qhead", "head": "w8a"}),
                           os.path.join(CT_MODELS, "untied"))
    assert c.head == vc.RoleSpec("w8a", "packed") and c.packed_roles == ("embedding", "head")


# ---- loading packed tables from real checkpoints -----------------------------------------------------

@pytest.mark.parametrize("case", ["untied", "ignore_re", "sharded_untied"])
@pytest.mark.parametrize("rows", [V, 128], ids=["exact", "padded"])
def test_packed_roles_load_and_serve(case, rows):
    """Each role's packed tensors load into the layer's Parameters (padded rows zero) and serve
    the compressed-tensors library's own decompression (reference.safetensors, BF16)."""
    d = os.path.join(CT_MODELS, case)
    cfg = vc.parse_config(_qcfg(case))
    sd = _checkpoint(d)
    ref = load_file(os.path.join(d, "reference.safetensors"))
    emb = _layer(cfg, cfg.embedding, rows=rows, where="model.embed_tokens")
    head = _layer(cfg, cfg.head, rows=rows, where="lm_head")
    m = _Model(emb, head)
    loaded = _load(m, sd)
    assert sorted(loaded) == sorted(k for k in sd if k.startswith(("model.embed_tokens.", "lm_head.")))
    se = vt.finish_table(emb, cfg.embedding, cfg, role="embedding", rows=rows, vocab=V, hidden=H,
                         out_dtype=torch.float32, tied=False, where="model.embed_tokens")
    sh = vt.finish_table(head, cfg.head, cfg, role="head", rows=rows, vocab=V, hidden=H, out_dtype=torch.float32,
                         tied=False, where="lm_head")
    ids = torch.tensor([5, 0, 66, 31, 5, 17], dtype=torch.long)
    got = se.embedding(ids)
    assert got.shape == (6, H) and got.dtype == torch.float32
    assert torch.equal(got.to(torch.bfloat16), ref["embedding"][ids].to(torch.bfloat16))
    # The head: logits of the dequantized rows; the padding rows' logits are 0.
    w = torch.from_numpy(sh.table.table().dequantize())
    assert torch.equal(w[:V].to(torch.bfloat16), ref["head"].to(torch.bfloat16))
    assert torch.count_nonzero(w[V:]) == 0
    x = _x(7)
    out = sh.logits(x)
    assert out.shape == (7, rows) and out.dtype == torch.float32
    torch.testing.assert_close(out, x @ w.T, atol=_logit_tol(x, w), rtol=0)
    bias = torch.randn(rows, generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(sh.logits(x, bias), x @ w.T + bias, atol=_logit_tol(x, w) * 2, rtol=0)
    # The layer holds the packed tensors only: no dense [V, H] anywhere.
    assert not any(p.is_floating_point() and p.numel() >= V * H for p in m.parameters())


@pytest.mark.parametrize("shards", [[(0, 32), (32, V)], [(0, 36), (36, V)]])
def test_packed_tensor_parallel_shards(shards):
    """A vocab-parallel shard loads its rows [start, stop) of the table: the shards' rows put
    together are the whole table."""
    cfg = vc.parse_config(_qcfg("untied"))
    sd = _checkpoint(os.path.join(CT_MODELS, "untied"))
    rows = 36
    parts = []
    for lo, hi in shards:
        layer = _layer(cfg, cfg.embedding, rows=rows, row_range=(lo, hi))
        for n, p in layer.named_parameters():
            p.weight_loader(p, sd["model.embed_tokens." + n])
        st = vt.finish_table(layer, cfg.embedding, cfg, role="embedding", rows=rows, vocab=V, hidden=H,
                             out_dtype=torch.float32, tied=False, where="e")
        parts.append(st.embedding(torch.arange(hi - lo)))
    full = _layer(cfg, cfg.embedding)
    for n, p in full.named_parameters():
        p.weight_loader(p, sd["model.embed_tokens." + n])
    want = vt.finish_table(full, cfg.embedding, cfg, role="embedding", rows=V, vocab=V, hidden=H,
                           out_dtype=torch.float32, tied=False, where="e").embedding(torch.arange(V))
    assert torch.equal(torch.cat(parts), want)
    # The asymmetric w8 head's zero points are packed 4 rows to a word: a shard must start on a word.
    lo, hi = shards[1]
    layer = _layer(cfg, cfg.head, rows=rows, row_range=(lo, hi))
    zp = layer.weight_zero_point
    if lo % 4:
        with pytest.raises(qhead.UnsupportedError, match="packed word"):
            zp.weight_loader(zp, sd["lm_head.weight_zero_point"])
    else:
        zp.weight_loader(zp, sd["lm_head.weight_zero_point"])
        assert torch.equal(zp.data[: (hi - lo) // 4 + 1], sd["lm_head.weight_zero_point"][lo // 4:])


def test_packed_load_checks_the_tensors():
    cfg = vc.parse_config(_qcfg("untied"))
    sd = _checkpoint(os.path.join(CT_MODELS, "untied"))
    layer = _layer(cfg, cfg.embedding, where="model.embed_tokens")
    p = layer.weight_packed
    with pytest.raises(qhead.InvalidFileError, match=r"model.embed_tokens.weight_packed has shape \[67, 16\]"):
        p.weight_loader(p, sd["lm_head.weight_packed"])  # a w8 table into a w4 layer
    with pytest.raises(qhead.InvalidFileError, match="weight_shape is"):
        layer.weight_shape.weight_loader(layer.weight_shape, torch.tensor([V + 1, H]))
    with pytest.raises(qhead.InvalidFileError, match="int32"):
        p.weight_loader(p, sd["model.embed_tokens.weight_packed"].to(torch.int64))
    # A scale of another float dtype keeps its own (the format's scales are never rounded).
    s = layer.weight_scale
    s.weight_loader(s, sd["model.embed_tokens.weight_scale"])
    assert s.dtype == torch.bfloat16 and torch.equal(s.data, sd["model.embed_tokens.weight_scale"])


def test_tied_table_is_one_copy():
    """A tied checkpoint (the fixture stores the table twice, identical bytes): the head shares
    the embedding's Parameters, vLLM's loader fills them once, one table serves both roles."""
    d = os.path.join(CT_MODELS, "tied")
    cfg = vc.parse_config(_qcfg("tied"))
    spec = cfg.tied_role()
    assert spec == vc.RoleSpec("w4g32", "packed")
    emb, head = _layer(cfg, spec), _layer(cfg, spec)
    vt.tie_tables(head, emb)
    m = _Model(emb, head)
    sd = _checkpoint(d)
    assert sorted(_load(m, sd)) == sorted(k for k in sd if k.startswith("model.embed_tokens."))
    sh = vt.finish_table(head, spec, cfg, role="head", rows=V, vocab=V, hidden=H, out_dtype=torch.float32, tied=True,
                         where="lm_head")
    se = vt.finish_table(emb, spec, cfg, role="embedding", rows=V, vocab=V, hidden=H, out_dtype=torch.float32,
                         tied=True, where="model.embed_tokens")
    assert se is sh and head.weight_packed is emb.weight_packed
    packed = sum(sd["model.embed_tokens." + n].numel() * sd["model.embed_tokens." + n].element_size()
                 for n in ("weight_packed", "weight_scale", "weight_shape"))
    assert vt.unique_tensor_bytes(m) == packed
    assert sh.table.weight_packed.data_ptr() == emb.weight_packed.data_ptr()  # the table is a view, no copy
    ref = load_file(os.path.join(d, "reference.safetensors"))
    assert torch.equal(se.embedding(torch.arange(V)).to(torch.bfloat16), ref["embedding"].to(torch.bfloat16))


# ---- dense checkpoints: RTN at load ------------------------------------------------------------------

def _dense_table(seed=1, v=V):
    return torch.randn(v, H, generator=torch.Generator().manual_seed(seed)) * 0.05


@pytest.mark.parametrize("rows", [V, 128], ids=["exact", "padded"])
def test_dense_checkpoint_rtn_at_load(rows):
    """A dense tied table: one RTN (the bytes qhead.quantize makes), the dense Parameter dropped;
    with rescore the rows are kept once, and serve an exact embedding and exact top-K logits."""
    w = _dense_table()
    for rescore in (0, 8):
        cfg = vc.parse_config({"quant_method": "qhead", "head": "w4g64", "rescore": rescore})
        spec = cfg.tied_role()
        emb, head = _layer(cfg, spec, rows=rows), _layer(cfg, spec, rows=rows)
        vt.tie_tables(head, emb)
        m = _Model(emb, head)
        assert _load(m, {"model.embed_tokens.weight": w}) == ["model.embed_tokens.weight"]
        se = vt.finish_table(emb, spec, cfg, role="embedding", rows=rows, vocab=V, hidden=H,
                             out_dtype=torch.float32, tied=True, where="e")
        sh = vt.finish_table(head, spec, cfg, role="head", rows=rows, vocab=V, hidden=H, out_dtype=torch.float32,
                             tied=True, where="h")
        assert se is sh and "weight" not in emb._parameters and "weight" not in head._parameters
        padded = torch.cat([w, torch.zeros(rows - V, H)])
        want = qhead.quantize(padded, "w4g64", scale_dtype="f32")
        assert torch.equal(emb.weight_packed, torch.from_dlpack(want.weight_packed))
        assert torch.equal(emb.weight_scale, torch.from_dlpack(want.weight_scale))
        packed_bytes = want.nbytes + 16  # + weight_shape
        dense_bytes = padded.numel() * 4
        assert vt.unique_tensor_bytes(m) == packed_bytes + (dense_bytes if rescore else 0)
        ids = torch.tensor([3, 66, 0, 3])
        x = _x(5)
        deq = torch.from_numpy(want.dequantize())
        if rescore:
            assert torch.equal(se.embedding(ids), w[ids])  # exact: the kept rows
            out = sh.logits(x)
            exact, quant = x @ padded.T, x @ deq.T
            # The quantized logits' top-K entries are exact; the others stay quantized.
            top = torch.topk(quant, rescore, dim=1).indices
            torch.testing.assert_close(out.gather(1, top), exact.gather(1, top), atol=_logit_tol(x, padded), rtol=0)
            rest = torch.ones_like(out, dtype=torch.bool).scatter_(1, top, False)
            torch.testing.assert_close(out[rest], quant[rest], atol=_logit_tol(x, deq), rtol=0)
        else:
            assert torch.equal(se.embedding(ids), deq[ids])
            torch.testing.assert_close(sh.logits(x), x @ deq.T, atol=_logit_tol(x, deq), rtol=0)


def test_untied_dense_head_only():
    """An untied model with head="w8": the embedding has no scheme (vLLM's own layer); the head
    is RTN-quantized from its dense rows."""
    cfg = vc.parse_config({"quant_method": "qhead", "head": "w8"})
    assert not cfg.role("embedding").quantized
    w = _dense_table(seed=4)
    head = _layer(cfg, cfg.role("head"), dtype=torch.bfloat16)
    head.weight.weight_loader(head.weight, w)
    assert head.weight.dtype == torch.bfloat16
    st = vt.finish_table(head, cfg.role("head"), cfg, role="head", rows=V, vocab=V, hidden=H,
                         out_dtype=torch.bfloat16, tied=False, where="lm_head")
    want = qhead.quantize(w.to(torch.bfloat16), "w8", scale_dtype="bf16")
    assert torch.equal(head.weight_packed, torch.from_dlpack(want.weight_packed))
    assert head.weight_scale.dtype == torch.bfloat16
    x = _x(3, dtype=torch.bfloat16)
    out = st.logits(x)
    assert out.dtype == torch.bfloat16 and out.shape == (3, V)
    with pytest.raises(qhead.InvalidFileError, match=r"lm_head.weight has shape \[66, 64\]"):
        head2 = _layer(cfg, cfg.role("head"), where="lm_head")
        head2.weight.weight_loader(head2.weight, w[:66])


def test_packed_checkpoint_rescore_needs_rows():
    """Rescoring over a packed checkpoint reads the full-precision rows from a safetensors file
    (mapped); without one it is an error naming the way out."""
    d = os.path.join(CT_MODELS, "untied")
    sd = _checkpoint(d)
    cfg = vc.with_checkpoint(vc.parse_config({"quant_method": "qhead", "head": "w8a", "rescore": 4}), d)
    head = _layer(cfg, cfg.head)
    for n, p in head.named_parameters():
        p.weight_loader(p, sd["lm_head." + n])
    with pytest.raises(qhead.InvalidArgumentError, match="dense_rows as the path"):
        vt.finish_table(head, cfg.head, cfg, role="head", rows=V, vocab=V, hidden=H, out_dtype=torch.float32,
                        tied=False, where="lm_head")


# ---- `qhead quantize` output and SmolLM2 ------------------------------------------------------------

def _qhead_cli():
    exe = os.environ.get("QHEAD_CLI") or shutil.which("qhead")
    return exe if exe and os.access(exe, os.X_OK) else None


@pytest.mark.skipif(_qhead_cli() is None, reason="the qhead CLI is not built (QHEAD_CLI names its path)")
def test_qhead_quantize_output_loads(tmp_path):
    """`qhead quantize MODEL_DIR --head w8` of a tied model: its compressed-tensors config gives
    the tied table packed, stored once; it loads into one table with the CLI's bytes."""
    w = _dense_table(seed=9)
    d = tmp_path / "dense"
    shutil.copytree(os.path.join(CT_MODELS, "tied"), d)
    os.remove(d / "reference.safetensors")
    sd = {k: v for k, v in load_file(str(d / "model.safetensors")).items()
          if not k.startswith(("model.embed_tokens.", "lm_head."))}
    sd["model.embed_tokens.weight"] = w.to(torch.bfloat16)
    save_file(sd, str(d / "model.safetensors"))
    cfgj = json.loads((d / "config.json").read_text())
    del cfgj["quantization_config"]
    (d / "config.json").write_text(json.dumps(cfgj))
    subprocess.run([_qhead_cli(), "quantize", str(d), "--head", "w8", "-o", str(tmp_path / "q")], check=True,
                   capture_output=True)
    q = json.loads((tmp_path / "q" / "config.json").read_text())["quantization_config"]
    cfg = vc.parse_config(q)
    spec = cfg.tied_role()
    assert spec == vc.RoleSpec("w8", "packed"), q
    emb, head = _layer(cfg, spec), _layer(cfg, spec)
    vt.tie_tables(head, emb)
    m = _Model(emb, head)
    qsd = _checkpoint(str(tmp_path / "q"))
    assert not any(k.startswith("lm_head.") for k in qsd)  # the tied table is stored once
    _load(m, qsd)
    st = vt.finish_table(head, spec, cfg, role="head", rows=V, vocab=V, hidden=H, out_dtype=torch.float32, tied=True,
                         where="lm_head")
    want = qhead.quantize(w.to(torch.bfloat16), "w8", scale_dtype="bf16")
    assert torch.equal(emb.weight_packed, torch.from_dlpack(want.weight_packed))
    assert torch.equal(emb.weight_scale, torch.from_dlpack(want.weight_scale))
    deq = torch.from_numpy(want.dequantize())
    x = _x(4)
    torch.testing.assert_close(st.logits(x), x @ deq.T, atol=_logit_tol(x, deq), rtol=0)


def test_smollm2_dense_tied_rtn():
    """SmolLM2-135M's tied 49152 x 576 table (the converted f32 checkpoint): one w8 table with
    the kept rows for rescoring, greedy top-1 of its exact top-8 equal to the dense logits'."""
    qm = pytest.importorskip("qhead.models")
    ref = qm.resolve("smollm2")
    d = ref.converted_dir
    if not os.path.isfile(os.path.join(d, "config.json")):
        pytest.skip(f"the converted SmolLM2 is not in the model cache ({d}); python -m qhead.models convert smollm2")
    hf = json.load(open(os.path.join(d, "config.json")))
    assert hf["tie_word_embeddings"]
    names = vc.checkpoint_tensor_names(d)
    key = "model.embed_tokens.weight"
    assert key in names and "lm_head.weight" not in names
    from safetensors import safe_open
    fn = next(os.path.join(d, f) for f in sorted(os.listdir(d)) if f.endswith(".safetensors"))
    with safe_open(fn, "pt") as f:
        w = f.get_tensor(key)
    v, h = w.shape
    cfg = vc.parse_config({"quant_method": "qhead", "head": "w8", "rescore": 8})
    spec = cfg.tied_role()
    layer = nn.Module()
    vt.create_table_weights(layer, spec, rows=v, hidden=h, vocab=v, row_range=(0, v), params_dtype=torch.float32,
                            scale_dtype=None, where="model.embed_tokens")
    layer.weight.weight_loader(layer.weight, w)
    st = vt.finish_table(layer, spec, cfg, role="embedding", rows=v, vocab=v, hidden=h, out_dtype=torch.float32,
                         tied=True, where="model.embed_tokens")
    assert vt.unique_tensor_bytes(layer) == layer.weight_packed.numel() * 4 + layer.weight_scale.numel() * 4 + 16 + \
        w.numel() * 4
    x = torch.randn(6, h, generator=torch.Generator().manual_seed(5)) * 2
    out = st.logits(x)
    dense = x @ w.T
    assert torch.equal(out.argmax(1), dense.argmax(1))
    ids = torch.tensor([1, 2, 49151, 100])
    assert torch.equal(st.embedding(ids), w[ids])


@pytest.mark.parametrize("source", ["dense", "packed"])
def test_rescore_rows_mapped_from_a_file(tmp_path, source):
    """dense_rows=PATH: the full-precision rows stay in the safetensors file (mapped, not loaded
    into the model): the model holds the packed table only, the tied embedding reads the file's
    rows exactly and the head's top-K logits are exact, over a dense or a packed checkpoint."""
    w = _dense_table(seed=6)
    path = str(tmp_path / "rows.safetensors")
    save_file({"model.embed_tokens.weight": w}, path)
    cfg = vc.parse_config({"quant_method": "qhead", "head": "w4g64", "rescore": 5, "dense_rows": path})
    want = qhead.quantize(w, "w4g64", scale_dtype="f32")
    if source == "packed":
        cfg = vc.replace(cfg, embedding=vc.RoleSpec(None, "dense"), packed_roles=("embedding",))
        sd = {"model.embed_tokens.weight_packed": torch.from_dlpack(want.weight_packed),
              "model.embed_tokens.weight_scale": torch.from_dlpack(want.weight_scale),
              "model.embed_tokens.weight_shape": torch.tensor([V, H])}
    else:
        sd = {"model.embed_tokens.weight": w}
    spec = cfg.tied_role()
    assert spec.source == source
    emb, head = _layer(cfg, spec), _layer(cfg, spec)
    vt.tie_tables(head, emb)
    m = _Model(emb, head)
    _load(m, sd)
    st = vt.finish_table(head, spec, cfg, role="head", rows=V, vocab=V, hidden=H, out_dtype=torch.float32, tied=True,
                         where="lm_head")
    assert vt.unique_tensor_bytes(m) == want.nbytes + 16  # no dense rows in the model
    ids = torch.tensor([0, 66, 12])
    assert torch.equal(st.embedding(ids), w[ids])
    x = _x(4, seed=2)
    deq = torch.from_numpy(want.dequantize())
    top = torch.topk(x @ deq.T, 5, dim=1).indices
    torch.testing.assert_close(st.logits(x).gather(1, top), (x @ w.T).gather(1, top), atol=_logit_tol(x, w), rtol=0)
    # A padded layer cannot rescore from the file's unpadded rows.
    emb2 = _layer(cfg, spec, rows=128)
    _load(_Model(emb2, nn.Module()), sd)
    with pytest.raises(qhead.UnsupportedError, match="pads the vocabulary"):
        vt.finish_table(emb2, spec, cfg, role="embedding", rows=128, vocab=V, hidden=H, out_dtype=torch.float32,
                        tied=True, where="e")


def test_register_without_vllm_is_an_import_error():
    """qhead.vllm imports without vLLM; register() needs it (vLLM is what calls it)."""
    import importlib.util

    import qhead.vllm as qv
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed (test_vllm_serving.py covers register())")
    with pytest.raises(ImportError):
        qv.register()
    assert not qv.registered()
