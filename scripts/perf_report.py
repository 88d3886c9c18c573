#!/usr/bin/env python3
"""The tables of docs/performance.md, generated from self-describing bench files.

A bench file (docs/bench/<device>/<name>.json) is one run:

    {"qhead":   {"version": "0.1.0", "commit": "<40 hex>"},
     "device":  {"name": "NVIDIA H200", ...free-form facts as found...},
     "command": "qhead bench --device cuda ... --json",
     "date":    "2026-11-30T12:30:29+00:00",
     "rows":    [ ...the rows `qhead bench --json` printed, unchanged... ]}

The rows are kept exactly as the bench (or scripts/bench_binding.py) wrote them
at that commit, so they are a record, not prose: their path names and notes are
those of the binary that ran. The tables show the design name of each path
(PATH_NAMES below) next to nothing else from the notes.

docs/performance.md holds the generated tables between markers:

    <!-- perf_report:begin KIND GLOB -->
    ...generated...
    <!-- perf_report:end KIND -->

KIND is one of cuda, cuda-kernels, cpu, tp, binding, cpu-peers (the files of
scripts/bench_llamacpp.sh), gpu-peers (scripts/bench_peers.py), sample (any file
with sample rows); GLOB (relative to the
repository root) picks the bench files, of which each table takes the ones
whose rows are of its kind (any number of files: one row per file and case,
each with its run number, and the runs listed under the table).

Usage:
    scripts/perf_report.py                 rewrite docs/performance.md's tables
    scripts/perf_report.py --check         exit 1 if the page differs from what would be generated
    scripts/perf_report.py wrap RAW -o OUT [--commit C] [--version V] [--device-name N]
                                         [--command CMD] [--date D] [--fact KEY=VALUE ...]
        wrap the JSON array of `qhead bench --json` (or the JSON lines of
        scripts/bench_binding.py --json) into a bench file; version, commit,
        device, command and date default to the rows' own fields.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import sys
from typing import Callable

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGE = os.path.join("docs", "performance.md")

BEGIN = re.compile(r"^<!-- perf_report:begin (\S+) (\S+) -->$")
END = "<!-- perf_report:end {} -->"

# Bench path names -> what they are. The bench names some paths by the kernel
# family it forces; both the names of older binaries and design names map here.
PATH_NAMES = {
    "fused_v7": "register-ring GEMV",
    "fused_gemv_regring": "register-ring GEMV",
    "fused_gemv_staged": "staged GEMV",
    "fused_gemv": "GEMV kernels",
    "fused_mma": "mma.sync GEMM",
    "fused_gemm_mma_sync": "mma.sync GEMM",
    "fused_wgmma": "wgmma GEMM (by M)",
    "fused_wgmma_v11": "CTA-barrier wgmma GEMM",
    "fused_gemm_wgmma": "CTA-barrier wgmma GEMM",
    "fused_wgmma_ws": "warp-specialized wgmma GEMM",
    "fused_gemm_wgmma_ws": "warp-specialized wgmma GEMM",
}
# The kernel-family columns of the cuda-kernels table, in order: the name, the
# bench paths that force it, and the kernel name a "fused" row carries when
# the plan chose it (its time then fills the column too).
KERNEL_COLUMNS = [
    ("register-ring GEMV", ("fused_v7", "fused_gemv_regring"), "gemv_regring"),
    ("staged GEMV", ("fused_gemv_staged",), "gemv_staged"),
    ("GEMV kernels", ("fused_gemv",), None),
    ("mma.sync GEMM", ("fused_mma", "fused_gemm_mma_sync"), "gemm_mma_sync"),
    ("CTA-barrier wgmma GEMM", ("fused_wgmma_v11", "fused_gemm_wgmma"), "gemm_wgmma"),
    ("warp-specialized wgmma GEMM", ("fused_wgmma_ws", "fused_gemm_wgmma_ws"), "gemm_wgmma_ws"),
]


class ReportError(Exception):
    pass


# ---------------------------------------------------------------- bench files


def load_bench(path: str) -> dict:
    with open(path, encoding="utf-8") as f:
        try:
            d = json.load(f)
        except json.JSONDecodeError as e:
            raise ReportError(f"{path}: not JSON: {e}") from None
    for key in ("qhead", "device", "command", "date", "rows"):
        if key not in d:
            raise ReportError(f"{path}: a bench file needs '{key}' (see scripts/perf_report.py)")
    if not isinstance(d["rows"], list) or not d["rows"]:
        raise ReportError(f"{path}: 'rows' must be a non-empty list")
    if "commit" not in d["qhead"] or "version" not in d["qhead"]:
        raise ReportError(f"{path}: 'qhead' needs 'version' and 'commit'")
    d["file"] = path
    return d


def kind_of(bench: dict) -> str:
    rows = bench["rows"]
    if bench.get("tool") == "bench_llamacpp":
        return "cpu-peers"
    if bench.get("tool") == "bench_peers":
        return "gpu-peers"
    if all("case" in r for r in rows):
        return "binding"
    paths = {r.get("path") for r in rows}
    if "tp_topk" in paths:
        return "tp"
    if "compute_ceiling" in paths:
        return "cpu"
    if "read_ceiling" in paths or "ceiling_matrix" in paths:
        return "cuda"
    return "unknown"


def device_name(bench: dict) -> str:
    dev = bench["device"]
    return dev.get("name", "") if isinstance(dev, dict) else str(dev)


# ---------------------------------------------------------------- formatting


def fmt_us(v):
    return "—" if v is None else f"{v:.1f}"


def fmt_ms(v):
    return "—" if v is None else f"{v / 1000.0:.2f}"


def fmt_frac(v):
    return "—" if v is None else f"{v:.2f}"


def fmt_ratio(v):
    return "—" if v is None else f"{v:.2f}×"


def ratio(a, b):
    return None if a is None or b is None or b == 0 else a / b


def table(header: list[str], align: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---:" if a == "r" else "---" for a in align) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return out


def runs_list(benches: list[dict]) -> list[str]:
    out = []
    for i, b in enumerate(benches, 1):
        q = b["qhead"]
        out.append(
            f"- run {i}: `{b['file']}` — qhead {q['version']} at {q['commit'][:7]}, {b['date'][:10]}, "
            f"{device_name(b)}; `{b['command']}`"
        )
    return out


class Index:
    """(shape, scheme, act, m, path) -> row, for one bench file."""

    def __init__(self, rows, act_default=""):
        self.rows = {}
        self.cases = []  # (shape, scheme, act, m) in file order
        seen = set()
        self.ceil = {}   # (shape, scheme, act) -> read_ceiling row
        for r in rows:
            if r.get("measured", True) is False or r.get("path") == "verdict":
                continue
            act = r.get("act", act_default)
            key = (r.get("shape", ""), r.get("scheme", ""), act, r.get("m", 0))
            if r.get("path") == "read_ceiling":
                self.ceil[key[:3]] = r
                continue
            if not key[0]:
                continue
            if key not in seen:
                seen.add(key)
                self.cases.append(key)
            self.rows[key + (r["path"],)] = r

    def us(self, case, path):
        r = self.rows.get(case + (path,))
        return None if r is None else r.get("us_median")

    def field(self, case, path, name):
        r = self.rows.get(case + (path,))
        return None if r is None else r.get(name)

    def row(self, case, path):
        return self.rows.get(case + (path,))


def shape_size(shape: str) -> int:
    try:
        v, h = shape.lower().split("x")
        return int(v) * int(h)
    except ValueError:
        return 0


def all_cases(benches: list[dict], act_default: str = ""):
    """(run, Index, case) for every case of every run: by table size (V·H), then scheme in order of first
    appearance, activation dtype, M, run, so that the runs of one case stand together."""
    out, scheme_order = [], {}
    for i, b in enumerate(benches, 1):
        ix = Index(b["rows"], act_default=act_default)
        for c in ix.cases:
            scheme_order.setdefault(c[1], len(scheme_order))
            out.append((i, ix, c))
    out.sort(key=lambda t: (shape_size(t[2][0]), t[2][0], scheme_order[t[2][1]], t[2][2], t[2][3], t[0]))
    return out


def by_date(benches):
    return sorted(benches, key=lambda b: (b["date"], b["file"]))


# ---------------------------------------------------------------- the tables


def table_cuda(benches: list[dict]) -> list[str]:
    rows = []
    for i, ix, c in all_cases(benches, act_default="f16"):
        shape, scheme, act, m = c
        fused = ix.row(c, "fused")
        ceil = ix.ceil.get(c[:3])
        fu = None if fused is None else fused["us_median"]
        dense = ix.us(c, "dense")
        rows.append([
            shape, scheme, act, str(m),
            fmt_us(None if ceil is None else ceil["us_median"]),
            fmt_us(dense), fmt_us(ix.us(c, "fallback")), fmt_us(fu),
            fmt_frac(None if fused is None else fused.get("read_ceiling_fraction")),
            fmt_ratio(ratio(dense, fu)),
            fmt_us(None if fused is None else fused.get("host_us")),
            fmt_us(ix.us(c, "logits_then_topk")), fmt_us(ix.us(c, "fused_topk")),
            fmt_us(ix.us(c, "auto_topk")), fmt_frac(ratio(ix.us(c, "auto_topk"), fu)),
            str(i),
        ])
    header = ["shape", "scheme", "act", "M", "read ceiling µs", "cuBLAS dense µs", "fallback µs", "fused µs",
              "fused / read ceiling", "fused vs cuBLAS", "fused host µs", "logits + selection µs",
              "fused top-k µs", "default top-k µs", "default top-k / fused", "run"]
    align = ["l", "l", "l"] + ["r"] * 13
    return table(header, align, rows) + [""] + runs_list(benches)


def table_cuda_act_out(benches: list[dict]) -> list[str]:
    """The logits stored in the activations' dtype: cuBLAS with a 16-bit output against the fused
    kernel's 16-bit store (rows `dense_act_out`, `fused_act_out`), beside the f32-output times."""
    rows = []
    for i, ix, c in all_cases(benches, act_default="f16"):
        shape, scheme, act, m = c
        fa, da = ix.us(c, "fused_act_out"), ix.us(c, "dense_act_out")
        if fa is None or da is None:
            continue
        fu, dense = ix.us(c, "fused"), ix.us(c, "dense")
        rows.append([shape, scheme, act, str(m), fmt_us(da), fmt_us(fa), fmt_ratio(ratio(da, fa)),
                     fmt_us(dense), fmt_us(fu), fmt_frac(ratio(fa, fu)), str(i)])
    header = ["shape", "scheme", "act", "M", "cuBLAS dense, act out µs", "fused, act out µs",
              "fused vs cuBLAS (act out)", "cuBLAS dense, f32 out µs", "fused, f32 out µs",
              "fused act out / f32 out", "run"]
    return table(header, ["l", "l", "l"] + ["r"] * 8, rows) + [""] + runs_list(benches)


