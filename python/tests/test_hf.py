"""qhead.hf on tiny random transformers models built in-process (no hub).

The quantized model is checked against a reference that keeps transformers' own modules
with the dequantized table in place of the dense one: that separates qhead's arithmetic
(exact up to f32 summation order) from the quantization error (bounded against the dense
model separately).
"""
import copy
import gc
import json
import os
import shutil
import subprocess
import sys
import weakref

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers.logging.set_verbosity_error()

import qhead  # noqa: E402
import qhead.hf as qh  # noqa: E402
from qhead.torch import QuantEmbedding, QuantLMHead  # noqa: E402
from safetensors import safe_open  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

V, H = 1000, 64
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CT_MODELS = os.path.join(REPO, "tests", "fixtures", "ct_models")


def _tiny(family, tied=None):
    """A tiny randomly initialised causal LM of the family (seeded)."""
    tf = transformers
    common = dict(vocab_size=V, hidden_size=H, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, max_position_embeddings=128)
    if family == "llama":
        cfg = tf.LlamaConfig(num_key_value_heads=2, tie_word_embeddings=True if tied is None else tied, **common)
        cls = tf.LlamaForCausalLM
    elif family == "qwen2":
        cfg = tf.Qwen2Config(num_key_value_heads=2, tie_word_embeddings=True if tied is None else tied, **common)
        cls = tf.Qwen2ForCausalLM
    elif family == "qwen3":
        cfg = tf.Qwen3Config(num_key_value_heads=2, head_dim=16, tie_word_embeddings=True if tied is None else tied,
                             **common)
        cls = tf.Qwen3ForCausalLM
    elif family == "gemma3":
        cfg = tf.Gemma3TextConfig(num_key_value_heads=1, head_dim=16, sliding_window=8, query_pre_attn_scalar=16,
                                  tie_word_embeddings=True if tied is None else tied, **common)
        cls = tf.Gemma3ForCausalLM
    elif family == "gpt2":
        cfg = tf.GPT2Config(vocab_size=V, n_embd=H, n_layer=2, n_head=4, n_positions=128,
                            tie_word_embeddings=True if tied is None else tied)
        cls = tf.GPT2LMHeadModel
    elif family == "gpt_neox":
        cfg = tf.GPTNeoXConfig(vocab_size=V, hidden_size=H, intermediate_size=128, num_hidden_layers=2,
                               num_attention_heads=4, max_position_embeddings=128,
                               tie_word_embeddings=False if tied is None else tied)
        cls = tf.GPTNeoXForCausalLM
    elif family == "opt":
        cfg = tf.OPTConfig(vocab_size=V, hidden_size=H, ffn_dim=128, num_hidden_layers=2, num_attention_heads=4,
                           word_embed_proj_dim=H, max_position_embeddings=128,
                           tie_word_embeddings=True if tied is None else tied)
        cls = tf.OPTForCausalLM
    else:
        raise AssertionError(family)
    torch.manual_seed(1234)
    m = cls(cfg).eval()
    # Random-init logits are nearly flat; a wider head makes greedy decisions well separated.
    with torch.no_grad():
        m.get_output_embeddings().weight.mul_(20.0)
        if not cfg.tie_word_embeddings:
            m.get_input_embeddings().weight.mul_(20.0)
    m.generation_config.pad_token_id = 0
    return m


def _dequantized_reference(dense, q):
    """A copy of the dense model with each quantized role's weight replaced by qhead's own
    dequantization of the packed table (transformers' modules do the arithmetic)."""
    ref = copy.deepcopy(dense)
    e, h = q.get_input_embeddings(), q.get_output_embeddings()
    with torch.no_grad():
        if isinstance(e, QuantEmbedding):
            w = torch.from_numpy(e.table.table().dequantize())
            ref.get_input_embeddings().weight.copy_(w)
        if isinstance(h, QuantLMHead):
            w = torch.from_numpy(h.table.table().dequantize())
            ref.get_output_embeddings().weight.copy_(w)
    return ref


def _ids(n=2, t=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, V, (n, t), generator=g)


FAMILIES = [
    # (family, tied, head scheme, embedding scheme)
    ("llama", True, "w4g64", None),
    ("llama", False, "w4g64", "w8"),
    ("qwen2", True, "w8", None),
    ("qwen3", True, "w4g64", None),
    ("gemma3", True, "w4g64", None),
    ("gpt2", True, "w4g32", None),
    ("gpt_neox", False, "w4g64", "w8"),
    ("opt", True, "w8", None),
]


