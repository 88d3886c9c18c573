#!/usr/bin/env python3
"""The sample op on a real model's decode states: qhead.sample (whole vocabulary at T = 1,
top_k = 50, T = 0.7 with top_p = 0.9) beside qhead's logits and top-k of the same quantized
table, and beside what a PyTorch user does on the dense table (F.linear, softmax,
torch.multinomial), in one process. Each call takes the next M states of the capture (the
states of `qhead agree`), so no two calls see the same activations.

    python scripts/bench_sample.py --model smollm2 [--scheme w4g64] [--m 1,8] [--reps 30] [--n N]
                                   [--device cpu|cuda] [--threads N] [--json OUT.json]

The states come from agree's cache (capturing them first when absent, as `qhead agree` does).
Also reported: per state, how many columns lie within 16.75 of the row's largest l/T (the
columns the CPU's fused Gumbel-max must draw noise for; the others cannot win).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time

import torch

import qhead
from qhead import agree
from qhead import models as qmodels


def _timer(device: str):
    if device == "cuda":
        from torch_baseline import median_us  # CUDA-event medians, as the torch baseline times them

        return lambda fn, reps: median_us(fn, reps=reps, warmup=0)

    def run(fn, reps):
        ts = []
        for i in range(reps):
            t0 = time.perf_counter()
            fn(i)
            ts.append((time.perf_counter() - t0) * 1e6)
        return statistics.median(ts)
    return run


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--scheme", default="w4g64")
    ap.add_argument("--m", default="1,8")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--n", type=int, help="about this many states, as `qhead agree --n` captures them "
                                          "(the same cache file)")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    if args.reps < 1:
        ap.error("--reps must be >= 1")
    ms = [int(v) for v in args.m.split(",")]
    if any(m < 1 for m in ms):
        ap.error("--m values must be >= 1")
    if args.threads:
        torch.set_num_threads(args.threads)
        qhead.set_num_threads(args.threads)
    ref = qmodels.resolve(args.model)
    path = agree.default_states_path(args.model, [], 512, 64, True, args.n)
    if not os.path.isfile(path):
        st = agree.capture(args.model, max_states=args.n, log=lambda s: print(s, file=sys.stderr))
        agree.save_states(st, path)
    st = agree.load_states(path)
    w = st.table.float()
    hidden = st.hidden.float()
    dev = args.device
    table = qhead.quantize(w, args.scheme, scale_dtype="f32")
    if dev == "cuda":
        table = qhead.to_device(table)
    dense = w.to(dev)
    xdt = torch.float32 if dev == "cpu" else torch.float16
    run = _timer(dev)
    rows = []
    n = hidden.shape[0]
    for m in ms:
        batches = [hidden[(i * m) % (n - m): (i * m) % (n - m) + m].to(dev, xdt).contiguous()
                   for i in range(args.reps + 3)]
        v = table.vocab
        out = torch.empty((m, v), dtype=torch.float32, device=dev)
        vals = torch.empty((m, 50), dtype=torch.float32, device=dev)
        ids = torch.empty((m, 50), dtype=torch.int32, device=dev)
        lse = torch.empty((m,), dtype=torch.float32, device=dev)
        sid = torch.empty((m,), dtype=torch.int32, device=dev)
        paths = {
            "qhead logits": lambda i: qhead.logits(table, batches[i], out),
            "qhead topk 50": lambda i: qhead.topk(table, batches[i], 50, vals, ids, lse),
            "qhead sample T=1": lambda i: qhead.sample(table, batches[i], sid, seed=1, offset=i),
            "qhead sample T=1 top_k=50": lambda i: qhead.sample(table, batches[i], sid, top_k=50, seed=1, offset=i),
            "qhead sample T=0.7 top_p=0.9": lambda i: qhead.sample(table, batches[i], sid, temperature=0.7, top_p=0.9,
                                                                   seed=1, offset=i),
            "torch dense F.linear + softmax + multinomial": lambda i: torch.multinomial(
                torch.softmax(torch.nn.functional.linear(batches[i].to(dense.dtype), dense), dim=-1), 1),
        }
        for name, fn in paths.items():
            for i in range(3):
                fn(i)  # warm-up
            us = run(lambda i: fn(i + 3), args.reps)
            rows.append({"m": m, "path": name, "us_median": us})
            print(f"M={m:<3} {name:46s} {us:10.1f} µs", file=sys.stderr)
    # The columns within the Gumbel bound of each state's best (T = 1).
    with torch.no_grad():
        l = hidden[:2000] @ w.T
        near = (l >= l.max(dim=1, keepdim=True).values - 16.75).sum(dim=1).double()
    facts = {"states": int(n), "vocab": int(w.shape[0]), "hidden": int(w.shape[1]),
             "columns_within_16.75_of_the_max_mean": float(near.mean()),
             "columns_within_16.75_of_the_max_p90": float(near.quantile(0.9))}
    print(json.dumps(facts), file=sys.stderr)
    doc = {"tool": "bench_sample", "qhead": {"version": qhead.__version__, "commit": qmodels.source_commit()},
           "device": {"name": torch.cuda.get_device_name() if dev == "cuda" else (qmodels.cpu_name() or platform.processor()),
                      "threads": qhead.num_threads() if dev == "cpu" else None},
           "command": " ".join(["scripts/bench_sample.py"] + (argv if argv is not None else sys.argv[1:])),
           "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
           "model": ref.name, "scheme": args.scheme, "facts": facts, "rows": rows}
    text = json.dumps(doc, indent=1)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
