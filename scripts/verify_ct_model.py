#!/usr/bin/env python3
"""Check `qhead quantize MODEL_DIR ... -o OUT_DIR` against the compressed-tensors library.

Run with the pinned venv (python 3.11, torch 2.15.0 CPU, compressed-tensors
0.20.0, transformers 5.24.0, safetensors 0.8.0):

    "$CTVENV"/bin/python scripts/verify_ct_model.py [--qhead build-write/qhead] [--keep DIR]
    "$CTVENV"/bin/python scripts/verify_ct_model.py --check OUT_DIR [OUT_DIR ...]

($CTVENV: the venv tests/fixtures/ct/README.md makes.)

Without --check it builds inputs from the committed fixtures in
tests/fixtures/ct_models (made by make_ct_model_fixtures.py with the library
itself), runs the qhead binary on each case below and checks every output.

Inputs: `dense_untied`, `dense_tied` (table stored once), `dense_tied_twice`
(two identical copies) and `dense_sharded` are the fixtures with each packed
role replaced by the library's own decompression of it (reference.safetensors,
BF16) and the quantization_config removed; the packed fixtures `untied`,
`tied` (stored twice), `ignore_re`, `sharded_untied` are used as they are
(with --requantize).

Checks on each OUT_DIR (all must hold):
  config    compressed-tensors parses quantization_config
            (QuantizationConfig.model_validate) and serializes it back exactly
            as qhead wrote it (model_dump + the keys update_config adds);
            tie_word_embeddings is the input's.
  lifecycle the library's load path (as in its ModelCompressor docstring and
            make_ct_model_fixtures.py --verify): the config's
            QuantizationConfig -> apply_quantization_config -> compress_model ->
            load_state_dict of the (sharded) files (no unexpected keys; the only
            missing key allowed is a tied model's lm_head.weight) ->
            decompress_model -> tie_weights. Each packed role's decompressed
            weight equals, exactly once rounded to the scale dtype, the values
            this script computes from the packed tensors with its own bit
            arithmetic: (q - z) * s. A tied head is the embedding's tensor.
  decompress PackedQuantizationCompressor.decompress of each role's tensors (with
            the scheme the library attached to the module) gives the same values.
  rtn       compressed-tensors' own RTN of the role's input (its min-max
            per group/row, calculate_qparams, PackedQuantizationCompressor.compress)
            gives byte-identical weight_packed / weight_scale /
            weight_zero_point / weight_shape. The input is the dense role, or
            for --requantize the script's own dequantization of the input's
            packed tensors in f32 (what qhead requantizes from).
  kept      a role without a scheme loads to the input's values.
The dequantized values qhead itself computes from the same packed tensors are
checked against the library's decompression in tests/test_model_dir.cc and
tests/test_compressed_tensors.cc (same formula, exact in f32); the C++ test
tests/test_model_write.cc checks qhead reads every OUT_DIR back as written.

Also reported, not required: transformers 5.24.0
AutoModelForCausalLM.from_pretrained(OUT_DIR,
quantization_config=CompressedTensorsConfig(run_compressed=False)). Its loader
decompresses every module with the FIRST config group's scheme
(get_dense_scheme; see tests/fixtures/ct_models/README.md), so it can only load
outputs whose groups all have one scheme.

Result (2026-11-29: qhead built from the commit adding this script, CPU
build; compressed-tensors 0.20.0, torch 2.15.0+cu132 on the CPU, transformers
5.24.0): ALL OK — all 12 cases pass every required check (config, lifecycle,
decompress, rtn, kept). transformers' from_pretrained, informational:

| case | transformers from_pretrained(run_compressed=False) |
|---|---|
| untied_w4g32_w8a | fails on lm_head (decompressed with group_0's w4g32: zero points [17, 1] vs 67 rows) |
| untied_w8g64a_w4 | fails on lm_head (group_0's asymmetric args: "Asymmetric quant requires zero-point values") |
| untied_head_only_w4g32a | loads, equal |
| untied_f32_scales | fails on lm_head (as untied_w4g32_w8a) |
| tied_w4g32a, tied_w8, tied_twice_w4g64 | load, equal (one table) |
| sharded_w4g64_w8g32a | fails on lm_head (as untied_w4g32_w8a) |
| requant_untied_head_w4g64 | loads, equal (the two groups differ only in group size) |
| requant_tied_w8a | loads, equal (the fixture's emptied "Embedding" group was dropped) |
| requant_ignore_re_both | loads, DIFFERENT values (lm_head's w8 codes read with group_0's w4g32) |
| requant_sharded_head_w4 | loads, equal |

So outputs whose roles share one scheme (every tied model; untied with one
scheme) load in transformers too; untied roles with different schemes load
through compressed-tensors' own path only — a transformers 5.24 limitation
(get_dense_scheme). `qhead quantize` therefore refuses config groups with
different weight schemes unless given --mixed-schemes, which the cases with two
schemes above pass (scripts/check_transformers_load.py checks the default).
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

import torch
from safetensors.torch import load_file, save_file

import compressed_tensors
import transformers
from compressed_tensors.compressors import ModelCompressor
from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
from compressed_tensors.quantization import QuantizationConfig, apply_quantization_config
from compressed_tensors.quantization.utils.helpers import calculate_qparams

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
FIX = os.path.join(REPO, "tests", "fixtures", "ct_models")
sys.path.insert(0, HERE)
from make_ct_fixtures import observe  # noqa: E402  (compressed-tensors' min-max per group / row)

ROLES = {"embedding": "model.embed_tokens", "head": "lm_head"}
PARTS = ("weight_packed", "weight_scale", "weight_zero_point", "weight_shape")

# (name, input, qhead arguments)
CASES = [
    ("untied_w4g32_w8a", "dense_untied", "--embedding w4g32 --head w8a --mixed-schemes"),
    ("untied_w8g64a_w4", "dense_untied", "--embedding w8g64a --head w4 --mixed-schemes"),
    ("untied_head_only_w4g32a", "dense_untied", "--head w4g32a"),
    ("untied_f32_scales", "dense_untied", "--embedding w4g32 --head w8g32a --scale-dtype f32 --mixed-schemes"),
    ("tied_w4g32a", "dense_tied", "--embedding w4g32a"),
    ("tied_w8", "dense_tied", "--head w8"),
    ("tied_twice_w4g64", "dense_tied_twice", "--embedding w4g64 --head w4g64"),
    ("sharded_w4g64_w8g32a", "dense_sharded", "--embedding w4g64 --head w8g32a --mixed-schemes"),
    ("requant_untied_head_w4g64", "untied", "--head w4g64 --requantize --mixed-schemes"),
    ("requant_tied_w8a", "tied", "--embedding w8a --requantize"),
    ("requant_ignore_re_both", "ignore_re", "--embedding w4g32 --head w8 --requantize --mixed-schemes"),
    ("requant_sharded_head_w4", "sharded_untied", "--head w4 --requantize --mixed-schemes"),
]


# ---- files ------------------------------------------------------------------------

def shard_files(d):
    idx = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(idx):
        with open(idx) as f:
            return sorted(set(json.load(f)["weight_map"].values()))
    return ["model.safetensors"]


def read_tensors(d):
    sd = {}
    for f in shard_files(d):
        sd.update(load_file(os.path.join(d, f)))
    return sd


def read_config(d):
    with open(os.path.join(d, "config.json")) as f:
        return json.load(f)


def make_dense(src, dst, tied_twice=False):
    """A dense model directory from a packed fixture: each role is the library's
    decompression of it (reference.safetensors), every other tensor as it is."""
    shutil.rmtree(dst, ignore_errors=True)
    os.makedirs(dst)
    cfg = read_config(src)
    cfg.pop("quantization_config")
    ref = load_file(os.path.join(src, "reference.safetensors"))
    sharded = os.path.exists(os.path.join(src, "model.safetensors.index.json"))
    groups = {}  # file -> tensors
    for f in shard_files(src):
        part = load_file(os.path.join(src, f))
        groups[f] = {k: v for k, v in part.items() if not k.startswith(("model.embed_tokens.weight_", "lm_head.weight_"))}
        if any(k.startswith("model.embed_tokens.weight_") for k in part):
            groups[f]["model.embed_tokens.weight"] = ref["embedding"].clone()
        if any(k.startswith("lm_head.weight_") for k in part) and (not cfg["tie_word_embeddings"] or tied_twice):
            groups[f]["lm_head.weight"] = ref["head"].clone()
    weight_map = {}
    for f, tensors in groups.items():
        save_file(tensors, os.path.join(dst, f), metadata={"format": "pt"})
        weight_map.update({k: f for k in tensors})
    if sharded:
        total = sum(v.numel() * v.element_size() for t in groups.values() for v in t.values())
        with open(os.path.join(dst, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2, sort_keys=True)
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
    with open(os.path.join(dst, "tokenizer_config.json"), "w") as f:
        json.dump({"note": "copied unchanged by qhead"}, f)
    return dst


# ---- the script's own arithmetic ----------------------------------------------------

def unpack(words, bits, n):
    """Signed codes [rows, n] from int32 rows, each one little-endian bit stream
    (code i at stream bit i*bits; a code may straddle two words)."""
    w = words.to(torch.int64) & 0xFFFFFFFF
    i = torch.arange(n, dtype=torch.int64) * bits
    k, off = i // 32, i % 32
    v = w[:, k] >> off
    k1 = torch.clamp(k + 1, max=w.shape[1] - 1)
    v = v | torch.where(off + bits > 32, w[:, k1] << (32 - off), torch.zeros_like(v))
    return (v & ((1 << bits) - 1)) - (1 << (bits - 1))


def dequant(sd, module, args):
    """(q - z) * s in float64 (exact), as [V, H] float64."""
    shape = sd[f"{module}.weight_shape"].tolist()
    v, h = int(shape[0]), int(shape[1])
    q = unpack(sd[f"{module}.weight_packed"], args.num_bits, h).to(torch.float64)
    s = sd[f"{module}.weight_scale"].to(torch.float64)
    g = s.shape[1]
    if args.symmetric:
        z = torch.zeros(v, g, dtype=torch.float64)
    else:
        zp = sd[f"{module}.weight_zero_point"]  # [ceil(V*b/32), G], packed along dim 0
        z = unpack(zp.t().contiguous(), args.num_bits, v).t().to(torch.float64)
    gl = h // g
    return (q - z.repeat_interleave(gl, dim=1)) * s.repeat_interleave(gl, dim=1)


# ---- the library's side ---------------------------------------------------------------

def lifecycle(d, dtype):
    """Loads d the way the library's ModelCompressor describes a load."""
    cfg = transformers.AutoConfig.from_pretrained(d)
    qc = QuantizationConfig.model_validate(read_config(d)["quantization_config"])
    model = transformers.LlamaForCausalLM(cfg).to(dtype)
    apply_quantization_config(model, qc, show_progress=False)
    comp = ModelCompressor(quantization_config=qc)
    comp.compress_model(model)
    missing, unexpected = model.load_state_dict(read_tensors(d), strict=False)
    comp.decompress_model(model)
    if cfg.tie_word_embeddings:
        model.tie_weights()
    return model, missing, unexpected