def table_cuda_kernels(benches: list[dict]) -> list[str]:
    present = []
    for name, paths, kernel in KERNEL_COLUMNS:
        if any(r.get("path") in paths or (kernel and r.get("path") == "fused" and r.get("kernel") == kernel)
               for b in benches for r in b["rows"]):
            present.append((name, paths, kernel))
    rows = []
    for i, ix, c in all_cases(benches, act_default="f16"):
        fused_kernel = ix.field(c, "fused", "kernel")
        cells = []
        for _, paths, kernel in present:
            us = next((ix.us(c, p) for p in paths if ix.us(c, p) is not None), None)
            if us is None and kernel and fused_kernel == kernel:
                us = ix.us(c, "fused")
            cells.append(fmt_us(us))
        if all(x == "—" for x in cells):
            continue
        rows.append([c[0], c[1], c[2], str(c[3]), fmt_us(ix.us(c, "fused")), fused_kernel or "—"] + cells + [str(i)])
    header = (["shape", "scheme", "act", "M", "fused µs (the selected kernel)", "selected"] +
              [n + " µs" for n, _, _ in present] + ["run"])
    align = ["l", "l", "l"] + ["r"] * 2 + ["l"] + ["r"] * (len(header) - 6)
    return table(header, align, rows) + [""] + runs_list(benches)


