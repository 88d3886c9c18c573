#!/usr/bin/env python3
"""Writes docs/accuracy.md from the JSON that `qhead agree --json` (and `qhead generate --json`)
wrote; every figure on the page comes from those files, which say how they were made.

    python scripts/accuracy_report.py docs/accuracy/smollm2.json docs/accuracy/gemma3.json docs/accuracy/*-quantizers.json docs/accuracy/*-bits.json docs/accuracy/*-embedding.json docs/accuracy/*-untie.json docs/accuracy/*-int8x.json docs/accuracy/generate_*.json [-o docs/accuracy.md]

A file is an agree result when it has "records", a generate result when it has "prompts".
"""
import argparse
import json
import os
import sys

# A published reference figure: int8 per-row symmetric heads, 99.658% top-1 agreement on 2632
# decode states (vLLM pull request "Fused WNA16 GEMM for tied quantized lm_head logits").
REF_INT8 = 0.99658


def pct(x, nd=3):
    return f"{100.0 * x:.{nd}f}"


def agree_table(recs, ks=None):
    out = ["| scheme | K | states | ties | top-1 agreement % [95% CI] | flips/1k | flips outside ties | "
           "displaced | top-5 | top-10 | KL mean | KL median | KL p99 | KL p99.9 | Δp top % (mean, RMS) | Δppl % |",
           "|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|"]
    for r in recs:
        if ks is not None and r["rescore"] not in ks:
            continue
        dppl = f"{r['dppl_pct']:+.2f}" if "dppl_pct" in r else "-"
        out.append(
            f"| {r['scheme']} | {r['rescore']} | {r['states']} | {r['ties']} | {pct(r['top1_agreement'])} "
            f"[{pct(r['wilson_lo'])}, {pct(r['wilson_hi'])}] | {r['flips_per_1k']:.2f} | {r['flips_outside_ties']} | "
            f"{r.get('displaced', 0)} | {r['top5_overlap']:.4f} | {r['top10_overlap']:.4f} | {r['kl_mean']:.2e} | "
            f"{r['kl_median']:.2e} | {r['kl_p99']:.2e} | {r['kl_p999']:.2e} | "
            f"{r['dp_top_mean_pct']:+.3f}, {r['dp_top_rms_pct']:.3f} | {dppl} |")
    return out


def pair_section(model, m, meta, pairs, rel):
    """One table or an untied pair: every head table with every embedding of the run (records
    with "pair"), at the bytes of both tables."""
    order = {"same": 0, "dense": 99}
    embs = sorted(dict.fromkeys(r["embedding"] for r in pairs), key=lambda e: (order.get(e, 1), e))
    heads = list(dict.fromkeys((r.get("quantizer", "rtn"), r["scheme"]) for r in pairs))
    cal = m.get("calibration") or {}
    dt = m.get("model_dtype", "float32")
    out = [f"## {model}: one table or an untied pair", "",
           f"The model's forward pass over the measured corpus states again ({pairs[0]['states']} states"
           + (f"; GPTQ's {cal.get('states')} calibration states are not among them" if cal else "") +
           "), its input embedding reading one of: the head's own table (**one copy**, what a tied model stores "
           "and `qhead quantize` writes by default); a table of its own (an **untied pair**: `qhead quantize --untie "
           "--embedding S`, `quantize_model(..., untie=True)`); or the dense rows (an untied pair whose embedding "
           "stays dense: `--untie` without `--embedding`, and what a rescoring head's tied embedding reads, the rows "
           "it keeps). Each head table is then scored against the dense model at the same positions. Bytes: both "
           f"tables as held in memory, the dense rows at the model's dtype ({dt}; a bf16 table is half). Run: "
           f"`{meta.get('command', 'qhead agree')}` — {meta['date']}, qhead {meta.get('qhead_commit') or ''}; "
           f"JSON `{rel}`.", "",
           "| head | embedding | tables (MiB) | top-1 % K = 0 | top-1 % K = 8 | flips outside ties (K = 0 / 8) "
           "| Δppl % K = 0 | Δppl % K = 8 | KL mean K = 0 |",
           "|---|---|---:|---:|---:|---|---:|---:|---:|"]

    def rec(q, s, e, k):
        return next((r for r in pairs if r.get("quantizer", "rtn") == q and r["scheme"] == s and r["embedding"] == e
                     and r["rescore"] == k), None)

    for q, s in heads:
        for e in embs:
            r0, r8 = rec(q, s, e, 0), rec(q, s, e, 8)
            if r0 is None:
                continue
            label = {"same": "same table (one copy)", "dense": "dense (untied pair)"}.get(e, f"`{e}` (untied pair)")

            def f(r, key, fmt):
                return "-" if r is None or key not in r else format(r[key], fmt)

            out.append(f"| {q} `{s}` | {label} | {r0['table_bytes'] / 2 ** 20:.1f} | {pct(r0['top1_agreement'])} | "
                       f"{'-' if r8 is None else pct(r8['top1_agreement'])} | {r0['flips_outside_ties']} / "
                       f"{'-' if r8 is None else r8['flips_outside_ties']} | {f(r0, 'dppl_pct', '+.2f')} | "
                       f"{f(r8, 'dppl_pct', '+.2f')} | {r0['kl_mean']:.2e} |")
    return out + [""]


