#!/usr/bin/env python3
"""Make real GPTQ-format checkpoint fixtures with the reference tools.

Each fixture is a tiny, seeded, random LlamaForCausalLM (1 layer, hidden 128,
intermediate 256, 4 heads, untied lm_head) with a locally trained WordLevel
tokenizer, quantized (lm_head included) by AutoRound or GPTQModel from PyPI and
saved in the GPTQ checkpoint format. Beside each one, expected.safetensors holds:

  lm_head.dequant        F32 [V, H]  lm_head dequantized by the TOOL's own code
                                     (AutoRound fixtures: auto_round_extension's
                                     torch QuantLinear.forward on an identity
                                     matrix; GPTQModel fixtures: GPTQModel's
                                     TorchLinear.dequantize_weight() after
                                     GPTQModel.load(backend=TORCH))
  lm_head.dequant_numpy  F32 [V, H]  the same, derived independently in numpy
                                     from qweight/qzeros/scales/g_idx with
                                     w[n,k] = scale[g[k],n] * (q[k,n] - (z[g[k],n] + off))
                                     off = 1 for the v1 'gptq' format, 0 for 'gptq_v2'
  embed_tokens           F32 [V, H]  model.embed_tokens.weight as stored (F16 there)

and (AutoRound fixtures) lm_head.dequant_gptqmodel: GPTQModel reading AutoRound's
checkpoint. The script asserts that the tool and numpy agree within one f16 ulp.

Run (CPU only, a few minutes on 2 cores):
  nice -n 10 "$GPTQVENV"/bin/python scripts/make_gptq_fixtures.py
See tests/fixtures/gptq/README.md for how that venv ($GPTQVENV) is made.
"""
import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile

# GPTQModel 7.7.0 asks for a 2-worker "model_loader:cpu" pool but only gives
# the cpu pool (cores+1)//2 workers: on a 2-core machine it raises
# "Virtual pool 'model_loader:cpu' requests 2 workers but parent 'cpu' only has 1".
os.environ.setdefault("GPTQMODEL_CPU_WORKERS", "2")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402
import torch  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
DEFAULT_OUT = os.path.join(REPO, "tests", "fixtures", "gptq")

# name -> spec. vocab must be a multiple of 32 for AutoRound (it silently
# leaves lm_head unquantized otherwise: "some layers are skipped quantization
# (shape not divisible by 32): lm_head").
FIXTURES = {
    "autoround_w4g32_asym": dict(tool="autoround", vocab=320, bits=4, group=32, sym=False),
    "autoround_w8pc_sym": dict(tool="autoround", vocab=160, bits=8, group=-1, sym=True),
    "gptqmodel_w4g32_actorder_asym": dict(tool="gptqmodel", vocab=320, bits=4, group=32, sym=False,
                                          desc_act=True, fmt="gptq"),
    "gptqmodel_w4g32_actorder_asym_v300": dict(tool="gptqmodel", vocab=300, bits=4, group=32, sym=False,
                                               desc_act=True, fmt="gptq"),
    "gptqmodel_w8g64_sym_v2": dict(tool="gptqmodel", vocab=160, bits=8, group=64, sym=True,
                                   desc_act=False, fmt="gptq_v2"),
}

HIDDEN = 128
SEED = 1234
KEEP_FILES = ("config.json", "generation_config.json", "model.safetensors", "quantize_config.json",
              "quantization_config.json", "tokenizer.json", "tokenizer_config.json")


# ----------------------------------------------------------------------------
# tiny model + tokenizer + calibration text, all local
# ----------------------------------------------------------------------------
def make_text(n_lines, seed):
    rng = random.Random(seed)
    syll = ["ka", "lo", "mi", "ne", "ru", "sa", "ti", "vo", "ze", "pa", "qu", "do", "fe", "gi", "hu", "ja"]
    words = sorted({"".join(rng.choice(syll) for _ in range(rng.randint(1, 3))) for _ in range(400)})[:140]
    return [" ".join(rng.choice(words) for _ in range(rng.randint(16, 48))) for _ in range(n_lines)]