def table_cpu(benches: list[dict]) -> list[str]:
    ceilings = []
    for b in benches:
        ceiling = next((r for r in b["rows"] if r.get("path") == "ceiling"), None)
        fma = next((r for r in b["rows"] if r.get("path") == "compute_ceiling"), None)
        m = None if fma is None else re.search(r"([0-9.]+) G multiply-adds/s", fma.get("note", ""))
        ceilings.append((ceiling, float(m.group(1)) if m else None))
    rows = []
    for i, ix, c in all_cases(benches):
        ceiling, fma_rate = ceilings[i - 1]
        fused = ix.row(c, "fused")
        fu = None if fused is None else fused["us_median"]
        topk, int8, dense = ix.us(c, "fused_topk"), ix.us(c, "fused_int8"), ix.us(c, "dense")
        rows.append([
            c[0], c[1], str(c[3]),
            "—" if ceiling is None else f"{ceiling['gbps']:.1f}",
            "—" if fma_rate is None else f"{fma_rate:.1f}",
            fmt_ms(dense), fmt_ms(ix.us(c, "fallback")), fmt_ms(fu),
            fmt_frac(None if fused is None else fused.get("bw_fraction")),
            fmt_ratio(ratio(dense, fu)), fmt_ms(ix.us(c, "fused_act_out")), fmt_ms(topk), fmt_frac(ratio(topk, fu)),
            fmt_ms(int8), fmt_frac(ratio(int8, fu)), str(i),
        ])
    header = ["shape", "scheme", "M", "read ceiling GB/s", "FMA rate G/s", "dense f32 BLAS ms", "fallback ms",
              "fused ms", "fused / read ceiling", "fused vs dense", "fused, bf16 out ms", "fused top-k ms",
              "top-k / fused", "int8 mode ms", "int8 / fused", "run"]
    align = ["l", "l"] + ["r"] * 14
    return table(header, align, rows) + [""] + runs_list(benches)