def by_source_table(recs):
    out = ["| scheme | K | corpus (teacher-forced) | greedy generation | sampled generation |", "|---|---:|---|---|---|"]
    for r in recs:
        cells = []
        for src in ("corpus", "greedy", "sampled"):
            b = r["by_source"].get(src)
            cells.append("-" if b is None else f"{pct(b['top1_agreement'], 2)} ({b['states']}; "
                                               f"{b['flips_outside_ties']} flips outside ties)")
        out.append(f"| {r['scheme']} | {r['rescore']} | " + " | ".join(cells) + " |")
    return out


def headline(model, recs):
    def rec(s, k):
        return next((r for r in recs if r["scheme"] == s and r["rescore"] == k and r["embedding"] == "dense"), None)

    lines = []
    w8_8, w4_8, w8_0, w4_0 = rec("w8", 8), rec("w4g64", 8), rec("w8", 0), rec("w4g64", 0)
    if w8_8:
        ok = "met" if w8_8["flips_outside_ties"] == 0 else "missed"
        lines.append(f"- `w8` + exact top-8 rescoring: {w8_8['flips_outside_ties']} flips outside ties in "
                     f"{w8_8['states']} states ({w8_8['ties']} ties) — target \"no flips outside ties\": **{ok}**.")
    if w4_8:
        ok = "met" if w4_8["top1_agreement"] >= 0.999 else "missed"
        lines.append(f"- `w4g64` + top-8 rescoring: {pct(w4_8['top1_agreement'])}% top-1 agreement "
                     f"[{pct(w4_8['wilson_lo'])}, {pct(w4_8['wilson_hi'])}] — target ≥ 99.9%: **{ok}**.")
    if w8_0:
        lines.append(f"- Without rescoring: `w8` {pct(w8_0['top1_agreement'])}% "
                     f"[{pct(w8_0['wilson_lo'])}, {pct(w8_0['wilson_hi'])}] ({w8_0['flips_per_1k']:.2f} flips per "
                     f"1000 states; the int8 per-row figure reported in vLLM's fused tied-head pull request is {pct(REF_INT8)}%, 3.42 per 1000)"
                     + (f", `w4g64` {pct(w4_0['top1_agreement'])}% ({w4_0['flips_per_1k']:.1f} per 1000, Δppl "
                        f"{w4_0.get('dppl_pct', float('nan')):+.2f}%)." if w4_0 else "."))
    return lines


QUANTIZER_ORDER = ("rtn", "mse", "mse-act", "gptq", "gptq-mse")


