#!/usr/bin/env python3
"""Greedy generation with a qhead-quantized token table against the model's own dense table.

    python scripts/generate_compare.py [--models smollm2,gemma3] [--new-tokens 32]
                                       [--variants w8+r8,w4g64,w4g64+r8] [--json OUT.json]

The models are qhead.models specs (default: the two real GGUF files scripts/fetch_models.sh
puts in $QHEAD_MODEL_CACHE, default ~/.cache/qhead/models: SmolLM2-135M-Instruct, Q4_1, tied
49152 x 576 table, and Gemma-3-270M, Q4_K_M, tied 262144 x 640 table, embedding scaled by
sqrt(640)); qhead.models.load reads them through transformers' GGUF loader (dequantized to
f32, converted once into the cache) with their encoder (Gemma-3's own SentencePiece
vocabulary). The "dense" model is that f32 model; each variant is the same model, loaded
again, after qhead.hf.quantize_model (a tied table: one packed copy serves embedding and head):

    w8+r8     head "w8" (int8, one scale per row) with rescore=8 (the top 8 candidates of
              every step recomputed from the f32 rows kept in CPU memory)
    w4g64     head "w4g64" (int4, group 64), no rescoring
    w4g64+r8  head "w4g64" with rescore=8
    w8+r8/dense-emb  (not by default) w8+r8 with the model's own dense embedding module put
              back (the rescoring variants' tied embedding already reads the f32 rows)

For each prompt (the corpus's validation prompts, qhead.corpus; raw text, batched with left
padding: qhead.generate.greedy) it compares the NEW tokens of greedy decoding (max_new_tokens,
no early stop) with the dense model's: a prompt agrees when all are equal; `first_diff` is
the index of the first differing new token. It also
reports the token table's bytes and the process RSS before and after quantize_model
(anonymous and file-backed apart; the converted model is loaded from a mapped safetensors
file, so its table is first copied into process memory, where a model loaded from GGUF
holds it: qhead.models.to_heap).
Prints a table; --json writes every number. `python -m qhead.generate` is the same comparison
for one model and variant at batch 1, with the head's timings.

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

from qhead import generate as qg  # noqa: E402
from qhead import models as qm  # noqa: E402

VARIANTS = {
    "w8+r8": dict(head="w8", rescore=8),
    "w4g64": dict(head="w4g64", rescore=0),
    "w4g64+r8": dict(head="w4g64", rescore=8),
    # A diagnostic, not a qhead configuration: the w8+r8 head with the model's dense
    # embedding module put back (the tied table then serves the head only).
    "w8+r8/dense-emb": dict(head="w8", rescore=8, dense_embedding=True),
}
DEFAULT_VARIANTS = "w8+r8,w4g64,w4g64+r8"
DEFAULT_MODELS = ",".join(qm.KNOWN)


def validation_texts():
    """The texts of the corpus's validation prompts."""
    return [p.text for p in qg.validation_prompts()]


def compare(name: str, variants, new_tokens: int = 32, prompts=None, log=print):
    """{model, table, dense: {...}, variants: {variant: {agree, prompts: [...], rss_*}}}"""
    import qhead.hf as qh

    ref = qm.resolve(name)
    prompts = list(validation_texts() if prompts is None else prompts)
    t0 = time.time()
    model, enc = qm.load(ref)
    emb = model.get_input_embeddings()
    result = {"model": name, "file": os.path.basename(ref.path), "prompts": prompts, "new_tokens": new_tokens,
              "vocab": int(emb.weight.shape[0]), "hidden": int(emb.weight.shape[1]),
              "tied": model.get_output_embeddings().weight is emb.weight, "variants": {}}
    if ref.kind == "gguf" and os.path.isfile(ref.path):
        result["sha256"] = qm.file_sha256(ref.path)
    t = time.time()
    dense = qg.greedy(model, enc, prompts, new_tokens)
    result["dense"] = {"tokens": dense, "seconds": round(time.time() - t, 2),
                       "table_bytes": qh.token_table_bytes(model),
                       "text": [enc.decode(d) for d in dense]}
    log(f"{name}: loaded in {t - t0:.1f} s; dense greedy {result['dense']['seconds']} s")
    del model, emb
    for v in variants:
        gc.collect()
        model, _ = qm.load(ref)
        qm.to_heap(model)
        gc.collect()
        before = qm.rss()
        kw = dict(VARIANTS[v])
        dense_emb = model.get_input_embeddings() if kw.pop("dense_embedding", False) else None
        qh.quantize_model(model, **kw)
        if dense_emb is not None:
            model.set_input_embeddings(dense_emb)
        del dense_emb
        gc.collect()
        after = qm.rss()
        t = time.time()
        got = qg.greedy(model, enc, prompts, new_tokens)
        rows = []
        for p, a, b in zip(prompts, dense, got):
            diff = qg.first_diff(a, b)
            rows.append({"prompt": p, "agree": diff is None, "first_diff": diff, "text": enc.decode(b)})
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
    ap.add_argument("--models", default=DEFAULT_MODELS,
                    help="comma-separated qhead.models specs (smollm2, gemma3, PATH.gguf, HF_DIR)")
    ap.add_argument("--variants", default=DEFAULT_VARIANTS, help=f"of {', '.join(VARIANTS)}")
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--prompts", type=int, default=None, help="how many of the validation prompts (default: all)")
    ap.add_argument("--threads", type=int, default=0, help="CPU threads for torch and qhead (0: their defaults)")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)
    set_threads(args.threads)
    variants = [v for v in args.variants.split(",") if v]
    for v in variants:
        if v not in VARIANTS:
            ap.error(f"unknown variant {v!r} (one of {', '.join(VARIANTS)})")
    names = [m for m in args.models.split(",") if m]
    for name in names:
        try:
            qm.resolve(name)
        except ValueError as e:
            ap.error(str(e))
    texts = validation_texts()[: args.prompts]
    results, status = [], 0
    for name in names:
        why = qm.unavailable(qm.resolve(name))
        if why:
            print(f"{name}: skipped: {why}", file=sys.stderr)
            status = 1
            continue
        results.append(compare(name, variants, args.new_tokens, texts))
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
