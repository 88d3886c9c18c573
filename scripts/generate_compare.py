#!/usr/bin/env python3
"""Greedy generation with a qhead-quantized token table against the model's own dense table.

    python scripts/generate_compare.py [--models smollm2,gemma3] [--new-tokens 32]
                                       [--variants w8+r8,w4g64,w4g64+r8] [--json OUT.json]

The models are the two real GGUF files scripts/fetch_models.sh puts in
$QHEAD_MODEL_CACHE (default ~/.cache/qhead/models): SmolLM2-135M-Instruct (Q4_1, tied
49152 x 576 table) and Gemma-3-270M (Q4_K_M, tied 262144 x 640 table, embedding scaled by
sqrt(640)). transformers' own GGUF loader reads them (it needs the gguf and accelerate
packages) and dequantizes every tensor to f32; the converted model is saved once under
$QHEAD_MODEL_CACHE/hf/<name>/ (save_pretrained, with its tokenizer) and loaded from there
afterwards. The "dense" model is that f32 model; each variant is the same model after
qhead.hf.quantize_model (a tied table: one packed copy serves embedding and head):

    w8+r8     head "w8" (int8, one scale per row) with rescore=8 (the top 8 candidates of
              every step recomputed from the f32 rows kept in CPU memory)
    w4g64     head "w4g64" (int4, group 64), no rescoring
    w4g64+r8  head "w4g64" with rescore=8
    w8+r8/dense-emb  (not by default) w8+r8 with the model's own dense embedding module put
              back (the rescoring variants' tied embedding already reads the f32 rows)

For each prompt (PROMPTS, raw text, batched with left padding) it compares the NEW tokens
of greedy decoding (max_new_tokens, no early stop) with the dense model's: a prompt agrees
when all are equal; `first_diff` is the index of the first differing new token. It also
reports the token table's bytes and the process RSS before and after quantize_model
(anonymous and file-backed apart; the converted model is loaded from a mapped safetensors
file, so its table is first copied into process memory, where a model loaded from GGUF
holds it).
Prints a table; --json writes every number.

Result (2026-12-02, `--threads 2`, 10 prompts x 32 new tokens, CPU, torch 2.11.0,
transformers 5.17.0; prompts agreeing with the dense model, first differing new token):

    model    variant   agree  first diff per prompt   table MiB (dense 108 / 640)  anon RSS MiB
    SmolLM2  w8+r8     10/10  - - - - - - - - - -     135.2 (packed + f32 rows)    559 -> 586
    SmolLM2  w4g64     0/10   3 0 3 8 7 0 4 5 3 3      15.2                        576 -> 477
    SmolLM2  w4g64+r8  10/10  - - - - - - - - - -     123.2                        604 -> 604
    Gemma-3  w8+r8     10/10  - - - - - - - - - -     801.0                       1476 -> 1636
    Gemma-3  w4g64     1/10   0 - 4 2 7 2 0 0 1 1      90.0                       1568 -> 1008
    Gemma-3  w4g64+r8  10/10  - - - - - - - - - -     730.0                       1568 -> 1648

With rescoring, a tied model's embedding reads the f32 rows the head keeps for rescoring
(exact), and the head's top 8 candidates of every step are rescored from them: the dense
model's greedy tokens on every prompt. Without rescoring both roles read the packed table.
"""
import argparse
import gc
import json
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

MODELS = {
    "smollm2": "SmolLM2-135M-Instruct.Q4_1.gguf",
    "gemma3": "gemma-3-270m-q4_k_m.gguf",
}

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Once upon a time, in a small village by the sea,",
    "The three primary colors are",
    "Water boils at a temperature of",
    "Here is a short list of tips for staying healthy:\n1.",
    "The quick brown fox",
    "In machine learning, a neural network is",
    "Question: What is 12 times 7?\nAnswer:",
    "The largest planet in our solar system is",
]

VARIANTS = {
    "w8+r8": dict(head="w8", rescore=8),
    "w4g64": dict(head="w4g64", rescore=0),
    "w4g64+r8": dict(head="w4g64", rescore=8),
    # A diagnostic, not a qhead configuration: the w8+r8 head with the model's dense
    # embedding module put back (the tied table then serves the head only).
    "w8+r8/dense-emb": dict(head="w8", rescore=8, dense_embedding=True),
}
DEFAULT_VARIANTS = "w8+r8,w4g64,w4g64+r8"


def model_cache() -> str:
    return os.environ.get("QHEAD_MODEL_CACHE", os.path.expanduser("~/.cache/qhead/models"))


def gguf_path(name: str) -> str:
    return os.path.join(model_cache(), MODELS[name])


def available(name: str):
    """None when the model can be loaded here, else the reason it cannot."""
    p = gguf_path(name)
    if not os.path.isfile(p):
        return f"{p} is not there (scripts/fetch_models.sh fetches it)"
    if os.path.isfile(os.path.join(_converted_dir(name), "config.json")):
        return None
    import importlib.util

    for mod in ("gguf", "accelerate"):
        if importlib.util.find_spec(mod) is None:
            return f"transformers' GGUF loader needs the {mod} package (pip install {mod})"
    return None