def quantizer_grid(recs, ks=(0, 4, 8, 16)):
    """Scheme × quantizer: top-1 agreement at each K, Δppl, KL mean and flips outside ties (K = 0
    and 8), the calibrated quantizers measured on the same held-out states as the others."""
    schemes = list(dict.fromkeys(r["scheme"] for r in recs))
    qs = [q for q in QUANTIZER_ORDER if any(r.get("quantizer") == q for r in recs)]
    qs += sorted(set(r.get("quantizer", "rtn") for r in recs) - set(qs))
    head = ("| scheme | quantizer | " + " | ".join(f"top-1 % K = {k}" for k in ks) +
            " | Δppl % | KL mean | flips outside ties (K = 0 / 8) |")
    out = [head, "|---|---|" + "---:|" * len(ks) + "---:|---:|---|"]
    for s in schemes:
        for q in qs:
            by_k = {r["rescore"]: r for r in recs if r["scheme"] == s and r.get("quantizer", "rtn") == q}
            if not by_k:
                continue
            r0 = by_k.get(0)
            cells = [pct(by_k[k]["top1_agreement"]) if k in by_k else "-" for k in ks]
            dppl = f"{r0['dppl_pct']:+.2f}" if r0 and "dppl_pct" in r0 else "-"
            kl = f"{r0['kl_mean']:.2e}" if r0 else "-"
            fl = f"{r0['flips_outside_ties'] if r0 else '-'} / {by_k[8]['flips_outside_ties'] if 8 in by_k else '-'}"
            ref = " (reference path)" if r0 and r0.get("path", "fused") != "fused" else ""
            out.append(f"| {s}{ref} | {q} | " + " | ".join(cells) + f" | {dppl} | {kl} | {fl} |")
    return out


def targets(model, recs, rtn_recs):
    """The targets of the quantizer work, measured: the best quantizer per scheme (by K = 0 top-1)."""
    def rec(q, s, k):
        return next((r for r in recs if r.get("quantizer", "rtn") == q and r["scheme"] == s and r["rescore"] == k),
                    None)

    def best(s):
        cands = [r for r in recs if r["scheme"] == s and r["rescore"] == 0]
        return max(cands, key=lambda r: r["top1_agreement"]) if cands else None

    lines = []
    b4, r4 = best("w4g64"), rec("rtn", "w4g64", 0)
    if b4 and r4:
        half = r4["top1_agreement"] + (1 - r4["top1_agreement"]) / 2
        ok = "met" if b4["top1_agreement"] >= half else "missed"
        lines.append(f"- `w4g64`, best quantizer ({b4['quantizer']}), no rescoring: {pct(b4['top1_agreement'])}% "
                     f"[{pct(b4['wilson_lo'])}, {pct(b4['wilson_hi'])}] against RTN's {pct(r4['top1_agreement'])}% "
                     f"on the same states — target ≥ {pct(half)}% (halfway to 100%): **{ok}**.")
        if "dppl_pct" in b4:
            ok = "met" if b4["dppl_pct"] < 5.0 else "missed"
            lines.append(f"- `w4g64`, {b4['quantizer']}: Δppl {b4['dppl_pct']:+.2f}% (RTN {r4.get('dppl_pct', float('nan')):+.2f}%) "
                         f"— target < 5%: **{ok}**.")
        b48 = rec(b4["quantizer"], "w4g64", 8)
        if b48:
            ok = "met" if b48["top1_agreement"] >= 0.999 else "missed"
            lines.append(f"- `w4g64`, {b4['quantizer']} + top-8 rescoring: {pct(b48['top1_agreement'])}% "
                         f"[{pct(b48['wilson_lo'])}, {pct(b48['wilson_hi'])}] — target ≥ 99.9%: **{ok}**.")
    b8 = best("w8")
    if b8:
        ok = "met" if b8["top1_agreement"] >= 0.995 else "missed"
        lines.append(f"- `w8`, best quantizer ({b8['quantizer']}), no rescoring: {pct(b8['top1_agreement'])}% "
                     f"[{pct(b8['wilson_lo'])}, {pct(b8['wilson_hi'])}] — target ≥ 99.5%: **{ok}**.")
        b88 = rec(b8["quantizer"], "w8", 8)
        if b88:
            ok = "met" if b88["flips_outside_ties"] == 0 else "missed"
            lines.append(f"- `w8`, {b8['quantizer']} + top-8 rescoring: {b88['flips_outside_ties']} flips outside ties "
                         f"in {b88['states']} states ({b88['ties']} ties) — target none: **{ok}**.")
    return lines


