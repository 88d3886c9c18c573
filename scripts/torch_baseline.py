#!/usr/bin/env python3
"""What a PyTorch user runs today for a quantized-head decode step, timed the
way `qhead bench --device cuda` times (CUDA events, medians, >= 4 rotated
table copies): f16 logits with F.linear (cuBLAS) + torch.topk(k=50), and
torch.topk alone, on the same shapes. Run on the GPU machine:
    python3 scripts/torch_baseline.py --shape 151936x1024 --m 1,16,32,256
"""
import argparse
import torch
import torch.nn.functional as F


def median_us(fn, reps=30, warmup=3):
    for i in range(warmup):
        fn(i)
    torch.cuda.synchronize()
    ts = []
    for i in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn(i)
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1000.0)
    ts.sort()
    return ts[len(ts) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="151936x1024")
    ap.add_argument("--m", default="1,16,32,256")
    ap.add_argument("--k", type=int, default=50)
    a = ap.parse_args()
    V, H = (int(v) for v in a.shape.split("x"))
    g = torch.Generator(device="cuda").manual_seed(0)
    ws = [(torch.rand(V, H, device="cuda", generator=g, dtype=torch.float16) - 0.5) * 0.1 for _ in range(4)]
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}, shape {V}x{H}, k {a.k}")
    print("| M | F.linear f16 µs | + torch.topk µs | torch.topk alone µs |")
    print("|---:|---:|---:|---:|")
    for M in (int(m) for m in a.m.split(",")):
        x = torch.randn(M, H, device="cuda", generator=g, dtype=torch.float16)
        logits = F.linear(x, ws[0])
        lin = median_us(lambda i: F.linear(x, ws[i % 4]))
        both = median_us(lambda i: torch.topk(F.linear(x, ws[i % 4]).float(), a.k, dim=-1))
        lf = logits.float()
        tk = median_us(lambda i: torch.topk(lf, a.k, dim=-1))
        print(f"| {M} | {lin:.0f} | {both:.0f} | {tk:.0f} |")


if __name__ == "__main__":
    main()