@pytest.mark.parametrize("family,tied,head,embedding", FAMILIES,
                         ids=[f"{f}-{'tied' if t else 'untied'}-{h}" for f, t, h, _ in FAMILIES])
def test_quantize_model_family(family, tied, head, embedding):
    dense = _tiny(family, tied)
    emb_cls = type(dense.get_input_embeddings())
    q = qh.quantize_model(copy.deepcopy(dense), head=head, embedding=embedding)
    e, h = q.get_input_embeddings(), q.get_output_embeddings()
    assert isinstance(h, QuantLMHead) and h.table.scheme == head
    if tied:
        assert isinstance(e, QuantEmbedding) and e.table is h.table  # one table for both roles
        assert q.config.quantization_config.tied is True
    elif embedding is None:
        assert type(e) is emb_cls
    else:
        assert isinstance(e, QuantEmbedding) and e.table.scheme == embedding and e.table is not h.table
    if family == "gemma3":  # the model's embedding scale stays
        assert float(e.embed_scale) == pytest.approx(H ** 0.5)

    ref = _dequantized_reference(dense, q)
    ids = _ids()
    with torch.no_grad():
        out_q = q(ids, labels=ids)
        out_r = ref(ids, labels=ids)
        out_d = dense(ids, labels=ids)
    assert out_q.logits.shape == (2, 12, V) and out_q.logits.dtype == torch.float32
    scale = float(out_r.logits.abs().max())
    torch.testing.assert_close(out_q.logits, out_r.logits, atol=2e-5 * scale, rtol=1e-4)
    assert abs(float(out_q.loss) - float(out_r.loss)) < 1e-4
    # Against the dense model: within what the quantization moves (the roles' error is a
    # few percent of the logits' range for 4 bits).
    err = float((out_q.logits - out_d.logits).abs().max())
    assert err < (0.25 if "w4" in head else 0.05) * float(out_d.logits.abs().max())
    assert abs(float(out_q.loss) - float(out_d.loss)) < 0.1 * float(out_d.loss)

    prompt = ids[:1, :6]
    greedy_q = q.generate(prompt, max_new_tokens=8, do_sample=False)
    assert torch.equal(greedy_q, ref.generate(prompt, max_new_tokens=8, do_sample=False))
    beam_q = q.generate(prompt, max_new_tokens=6, do_sample=False, num_beams=3)
    assert torch.equal(beam_q, ref.generate(prompt, max_new_tokens=6, do_sample=False, num_beams=3))
    torch.manual_seed(7)
    samp_q = q.generate(prompt, max_new_tokens=8, do_sample=True, top_k=50)
    torch.manual_seed(7)
    samp_r = ref.generate(prompt, max_new_tokens=8, do_sample=True, top_k=50)
    assert samp_q.shape == (1, 14) and torch.equal(samp_q, samp_r)


def _head_input(model, ids):
    """(logits, the lm_head's input x) of one forward pass."""
    seen = {}

    def keep(mod, args, out):
        seen["x"] = args[0]

    hook = model.get_output_embeddings().register_forward_hook(keep)
    try:
        with torch.no_grad():
            logits = model(ids).logits
    finally:
        hook.remove()
    return logits, seen["x"].reshape(-1, H)


def test_rescore_top_k_exact():
    dense = _tiny("llama", True)
    w = dense.lm_head.weight.detach().clone().double()
    q = qh.quantize_model(copy.deepcopy(dense), head="w4g64", rescore=8)
    assert q.lm_head.rescore == 8
    logits, x = _head_input(q, _ids(4, 16, seed=3))
    logits = logits.reshape(-1, V).double()
    exact = x.double() @ w.T
    deq = torch.from_numpy(q.lm_head.table.table().dequantize()).double()
    candidates = (x.double() @ deq.T).topk(8, dim=1).indices  # the quantized head's top 8
    # The quantized head's 8 largest logits of every row are rescored: the full-precision values ...
    torch.testing.assert_close(logits.gather(1, candidates), exact.gather(1, candidates), atol=1e-5, rtol=1e-6)
    # ... so the argmax is the dense head's.
    assert torch.equal(logits.argmax(1), exact.argmax(1))
    values, ids, lse = q.lm_head.topk(x, 5)  # exact values, from the quantized top max(5, 8)
    assert torch.equal(ids[:, 0].long(), exact.argmax(1))
    torch.testing.assert_close(values.double(), exact.gather(1, ids.long()), atol=1e-5, rtol=1e-6)
    assert bool((values[:, :-1] >= values[:, 1:]).all())
    # The tied embedding reads the rows kept for rescoring: the dense model's embeddings exactly.
    ids = _ids(4, 16, seed=4)
    assert torch.equal(q.get_input_embeddings()(ids), dense.get_input_embeddings()(ids))
    assert q.config.quantization_config.exact_embedding is True
    # Without rescoring the embedding is the packed table's rows, and the logits (on the same x)
    # are the quantized ones.
    q0 = qh.quantize_model(copy.deepcopy(dense), head="w4g64")
    assert torch.equal(q0.get_input_embeddings()(ids).double(), deq[ids])
    l0 = q0.lm_head(x)
    assert float((l0.reshape(-1, V).double().gather(1, candidates) - exact.gather(1, candidates)).abs().max()) > 1e-3