def gen_rows(gens):
    """One table over every generate result: model, device, variant, identical prompts, tokens/s,
    the head's share, head time and bytes per step, table memory."""
    out = ["| model | device | head | prompts identical | tokens/s dense → quantized | head share of a step | "
           "head ms per step | head reads per step (MiB) | token table (MiB) | first differing new token |",
           "|---|---|---|---:|---|---|---|---|---|---|"]
    for f, g in gens:
        d, q = g["dense"], g["quantized"]
        head = g["head"] + (f" + rescore {g['rescore']}" if g.get("rescore") else "")
        diffs = " ".join("-" if p["first_diff"] is None else str(p["first_diff"]) for p in g["prompts"])
        mib = 2.0 ** 20
        out.append(
            f"| {g['model']['name']} | {g['device']} ({g['threads']['torch']} threads) | {head} | "
            f"{g['identical']}/{len(g['prompts'])} × {g['new_tokens']} | {d['tokens_per_s']:.2f} → {q['tokens_per_s']:.2f} | "
            f"{100 * d['head_share']:.1f}% → {100 * q['head_share']:.1f}% | {d['head_step_ms']:.3f} → "
            f"{q['head_step_ms']:.3f} | {d['head_read_bytes'] / mib:.1f} → {q['head_read_bytes'] / mib:.1f} | "
            f"{d['table_bytes'] / mib:.1f} → {q['table_bytes'] / mib:.1f} | {diffs} |")
    return out