def _converted_dir(name: str) -> str:
    st = os.stat(gguf_path(name)) if os.path.exists(gguf_path(name)) else None
    tag = f"{MODELS[name].rsplit('.gguf', 1)[0]}-{st.st_size if st else 0}"
    return os.path.join(model_cache(), "hf", tag)


def load(name: str):
    """(model, tokenizer): the GGUF model dequantized to f32 by transformers, through the
    converted copy in the cache (made on first use)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    d = _converted_dir(name)
    if not os.path.isfile(os.path.join(d, "config.json")):
        src, f = model_cache(), MODELS[name]
        tok = AutoTokenizer.from_pretrained(src, gguf_file=f)
        model = AutoModelForCausalLM.from_pretrained(src, gguf_file=f, dtype=torch.float32)
        tmp = d + ".tmp"
        if getattr(model, "hf_quantizer", None) is not None:  # the GGUF "quantizer": the weights are f32 now
            model.hf_quantizer.remove_quantization_config(model)
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        os.replace(tmp, d)
        del model
    tok = AutoTokenizer.from_pretrained(d)
    model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
    return model, tok


def to_heap(model) -> None:
    """Copies the token table(s) out of the mapped checkpoint into process memory, where a
    model loaded from GGUF or built in-process holds them, so that RSS shows what releasing
    the dense table frees."""
    import torch

    with torch.no_grad():
        for m in (model.get_input_embeddings(), model.get_output_embeddings()):
            w = m.weight
            if not getattr(w, "_qhead_on_heap", False):
                w.data = w.data.clone()
                w._qhead_on_heap = True


def rss() -> dict:
    """The process's resident memory in bytes: total, anonymous (heap) and file-backed (a
    safetensors file mapped by the loader counts here, not as heap)."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "RssAnon", "RssFile"):
                out[{"VmRSS": "total", "RssAnon": "anon", "RssFile": "file"}[k]] = int(v.split()[0]) * 1024
    return out


class SpmEncoder:
    """The GGUF file's own SentencePiece ("llama" tokenizer model) encoding, as llama.cpp does
    it: spaces become U+2581, the characters are merged pairwise, highest-scoring vocabulary
    entry first, unknown characters fall back to <0xXX> byte tokens, and BOS is prepended when
    the file says so. transformers 5.17's GGUF tokenizer conversion gives Gemma-3 a tokenizer
    that splits text into single characters without BOS (on which the model only repeats
    itself), so the Gemma-3 prompts are encoded with this instead. The vocabulary is read from
    the GGUF once and kept beside the converted model (spm_vocab.json)."""

    def __init__(self, name: str):
        path = os.path.join(_converted_dir(name), "spm_vocab.json")
        if not os.path.isfile(path):
            from gguf import GGUFReader

            r = GGUFReader(gguf_path(name))

            def arr(key):
                f = r.fields[key]
                return [f.parts[i] for i in f.data]

            tokens = [bytes(p).decode("utf-8", "replace") for p in arr("tokenizer.ggml.tokens")]
            scores = [float(p[0]) for p in arr("tokenizer.ggml.scores")]
            add_bos = bool(arr("tokenizer.ggml.add_bos_token")[0][0]) if "tokenizer.ggml.add_bos_token" in r.fields else True
            bos = int(arr("tokenizer.ggml.bos_token_id")[0][0])
            with open(path + ".tmp", "w") as f:
                json.dump({"tokens": tokens, "scores": scores, "bos": bos if add_bos else None}, f)
            os.replace(path + ".tmp", path)
        with open(path) as f:
            v = json.load(f)
        self.ids = {t: i for i, t in enumerate(v["tokens"])}
        self.scores = v["scores"]
        self.bos = v["bos"]

    def encode(self, text: str):
        syms = list(text.replace(" ", "\u2581"))
        while len(syms) > 1:
            best, at = None, -1
            for i in range(len(syms) - 1):
                j = self.ids.get(syms[i] + syms[i + 1])
                if j is not None and (best is None or self.scores[j] > best):
                    best, at = self.scores[j], i
            if at < 0:
                break
            syms[at: at + 2] = [syms[at] + syms[at + 1]]
        out = [] if self.bos is None else [self.bos]
        for s in syms:
            if s in self.ids:
                out.append(self.ids[s])
            else:
                out.extend(self.ids[f"<0x{b:02X}>"] for b in s.encode("utf-8"))
        return out


# Models whose prompts are encoded with the GGUF's own SentencePiece vocabulary.
SPM_MODELS = {"gemma3"}