def _rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _tied_model():
    cfg = transformers.LlamaConfig(vocab_size=65536, hidden_size=256, intermediate_size=64, num_hidden_layers=1,
                                   num_attention_heads=4, num_key_value_heads=1, tie_word_embeddings=True)
    torch.manual_seed(0)
    m = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # every page of the table written (resident), whatever the initializer did
        m.model.embed_tokens.weight.uniform_(-0.02, 0.02)
    return m


def _tied_rss_drop():
    """A fresh process's RSS drop from quantizing the tied table (the body of the memory check)."""
    m = _tied_model()
    gc.collect()
    before = _rss()
    qh.quantize_model(m, head="w4g64")
    gc.collect()
    return before - _rss(), qh.token_table_bytes(m)


def test_tied_one_copy_and_memory():
    """A model whose table dominates: quantizing frees the dense table (RSS drops by about its
    size less the packed one), one packed copy serves both roles, transformers does not re-tie."""
    m = _tied_model()
    assert m.lm_head.weight is m.model.embed_tokens.weight
    dense_bytes = 65536 * 256 * 4
    assert qh.token_table_bytes(m) == dense_bytes
    old = weakref.ref(m.model.embed_tokens.weight)
    qh.quantize_model(m, head="w4g64")
    gc.collect()
    packed = qh.token_table_bytes(m)
    assert packed == 65536 * (256 // 8) * 4 + 65536 * (256 // 64) * 4  # int32 words + f32 scales, once
    assert old() is None, "the dense table is still referenced"
    assert all(p.numel() < 65536 * 256 for p in m.parameters())
    # The RSS drop, measured in a fresh process: inside a long test process the allocator's state
    # that earlier tests leave can keep the freed pages mapped (a drop of 0 was seen in CI).
    code = (f"import sys, json; sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r}); "
            "import test_hf; print(json.dumps(test_hf._tied_rss_drop()))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    drop, child_packed = json.loads(r.stdout.strip().splitlines()[-1])
    assert child_packed == packed
    print(f"\ntied 65536x256 f32 table: RSS drop {drop / 2**20:.1f} MiB "
          f"(dense {dense_bytes / 2**20:.1f} MiB, packed {packed / 2**20:.1f} MiB)")
    assert drop >= 0.8 * (dense_bytes - packed)
    # transformers' own tying finds nothing to re-tie or re-materialise.
    m.tie_weights()
    assert m.lm_head.table is m.model.embed_tokens.table
    assert not any(n.endswith("embed_tokens.weight") or n == "lm_head.weight" for n, _ in m.named_parameters())
    ids = torch.tensor([[1, 2, 3]])
    assert m.generate(ids, max_new_tokens=2, do_sample=False, pad_token_id=0).shape == (1, 5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_tied_memory_cuda():
    tf = transformers
    cfg = tf.LlamaConfig(vocab_size=65536, hidden_size=256, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=1, tie_word_embeddings=True)
    torch.manual_seed(0)
    m = tf.LlamaForCausalLM(cfg).eval().to("cuda")
    gc.collect()
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    qh.quantize_model(m, head="w4g64")
    gc.collect()
    torch.cuda.synchronize()
    after = torch.cuda.memory_allocated()
    dense_bytes = 65536 * 256 * 4
    packed = qh.token_table_bytes(m)
    print(f"\ncuda tied table: memory_allocated {before / 2**20:.1f} MiB -> {after / 2**20:.1f} MiB")
    assert m.lm_head.table.device.type == "cuda"
    assert before - after >= 0.8 * (dense_bytes - packed)
    ids = torch.tensor([[1, 2, 3]], device="cuda")
    assert m.generate(ids, max_new_tokens=2, do_sample=False, pad_token_id=0).shape == (1, 5)


def _packed_keys(path):
    with safe_open(path, framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys() if "embed" in k or "lm_head" in k or "wte" in k}


@pytest.mark.parametrize("case", ["tied", "tied-rescore", "untied-rescore"])
def test_save_pretrained_round_trip(tmp_path, case):
    if case.startswith("tied"):
        dense = _tiny("llama", True)
        q = qh.quantize_model(copy.deepcopy(dense), head="w4g64", rescore=4 if case == "tied-rescore" else 0)
    else:
        dense = _tiny("llama", False)
        q = qh.quantize_model(copy.deepcopy(dense), head="w4g64", embedding="w8", rescore=4)
    ids = _ids()
    with torch.no_grad():
        want = q(ids).logits
    q.save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    qc = cfg["quantization_config"]
    assert qc["quant_method"] == "qhead" and qc["head"] == "w4g64"
    tensors = _packed_keys(str(tmp_path / "model.safetensors"))
    if case.startswith("tied"):
        assert qc["tied"] is True
        rows = {"lm_head.dense_weight"} if case == "tied-rescore" else set()
        assert set(tensors) == {"model.embed_tokens.weight_packed", "model.embed_tokens.weight_scale",
                                "model.embed_tokens.weight_shape"} | rows
        if rows:  # the full-precision rows, as they were
            assert torch.equal(tensors["lm_head.dense_weight"], dense.lm_head.weight.detach())
    else:
        assert qc["embedding"] == "w8" and qc["rescore"] == 4
        assert {"lm_head.weight_packed", "lm_head.weight_scale", "lm_head.dense_weight",
                "model.embed_tokens.weight_packed"} <= set(tensors)
        assert "lm_head.weight" not in tensors and "model.embed_tokens.weight" not in tensors
    assert tensors["model.embed_tokens.weight_shape"].tolist() == [V, H]

    r = transformers.AutoModelForCausalLM.from_pretrained(tmp_path)
    e, h = r.get_input_embeddings(), r.get_output_embeddings()
    assert isinstance(e, QuantEmbedding) and isinstance(h, QuantLMHead)
    assert (e.table is h.table) == case.startswith("tied")
    assert h.table.scheme == "w4g64" and e.table.scheme == q.get_input_embeddings().table.scheme
    # The packed tensors as saved, not re-quantized from a dense copy.
    src = q.get_input_embeddings().table
    assert torch.equal(e.table.weight_packed, src.weight_packed)
    assert torch.equal(e.table.weight_scale, src.weight_scale)
    assert torch.equal(e.table.weight_packed, tensors["model.embed_tokens.weight_packed"])
    if case.endswith("rescore"):
        assert h.rescore == 4
        assert torch.equal(h.table.weight_packed, q.lm_head.table.weight_packed)
    with torch.no_grad():
        got = r(ids).logits
    assert torch.equal(got, want)
    prompt = ids[:1, :5]
    assert torch.equal(r.generate(prompt, max_new_tokens=6, do_sample=False),
                       q.generate(prompt, max_new_tokens=6, do_sample=False))


def test_from_pretrained_with_qhead_config(tmp_path):
    dense = _tiny("qwen3", True)
    dense.save_pretrained(tmp_path)
    m = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, quantization_config=qh.QHeadConfig(head="w8"))
    assert isinstance(m.get_output_embeddings(), QuantLMHead)
    assert m.get_input_embeddings().table is m.get_output_embeddings().table
    assert m.config.quantization_config.quant_method == "qhead"
    want = qh.quantize_model(copy.deepcopy(dense), head="w8")
    assert torch.equal(m.lm_head.table.weight_packed, want.lm_head.table.weight_packed)
    ids = _ids()
    with torch.no_grad():
        assert torch.equal(m(ids).logits, want(ids).logits)
    # And that model saves and reloads like any other.
    m.save_pretrained(tmp_path / "q")
    r = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "q")
    with torch.no_grad():
        assert torch.equal(r(ids).logits, want(ids).logits)


@pytest.mark.parametrize("case", ["untied", "tied", "ignore_re", "sharded_untied"])
def test_load_quantized_compressed_tensors(case):
    """compressed-tensors model directories (made with the compressed-tensors library): the
    packed roles load into qhead modules and give the library's own decompression."""
    d = os.path.join(CT_MODELS, case)
    m = qh.load_quantized(d)
    e, h = m.get_input_embeddings(), m.get_output_embeddings()
    assert isinstance(e, QuantEmbedding) and isinstance(h, QuantLMHead)
    if case == "tied":
        assert e.table is h.table  # stored twice with identical bytes: one table
    assert not any(p.numel() >= 67 * 64 for p in m.parameters())  # no dense table anywhere
    ref = load_file(os.path.join(d, "reference.safetensors"))
    got = e(torch.arange(67)).to(torch.bfloat16)
    assert torch.equal(got, ref["embedding"].to(torch.bfloat16))
    # The library's decompression is qhead's dequantization rounded to BF16 (the scale dtype).
    deq = torch.from_numpy(h.table.table().dequantize())
    assert torch.equal(deq.to(torch.bfloat16), ref["head"].to(torch.bfloat16))
    x = torch.randn(5, 64, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(h(x), x @ deq.T, atol=1e-5, rtol=1e-5)
    assert m.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=3, do_sample=False, pad_token_id=0).shape == (1, 6)


def _qhead_cli():
    exe = os.environ.get("QHEAD_CLI") or shutil.which("qhead")
    return exe if exe and os.access(exe, os.X_OK) else None


@pytest.mark.skipif(_qhead_cli() is None, reason="the qhead CLI is not built (QHEAD_CLI names its path)")
@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied-head-only"])
def test_load_quantized_qhead_cli_output(tmp_path, tied):
    """`qhead quantize MODEL_DIR` output loads into qhead modules with the CLI's packed bytes,
    which are the bytes quantize_model makes (one RTN)."""
    dense = _tiny("llama", tied)
    dense.save_pretrained(tmp_path / "dense")
    scheme = "w4g64" if tied else "w8"
    subprocess.run([_qhead_cli(), "quantize", str(tmp_path / "dense"), "--head", scheme, "-o", str(tmp_path / "q")],
                   check=True, capture_output=True)
    m = qh.load_quantized(tmp_path / "q")
    want = qh.quantize_model(copy.deepcopy(dense), head=scheme)
    e, h = m.get_input_embeddings(), m.get_output_embeddings()
    assert isinstance(h, QuantLMHead) and h.table.scheme == scheme
    if tied:
        assert isinstance(e, QuantEmbedding) and e.table is h.table
    else:
        assert type(e) is torch.nn.Embedding
    assert torch.equal(h.table.weight_packed, want.lm_head.table.weight_packed)
    assert torch.equal(h.table.weight_scale, want.lm_head.table.weight_scale)
    ids = _ids()
    with torch.no_grad():
        assert torch.equal(m(ids).logits, want(ids).logits)


@pytest.mark.skipif(_qhead_cli() is None, reason="the qhead CLI is not built (QHEAD_CLI names its path)")
@pytest.mark.parametrize("embedding", [None, "w8"], ids=["dense-embedding", "w8-embedding"])
def test_qhead_cli_untie(tmp_path, embedding):
    """`qhead quantize --untie` of a tied model: two roles for transformers (through
    compressed-tensors, the independent reader) and for qhead.hf, with quantize_model(untie=True)'s
    tables."""
    dense = _tiny("llama", True)
    dense.save_pretrained(tmp_path / "dense")
    cmd = [_qhead_cli(), "quantize", str(tmp_path / "dense"), "--head", "w4g64", "--untie", "-o", str(tmp_path / "q")]
    if embedding:
        cmd += ["--embedding", embedding, "--mixed-schemes"]
    subprocess.run(cmd, check=True, capture_output=True)
    cfg = json.loads((tmp_path / "q" / "config.json").read_text())
    assert cfg["tie_word_embeddings"] is False
    want = qh.quantize_model(copy.deepcopy(dense), head="w4g64", embedding=embedding, untie=True)
    ids = _ids()
    with torch.no_grad():
        ref = want(ids).logits
    m = qh.load_quantized(tmp_path / "q")
    e, h = m.get_input_embeddings(), m.get_output_embeddings()
    assert isinstance(h, QuantLMHead) and torch.equal(h.table.weight_packed, want.lm_head.table.weight_packed)
    if embedding:
        assert isinstance(e, QuantEmbedding) and e.table is not h.table and e.table.scheme == embedding
        assert torch.equal(e.table.weight_packed, want.get_input_embeddings().table.weight_packed)
    else:
        assert type(e) is torch.nn.Embedding and torch.equal(e.weight, dense.get_input_embeddings().weight)
    with torch.no_grad():
        assert torch.equal(m(ids).logits, ref)
    if embedding is None:  # one scheme: transformers reads it through compressed-tensors
        pytest.importorskip("compressed_tensors")
        t = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "q")
        assert t.config.tie_word_embeddings is False
        with torch.no_grad():
            torch.testing.assert_close(t(ids).logits, ref, atol=2e-5 * float(ref.abs().max()), rtol=1e-4)


