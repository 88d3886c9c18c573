#!/usr/bin/env python3
"""Make the compressed-tensors interoperability fixtures for qhead's tests.

For each case below: a seeded random dense table [V, H] in a float dtype is
quantized by compressed-tensors' OWN round-to-nearest (per-group min/max as
its observers compute them, then `calculate_qparams`), packed by its
`PackedQuantizationCompressor.compress` (the `pack-quantized` format), and
decompressed again by its `decompress`. One safetensors file per case holds:

  dense.weight                 the input table (dtype of the case)
  <prefix>.weight_packed       compressed-tensors' packed codes   (I32)
  <prefix>.weight_scale        its scales                         (dtype of the case)
  <prefix>.weight_zero_point   its packed zero points (asymmetric only)
  <prefix>.weight_shape        its shape record                   (I64)
  decompressed.weight          what compressed-tensors decompresses the packed tensors to

and __metadata__ records the scheme and the versions. qhead's tests check that
qhead (1) reads the packed tensors to the same values (exactly, once rounded to
the scale dtype, which is the dtype compressed-tensors dequantizes in), and
(2) quantizes dense.weight to byte-identical packed/scale/zero-point tensors.

`--verify QHEAD_FILE PREFIX FIXTURE` goes the other way: it decompresses the
packed tensors `qhead quantize` wrote (PREFIX.weight_*) with compressed-tensors
and compares them, and the decompressed weight, with what compressed-tensors
itself makes from the fixture's dense.weight.

Made with: python 3.11, torch 2.15.0 (CPU), compressed-tensors 0.20.0,
safetensors 0.8.0 (pip install torch compressed-tensors==0.20.0 safetensors).
"""
import argparse
import json
import os
import sys

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

import compressed_tensors
from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
from compressed_tensors.quantization.utils.helpers import calculate_qparams

DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}

# name, prefix, bits, group (None = channel), symmetric, dtype, V, H
CASES = [
    ("w4g64_bf16", "model.embed_tokens", 4, 64, True, "bf16", 37, 256),
    ("w4g32a_f16", "lm_head", 4, 32, False, "f16", 37, 128),
    ("w8_f32", "lm_head", 8, None, True, "f32", 33, 96),
    ("w8g128a_bf16", "model.embed_tokens", 8, 128, False, "bf16", 19, 256),
    ("w4a_f16", "lm_head", 4, None, False, "f16", 41, 64),
    ("w3g32_bf16", "lm_head", 3, 32, True, "bf16", 11, 96),
]


def make_args(bits, group, sym):
    if group is None:
        return QuantizationArgs(num_bits=bits, type="int", symmetric=sym, strategy="channel")
    return QuantizationArgs(num_bits=bits, type="int", symmetric=sym, strategy="group", group_size=group)


def table(v, h, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(v, h, generator=g) * 0.05
    # Outliers, a row of one sign each way, and (for symmetric use) zeros.
    w[0, 3] = 0.9
    w[min(1, v - 1)] = w[min(1, v - 1)].abs() + 0.01
    w[min(2, v - 1)] = -w[min(2, v - 1)].abs() - 0.01
    return w.to(dtype)


def observe(w, args):
    """Per-group (or per-row) min / max, as compressed-tensors' min-max observer."""
    v, h = w.shape
    if args.strategy == "channel":
        return w.amin(dim=1, keepdim=True), w.amax(dim=1, keepdim=True)
    gw = w.reshape(v, h // args.group_size, args.group_size)
    return gw.amin(dim=2), gw.amax(dim=2)


def make_case(out_dir, name, prefix, bits, group, sym, dt, v, h, seed):
    args = make_args(bits, group, sym)
    scheme = QuantizationScheme(targets=["Linear"], weights=args)
    w = table(v, h, DTYPES[dt], seed)
    mn, mx = observe(w, args)
    scale, zp = calculate_qparams(mn, mx, args)
    scale = scale.to(w.dtype)  # the module's weight_scale parameter has the weight dtype
    state = {"weight": w, "weight_scale": scale, "weight_zero_point": zp}
    comp = PackedQuantizationCompressor.compress(state, scheme)
    back = PackedQuantizationCompressor.decompress(dict(comp), scheme)
    tensors = {"dense.weight": w.contiguous(), "decompressed.weight": back["weight"].contiguous()}
    for k in ("weight_packed", "weight_scale", "weight_zero_point", "weight_shape"):
        if k in comp:
            tensors[f"{prefix}.{k}"] = comp[k].contiguous()
    meta = {
        "prefix": prefix, "num_bits": str(bits), "group_size": str(group or -1),
        "symmetric": str(sym).lower(), "dtype": dt,
        "compressed_tensors": compressed_tensors.__version__, "torch": torch.__version__,
    }
    save_file(tensors, os.path.join(out_dir, f"{name}.safetensors"), metadata=meta)
    print(f"{name}: " + ", ".join(f"{k} {tuple(t.shape)} {t.dtype}" for k, t in tensors.items()))


def verify(path, prefix, fixture):
    """compressed-tensors reads a qhead-written file to the values it makes itself."""
    meta = safe_open(fixture, "pt").metadata()
    bits, group, sym = int(meta["num_bits"]), int(meta["group_size"]), meta["symmetric"] == "true"
    args = make_args(bits, None if group < 0 else group, sym)
    scheme = QuantizationScheme(targets=["Linear"], weights=args)
    ours = {k.split(".")[-1]: v for k, v in load_file(path).items() if k.startswith(prefix + ".weight_")}
    w = load_file(fixture)["dense.weight"]
    mn, mx = observe(w, args)
    scale, zp = calculate_qparams(mn, mx, args)
    theirs = PackedQuantizationCompressor.compress({"weight": w, "weight_scale": scale.to(w.dtype), "weight_zero_point": zp}, scheme)
    ok = True
    for k in ("weight_packed", "weight_scale", "weight_zero_point", "weight_shape"):
        if (k in ours) != (k in theirs) or (k in ours and not torch.equal(ours[k], theirs[k])):
            print(f"  {k}: differs")
            ok = False
    a = PackedQuantizationCompressor.decompress(dict(ours), scheme)["weight"]
    b = PackedQuantizationCompressor.decompress(dict(theirs), scheme)["weight"]
    ok = ok and torch.equal(a, b)
    print(f"verify {path} against {os.path.basename(fixture)}: {'identical tensors and decompressed values' if ok else 'DIFFERENT'}")
    return ok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "ct"))
    ap.add_argument("--verify", nargs=3, metavar=("QHEAD_FILE", "PREFIX", "FIXTURE"))
    a = ap.parse_args()
    if a.verify:
        f, p, fx = a.verify
        sys.exit(0 if verify(f, p, fx) else 1)
    os.makedirs(a.out, exist_ok=True)
    for i, case in enumerate(CASES):
        make_case(a.out, *case, seed=1000 + i)


if __name__ == "__main__":
    main()