def fmt(x):
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.3g}" if abs(x) < 1000 else f"{x:,.0f}"
    if isinstance(x, int):
        return f"{x:,}"
    return str(x)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+")
    ap.add_argument("-o", "--out", default="docs/accuracy.md")
    args = ap.parse_args(argv)
    agrees, gens = [], []
    for f in args.files:
        with open(f) as fh:
            d = json.load(fh)
        (agrees if "records" in d else gens).append((f, d))
    out = ["# Accuracy: what a quantized head does to real models", "",
           "Generated by `scripts/accuracy_report.py` from the JSON beside it in `docs/accuracy/`, which `qhead agree "
           "--json` and `qhead generate --json` wrote. Method: [architecture.md](architecture.md#accuracy-qhead-agree-"
           "pythonqheadagreepy-statspy-modelspy-corpus). Every record compares a quantized head with the model's own "
           "dense head (its GGUF table dequantized to f32) on the same decode states; the quantizer is RTN unless a "
           "section compares quantizers. Both GGUF files store the token table as Q8_0 (blocks of 32 8-bit codes "
           "with an f16 scale), so the dense reference is that table dequantized: a symmetric `w8g32` head with f16 "
           "scales can reproduce it exactly (the MSE search finds those scales), and 8-bit figures at group 32 say "
           "nothing about a bf16 checkpoint; none is reported here.", ""]
    for f, d in agrees:
        meta = d["meta"]
        for model, m in d["models"].items():
            recs = [r for r in d["records"] if r["model"] == model]
            head = [r for r in recs if r["embedding"] == "dense" and "pair" not in r]
            emb = [r for r in recs if r["embedding"] != "dense" and "pair" not in r]
            pairs = [r for r in recs if "pair" in r]
            if pairs:
                out += pair_section(model, m, meta, pairs, os.path.relpath(f, os.path.dirname(args.out)))
                continue
            if emb:
                # A run with the embedding quantized too: its own, smaller state set.
                out += [f"## {model}: the input embedding quantized too", "",
                        f"The model's forward pass over the corpus again, its input embedding reading the quantized "
                        f"table (tied: the head's own packed table), against the dense model at the same positions "
                        f"({emb[0]['states']} corpus states; the head-only rows are the {head[0]['states']} states of "
                        f"this run). Run: `{meta.get('command', 'qhead agree')}` — {meta['date']}; JSON "
                        f"`{os.path.relpath(f, os.path.dirname(args.out))}`.", ""]
                out += ["| embedding | " + agree_table(head + emb)[0][2:], "|---" + agree_table(head + emb)[1]]
                for r, line in zip(head + emb, agree_table(head + emb)[2:]):
                    out.append(f"| {r['embedding']} " + line)
                out.append("")
                continue
            if any(r.get("activations") == "int8" for r in head):
                # The CPU kernels' int8-activation mode beside the exact one, same tables and states.
                out += [f"## {model}: the CPU int8-activation mode", "",
                        f"The same quantized tables measured twice on the same {head[0]['states']} states: with the "
                        f"CPU kernels' exact f32 activations and with x quantized per block of 32 to int8 "
                        f"(`set_cpu_activations(kInt8)`, integer dot products). Run: "
                        f"`{meta.get('command', 'qhead agree')}` — {meta['date']}, qhead "
                        f"{meta.get('qhead_commit') or ''}; JSON `{os.path.relpath(f, os.path.dirname(args.out))}`.",
                        "", "| activations " + agree_table(head)[0], "|---" + agree_table(head)[1]]
                for r, line in zip(head, agree_table(head)[2:]):
                    out.append(f"| {r.get('activations', 'exact')} " + line)
                out.append("")
                continue
            qset = set(r.get("quantizer", "rtn") for r in head)
            if len(qset) > 1:
                cal = m.get("calibration") or {}
                out += [f"## {model}: quantizers compared", "",
                        f"Every quantizer of qhead on the same held-out states: {m['states']} states "
                        f"measured; GPTQ's calibration set is {cal.get('states', 0)} other states ({cal.get('rule', '')}). "
                        f"Quantization time on this CPU (s, 2 threads): "
                        + ", ".join(f"{k} {v}" for k, v in (m.get("seconds_quantize_each") or {}).items()) + ".",
                        f"Run: `{meta.get('command', 'qhead agree')}` — {meta['date']}, qhead "
                        f"{meta.get('qhead_commit') or ''}; JSON `{os.path.relpath(f, os.path.dirname(args.out))}`.", "",
                        "### Targets", ""] + targets(model, head, None) + [""]
                out += ["### Top-1 agreement, Δppl and KL by scheme and quantizer", ""] + quantizer_grid(head) + [""]
                out += ["### Every record", "", "| quantizer " + agree_table(head)[0]
                        , "|---" + agree_table(head)[1]]
                for r, line in zip([r for r in head], agree_table(head)[2:]):
                    out.append(f"| {r.get('quantizer', 'rtn')} " + line)
                out.append("")
                continue
            out += [f"## {model}", ""]
            out += headline(model, recs) + [""]
            out += [f"- Model: `{m['model_file']}` (sha256 `{m['model_sha256']}`), V × H = {m['vocab']} × {m['hidden']}, "
                    f"tied: {m['tied']}, dtype {m['model_dtype']}.",
                    f"- States: {m['states']} used of {m['states_captured']} captured ({m['states_teacher_forced']} "
                    f"teacher-forced over the corpus, sha256 `{m['corpus_sha256'][:16]}…`, windows of {m['window']}; "
                    f"the rest from greedy and sampled generation, {m['new_tokens']} tokens per prompt). Capture: "
                    f"{m['seconds']['teacher_forced']:.0f} s teacher-forced + {m['seconds']['generation']:.0f} s "
                    f"generation on {m['cpu']}, {m['threads']} threads; comparison {m['seconds_compare']:.0f} s.",
                    f"- Run: `{meta.get('command', 'qhead agree')}` — qhead {meta['qhead_version']} "
                    f"({meta.get('qhead_commit') or 'commit unknown'}), torch {meta['torch']}, transformers "
                    f"{meta['transformers']}, {meta['date']}. JSON: `{os.path.relpath(f, os.path.dirname(args.out))}`."]
            if m.get("skipped"):
                out.append(f"- Not run: {', '.join(m['skipped'])} (the group size does not divide H = {m['hidden']}).")
            out += ["", "### Head only, every scheme and K", ""] + agree_table(head) + [""]
            out += ["### By origin of the state (top-1 agreement %)", ""] + by_source_table(
                [r for r in head if r["rescore"] in (0, 8)]) + [""]
            png = os.path.splitext(f)[0] + ".png"
            if os.path.isfile(png):
                out += [f"![{model}]({os.path.relpath(png, os.path.dirname(args.out))})", ""]
    if gens:
        out += ["## Generation side by side (`qhead generate`)", "",
                "Greedy decoding at batch 1, the dense model then the same model with its tied table quantized in "
                "place (one packed copy for both roles). The head's share is the time inside the output "
                "embedding's forward over the time of `generate`.", ""]
        out += gen_rows(gens) + [""]
        for f, g in gens:
            cmd = g["command"].replace("\n", "\\n")
            out.append(f"- `{cmd}` — {g['date']}, qhead {g['qhead_version']}, torch {g['torch_version']}, "
                       f"transformers {g['transformers_version']}; JSON `{os.path.relpath(f, os.path.dirname(args.out))}`.")
        out.append("")
    out += ["## Reading the tables", "",
            "- **ties**: states whose dense top-1/top-2 margin is within the rounding bound of the dense logits (an f32 "
            "dot product over H); **flips outside ties** are the real ones. **displaced**: states where the argmax of "
            "the rescored logits is not among the K candidates (the rescored top-1 reported is the best candidate).",
            "- **KL** is KL(dense ‖ quantized) per state from the full distributions; **Δp top** the change in the "
            "probability of the dense top token; **same top p** (llama.cpp's name) equals the top-1 agreement.",
            "- **Δppl** is the perplexity of the corpus' next tokens with the quantized head against the dense head "
            "(teacher-forced states only).", "",
            "## Reproduce", "",
            "```sh",
            "scripts/fetch_models.sh",
            "qhead agree --model smollm2 --threads 2 --json docs/accuracy/smollm2.json --plot docs/accuracy/smollm2.png",
            "qhead agree --model gemma3 --n 12000 --capture-all --threads 2 --json docs/accuracy/gemma3.json "
            "--plot docs/accuracy/gemma3.png",
            "qhead agree --model smollm2 --n 14500 --quantizer rtn,mse,mse-act,gptq,gptq-mse --schemes w8,w4g64 "
            "--rescore 4,8,16 --threads 2 --json docs/accuracy/smollm2-quantizers.json   # and gemma3; 4096 states "
            "calibrate, the rest are measured",
            "qhead agree --model smollm2 --n 4000 --schemes w8,w4g64 --rescore 8 --embedding same --threads 2 "
            "--json docs/accuracy/smollm2-embedding.json   # and gemma3",
            "qhead agree --model smollm2 --schemes w4g64,w8 --rescore 8 --cpu-activations exact,int8 --n 6000 "
            "--json docs/accuracy/smollm2-int8x.json",
            "qhead generate --model gemma3 --head w4g64 --rescore 8 --validation --new-tokens 64 --threads 2 "
            "--json docs/accuracy/generate_cpu_gemma3_w4g64_r8.json   # and the other generate_*.json",
            "python scripts/accuracy_report.py docs/accuracy/smollm2.json docs/accuracy/gemma3.json docs/accuracy/*-quantizers.json docs/accuracy/*-bits.json docs/accuracy/*-embedding.json docs/accuracy/*-untie.json docs/accuracy/*-int8x.json docs/accuracy/generate_*.json",
            "```", ""]
    tmp = args.out + ".tmp"
    with open(tmp, "w") as fh:
        fh.write("\n".join(out))
    os.replace(tmp, args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