def test_load_quantized_refuses_other_packed_modules(tmp_path):
    import shutil

    from safetensors.torch import save_file

    src = os.path.join(CT_MODELS, "untied")
    shutil.copy(os.path.join(src, "config.json"), tmp_path / "config.json")
    sd = load_file(os.path.join(src, "model.safetensors"))
    w = sd.pop("model.layers.0.mlp.up_proj.weight")
    sd["model.layers.0.mlp.up_proj.weight_packed"] = torch.zeros(w.shape[0], w.shape[1] // 8, dtype=torch.int32)
    sd["model.layers.0.mlp.up_proj.weight_scale"] = torch.ones(w.shape[0], 1, dtype=torch.bfloat16)
    sd["model.layers.0.mlp.up_proj.weight_shape"] = torch.tensor(list(w.shape))
    save_file(sd, str(tmp_path / "model.safetensors"))
    with pytest.raises((qhead.UnsupportedError, qhead.InvalidFileError), match="up_proj"):
        qh.load_quantized(tmp_path)


def test_no_output_embedding_raises():
    base = transformers.LlamaModel(transformers.LlamaConfig(vocab_size=V, hidden_size=H, intermediate_size=128,
                                                            num_hidden_layers=1, num_attention_heads=4))
    with pytest.raises(qhead.InvalidArgumentError, match="no output embedding"):
        qh.quantize_model(base)


def test_bad_arguments():
    m = _tiny("llama", True)
    with pytest.raises(qhead.InvalidArgumentError, match="w5g7"):
        qh.quantize_model(m, head="w5g7")
    with pytest.raises(qhead.InvalidArgumentError):
        qh.QHeadConfig(head="int4")
    with pytest.raises(qhead.InvalidArgumentError, match="one scheme"):
        qh.quantize_model(m, head="w4g64", embedding="w8")
    with pytest.raises(qhead.InvalidArgumentError, match="nothing to quantize"):
        qh.quantize_model(m, head=None)
    with pytest.raises(qhead.InvalidArgumentError, match="rescore"):
        qh.quantize_model(m, head="w8", rescore=-1)
    with pytest.raises(qhead.InvalidArgumentError, match="group|multiple|divide"):
        qh.quantize_model(m, head="w4g128")  # H = 64
    assert isinstance(m.get_output_embeddings(), torch.nn.Linear)  # a failed call changes nothing
    qh.quantize_model(m, head="w8")
    with pytest.raises(qhead.InvalidArgumentError, match="already quantized"):
        qh.quantize_model(m, head="w8")
    with pytest.raises(qhead.InvalidArgumentError, match="PreTrainedModel"):
        qh.quantize_model(torch.nn.Linear(4, 4))


def _calibration(model, n=96, seed=5):
    """The head's inputs over random ids: [n * 16, H] f32."""
    _, x = _head_input(model, _ids(n // 16 if n >= 16 else 1, 16, seed=seed))
    return x.detach().contiguous()


def _gptq_objective(w, table, x):
    """sum over rows of (w - ŵ)ᵀ XᵀX (w - ŵ): GPTQ's objective for a table on the inputs x."""
    d = w.double() - torch.from_numpy(table.table().dequantize()).double()
    return float(((x.double() @ d.T) ** 2).sum())


@pytest.mark.parametrize("quantizer", ["mse", "gptq", "gptq-mse"])
def test_quantize_model_quantizer(tmp_path, quantizer):
    dense = _tiny("llama", True)
    x = _calibration(dense)
    w = dense.lm_head.weight.detach().clone()
    q = qh.quantize_model(copy.deepcopy(dense), head="w4g64", quantizer=quantizer, calibration=x)
    h = q.get_output_embeddings()
    assert q.get_input_embeddings().table is h.table  # still one table for both roles
    # The table is qhead.quantize's, bit for bit.
    want = qhead.quantize(w, "w4g64", scale_dtype="f32", quantizer=quantizer, calibration=x)
    deq_want = torch.from_numpy(want.dequantize())
    assert torch.equal(torch.from_numpy(h.table.table().dequantize()), deq_want)
    cfg = q.config.quantization_config
    assert cfg.quantizer == quantizer and cfg.calibration is None and cfg.calibration_rows == x.shape[0]
    # The calibrated quantizers lower GPTQ's objective against RTN on the same inputs.
    rtn = qh.quantize_model(copy.deepcopy(dense), head="w4g64")
    if quantizer != "mse":
        assert _gptq_objective(w, h.table, x) < 0.9 * _gptq_objective(w, rtn.lm_head.table, x)
    # A safetensors path gives the same table (its tensor "hidden"), and the config keeps the path.
    from safetensors.torch import save_file

    path = str(tmp_path / "states.safetensors")
    save_file({"hidden": x, "target": torch.zeros(x.shape[0], dtype=torch.int64)}, path)
    qp = qh.quantize_model(copy.deepcopy(dense), head="w4g64", quantizer=quantizer, calibration=path)
    assert torch.equal(torch.from_numpy(qp.lm_head.table.table().dequantize()), deq_want)
    assert qp.config.quantization_config.calibration == path
    # from_pretrained quantizing while it loads, with the config's calibration file.
    dense.save_pretrained(tmp_path / "dense")
    m = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path / "dense", quantization_config=qh.QHeadConfig(head="w4g64", quantizer=quantizer, calibration=path))
    assert torch.equal(torch.from_numpy(m.lm_head.table.table().dequantize()), deq_want)


def test_quantize_model_damp(tmp_path):
    """damp= reaches qhead.quantize (the table is its table at that damping, not the default's),
    is kept in the saved config and read back by from_pretrained; bad values are refused."""
    dense = _tiny("llama", True)
    x = _calibration(dense)
    w = dense.lm_head.weight.detach().clone()
    q = qh.quantize_model(copy.deepcopy(dense), head="w4g64", quantizer="gptq-mse", calibration=x, damp=0.5)
    got = torch.from_numpy(q.lm_head.table.table().dequantize())
    want = qhead.quantize(w, "w4g64", scale_dtype="f32", quantizer="gptq-mse", calibration=x, damp=0.5)
    default = qhead.quantize(w, "w4g64", scale_dtype="f32", quantizer="gptq-mse", calibration=x)
    assert torch.equal(got, torch.from_numpy(want.dequantize()))
    assert not torch.equal(got, torch.from_numpy(default.dequantize()))
    assert q.config.quantization_config.damp == 0.5
    from safetensors.torch import save_file

    path = str(tmp_path / "states.safetensors")
    save_file({"hidden": x}, path)
    dense.save_pretrained(tmp_path / "dense")
    m = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path / "dense",
        quantization_config=qh.QHeadConfig(head="w4g64", quantizer="gptq-mse", calibration=path, damp=0.5))
    assert torch.equal(torch.from_numpy(m.lm_head.table.table().dequantize()), got)
    for bad, msg in ((-0.1, "finite number >= 0"), (float("nan"), "finite number >= 0"), ("0.1", "finite number"),
                     (True, "finite number")):
        with pytest.raises(qhead.InvalidArgumentError, match=msg):
            qh.QHeadConfig(head="w4g64", quantizer="gptq", damp=bad)
    with pytest.raises(qhead.InvalidArgumentError, match="reads calibration"):
        qh.quantize_model(copy.deepcopy(dense), head="w4g64", damp=0.2)


def test_untie_quantized_pair(tmp_path):
    dense = _tiny("llama", True)
    x = _calibration(dense)
    w = dense.lm_head.weight.detach().clone()
    q = qh.quantize_model(copy.deepcopy(dense), head="w4g64", embedding="w8", quantizer="gptq-mse",
                          calibration=x, untie=True)
    e, h = q.get_input_embeddings(), q.get_output_embeddings()
    assert isinstance(e, QuantEmbedding) and isinstance(h, QuantLMHead) and e.table is not h.table
    assert e.table.scheme == "w8" and h.table.scheme == "w4g64"
    # The head: GPTQ-MSE on the calibration; the embedding: the MSE search without it.
    assert torch.equal(torch.from_numpy(h.table.table().dequantize()),
                       torch.from_numpy(qhead.quantize(w, "w4g64", scale_dtype="f32", quantizer="gptq-mse",
                                                       calibration=x).dequantize()))
    assert torch.equal(torch.from_numpy(e.table.table().dequantize()),
                       torch.from_numpy(qhead.quantize(w, "w8", scale_dtype="f32", quantizer="mse").dequantize()))
    cfg = q.config.quantization_config
    assert cfg.tied is False and cfg.untie is True and q.config.tie_word_embeddings is False
    assert qh.token_table_bytes(q) == e.table.nbytes + h.table.nbytes
    ref = copy.deepcopy(dense)  # dense is tied: the reference gets its own two tables
    ref.config.tie_word_embeddings = False
    ref.lm_head.weight = torch.nn.Parameter(torch.from_numpy(h.table.table().dequantize()))
    ref.model.embed_tokens.weight = torch.nn.Parameter(torch.from_numpy(e.table.table().dequantize()))
    ids = _ids()
    with torch.no_grad():
        want = q(ids).logits
        torch.testing.assert_close(want, ref(ids).logits, atol=2e-5 * float(want.abs().max()), rtol=1e-4)
    q.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["tie_word_embeddings"] is False and saved["quantization_config"]["untie"] is True
    tensors = _packed_keys(str(tmp_path / "model.safetensors"))
    assert {"model.embed_tokens.weight_packed", "lm_head.weight_packed"} <= set(tensors)
    r = transformers.AutoModelForCausalLM.from_pretrained(tmp_path)
    re_, rh = r.get_input_embeddings(), r.get_output_embeddings()
    assert re_.table is not rh.table and re_.table.scheme == "w8" and rh.table.scheme == "w4g64"
    assert torch.equal(rh.table.weight_packed, h.table.weight_packed)
    assert torch.equal(re_.table.weight_packed, e.table.weight_packed)
    with torch.no_grad():
        assert torch.equal(r(ids).logits, want)


def test_untie_dense_embedding_rescoring(tmp_path):
    """untie with no embedding scheme: the embedding keeps the dense Parameter, and the rescoring
    head reads its rows from it (one dense copy, in memory and on disk)."""
    dense = _tiny("llama", True)
    w = dense.lm_head.weight.detach().clone()
    q = qh.quantize_model(copy.deepcopy(dense), head="w4g64", untie=True, rescore=4)
    e, h = q.get_input_embeddings(), q.get_output_embeddings()
    assert type(e) is torch.nn.Embedding and isinstance(h, QuantLMHead) and h.rescore == 4
    assert torch.equal(e.weight, w)
    assert qh.token_table_bytes(q) == w.numel() * w.element_size() + h.table.nbytes
    ids = _ids()
    assert torch.equal(e(ids), dense.get_input_embeddings()(ids))
    logits, xs = _head_input(q, ids)
    exact = xs.double() @ w.double().T
    assert torch.equal(logits.reshape(-1, V).argmax(1), exact.argmax(1))
    q.save_pretrained(tmp_path)
    with safe_open(str(tmp_path / "model.safetensors"), framework="pt") as f:
        keys = set(f.keys())
    assert "model.embed_tokens.weight" in keys and "lm_head.weight_packed" in keys
    assert "lm_head.dense_weight" not in keys  # the embedding's weight is the rows
    r = transformers.AutoModelForCausalLM.from_pretrained(tmp_path)
    assert type(r.get_input_embeddings()) is torch.nn.Embedding and r.lm_head.rescore == 4
    with torch.no_grad():
        assert torch.equal(r(ids).logits, q(ids).logits)


def test_quantizer_bad_arguments(tmp_path):
    m = _tiny("llama", True)
    with pytest.raises(qhead.InvalidArgumentError, match="quantizer"):
        qh.QHeadConfig(head="w4g64", quantizer="awq")
    with pytest.raises(qhead.InvalidArgumentError, match="needs calibration"):
        qh.quantize_model(m, head="w4g64", quantizer="gptq")
    with pytest.raises(qhead.InvalidArgumentError, match=r"\[N >= 1, 64\].*\[10, 32\]"):
        qh.quantize_model(m, head="w4g64", quantizer="gptq", calibration=torch.ones(10, 32))
    with pytest.raises(qhead.IoError, match="does not exist"):
        qh.quantize_model(m, head="w4g64", quantizer="gptq", calibration=str(tmp_path / "none.safetensors"))
    from safetensors.torch import save_file

    two = str(tmp_path / "two.safetensors")
    save_file({"a": torch.ones(4, H), "b": torch.ones(4, H)}, two)
    with pytest.raises(qhead.InvalidArgumentError, match="PATH:TENSOR"):
        qh.quantize_model(m, head="w4g64", quantizer="gptq", calibration=two)
    with pytest.raises(qhead.InvalidArgumentError, match="untie"):
        qh.quantize_model(m, head=None, embedding="w8", untie=True)
    assert isinstance(m.get_output_embeddings(), torch.nn.Linear)  # failed calls change nothing
    qh.quantize_model(m, head="w4g64", quantizer="gptq", calibration=two + ":b")
    assert m.config.quantization_config.calibration == two + ":b"
