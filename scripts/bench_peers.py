#!/usr/bin/env python3
"""qhead's torch ops against the GPU alternatives a user has, in one process.

On the same shapes, M and weights, with CUDA events and rotated tables:

  qhead          torch.ops.qhead.logits / topk on qhead's packed table (--scheme)
  qhead_f16      the same logits stored as f16 (out_dtype), as the peers return theirs
  cublas_f16     F.linear on the dense f16 table (cuBLAS)
  cublas_bf16    F.linear on the dense bf16 table
  tinygemm       torch.ops.aten._weight_int4pack_mm (bf16 activations; 4-bit only)
  gemlite        gemlite's GemLiteLinear (Triton; 4- and 8-bit), when gemlite imports
  linear_topk    F.linear f16 + torch.topk(k), the decode step a PyTorch user runs
  qhead_topk     torch.ops.qhead.topk(k): the same step in one op

The 4-bit peers are given qhead's own codes and scales (symmetric code c in
[-8, 7] is stored as c + 8 with a zero point of 8), so every row computes with
the same weights. Before timing, each peer's output is checked against a
float64 product with the weights that peer holds (qhead: its dequantized table,
read back through qhead.embed); a peer off by more than its precision's
tolerance is reported, not timed.

Timing: each call reads one of N copies of its weights in turn, N chosen so
the copies exceed 3x the L2. Where the calls can be captured in a CUDA graph
(one graph of the N calls, replayed), the row's `us_median` is the replay time
per call, the device time without Python's launch cost; `us_eager` is the same
loop called from Python. The read ceiling of the same run (a torch sum over
2 GiB) gives each row's fraction of the memory floor.

    python3 scripts/bench_peers.py [--shape 151936x1024,262144x2560] [--scheme w4g64]
                                   [--m 1,16,32,256] [--k 50] [--json FILE]
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import shlex
import statistics
import subprocess
import sys

import torch
import torch.nn.functional as F

import qhead
import qhead.torch as qt


def commit() -> str:
    if os.environ.get("QHEAD_COMMIT"):
        return os.environ["QHEAD_COMMIT"]
    try:
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        return subprocess.run(["git", "-C", root, "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


class Timer:
    """Median device µs per call of a list of closures (one per rotated copy)."""

    def __init__(self, reps: int, stream: torch.cuda.Stream):
        self.reps = reps
        self.stream = stream

    def _events(self, body, calls: int) -> float:
        ts = []
        for _ in range(self.reps):
            a = torch.cuda.Event(enable_timing=True)
            b = torch.cuda.Event(enable_timing=True)
            a.record(self.stream)
            body()
            b.record(self.stream)
            b.synchronize()
            ts.append(a.elapsed_time(b) * 1000.0 / calls)
        return statistics.median(ts)

    def run(self, fns: list) -> dict:
        with torch.cuda.stream(self.stream):
            for _ in range(2):                       # warm-up: autotuning, workspaces, handles
                for f in fns:
                    f()
            self.stream.synchronize()
            loops = max(1, 64 // len(fns))

            def eager():
                for _ in range(loops):
                    for f in fns:
                        f()

            out = {"us_eager": self._events(eager, loops * len(fns)), "graph": False}
            try:
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g, stream=self.stream):
                    for f in fns:
                        f()
                g.replay()
                self.stream.synchronize()

                def replay():
                    for _ in range(loops):
                        g.replay()

                out["us_graph"] = self._events(replay, loops * len(fns))
                out["graph"] = True
                del g
            except Exception as e:                   # noqa: BLE001 - a peer that cannot be captured is timed eagerly
                out["graph_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
                torch.cuda.synchronize()
            out["us_median"] = out["us_graph"] if out["graph"] else out["us_eager"]
            return out


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    d = out.double() - ref
    return float(d.norm() / ref.norm().clamp_min(1e-300))


def read_ceiling_gbs(timer: Timer) -> float:
    """Bytes read per second by a torch sum over 2 GiB of f32."""
    buf = torch.rand(1 << 29, dtype=torch.float32, device="cuda")
    res = torch.empty((), dtype=torch.float32, device="cuda")
    t = timer.run([lambda: torch.sum(buf, dim=0, out=res)])
    del buf
    return buf_bytes_over(1 << 31, t["us_median"])


def buf_bytes_over(nbytes: int, us: float) -> float:
    return nbytes / (us * 1e-6) / 1e9


def copies_for(nbytes: int, l2: int) -> int:
    return max(2, min(16, math.ceil(3 * l2 / max(nbytes, 1))))


def timeline(fn, calls: int = 8) -> list:
    """The kernels of the last of `calls` eager calls of fn (torch's profiler, CUPTI): name,
    device µs, and the idle gap before each on the device."""
    from torch.profiler import ProfilerActivity, profile  # noqa: PLC0415
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            torch.cuda.synchronize()
            fn()
        torch.cuda.synchronize()
    ks = sorted(((e.start_ns(), e.duration_ns(), e.name()) for e in prof.profiler.kineto_results.events()
                 if str(e.device_type()).endswith("CUDA") and e.duration_ns() > 0),
                key=lambda t: t[0])
    if not ks:
        return []
    per_call = len(ks) // calls                  # every call launches the same kernels
    last = ks[-per_call:] if per_call else ks
    out, prev_end = [], None
    for start, dur, name in last:
        out.append({"kernel": name[:120], "us": dur / 1000.0,
                    "gap_before_us": None if prev_end is None else (start - prev_end) / 1000.0})
        prev_end = start + dur
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="151936x1024,262144x2560", help="VxH[,VxH...]")
    ap.add_argument("--scheme", default="w4g64", help="qhead scheme (4-bit symmetric for the 4-bit peers)")
    ap.add_argument("--m", default="1,16,32,256")
    ap.add_argument("--k", type=int, default=50)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--peers", default="cublas_f16,cublas_bf16,tinygemm,gemlite,linear_topk",
                    help="comma list of peers to time beside qhead")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--timeline", action="store_true",
                    help="also print the kernels of one qhead top-k call at each M (torch's profiler)")
    ap.add_argument("--json", default=None, help="write the bench file here")
    a = ap.parse_args()

    if not torch.cuda.is_available():
        print("bench_peers: needs a CUDA device (torch sees none)", file=sys.stderr)
        return 2
    try:
        shapes = [tuple(int(v) for v in s.split("x")) for s in a.shape.split(",")]
        ms = [int(v) for v in a.m.split(",")]
    except ValueError:
        print(f"bench_peers: --shape takes VxH[,VxH], --m a comma list of ints (got {a.shape!r}, {a.m!r})",
              file=sys.stderr)
        return 2
    scheme = qhead.Scheme(a.scheme)
    peers = [p for p in a.peers.split(",") if p]
    dev = torch.cuda.get_device_properties(0)
    l2 = int(getattr(dev, "L2_cache_size", 50 << 20))
    stream = torch.cuda.Stream()
    timer = Timer(a.reps, stream)
    gemlite_mod, gemlite_why = None, ""
    if "gemlite" in peers:
        try:
            import gemlite                       # noqa: PLC0415
            gemlite_mod = gemlite
        except Exception as e:                   # noqa: BLE001
            gemlite_why = f"gemlite does not import: {type(e).__name__}: {e}"

    ceiling = read_ceiling_gbs(timer)
    argv = list(sys.argv[1:])
    if "--json" in argv:                         # the command as typed, without where it wrote
        i = argv.index("--json")
        del argv[i:i + 2]
    cmd = " ".join(["python3 scripts/bench_peers.py"] + [shlex.quote(v) for v in argv])
    versions = {"torch": torch.__version__, "cuda": torch.version.cuda}
    try:
        import triton                            # noqa: PLC0415
        versions["triton"] = triton.__version__
    except ImportError:
        pass
    if gemlite_mod is not None:
        versions["gemlite"] = gemlite_mod.__version__
    date = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat()

    def write(rows_so_far):
        if not a.json or not rows_so_far:
            return
        bench = {
            "qhead": {"version": qhead.__version__, "commit": commit()},
            "tool": "bench_peers",
            "device": {"name": dev.name, "sms": dev.multi_processor_count, "l2_bytes": l2,
                       "read_ceiling_gbs": round(ceiling, 1), "versions": versions},
            "command": cmd,
            "date": date,
            "rows": rows_so_far,
        }
        tmp = a.json + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(bench, f, indent=1)
            f.write("\n")
        os.replace(tmp, a.json)

    print(f"torch {torch.__version__}, {dev.name}, {dev.multi_processor_count} SMs, L2 {l2 >> 20} MiB, "
          f"read ceiling {ceiling:.0f} GB/s, scheme {a.scheme}, k {a.k}", flush=True)
    rows = []
    base = {"scheme": a.scheme, "k": a.k}

    def add(shape, m, peer, weights_bytes, t, err, note=""):
        r = dict(base, shape=f"{shape[0]}x{shape[1]}", m=m, peer=peer, weights_bytes=weights_bytes,
                 rel_err=err, **t)
        if note:
            r["note"] = note
        r["read_fraction"] = buf_bytes_over(weights_bytes, r["us_median"]) / ceiling
        rows.append(r)
        print(f"  {r['shape']} M={m:<4} {peer:<12} {r['us_median']:9.1f} us  (eager {r['us_eager']:9.1f}"
              f"{'' if r['graph'] else ', not captured'})  {r['read_fraction']:.2f} of the read ceiling"
              f"  rel err {err:.1e}", flush=True)

    def skip(shape, m, peer, why):
        rows.append(dict(base, shape=f"{shape[0]}x{shape[1]}", m=m, peer=peer, skipped=why))
        print(f"  {shape[0]}x{shape[1]} M={m:<4} {peer:<12} skipped: {why}", flush=True)

    for V, H in shapes:
        g = torch.Generator(device="cpu").manual_seed(a.seed)
        W = torch.randn(V, H, generator=g, dtype=torch.float32) * 0.05
        # qhead's table, and its dequantized weights through qhead.embed (the values the kernels use).
        table = qt.QuantTable.from_dense(W, a.scheme)                 # on the CPU
        Wq = qhead.embed(table.table(), torch.arange(V, dtype=torch.int32)).float()
        qbytes = table.nbytes
        Wq_dev = Wq.to("cuda")
        Wd = Wq_dev.double()
        codes = scales = None
        if scheme.bits == 4 and scheme.symmetric and scheme.group_size > 0:
            G = H // scheme.group_size
            # The stored scales (f16) and the codes: a dequantized value is code x scale exactly.
            ws = table.weight_scale.float().reshape(V, G)
            codes = torch.round(Wq.reshape(V, G, -1) / ws.reshape(V, G, 1)).reshape(V, H)
            assert torch.equal((codes.reshape(V, G, -1) * ws.reshape(V, G, 1)).reshape(V, H), Wq), \
                "qhead's dequantized table is not code x scale"
            assert codes.min() >= -8 and codes.max() <= 7
            scales = ws
        # nn.Module.to moves in place: the CPU table above is done with.
        tables = [table.to("cuda")] + [qt.QuantTable.from_dense(W, a.scheme).to("cuda")
                                       for _ in range(copies_for(qbytes, l2) - 1)]
        targs = [t.op_args() for t in tables]
        del W
        print(f"{V}x{H}: qhead {qbytes / 2**20:.1f} MiB x {len(tables)} copies", flush=True)

        # Peers' weights, built once per shape.
        dense16 = [Wq_dev.half()] + [Wq_dev.half().clone() for _ in range(copies_for(V * H * 2, l2) - 1)]
        dense_b16 = None
        if "cublas_bf16" in peers:
            dense_b16 = [Wq_dev.bfloat16()] + [Wq_dev.bfloat16().clone() for _ in range(len(dense16) - 1)]
        tg = None
        tg_why = "needs a 4-bit symmetric grouped scheme"
        if "tinygemm" in peers and codes is not None:
            try:
                q = (codes + 8).to(torch.int32).to("cuda")
                packed_u8 = (q[:, ::2] << 4 | q[:, 1::2]).to(torch.uint8)
                inner = 8 if H % 128 == 0 else (4 if H % 64 == 0 else 2)
                wp = torch.ops.aten._convert_weight_to_int4pack(packed_u8, inner)
                sz = torch.stack([scales.to("cuda"), torch.zeros_like(scales, device="cuda")], 2)
                sz = sz.transpose(0, 1).contiguous().bfloat16()           # [H / g, V, 2]: scale, zero
                tg = [(wp, sz)] + [(wp.clone(), sz.clone()) for _ in range(copies_for(wp.numel() + sz.numel() * 2, l2) - 1)]
                tg_bytes = wp.numel() * wp.element_size() + sz.numel() * 2
            except Exception as e:               # noqa: BLE001
                tg, tg_why = None, f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
        gl = None
        gl_why = gemlite_why or "needs a 4-bit symmetric grouped scheme"
        if gemlite_mod is not None and codes is not None:
            try:
                from gemlite import DType, GemLiteLinear  # noqa: PLC0415
                gl = []
                for _ in range(copies_for(qbytes, l2)):
                    lin = GemLiteLinear(4, group_size=scheme.group_size, in_features=H, out_features=V,
                                        input_dtype=DType.FP16, output_dtype=DType.FP16)
                    lin.pack((codes + 8).to(torch.uint8).to("cuda"), scales.half().to("cuda"), 8, bias=None)
                    gl.append(lin)
                gl_bytes = sum(t.numel() * t.element_size() for t in (gl[0].W_q, gl[0].scales))
            except Exception as e:               # noqa: BLE001
                gl, gl_why = None, f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"

        for m in ms:
            gx = torch.Generator(device="cpu").manual_seed(a.seed + m)
            x32 = torch.randn(m, H, generator=gx, dtype=torch.float32)
            x16 = x32.half().to("cuda")
            xb16 = x32.bfloat16().to("cuda")
            ref16 = x16.double() @ Wd.T                                # f16 activations, qhead's weights
            refb16 = xb16.double() @ Wd.T
            # qhead logits (f16 activations, f32 logits out)
            out = torch.ops.qhead.logits(*targs[0][0], x16, **targs[0][1])
            err = rel_err(out, ref16)
            t = timer.run([lambda ta=ta: torch.ops.qhead.logits(*ta[0], x16, **ta[1]) for ta in targs])
            add((V, H), m, "qhead", qbytes, t, err)
            # qhead logits stored as f16, as the peers return theirs
            out = torch.ops.qhead.logits(*targs[0][0], x16, **targs[0][1], out_dtype=torch.float16)
            err = rel_err(out, ref16)
            t = timer.run([lambda ta=ta: torch.ops.qhead.logits(*ta[0], x16, **ta[1], out_dtype=torch.float16)
                           for ta in targs])
            add((V, H), m, "qhead_f16", qbytes, t, err)
            # qhead top-k
            vals, ids = torch.ops.qhead.topk(*targs[0][0], x16, a.k, **targs[0][1])[:2]
            rv, ri = torch.topk(ref16, a.k, dim=1)
            terr = rel_err(vals, rv)
            t = timer.run([lambda ta=ta: torch.ops.qhead.topk(*ta[0], x16, a.k, **ta[1]) for ta in targs])
            add((V, H), m, "qhead_topk", qbytes, t, terr)
            if a.timeline:
                try:
                    tl = timeline(lambda: torch.ops.qhead.topk(*targs[0][0], x16, a.k, **targs[0][1]))
                except Exception as e:           # noqa: BLE001 - the timeline is a diagnostic
                    print(f"      timeline: {type(e).__name__}: {e}", flush=True)
                    tl = []
                rows[-1]["timeline"] = tl
                for e in tl:
                    gap = "" if e["gap_before_us"] is None else f" (after {e['gap_before_us']:.1f} us idle)"
                    print(f"      {e['us']:7.1f} us{gap}  {e['kernel']}", flush=True)
            if "cublas_f16" in peers or "linear_topk" in peers:
                y = F.linear(x16, dense16[0])
                err = rel_err(y, ref16)
                if err > 5e-3:
                    skip((V, H), m, "cublas_f16", f"rel err {err:.2e} against float64")
                else:
                    if "cublas_f16" in peers:
                        t = timer.run([lambda w=w: F.linear(x16, w) for w in dense16])
                        add((V, H), m, "cublas_f16", V * H * 2, t, err)
                    if "linear_topk" in peers:
                        t = timer.run([lambda w=w: torch.topk(F.linear(x16, w), a.k, dim=1) for w in dense16])
                        add((V, H), m, "linear_topk", V * H * 2, t, err)
            if dense_b16 is not None:
                y = F.linear(xb16, dense_b16[0])
                err = rel_err(y, refb16)
                if err > 2e-2:
                    skip((V, H), m, "cublas_bf16", f"rel err {err:.2e} against float64")
                else:
                    t = timer.run([lambda w=w: F.linear(xb16, w) for w in dense_b16])
                    add((V, H), m, "cublas_bf16", V * H * 2, t, err)
            if "tinygemm" in peers:
                if tg is None:
                    skip((V, H), m, "tinygemm", tg_why)
                else:
                    try:
                        y = torch.ops.aten._weight_int4pack_mm(xb16, tg[0][0], scheme.group_size, tg[0][1])
                        err = rel_err(y, refb16)
                        if err > 2e-2:
                            skip((V, H), m, "tinygemm", f"rel err {err:.2e} against float64")
                        else:
                            t = timer.run([lambda p=p: torch.ops.aten._weight_int4pack_mm(
                                xb16, p[0], scheme.group_size, p[1]) for p in tg])
                            add((V, H), m, "tinygemm", tg_bytes, t, err)
                    except Exception as e:       # noqa: BLE001
                        skip((V, H), m, "tinygemm", f"{type(e).__name__}: {str(e).splitlines()[0][:200]}")
            if "gemlite" in peers:
                if gl is None:
                    skip((V, H), m, "gemlite", gl_why)
                else:
                    try:
                        y = gl[0](x16)
                        err = rel_err(y, ref16)
                        if err > 5e-3:
                            skip((V, H), m, "gemlite", f"rel err {err:.2e} against float64")
                        else:
                            t = timer.run([lambda lin=lin: lin(x16) for lin in gl])
                            add((V, H), m, "gemlite", gl_bytes, t, err)
                    except Exception as e:       # noqa: BLE001
                        skip((V, H), m, "gemlite", f"{type(e).__name__}: {str(e).splitlines()[0][:200]}")
        del tables, targs, dense16, dense_b16, tg, gl, Wq_dev, Wd
        torch.cuda.empty_cache()
        write(rows)

    write(rows)
    # Summary: qhead against the best peer at each case.
    print("\n| shape | M | qhead µs | best weight-only peer | its µs | qhead speed-up | qhead top-k µs |"
          " F.linear + topk µs | speed-up |")
    print("|---|---:|---:|---|---:|---:|---:|---:|---:|")
    cases = sorted({(r["shape"], r["m"]) for r in rows}, key=lambda c: (c[0], c[1]))
    for shape, m in cases:
        rs = {r["peer"]: r for r in rows if r["shape"] == shape and r["m"] == m and "us_median" in r}
        q = rs.get("qhead")
        others = [(r["us_median"], p) for p, r in rs.items() if p in ("cublas_f16", "cublas_bf16", "tinygemm",
                                                                     "gemlite")]
        best = min(others) if others else (None, "—")
        qt_ = rs.get("qhead_topk")
        lt = rs.get("linear_topk")

        def f(v):
            return "—" if v is None else f"{v:.1f}"

        def x(num, den):
            return "—" if num is None or den is None else f"{num / den:.2f}x"

        qv = q["us_median"] if q else None
        qtv = qt_["us_median"] if qt_ else None
        ltv = lt["us_median"] if lt else None
        print(f"| {shape} | {m} | {f(qv)} | {best[1]} | {f(best[0])} | {x(best[0], qv)} | {f(qtv)} | "
              f"{f(ltv)} | {x(ltv, qtv)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