def ct_rtn(w, args, scale_dtype, scheme):
    """compressed-tensors' own RTN of w: min-max per group/row, calculate_qparams, compress."""
    mn, mx = observe(w, args)
    scale, zp = calculate_qparams(mn, mx, args)
    state = {"weight": w, "weight_scale": scale.to(scale_dtype), "weight_zero_point": zp}
    return PackedQuantizationCompressor.compress(state, scheme)


def config_as_library_writes(qc_ours):
    """What ModelCompressor.update_config writes for this config."""
    qc = QuantizationConfig.model_validate(qc_ours)
    data = qc.model_dump(exclude=["quant_method"])
    return json.loads(json.dumps({"version": qc_ours.get("version", compressed_tensors.__version__),
                                  "quant_method": "compressed-tensors",
                                  "sparsity_config": qc_ours.get("sparsity_config", {}),
                                  "transform_config": qc_ours.get("transform_config", {}), **data}))


# ---- one output ------------------------------------------------------------------------

def check(out, inp=None):
    """Returns (ok, notes, {role: QuantizationArgs}) for OUT_DIR `out` made from input dir `inp`."""
    notes, ok = [], True

    def need(cond, what):
        nonlocal ok
        if not cond:
            ok = False
            notes.append("FAIL " + what)

    cfg = read_config(out)
    qc = cfg["quantization_config"]
    need(config_as_library_writes(qc) == qc, "config: the library serializes quantization_config differently")
    if inp:
        need(cfg.get("tie_word_embeddings") == read_config(inp).get("tie_word_embeddings"), "config: tie changed")
    tied = bool(cfg.get("tie_word_embeddings"))
    sd = read_tensors(out)
    packed = {r: m for r, m in ROLES.items() if f"{m}.weight_packed" in sd}
    scale_dtypes = {sd[f"{m}.weight_scale"].dtype for m in packed.values()}
    # Load in the scale dtype (load_state_dict casts every tensor to its parameter's dtype).
    dtype = scale_dtypes.pop() if len(scale_dtypes) == 1 else torch.float32
    model, missing, unexpected = lifecycle(out, dtype)
    need(not unexpected, f"lifecycle: unexpected keys {unexpected}")
    need(set(missing) <= ({"lm_head.weight"} if tied else set()), f"lifecycle: missing keys {missing}")
    mods = {"embedding": model.model.embed_tokens, "head": model.lm_head}
    in_sd = read_tensors(inp) if inp else None
    schemes = {}
    for role, m in ROLES.items():
        if role == "head" and tied:
            need(model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
                 or torch.equal(model.lm_head.weight, model.model.embed_tokens.weight), "tied head differs")
            need(not any(k.startswith("lm_head.") for k in sd), "tied output stores a head tensor")
            continue
        if role not in packed:
            if in_sd is not None:
                need(torch.equal(mods[role].weight, in_sd[f"{m}.weight"].to(dtype)), f"kept {role} differs")
            notes.append(f"{role}: dense (kept)")
            continue
        scheme = mods[role].quantization_scheme
        args = scheme.weights
        schemes[role] = args
        sdt = sd[f"{m}.weight_scale"].dtype
        want = dequant(sd, m, args).to(sdt)
        got = mods[role].weight.detach().to(sdt)
        need(torch.equal(got, want), f"lifecycle: {role} decompressed != (q - z) * s")
        local = {p: sd[f"{m}.{p}"] for p in PARTS if f"{m}.{p}" in sd}
        direct = PackedQuantizationCompressor.decompress(local, scheme)["weight"].to(sdt)
        need(torch.equal(direct, want), f"decompress: {role} != (q - z) * s")
        kept_packed = in_sd is not None and all(
            (f"{m}.{p}" in in_sd) == (p in local) and (p not in local or torch.equal(in_sd[f"{m}.{p}"], local[p]))
            for p in PARTS)
        if kept_packed:
            notes.append(f"{role}: packed tensors kept as they were")
        elif in_sd is not None:
            if f"{m}.weight" in in_sd:
                src = in_sd[f"{m}.weight"]
            else:  # requantized: from the input's dequantized values, in f32 (exact)
                src_model, _, _ = lifecycle(inp, torch.float32)  # for the scheme the library gives the input's role
                in_scheme = {"embedding": src_model.model.embed_tokens, "head": src_model.lm_head}[role].quantization_scheme
                src = dequant(in_sd, m, in_scheme.weights).to(torch.float32)
            theirs = ct_rtn(src, args, sdt, scheme)
            for p in PARTS:
                a, b = theirs.get(p), local.get(p)
                need((a is None) == (b is None) and (a is None or (a.dtype == b.dtype and torch.equal(a, b))),
                     f"rtn: {role} {p} differs from compressed-tensors' own quantization")
        notes.append(f"{role}: {args.num_bits}-bit {args.strategy}"
                     f"{'' if args.group_size in (None, -1) else ' ' + str(args.group_size)}"
                     f" {'sym' if args.symmetric else 'asym'} {str(sdt)[6:]} scales")
    return ok, notes, schemes


