#!/usr/bin/env python3
"""Write the seed corpora of qhead's fuzz targets (fuzz/corpus/<target>/).

Seeds come from the test fixtures (tests/fixtures), cut small: a safetensors
seed keeps the header entries of tensors of at most 4 KB (the packed tables of
the fixtures fit), re-laid out back to back, so mutations spend their time on
the header. Hand-made seeds add the corner cases of each format (empty header,
metadata only, every dtype, tiny GGUF files of one tensor each, GPTQ heads in
act-order and symmetric variants). Standard library only.

Usage: python3 fuzz/make_corpus.py   (from the repository root; rewrites the corpora)
"""
import json
import os
import shutil
import struct
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIX = os.path.join(ROOT, "tests", "fixtures")
OUT = os.path.join(ROOT, "fuzz", "corpus")
MAX_TENSOR = 4096


def safetensors_bytes(tensors, metadata=None):
    """tensors: list of (name, dtype, shape, bytes) -> a safetensors image."""
    header, blobs, off = {}, [], 0
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, dtype, shape, data in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(data)]}
        blobs.append(data)
        off += len(data)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - (8 + len(h)) % 8) % 8)
    return struct.pack("<Q", len(h)) + h + b"".join(blobs)


def read_safetensors(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    meta = h.pop("__metadata__", None)
    out = []
    for name, e in sorted(h.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        s, t = e["data_offsets"]
        out.append((name, e["dtype"], e["shape"], b[8 + n + s:8 + n + t]))
    return out, meta


def cut(path):
    tensors, meta = read_safetensors(path)
    return safetensors_bytes([t for t in tensors if len(t[3]) <= MAX_TENSOR], meta)


def put(target, name, data):
    d = os.path.join(OUT, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


# ---- safetensors ----------------------------------------------------------------
def safetensors_seeds():
    for sub in ("ct",):
        for f in sorted(os.listdir(os.path.join(FIX, sub))):
            if f.endswith(".safetensors"):
                put("safetensors", "ct_" + f, cut(os.path.join(FIX, sub, f)))
    for m in sorted(os.listdir(os.path.join(FIX, "ct_models"))):
        d = os.path.join(FIX, "ct_models", m)
        if os.path.isdir(d):
            for f in sorted(os.listdir(d)):
                if f.endswith(".safetensors") and f != "reference.safetensors":
                    put("safetensors", f"ctm_{m}_{f}", cut(os.path.join(d, f)))
    put("safetensors", "empty_header", safetensors_bytes([]))
    put("safetensors", "metadata_only", safetensors_bytes([], {"format": "pt", "k": "v"}))
    sizes = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}
    put("safetensors", "all_dtypes", safetensors_bytes(
        [(f"t_{d}", d, [2, 3], bytes(range(6 * s))) for d, s in sizes.items()] +
        [("scalar", "F32", [], b"\0\0\x80\x3f"), ("empty", "F32", [0, 4], b"")], {"format": "pt"}))


# ---- gguf -----------------------------------------------------------------------
def gstr(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def gguf_bytes(kvs, tensors, alignment=32):
    """kvs: list of (key, type_id, packed value bytes); tensors: (name, ne, type, data)."""
    out = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs))
    for k, t, v in kvs:
        out += gstr(k) + struct.pack("<I", t) + v
    off, blobs = 0, []
    for name, ne, ty, data in tensors:
        out += gstr(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", d) for d in ne)
        out += struct.pack("<IQ", ty, off)
        blobs.append(data + b"\0" * ((alignment - len(data) % alignment) % alignment))
        off += len(blobs[-1])
    out += b"\0" * ((alignment - len(out) % alignment) % alignment)
    return out + b"".join(blobs)


def gguf_seeds():
    d = os.path.join(FIX, "gguf")
    for f in sorted(os.listdir(d)):
        if f.endswith(".gguf"):
            shutil.copy(os.path.join(d, f), os.path.join(OUT, "gguf", f))
    arch = ("general.architecture", 8, gstr("llama"))
    toks = ("tokenizer.ggml.tokens", 9, struct.pack("<IQ", 8, 2) + gstr("a") + gstr("b"))
    f16_one = struct.pack("<H", 0x3C00)
    q8_0 = f16_one + bytes(range(32))               # one block of 32
    q4_0 = f16_one + bytes(range(16))               # one block of 32
    put("gguf", "tiny_f32_tied", gguf_bytes([arch, toks], [("token_embd.weight", [32, 2], 0, b"\0\0\x80\x3f" * 64)]))
    put("gguf", "tiny_q8_0_untied", gguf_bytes([arch, ("general.alignment", 4, struct.pack("<I", 64))],
                                               [("token_embd.weight", [32, 2], 8, q8_0 * 2),
                                                ("output.weight", [32, 2], 8, q8_0 * 2)], 64))
    put("gguf", "tiny_q4_0", gguf_bytes([arch], [("token_embd.weight", [64, 1], 2, q4_0 * 2)]))
    put("gguf", "tiny_f16_bf16", gguf_bytes([arch], [("token_embd.weight", [32, 1], 1, f16_one * 32),
                                                     ("output.weight", [32, 1], 30, b"\x80\x3f" * 32)]))
    put("gguf", "zero_rows", gguf_bytes([arch], [("token_embd.weight", [64, 0], 0, b"")]))
    put("gguf", "no_tensors", gguf_bytes([arch, ("a.u8", 0, b"\x01"), ("a.i16", 3, b"\xff\xff"),
                                          ("a.f64", 12, struct.pack("<d", 1.5)), ("a.bool", 7, b"\x01"),
                                          ("a.nested", 9, struct.pack("<IQ", 9, 1) + struct.pack("<IQ", 4, 1) +
                                           struct.pack("<I", 7))], []))


# ---- model directories ----------------------------------------------------------
def model_config_seeds():
    for group in ("ct_models", "gptq"):
        for m in sorted(os.listdir(os.path.join(FIX, group))):
            p = os.path.join(FIX, group, m, "config.json")
            if os.path.exists(p):
                shutil.copy(p, os.path.join(OUT, "model_config", f"{group}_{m}.json"))
    base = json.load(open(os.path.join(FIX, "ct_models", "untied", "config.json")))
    dense = {k: v for k, v in base.items() if k != "quantization_config"}
    put("model_config", "dense_untied.json", json.dumps(dense, indent=1))
    tied = dict(dense, tie_word_embeddings=True)
    put("model_config", "tied_claim.json", json.dumps(tied, indent=1))


def shard_index_seeds():
    p = os.path.join(FIX, "ct_models", "sharded_untied", "model.safetensors.index.json")
    shutil.copy(p, os.path.join(OUT, "shard_index", "fixture.json"))
    idx = json.load(open(p))
    wm = idx["weight_map"]
    one = {k: "model-00001-of-00002.safetensors" for k in wm}
    put("shard_index", "one_shard.json", json.dumps({"metadata": {}, "weight_map": one}))
    put("shard_index", "no_metadata.json", json.dumps({"weight_map": wm}))


# ---- gptq -----------------------------------------------------------------------
def gptq_model(act_order=False, sym=False, v=64, h=64, bits=4, gs=32):
    """A GPTQ safetensors of an untied head: lm_head.{qweight,qzeros,scales,g_idx} + a dense embedding."""
    pack = 32 // bits
    g = h // gs
    words = bytes((i * 37 + 11) % 256 for i in range(4 * (h // pack) * v))
    zero_code = (1 << (bits - 1)) - 1  # v1 storage of the mid zero point (symmetric)
    zword = 0
    for j in range(pack):
        zword |= (zero_code if sym else (j * 3) % ((1 << bits) - 1)) << (bits * j)
    qzeros = struct.pack("<I", zword) * (g * (v * bits // 32))
    scales = struct.pack("<e", 0.01) * (g * v)
    gidx = [k // gs for k in range(h)]
    if act_order:
        gidx = [(k % g) for k in range(h)]
    emb = struct.pack("<e", 0.5) * (v * h)
    t = [("lm_head.qweight", "I32", [h // pack, v], words),
         ("lm_head.qzeros", "I32", [g, v * bits // 32], qzeros),
         ("lm_head.scales", "F16", [g, v], scales),
         ("lm_head.g_idx", "I32", [h], b"".join(struct.pack("<i", x) for x in gidx)),
         ("model.embed_tokens.weight", "F16", [v, h], emb)]
    return safetensors_bytes(t, {"format": "pt"})


def gptq_seeds():
    put("gptq", "w4g32_asym", gptq_model())
    put("gptq", "w4g32_sym", gptq_model(sym=True))
    put("gptq", "w4g32_actorder", gptq_model(act_order=True))


if __name__ == "__main__":
    if os.path.isdir(OUT):
        shutil.rmtree(OUT)
    for t in ("safetensors", "gguf", "model_config", "shard_index", "gptq"):
        os.makedirs(os.path.join(OUT, t))
    safetensors_seeds()
    gguf_seeds()
    model_config_seeds()
    shard_index_seeds()
    gptq_seeds()
    total = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(OUT) for f in fs)
    print(f"fuzz/corpus: {total} bytes", file=sys.stderr)