def encode(name: str, tok, prompts):
    """{input_ids, attention_mask} for the prompts, left-padded."""
    import torch

    if name in SPM_MODELS:
        enc = SpmEncoder(name)
        rows = [enc.encode(p) for p in prompts]
    else:
        rows = [tok(p)["input_ids"] for p in prompts]
    pad = tok.pad_token_id if tok.pad_token_id is not None else (tok.eos_token_id or 0)
    n = max(len(r) for r in rows)
    ids = torch.tensor([[pad] * (n - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (n - len(r)) + [1] * len(r) for r in rows])
    return {"input_ids": ids, "attention_mask": mask}


def greedy(model, tok, prompts, new_tokens: int, name: str = "smollm2"):
    """The new token ids of greedy decoding for each prompt (a list of lists)."""
    import torch

    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    enc = encode(name, tok, prompts)
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                             pad_token_id=tok.pad_token_id)
    return out[:, enc["input_ids"].shape[1]:].tolist()


def compare(name: str, variants, new_tokens: int = 32, prompts=None, log=print):
    """{model, table, dense: {...}, variants: {variant: {agree, prompts: [...], rss_*}}}"""
    import qhead.hf as qh

    prompts = list(PROMPTS if prompts is None else prompts)
    t0 = time.time()
    model, tok = load(name)
    emb = model.get_input_embeddings()
    result = {"model": name, "file": MODELS[name], "prompts": prompts, "new_tokens": new_tokens,
              "vocab": int(emb.weight.shape[0]), "hidden": int(emb.weight.shape[1]),
              "tied": model.get_output_embeddings().weight is emb.weight, "variants": {}}
    t = time.time()
    dense = greedy(model, tok, prompts, new_tokens, name)
    result["dense"] = {"tokens": dense, "seconds": round(time.time() - t, 2),
                       "table_bytes": qh.token_table_bytes(model),
                       "text": [tok.decode(d) for d in dense]}
    log(f"{name}: loaded in {t - t0:.1f} s; dense greedy {result['dense']['seconds']} s")
    del model
    for v in variants:
        gc.collect()
        model, _ = load(name)
        to_heap(model)
        gc.collect()
        before = rss()
        kw = dict(VARIANTS[v])
        dense_emb = model.get_input_embeddings() if kw.pop("dense_embedding", False) else None
        qh.quantize_model(model, **kw)
        if dense_emb is not None:
            model.set_input_embeddings(dense_emb)
        del dense_emb
        gc.collect()
        after = rss()
        t = time.time()
        got = greedy(model, tok, prompts, new_tokens, name)
        rows = []
        for p, a, b in zip(prompts, dense, got):
            diff = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
            rows.append({"prompt": p, "agree": diff is None, "first_diff": diff, "text": tok.decode(b)})
        result["variants"][v] = {
            **{k: x for k, x in VARIANTS[v].items()}, "agree": sum(r["agree"] for r in rows), "of": len(rows),
            "seconds": round(time.time() - t, 2), "table_bytes": qh.token_table_bytes(model),
            "rss_before": before, "rss_after": after, "prompts": rows,
        }
        r = result["variants"][v]
        log(f"{name} {v}: {r['agree']}/{r['of']} prompts agree; table {r['table_bytes'] / 2**20:.1f} MiB "
            f"(dense {result['dense']['table_bytes'] / 2**20:.1f}); RSS {_mib(before)} -> {_mib(after)}; "
            f"{r['seconds']} s")
        del model
    return result


def _mib(r: dict) -> str:
    return f"{r['total'] / 2**20:.0f} MiB (anon {r['anon'] / 2**20:.0f}, file {r['file'] / 2**20:.0f})"


def set_threads(n: int) -> None:
    """n > 0: torch's and qhead's CPU threads (1 avoids oversubscribing a small shared machine)."""
    if n > 0:
        import torch

        import qhead

        torch.set_num_threads(n)
        qhead.set_num_threads(n)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="smollm2,gemma3")
    ap.add_argument("--variants", default=DEFAULT_VARIANTS, help=f"of {', '.join(VARIANTS)}")
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--prompts", type=int, default=len(PROMPTS), help="how many of the built-in prompts")
    ap.add_argument("--threads", type=int, default=0, help="CPU threads for torch and qhead (0: their defaults)")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)
    set_threads(args.threads)
    variants = [v for v in args.variants.split(",") if v]
    for v in variants:
        if v not in VARIANTS:
            ap.error(f"unknown variant {v!r} (one of {', '.join(VARIANTS)})")
    results, status = [], 0
    for name in [m for m in args.models.split(",") if m]:
        if name not in MODELS:
            ap.error(f"unknown model {name!r} (one of {', '.join(MODELS)})")
        why = available(name)
        if why:
            print(f"{name}: skipped: {why}", file=sys.stderr)
            status = 1
            continue
        results.append(compare(name, variants, args.new_tokens, PROMPTS[: args.prompts]))
    print()
    print("| model | variant | prompts agreeing | first differing new token per prompt | table MiB (dense) |")
    print("|---|---|---:|---|---:|")
    for r in results:
        for v, x in r["variants"].items():
            diffs = " ".join("-" if p["first_diff"] is None else str(p["first_diff"]) for p in x["prompts"])
            print(f"| {r['model']} | {v} | {x['agree']}/{x['of']} | {diffs} | "
                  f"{x['table_bytes'] / 2**20:.1f} ({r['dense']['table_bytes'] / 2**20:.1f}) |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return status


if __name__ == "__main__":
    sys.exit(main())