def table_tp(benches: list[dict]) -> list[str]:
    rows = []
    for i, b in enumerate(benches, 1):
        by = {}
        ms = []
        for r in b["rows"]:
            if r.get("m", 0) and r.get("path", "").startswith(("tp_", "single_gpu")):
                by[(r["m"], r["path"])] = r["us_median"]
                if r["m"] not in ms:
                    ms.append(r["m"])
        shape = next((r["shape"] for r in b["rows"] if r.get("path") == "tp_topk"), "")
        scheme = next((r["scheme"] for r in b["rows"] if r.get("path") == "tp_topk"), "")
        n = b["device"].get("gpus", "") if isinstance(b["device"], dict) else ""
        for m in ms:
            one, step = by.get((m, "single_gpu_topk")), by.get((m, "tp_topk"))
            rows.append((m, i, [
                shape, scheme, str(n), str(m), fmt_us(one), fmt_us(by.get((m, "tp_local_topk"))),
                fmt_us(by.get((m, "tp_exchange"))), fmt_us(step), fmt_ratio(ratio(one, step)),
                fmt_us(by.get((m, "tp_logits_allgather"))), fmt_us(by.get((m, "tp_allgather_logits_comm"))),
                str(i),
            ]))
    rows = [r for _, _, r in sorted(rows, key=lambda t: (t[0], t[1]))]
    header = ["shape", "scheme", "GPUs", "M", "1 GPU top-k µs", "local top-k µs (slowest rank)",
              "exchange µs (alone)", "sharded step µs", "speed-up", "logits + all-gather [M, V] µs",
              "that all-gather alone µs", "run"]
    align = ["l", "l"] + ["r"] * 10
    return table(header, align, rows) + [""] + runs_list(benches)


BINDING_VARIANTS = [
    ("raw `_C`", "raw", "host_us"),
    ("C++ op", "op", "overhead_us"),
    ("Python op", "py-op", "overhead_us"),
    ("`custom_op`", "custom", "overhead_us"),
    ("module, eager", "module", "overhead_us"),
    ("module, C++ op", "module-op", "overhead_us"),
    ("module, Python op", "py-module-op", "overhead_us"),
]