def build_base(out, vocab):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    lines = make_text(400, SEED)
    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(lines, trainer=trainers.WordLevelTrainer(
        vocab_size=vocab, special_tokens=["<unk>", "<s>", "</s>"]))
    assert tok.get_vocab_size() <= vocab, tok.get_vocab_size()
    ftok = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>",
                                   eos_token="</s>", pad_token="</s>")
    torch.manual_seed(SEED + vocab)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=HIDDEN, intermediate_size=256, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=256,
                      tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=2)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        for _, p in model.named_parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.05)
    model = model.to(torch.float16)
    model.save_pretrained(out)
    ftok.save_pretrained(out)


def calibration():
    return make_text(64, 99)


# ----------------------------------------------------------------------------
# quantizers (each run in its own process)
# ----------------------------------------------------------------------------
def run_autoround(base, out, spec):
    from auto_round import AutoRound
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(base)
    ar = AutoRound(model, tok, bits=spec["bits"], group_size=spec["group"], sym=spec["sym"],
                   iters=4, nsamples=16, seqlen=32, batch_size=4, dataset=calibration(),
                   quant_lm_head=True, device_map="cpu", seed=42)
    tmp = out + ".ar"
    ar.quantize_and_save(tmp, format="auto_gptq")
    # AutoRound 0.16.1 writes into a sub-folder named <model>-w<bits>g<group>
    found = [r for r, _, fs in os.walk(tmp) if "model.safetensors" in fs]
    assert len(found) == 1, found
    shutil.move(found[0], out)
    shutil.rmtree(tmp)


def run_gptqmodel(base, out, spec):
    from gptqmodel import GPTQModel, QuantizeConfig
    from gptqmodel.quantization import FORMAT
    from transformers import AutoTokenizer

    lm = {"bits": spec["bits"], "group_size": spec["group"], "sym": spec["sym"], "desc_act": spec["desc_act"]}
    # Without the explicit `dynamic` rule GPTQModel 7.7.0 quantizes lm_head with its
    # own default {"bits": 8, "group_size": 32, "sym": True, "desc_act": False, "mse": 2.4}
    # (gptqmodel/looper/module_looper.py), whatever bits/sym/desc_act say.
    qc = QuantizeConfig(bits=spec["bits"], group_size=spec["group"], sym=spec["sym"],
                        desc_act=spec["desc_act"], act_group_aware=False, lm_head=True,
                        dynamic={"lm_head": lm},
                        format=FORMAT.GPTQ if spec["fmt"] == "gptq" else FORMAT.GPTQ_V2)
    tok = AutoTokenizer.from_pretrained(base)
    model = GPTQModel.load(base, qc, dtype=torch.float16)
    model.quantize(calibration(), batch_size=4, tokenizer=tok)
    model.save(out)


# ----------------------------------------------------------------------------
# dequantization: numpy (independent) and the tools' own code
# ----------------------------------------------------------------------------
def np_unpack_rows(packed, bits, rows):
    """int32 [R, N] packed along dim 0, low bits first -> int [rows, N]."""
    pf = 32 // bits
    u = packed.astype(np.int64) & 0xFFFFFFFF
    out = np.stack([(u >> (bits * i)) & ((1 << bits) - 1) for i in range(pf)], axis=1)  # [R, pf, N]
    return out.reshape(-1, packed.shape[1])[:rows]


def np_unpack_cols(packed, bits, cols):
    """int32 [G, C] packed along dim 1, low bits first -> int [G, cols]."""
    return np_unpack_rows(np.ascontiguousarray(packed.T), bits, cols).T


def numpy_dequant(t, bits, v1):
    qweight, qzeros, scales, g_idx = (t["lm_head.qweight"], t["lm_head.qzeros"], t["lm_head.scales"],
                                      t["lm_head.g_idx"])
    K = g_idx.shape[0]
    N = scales.shape[1]
    q = np_unpack_rows(qweight, bits, K)                    # [K, N]
    z = np_unpack_cols(qzeros, bits, N) + (1 if v1 else 0)  # [G, N]
    g = g_idx.astype(np.int64)
    w = scales.astype(np.float32)[g] * (q - z[g]).astype(np.float32)  # [K, N]
    return np.ascontiguousarray(w.T)                        # [N, K] = [V, H]


