#!/usr/bin/env python3
"""Host time per call of qhead's Python layers at M = 1 (decode).

For each op it times many back-to-back calls without synchronizing and divides
(host µs per call: what the Python layers cost on the launching thread; on CUDA
the kernels run behind it, on CPU the op's own work is included):

  raw     qhead._C.<op> with preallocated outputs and a prebuilt Table
  op      torch.ops.qhead.<op>.default, arguments positional: the C++ kernels of
          qhead/_torch_ops when the package has them (qhead.torch.OPS == "cpp"), else the
          Python kernels (torch.library.define + impl); QHEAD_TORCH_OPS=python forces those
  op-kwargs  the same through the overload packet with scheme/vocab/hidden by name
  custom  the Python kernel registered through torch.library.custom_op (for comparison)
  module  QuantLMHead.forward / .topk, QuantEmbedding.forward (eager: they call _C directly)
  module-op  the same modules made to take their torch.ops path (as under torch.compile)

With the C++ kernels (qhead.torch.OPS == "cpp") the script also runs itself once with
QHEAD_TORCH_OPS=python and adds those rows as py-op, py-op-kwargs and py-module-op (their
overheads over that run's raw; --no-python-ops skips it).

and prints the overhead of each over `raw`. One JSON row per case (commit,
device, command, date) goes to stdout or --json FILE, then a table.

    python scripts/bench_binding.py [--device cpu|cuda] [--vocab 151936] [--hidden 1024]
                                    [--scheme w4g64] [--iters N] [--json FILE]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import statistics
import subprocess
import sys
import time

import torch

import qhead
import qhead.torch as qt
from qhead import _C


def commit() -> str:
    try:
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        return subprocess.run(["git", "-C", root, "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return f"{line.split(':', 1)[1].strip()} ({os.cpu_count()} cores)"
    except OSError:
        pass
    return "cpu"


def host_us(fn, iters: int, reps: int, sync) -> tuple:
    """(median, min) over reps of (wall time of `iters` back-to-back calls) / iters, in µs (the
    minimum is the steadier figure on a machine shared with other work)."""
    for _ in range(max(10, iters // 10)):
        fn()
    sync()
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        t1 = time.perf_counter()
        sync()
        samples.append((t1 - t0) / iters * 1e6)
    return statistics.median(samples), min(samples)


def register_custom_ops():
    """The same kernels as torch.library.custom_op ops (namespace qhead_bench)."""
    @torch.library.custom_op("qhead_bench::logits", mutates_args=())
    def logits(weight_packed: torch.Tensor, weight_scale: torch.Tensor, weight_zero_point: torch.Tensor | None,
               col_perm: torch.Tensor | None, x: torch.Tensor, scheme: str, vocab: int, hidden: int) -> torch.Tensor:
        return qt._logits_impl(weight_packed, weight_scale, weight_zero_point, col_perm, x, scheme, vocab, hidden)

    @logits.register_fake
    def _(weight_packed, weight_scale, weight_zero_point, col_perm, x, scheme, vocab, hidden):
        return x.new_empty((x.shape[0], vocab), dtype=torch.float32)

    @torch.library.custom_op("qhead_bench::embed", mutates_args=())
    def embed(weight_packed: torch.Tensor, weight_scale: torch.Tensor, weight_zero_point: torch.Tensor | None,
              col_perm: torch.Tensor | None, ids: torch.Tensor, scheme: str, vocab: int, hidden: int,
              out_dtype: torch.dtype) -> torch.Tensor:
        return qt._embed_impl(weight_packed, weight_scale, weight_zero_point, col_perm, ids, scheme, vocab, hidden,
                              out_dtype)

    @embed.register_fake
    def _(weight_packed, weight_scale, weight_zero_point, col_perm, ids, scheme, vocab, hidden, out_dtype):
        return weight_packed.new_empty((ids.shape[0], hidden), dtype=out_dtype)

    return logits, embed


def python_kernel_rows(a) -> list:
    """The op rows of this benchmark run again with the Python kernels (QHEAD_TORCH_OPS=python)."""
    import tempfile
    argv = [x for x in sys.argv[1:]]
    if "--json" in argv:
        i = argv.index("--json")
        del argv[i:i + 2]
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "rows.json")
        env = dict(os.environ, QHEAD_TORCH_OPS="python")
        r = subprocess.run([sys.executable, os.path.abspath(__file__), *argv, "--no-python-ops", "--json", path],
                           env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if r.returncode != 0:
            print(f"bench_binding: the run with the Python kernels failed:\n{r.stderr}", file=sys.stderr)
            return []
        with open(path) as f:
            rows = [json.loads(line) for line in f if line.strip()]
    keep = {"op": "py-op", "op-kwargs": "py-op-kwargs", "module-op": "py-module-op"}
    out = []
    for row in rows:
        op, _, path = row["case"].partition("/")
        if path in keep:
            out.append(dict(row, case=f"{op}/{keep[path]}"))
    return out


def _command() -> str:
    """The command as typed from the repository root, with no machine paths (the --json file by
    its name; the Python-kernel run's environment variable in front)."""
    args = list(sys.argv[1:])
    if "--json" in args and args.index("--json") + 1 < len(args):
        i = args.index("--json") + 1
        args[i] = os.path.basename(args[i])
    env = "QHEAD_TORCH_OPS=python " if os.environ.get("QHEAD_TORCH_OPS") == "python" else ""
    return env + " ".join(shlex.quote(a) for a in ["python3", "scripts/bench_binding.py", *args])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cpu", "cuda"])
    ap.add_argument("--vocab", type=int, default=None, help="V (default: 151936 on CUDA; 509 on CPU, where the op itself runs on the timed thread)")
    ap.add_argument("--hidden", type=int, default=None, help="H (default: 1024 on CUDA, 256 on CPU)")
    ap.add_argument("--scheme", default="w4g64")
    ap.add_argument("--k", type=int, default=50)
    ap.add_argument("--iters", type=int, default=None, help="calls per sample (default 2000 CUDA, 500 CPU)")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--threads", type=int, default=0, help="CPU worker threads (0: qhead's default)")
    ap.add_argument("--json", default=None, help="write the JSON rows here instead of stdout")
    ap.add_argument("--no-python-ops", action="store_true",
                    help="with the C++ kernels, do not also time the Python kernels (a second run)")
    a = ap.parse_args()

    cuda = a.device == "cuda"
    if cuda and not torch.cuda.is_available():
        print("bench_binding: --device cuda but torch sees no CUDA device", file=sys.stderr)
        return 2
    V = a.vocab or (151936 if cuda else 509)
    H = a.hidden or (1024 if cuda else 256)
    iters = a.iters or (2000 if cuda else 500)
    if a.threads:
        qhead.set_num_threads(a.threads)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    act = torch.bfloat16 if cuda else torch.float32

    g = torch.Generator().manual_seed(0)
    w = (torch.rand((V, H), generator=g) * 2 - 1).to(torch.bfloat16)
    t = qt.QuantTable.from_dense(w, a.scheme).to(a.device)
    tensors, kw = t.op_args()
    pos = (kw["scheme"], kw["vocab"], kw["hidden"])
    table = t.table()
    x = (torch.rand((1, H), generator=g) * 2 - 1).to(act).to(a.device)
    ids = torch.tensor([7], dtype=torch.int64, device=a.device)
    out = torch.empty((1, V), dtype=torch.float32, device=a.device)
    rows = torch.empty((1, H), dtype=act, device=a.device)
    values = torch.empty((1, a.k), dtype=torch.float32, device=a.device)
    vids = torch.empty((1, a.k), dtype=torch.int32, device=a.device)
    lse = torch.empty((1,), dtype=torch.float32, device=a.device)
    stream = qt._stream(out)
    head, emb = qt.QuantLMHead(t), qt.QuantEmbedding(t, dtype=act)
    c_logits, c_embed = register_custom_ops()

    def op_path(fn):
        """fn with the modules' eager fast path off (they call torch.ops.qhead.*)."""
        def run():
            eager = qt._eager
            qt._eager = lambda *_: False
            try:
                return fn()
            finally:
                qt._eager = eager
        return run
    ops = torch.ops.qhead

    cases = {
        "logits": {
            "raw": lambda: _C.logits(table, x, out, stream=stream),
            "op": lambda: ops.logits.default(*tensors, x, *pos),
            "op-kwargs": lambda: ops.logits(*tensors, x, **kw),
            "custom": lambda: c_logits(*tensors, x, *pos),
            "module": lambda: head(x),
            "module-op": op_path(lambda: head(x)),
        },
        "topk": {
            "raw": lambda: _C.topk(table, x, a.k, values, vids, lse, stream=stream),
            "op": lambda: ops.topk.default(*tensors, x, a.k, *pos),
            "module": lambda: head.topk(x, a.k),
            "module-op": op_path(lambda: head.topk(x, a.k)),
        },
        "embed": {
            "raw": lambda: _C.embed(table, ids, rows, stream=stream),
            "op": lambda: ops.embed.default(*tensors, ids, *pos, act),
            "op-kwargs": lambda: ops.embed(*tensors, ids, **kw, out_dtype=act),
            "custom": lambda: c_embed(*tensors, ids, *pos, act),
            "module": lambda: emb(ids),
            "module-op": op_path(lambda: emb(ids)),
        },
    }
    # the pieces the op path adds, alone
    extra = {
        "table lookup (cache hit)": lambda: qt.table_from_tensors(*tensors, t.scheme, t.vocab, t.hidden),
        "torch.empty [1, V] f32": lambda: torch.empty((1, V), dtype=torch.float32, device=a.device),
    }
    if cuda:
        extra["current raw stream"] = lambda: torch._C._cuda_getCurrentRawStream(x.device.index)

    device_name = torch.cuda.get_device_name() if cuda else cpu_name()
    meta = {
        "commit": commit(),
        "device": device_name,
        "command": _command(),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "torch": torch.__version__,
        "shape": {"V": V, "H": H, "M": 1, "k": a.k},
        "scheme": a.scheme,
        "activations": str(act).replace("torch.", ""),
        "threads": qhead.num_threads(),
        "ops": qt.OPS,
    }
    results = []
    for op, paths in cases.items():
        raw = None
        for path, fn in paths.items():
            us, lo = host_us(fn, iters, a.reps, sync)
            raw = (us, lo) if path == "raw" else raw
            results.append(dict(meta, case=f"{op}/{path}", host_us=round(us, 3), host_us_min=round(lo, 3),
                                overhead_us=None if path == "raw" else round(us - raw[0], 3),
                                overhead_us_min=None if path == "raw" else round(lo - raw[1], 3)))
    for name, fn in extra.items():
        us, lo = host_us(fn, iters, a.reps, sync)
        results.append(dict(meta, case=f"piece/{name}", host_us=round(us, 3), host_us_min=round(lo, 3),
                            overhead_us=None, overhead_us_min=None))

    if qt.OPS == "cpp" and not a.no_python_ops:
        results += python_kernel_rows(a)

    text = "\n".join(json.dumps(r) for r in results) + "\n"
    if a.json:
        with open(a.json, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    print(f"\n{meta['device']}  V={V} H={H} M=1 {a.scheme} x={meta['activations']}  ops={qt.OPS}"
          f"  commit {meta['commit'][:10]}"
          f"  (host µs per call over {a.reps} samples of {iters} calls)", file=sys.stderr)
    print(f"{'case':34s} {'median':>9s} {'over raw':>9s} {'min':>9s} {'over raw':>9s}", file=sys.stderr)
    for r in results:
        over = "" if r["overhead_us"] is None else f"{r['overhead_us']:+9.2f}"
        over_lo = "" if r["overhead_us_min"] is None else f"{r['overhead_us_min']:+9.2f}"
        print(f"{r['case']:34s} {r['host_us']:9.2f} {over:>9s} {r['host_us_min']:9.2f} {over_lo:>9s}",
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