def table_binding(benches: list[dict]) -> list[str]:
    rows = []
    for i, b in enumerate(benches, 1):
        cases = {r["case"]: r for r in b["rows"]}
        ops = []
        for r in b["rows"]:
            op = r["case"].split("/")[0]
            if op != "piece" and op not in ops:
                ops.append(op)
        for op in ops:
            cells = []
            for _, variant, field in BINDING_VARIANTS:
                r = cases.get(f"{op}/{variant}")
                v = None if r is None else r.get(field)
                cells.append("—" if v is None else (f"{v:.2f}" if field == "host_us" else f"+{v:.2f}"))
            rows.append([op] + cells + [str(i)])
    header = ["op"] + [n for n, _, _ in BINDING_VARIANTS] + ["run"]
    align = ["l"] + ["r"] * (len(header) - 1)
    out = table(header, align, rows)
    pieces = [(r["case"].split("/", 1)[1], r["host_us"]) for b in benches for r in b["rows"]
              if r["case"].startswith("piece/")]
    if pieces:
        out += ["", "Pieces: " + "; ".join(f"{n} {v:.1f} µs" for n, v in pieces) + "."]
    return out + [""] + runs_list(benches)


def table_cpu_peers(benches: list[dict]) -> list[str]:
    """qhead's CPU paths and llama.cpp's ggml mul_mat (scripts/bench_llamacpp.sh) in one run."""
    ggml_cols = [("q4_0", "plain"), ("q4_0", "repacked"), ("q4_K", "plain"), ("q4_K", "repacked"),
                 ("q8_0", "plain"), ("f16", "plain")]
    rows = []
    for i, b in enumerate(benches, 1):
        isa = b["device"].get("isa", "") if isinstance(b["device"], dict) else ""
        q = Index([r for r in b["rows"] if r.get("peer") != "ggml"])
        g = {(r["shape"], r["m"], r.get("type"), r.get("layout", "plain")): r.get("us_median")
             for r in b["rows"] if r.get("peer") == "ggml" and r.get("us_median")}
        for c in q.cases:
            shape, _, _, m = c
            fused, int8 = q.us(c, "fused"), q.us(c, "fused_int8")
            gv = [g.get((shape, m, t, lay)) for t, lay in ggml_cols]
            four = [(v, f"{t} {lay}") for (t, lay), v in zip(ggml_cols, gv) if v and t.startswith("q4")]
            best = min(four) if four else (None, "")
            rows.append([shape, c[1], str(m), isa, fmt_ms(fused), fmt_ms(int8), fmt_ms(q.us(c, "sample"))]
                        + [fmt_ms(None if v is None else v) for v in gv]
                        + [best[1] or "—", fmt_ratio(ratio(best[0], fused)), fmt_ratio(ratio(best[0], int8)), str(i)])
    header = ["shape", "qhead scheme", "M", "qhead ISA", "qhead fused ms", "qhead int8 mode ms", "qhead sample ms"] + \
             [f"ggml {t} {lay} ms" for t, lay in ggml_cols] + \
             ["ggml's best 4-bit", "its time / qhead fused", "its time / qhead int8", "run"]
    align = ["l", "l", "r", "l"] + ["r"] * 9 + ["l", "r", "r", "r"]
    return table(header, align, rows) + [""] + runs_list(benches)


def table_sample(benches: list[dict]) -> list[str]:
    """The sample op beside the logits and the top-k of the same run (CPU and CUDA bench files)."""
    rows = []
    for i, b in enumerate(benches, 1):
        ix = Index([r for r in b["rows"] if r.get("peer") != "ggml"])
        for c in ix.cases:
            cuda = "cuda" in device_name(b).lower() or "nvidia" in device_name(b).lower()
            fused = ix.us(c, "fused")
            topk = ix.us(c, "fused_topk")
            full = ix.us(c, "sample")
            tk = ix.us(c, "sample_top_k")
            tp = ix.us(c, "sample_top_p")
            unit = fmt_us if cuda else fmt_ms
            rows.append([device_name(b), c[0], c[1], str(c[3]), "µs" if cuda else "ms", unit(fused),
                         unit(topk), unit(full), fmt_frac(ratio(full, fused)), unit(tk), fmt_frac(ratio(tk, fused)),
                         unit(tp), str(i)])
    header = ["device", "shape", "scheme", "M", "unit", "logits (fused)", "top-k 50", "sample T = 1", "/ logits",
              "sample top_k 50", "/ logits", "sample T 0.7 top_p 0.9", "run"]
    align = ["l", "l", "l", "r", "l"] + ["r"] * 8
    return table(header, align, rows) + [""] + runs_list(benches)