def transformers_load(out, schemes):
    """Informational: transformers' own loader with decompression."""
    import io
    import logging
    log = io.StringIO()
    handler = logging.StreamHandler(log)
    tlog = logging.getLogger("transformers")
    tlog.addHandler(handler)
    try:
        from transformers import AutoModelForCausalLM, CompressedTensorsConfig
        m = AutoModelForCausalLM.from_pretrained(out, quantization_config=CompressedTensorsConfig(run_compressed=False))
        sd = read_tensors(out)
        cfg = read_config(out)
        res = []
        for role, mod in ROLES.items():
            if f"{mod}.weight_packed" not in sd:
                continue
            w = {"embedding": m.model.embed_tokens, "head": m.lm_head}[role].weight.detach()
            sdt = sd[f"{mod}.weight_scale"].dtype
            res.append(torch.equal(w.to(sdt), dequant(sd, mod, schemes[role]).to(sdt)))
        if cfg.get("tie_word_embeddings"):
            res.append(torch.equal(m.lm_head.weight, m.model.embed_tokens.weight))
        return "loads, equal" if all(res) else "loads, DIFFERENT values"
    except Exception as e:  # noqa: BLE001  (reported, not required)
        # transformers logs the cause (its conversion report) rather than raising it.
        lines = log.getvalue().splitlines()
        why = next((ln for ln in lines if ln.startswith(("RuntimeError", "AssertionError"))), "")
        where = next((ln.split(" on tensors destined for ")[-1].split(".weight")[0] for ln in lines
                      if "on tensors destined for" in ln), "")
        return f"fails on {where}: {why}" if why else "fails: " + str(e).strip().splitlines()[0][:120]
    finally:
        tlog.removeHandler(handler)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--qhead", default=None, help="qhead binary (default: build-write/qhead, else build/qhead)")
    ap.add_argument("--keep", default=None, help="write the inputs and outputs here and keep them")
    ap.add_argument("--check", nargs="+", default=None, help="only check these OUT_DIRs")
    a = ap.parse_args()
    print(f"compressed-tensors {compressed_tensors.__version__}, torch {torch.__version__}, "
          f"transformers {transformers.__version__}")
    if a.check:
        good = True
        for d in a.check:
            ok, notes, _ = check(d)
            good &= ok
            print(f"{d}: {'OK' if ok else 'FAILED'}; " + "; ".join(notes))
        sys.exit(0 if good else 1)

    qhead = a.qhead or next((p for p in (os.path.join(REPO, "build-write", "qhead"), os.path.join(REPO, "build", "qhead"))
                             if os.path.exists(p)), None)
    if not qhead:
        sys.exit("no qhead binary: build it or pass --qhead")
    work = a.keep or tempfile.mkdtemp(prefix="qhead_verify_")
    os.makedirs(work, exist_ok=True)
    inputs = {
        "dense_untied": make_dense(os.path.join(FIX, "untied"), os.path.join(work, "dense_untied")),
        "dense_tied": make_dense(os.path.join(FIX, "tied"), os.path.join(work, "dense_tied")),
        "dense_tied_twice": make_dense(os.path.join(FIX, "tied"), os.path.join(work, "dense_tied_twice"), tied_twice=True),
        "dense_sharded": make_dense(os.path.join(FIX, "sharded_untied"), os.path.join(work, "dense_sharded")),
    }
    for name in ("untied", "tied", "ignore_re", "sharded_untied"):
        inputs[name] = os.path.join(FIX, name)
    good = True
    rows = []
    for name, inp, flags in CASES:
        out = os.path.join(work, "out_" + name)
        cmd = [qhead, "quantize", inputs[inp], *flags.split(), "-o", out, "--force", "--json"]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            good = False
            print(f"{name}: qhead FAILED: {r.stderr.strip()}")
            continue
        rep = json.loads(r.stdout)
        ok, notes, schemes = check(out, inputs[inp])
        good &= ok
        tf = transformers_load(out, schemes)
        rows.append((name, ok, tf))
        print(f"{name} ({inp} {flags}): {'OK' if ok else 'FAILED'} [verified by qhead: {rep['verified']}]; "
              + "; ".join(notes) + f"; transformers: {tf}")
    print("\n| case | compressed-tensors checks | transformers from_pretrained |\n|---|---|---|")
    for name, ok, tf in rows:
        print(f"| {name} | {'pass' if ok else 'FAIL'} | {tf} |")
    if not a.keep:
        shutil.rmtree(work, ignore_errors=True)
    print("ALL OK" if good else "SOME CHECKS FAILED")
    sys.exit(0 if good else 1)


if __name__ == "__main__":
    main()