def autoround_dequant(t, bits, group):
    """AutoRound's own torch QuantLinear (auto_round_extension.torch.qlinear_torch_zp), the class
    its auto_gptq export packs with and its 'auto_round:torch_zp' inference backend. Built the way
    AutoRound's inference builds it (auto_round/inference/convert_model.py _create_quant_layer:
    no g_idx buffer -- AutoRound refuses desc_act checkpoints), then forward() on an identity.
    (With g_idx=True its forward slices scales/zeros columns by in_features and breaks for
    out_features != in_features, e.g. lm_head.)"""
    from auto_round_extension.torch.qlinear_torch_zp import QuantLinear

    K = t["lm_head.g_idx"].shape[0]
    N = t["lm_head.scales"].shape[1]
    gs = K if group == -1 else group
    assert (t["lm_head.g_idx"] == np.arange(K) // gs).all(), "AutoRound g_idx must be trivial"
    ql = QuantLinear(bits, group, K, N, bias=False)
    for k in ("qweight", "qzeros", "scales"):
        v = torch.from_numpy(t["lm_head." + k])
        assert getattr(ql, k).shape == v.shape and getattr(ql, k).dtype == v.dtype, (k, v.shape, v.dtype)
        setattr(ql, k, v)
    with torch.no_grad():
        w = ql(torch.eye(K, dtype=torch.float32))  # [K, N]
    return w.t().contiguous().numpy()


def gptqmodel_dequant(fixture_dir):
    """GPTQModel's own loader (v1 -> v2 conversion included) + TorchLinear.dequantize_weight()."""
    from gptqmodel import BACKEND, GPTQModel

    m = GPTQModel.load(fixture_dir, backend=BACKEND.TORCH, device="cpu", dtype=torch.float16)
    head = m.model.lm_head
    with torch.no_grad():
        w = head.dequantize_weight()  # [K, N] in the scales dtype
    return type(head).__name__, w.float().t().contiguous().numpy()


def f16_ulp(x):
    a = np.abs(x.astype(np.float16)).astype(np.float32)
    return np.spacing(a.astype(np.float16)).astype(np.float32)


def make_expected(name, spec, out_dir):
    from safetensors.numpy import save_file
    from safetensors.torch import load_file

    d = os.path.join(out_dir, name)
    tt = load_file(os.path.join(d, "model.safetensors"))
    dtypes = {k: str(v.dtype).replace("torch.", "") for k, v in tt.items()}
    # AutoRound on CPU writes the unquantized tensors as bfloat16 (numpy has none)
    t = {k: (v.float() if v.dtype == torch.bfloat16 else v).numpy() for k, v in tt.items()}
    cfg = json.load(open(os.path.join(d, "config.json")))["quantization_config"]
    v1 = cfg.get("checkpoint_format", "gptq") == "gptq"
    assert v1 == (spec.get("fmt", "gptq") == "gptq"), cfg
    ref_np = numpy_dequant(t, spec["bits"], v1)
    tensors = {"lm_head.dequant_numpy": ref_np,
               "embed_tokens": t["model.embed_tokens.weight"].astype(np.float32)}
    report = {}
    if spec["tool"] == "autoround":
        tool = autoround_dequant(t, spec["bits"], spec["group"])
        report["tool_path"] = "auto_round_extension.torch.qlinear_torch_zp.QuantLinear.forward(eye)"
        try:  # cross-check: GPTQModel reading AutoRound's checkpoint
            _, gm = gptqmodel_dequant(d)
            tensors["lm_head.dequant_gptqmodel"] = gm
            report["max_abs_diff_gptqmodel_vs_numpy"] = float(np.abs(gm - ref_np).max())
        except Exception as e:  # GPTQModel refuses sym=False v1 checkpoints it did not write
            report["gptqmodel_load_error"] = f"{type(e).__name__}: {e}"
    else:
        cls, tool = gptqmodel_dequant(d)
        report["tool_path"] = f"GPTQModel.load(backend=TORCH) lm_head {cls}.dequantize_weight()"
    tensors["lm_head.dequant"] = tool
    diff = np.abs(tool - ref_np)
    report["max_abs_diff_tool_vs_numpy"] = float(diff.max())
    report["max_abs_lm_head"] = float(np.abs(ref_np).max())
    # the tools dequantize in f16 (scales dtype); numpy in f32 (exact) -> <= half an f16 ulp
    tol = 0.5 * f16_ulp(ref_np) + 1e-12
    assert (diff <= tol).all(), (name, float(diff.max()))
    if "lm_head.dequant_gptqmodel" in tensors:
        assert (np.abs(tensors["lm_head.dequant_gptqmodel"] - ref_np) <= tol).all(), name
    meta = {"fixture": name, "tool": spec["tool"], "bits": str(spec["bits"]), "group_size": str(spec["group"]),
            "sym": str(spec["sym"]), "checkpoint_format": "gptq" if v1 else "gptq_v2",
            "tool_path": report["tool_path"]}
    save_file({k: np.ascontiguousarray(v, dtype=np.float32) for k, v in tensors.items()},
              os.path.join(d, "expected.safetensors"), metadata=meta)

    # facts for the README
    g = t["lm_head.g_idx"]
    K = g.shape[0]
    N = t["lm_head.scales"].shape[1]
    gs = K if spec["group"] == -1 else spec["group"]
    zs = np_unpack_cols(t["lm_head.qzeros"], spec["bits"], N)
    pf = 32 // spec["bits"]
    pad_bits = None
    if N % pf:
        last = t["lm_head.qzeros"][:, -1].astype(np.int64) & 0xFFFFFFFF
        pad_bits = sorted({hex(int(x) >> (spec["bits"] * (N % pf))) for x in last})
    report.update({
        "lm_head_tensors": {k: [dtypes[k], list(v.shape)] for k, v in t.items() if k.startswith("lm_head.")},
        "embed_tokens_dtype": dtypes["model.embed_tokens.weight"],
        "g_idx_is_k_div_group": bool((g == np.arange(K) // gs).all()),
        "stored_zero_min": int(zs.min()), "stored_zero_max": int(zs.max()),
        "stored_zero_values_if_few": sorted({int(x) for x in zs.ravel()})[:4] if len(set(zs.ravel())) <= 4 else None,
        "qzeros_padding_bits_last_word": pad_bits,
    })
    return report


# ----------------------------------------------------------------------------
def versions():
    import importlib.metadata as md
    out = {}
    for p in ("auto-round", "gptqmodel", "torch", "transformers", "tokenizers", "safetensors", "numpy",
              "accelerate", "datasets"):
        try:
            out[p] = md.version(p)
        except md.PackageNotFoundError:
            out[p] = None
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=DEFAULT_OUT)
    ap.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "gptq_fixture_work"))
    ap.add_argument("--only", nargs="*", help="fixture names (default: all)")
    ap.add_argument("--expected-only", action="store_true", help="recompute expected.safetensors only")
    ap.add_argument("--_child", nargs=3, metavar=("NAME", "BASE", "OUT"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    # GPTQModel writes its logs into ./logs: keep them out of the repository
    # (paths made absolute first, then run from the work directory).
    a.out, a.work = os.path.abspath(a.out), os.path.abspath(a.work)
    if a._child:
        a._child = [a._child[0]] + [os.path.abspath(p) for p in a._child[1:]]
    os.makedirs(a.work, exist_ok=True)
    os.chdir(a.work)
    torch.set_num_threads(2)

    if a._child:
        name, base, out = a._child
        spec = FIXTURES[name]
        (run_autoround if spec["tool"] == "autoround" else run_gptqmodel)(base, out, spec)
        return

    names = a.only or list(FIXTURES)
    os.makedirs(a.out, exist_ok=True)
    os.makedirs(a.work, exist_ok=True)
    reports = {}
    for name in names:
        spec = FIXTURES[name]
        dst = os.path.join(a.out, name)
        if not a.expected_only:
            base = os.path.join(a.work, f"base_v{spec['vocab']}")
            if not os.path.exists(os.path.join(base, "model.safetensors")):
                build_base(base, spec["vocab"])
            tmp = os.path.join(a.work, name)
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.rmtree(tmp + ".ar", ignore_errors=True)
            subprocess.run([sys.executable, os.path.abspath(__file__), "--_child", name, base, tmp], check=True)
            shutil.rmtree(dst, ignore_errors=True)
            os.makedirs(dst)
            for f in sorted(os.listdir(tmp)):
                if f in KEEP_FILES:
                    shutil.copy(os.path.join(tmp, f), os.path.join(dst, f))
        reports[name] = make_expected(name, spec, a.out)
        print(name, json.dumps(reports[name], indent=1), flush=True)
    summary = {"versions": versions(), "fixtures": reports}
    with open(os.path.join(a.work, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print("summary:", os.path.join(a.work, "summary.json"))


if __name__ == "__main__":
    main()