def table_gpu_peers(benches: list[dict]) -> list[str]:
    """qhead's torch ops and the GPU peers (scripts/bench_peers.py) in one process."""
    peers = ["cublas_f16", "cublas_bf16", "tinygemm", "gemlite"]
    rows = []
    for i, b in enumerate(benches, 1):
        by = {}
        for r in b["rows"]:
            by.setdefault((r["shape"], r.get("scheme", ""), r["m"]), {})[r["peer"]] = r
        for (shape, scheme, m), rs in sorted(by.items(), key=lambda kv: (shape_size(kv[0][0]), kv[0][2])):
            us = {p: rs[p]["us_median"] for p in rs if "us_median" in rs[p]}
            q, qt, q16 = us.get("qhead"), us.get("qhead_topk"), us.get("qhead_f16")
            others = [(us[p], p) for p in peers if p in us]
            best = min(others) if others else (None, "—")
            frac = rs["qhead"].get("read_fraction") if "qhead" in rs else None
            rows.append([shape, scheme, str(m), fmt_us(q), fmt_frac(frac), fmt_us(q16)] +
                        [fmt_us(us.get(p)) for p in peers] +
                        [best[1].replace("_", " "), fmt_ratio(ratio(best[0], q)), fmt_ratio(ratio(best[0], q16)),
                         fmt_us(qt), fmt_us(us.get("linear_topk")), fmt_ratio(ratio(us.get("linear_topk"), qt)), str(i)])
    header = ["shape", "qhead scheme", "M", "qhead logits µs", "of the read ceiling", "qhead logits, f16 out µs",
              "cuBLAS f16 µs", "cuBLAS bf16 µs", "tinygemm int4 µs", "gemlite µs", "fastest peer",
              "its time / qhead's", "its time / qhead's f16 out", "qhead top-k 50 µs", "F.linear + torch.topk µs",
              "its time / qhead's", "run"]
    align = ["l", "l", "r", "r", "r", "r", "r", "r", "r", "r", "l", "r", "r", "r", "r", "r", "r"]
    return table(header, align, rows) + [""] + runs_list(benches)


TABLES: dict[str, Callable[[list[dict]], list[str]]] = {
    "cuda": table_cuda,
    "cuda-kernels": table_cuda_kernels,
    "cuda-act-out": table_cuda_act_out,
    "cpu": table_cpu,
    "tp": table_tp,
    "binding": table_binding,
    "cpu-peers": table_cpu_peers,
    "gpu-peers": table_gpu_peers,
    "sample": table_sample,
}
KIND_OF_TABLE = {"cuda": "cuda", "cuda-kernels": "cuda", "cuda-act-out": "cuda", "cpu": "cpu", "tp": "tp", "binding": "binding",
                 "cpu-peers": "cpu-peers", "gpu-peers": "gpu-peers",
                 "sample": "sample"}


def has_sample_rows(bench: dict) -> bool:
    return any(r.get("path") == "sample" for r in bench["rows"])


def generate_block(kind: str, pattern: str, root: str) -> list[str]:
    if kind not in TABLES:
        raise ReportError(f"unknown table kind '{kind}' (one of {', '.join(TABLES)})")
    files = sorted(glob.glob(os.path.join(root, pattern)))
    benches = []
    for f in files:
        b = load_bench(f)
        b["file"] = os.path.relpath(f, root)
        if (has_sample_rows(b) if kind == "sample" else kind_of(b) == KIND_OF_TABLE[kind]):
            benches.append(b)
    if not benches:
        raise ReportError(f"table '{kind}': no {KIND_OF_TABLE[kind]} bench file matches {pattern}")
    return TABLES[kind](by_date(benches))


def render(page: str, root: str) -> str:
    lines = page.split("\n")
    out, i = [], 0
    while i < len(lines):
        line = lines[i]
        m = BEGIN.match(line)
        if not m:
            out.append(line)
            i += 1
            continue
        kind, pattern = m.group(1), m.group(2)
        end = END.format(kind)
        try:
            j = lines.index(end, i + 1)
        except ValueError:
            raise ReportError(f"line {i + 1}: '{line}' has no '{end}'") from None
        out.append(line)
        out += [""] + generate_block(kind, pattern, root) + [""]
        out.append(end)
        i = j + 1
    return "\n".join(out)


# ---------------------------------------------------------------- wrap


def read_rows(path: str) -> list:
    with open(path, encoding="utf-8") as f:
        text = f.read()
    try:
        d = json.loads(text)
    except json.JSONDecodeError:
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    if isinstance(d, dict) and "rows" in d:
        return d["rows"]
    if not isinstance(d, list):
        raise ReportError(f"{path}: expected a JSON array of bench rows")
    return d


def common(rows, key):
    vals = {json.dumps(r[key], sort_keys=True) for r in rows if key in r}
    return json.loads(vals.pop()) if len(vals) == 1 else None


def wrap(args) -> int:
    rows = read_rows(args.raw)
    version = args.version or common(rows, "version")
    commit = args.commit or common(rows, "commit")
    command = args.command or common(rows, "command")
    date = args.date or common(rows, "date")
    name = args.device_name or common(rows, "device")
    missing = [k for k, v in (("version", version), ("commit", commit), ("command", command), ("date", date),
                              ("device", name)) if not v]
    if missing:
        raise ReportError(f"{args.raw}: the rows do not give {', '.join(missing)}; pass them as options")
    device = {"name": name}
    for fact in args.fact or []:
        k, sep, v = fact.partition("=")
        if not sep:
            raise ReportError(f"--fact takes KEY=VALUE, got '{fact}'")
        device[k] = int(v) if v.isdigit() else v
    out = {"qhead": {"version": version, "commit": commit}, "device": device, "command": command,
           "date": date, "rows": rows}
    if args.provenance:
        out["provenance"] = args.provenance
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    with open(args.output, "w", encoding="utf-8") as f:
        json.dump(out, f, indent=1, ensure_ascii=False)
        f.write("\n")
    return 0


# ---------------------------------------------------------------- main


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "wrap":
        ap = argparse.ArgumentParser(prog="perf_report.py wrap")
        ap.add_argument("raw")
        ap.add_argument("-o", "--output", required=True)
        ap.add_argument("--version")
        ap.add_argument("--commit")
        ap.add_argument("--device-name")
        ap.add_argument("--command")
        ap.add_argument("--date")
        ap.add_argument("--fact", action="append", help="KEY=VALUE into 'device' (e.g. driver=580.159.04)")
        ap.add_argument("--provenance", help="a sentence on where the fields come from")
        return wrap(ap.parse_args(argv[1:]))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if the page is not what would be generated")
    ap.add_argument("--page", default=os.path.join(REPO, PAGE))
    ap.add_argument("--root", default=REPO, help="where the markers' globs are resolved")
    a = ap.parse_args(argv)
    with open(a.page, encoding="utf-8") as f:
        page = f.read()
    new = render(page, a.root)
    if a.check:
        if new != page:
            import difflib

            diff = difflib.unified_diff(page.splitlines(), new.splitlines(), a.page, "generated", lineterm="", n=1)
            sys.stdout.write("\n".join(list(diff)[:60]) + "\n")
            print(f"perf_report: {a.page} differs from its bench files; run scripts/perf_report.py", file=sys.stderr)
            return 1
        return 0
    if new != page:
        with open(a.page, "w", encoding="utf-8") as f:
            f.write(new)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except ReportError as e:
        print(f"perf_report: {e}", file=sys.stderr)
        sys.exit(2)
