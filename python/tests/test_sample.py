"""torch.ops.qhead.sample and QuantLMHead.sample: the draw's distribution (chi-square against
the softmax of the float64 logits of the dequantized table, with the cuts applied in float64,
and the same counts rejected at a temperature 5% off), reproducibility, argmax at T = 0, shapes
and fakes, bad settings, and CPU against CUDA draw for draw."""

from __future__ import annotations

import math

import pytest
import torch

import qhead
import qhead.torch as qt
from torch_oracle import dequantize, random_weight, random_x

CUDA = torch.cuda.is_available() and qhead.cuda_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU and a CUDA build of qhead")

SETTINGS = [  # temperature, top_k, top_p, min_p
    (1.0, 0, 1.0, 0.0),
    (0.7, 0, 1.0, 0.0),
    (1.5, 8, 1.0, 0.0),
    (1.0, 0, 0.8, 0.0),
    (0.8, 12, 0.9, 0.0),
    (1.2, 0, 1.0, 0.05),
]


def call(t: qt.QuantTable, x, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=0, offset=0):
    tensors, kw = t.op_args()
    return torch.ops.qhead.sample(*tensors, x, temperature, top_k, top_p, min_p, seed, offset, **kw)


def contract_probs(l: torch.Tensor, temperature, top_k, top_p, min_p) -> torch.Tensor:
    """The distribution qhead.ops.h defines, in float64, for one row of float64 logits."""
    v = l.numel()
    z = l / temperature
    order = sorted(range(v), key=lambda i: (-float(z[i]), i))
    zs = z[order]
    w = torch.exp(zs - zs[0])
    k = top_k if top_k > 0 else v
    total = float(w[:k].sum())
    n = k
    if top_p < 1.0:
        acc = torch.cumsum(w[:k], 0)
        n = min(n, int(torch.nonzero(acc >= top_p * total)[0]) + 1)
    small = torch.nonzero(w[1:k] < min_p)
    if len(small):
        n = min(n, int(small[0]) + 1)
    p = torch.zeros(v, dtype=torch.float64)
    kept = w[:n] / w[:n].sum()
    for j in range(n):
        p[order[j]] = kept[j]
    return p


def chi2(counts: torch.Tensor, probs: torch.Tensor, n: int):
    """Pearson's statistic (bins of expectation >= 5, the rest pooled), degrees of freedom, and the
    draws of tokens of probability 0."""
    e = probs * n
    outside = int(counts[probs == 0].sum())
    big = e >= 5
    stat = float((((counts[big] - e[big]) ** 2) / e[big]).sum())
    bins = int(big.sum())
    pool_e, pool_o = float(e[(~big) & (probs > 0)].sum()), float(counts[(~big) & (probs > 0)].sum())
    if pool_e >= 5:
        stat += (pool_o - pool_e) ** 2 / pool_e
        bins += 1
    return stat, bins - 1, outside


def critical(df: int, z: float = 4.753) -> float:
    """Upper 1e-6 quantile of chi-square (Wilson-Hilferty)."""
    a = 2.0 / (9.0 * df)
    return df * (1 - a + z * math.sqrt(a)) ** 3


def draws(t: qt.QuantTable, x1: torch.Tensor, setting, rows: int, calls: int, device="cpu") -> torch.Tensor:
    temperature, top_k, top_p, min_p = setting
    x = x1.expand(rows, -1).contiguous().to(device)
    counts = torch.zeros(t.vocab, dtype=torch.float64)
    for c in range(calls):
        ids = call(t, x, temperature, top_k, top_p, min_p, seed=1234, offset=c)
        assert ids.dtype == torch.int32 and ids.shape == (rows,)
        counts += torch.bincount(ids.cpu().long(), minlength=t.vocab).double()
    return counts


@pytest.fixture(scope="module")
def small():
    t = qt.QuantTable.from_dense(random_weight(23, 64, 5), "w4g32a")
    x1 = random_x((1, 64), 6) * 0.4
    l = (x1.double() @ dequantize(t).T)[0]
    return t, x1, l


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: f"T{s[0]}_k{s[1]}_p{s[2]}_minp{s[3]}")
def test_distribution_is_exact(small, setting):
    t, x1, l = small
    counts = draws(t, x1, setting, 4096, 64)
    n = 4096 * 64
    probs = contract_probs(l, *setting)
    assert int((probs > 0).sum()) >= 3, "the setting keeps too few tokens to test"
    stat, df, outside = chi2(counts, probs, n)
    assert outside == 0
    assert stat < critical(df), (stat, df)
    off = (setting[0] * 1.05,) + tuple(setting[1:])
    s2, df2, out2 = chi2(counts, contract_probs(l, *off), n)
    assert out2 > 0 or s2 > critical(max(df2, 1)), "a temperature 5% off was not rejected"


def test_reproducible_and_argmax():
    t = qt.QuantTable.from_dense(random_weight(5003, 96, 7), "w8g32")
    x = random_x((3, 96), 8, torch.bfloat16)
    a = call(t, x, 0.9, 0, 0.95, 0.0, seed=5, offset=2)
    assert torch.equal(a, call(t, x, 0.9, 0, 0.95, 0.0, seed=5, offset=2))
    differ = sum(int((call(t, x, 0.9, 0, 0.95, 0.0, seed=5, offset=o) != a).sum()) for o in range(3, 11))
    assert differ > 0
    greedy = call(t, x, 0.0)
    tensors, kw = t.op_args()
    _, top1, _ = torch.ops.qhead.topk(*tensors, x, 1, **kw)
    assert torch.equal(greedy, top1[:, 0])


def test_head_sample_shapes():
    t = qt.QuantTable.from_dense(random_weight(301, 64, 9), "w4g64")
    head = qt.QuantLMHead(t)
    x = random_x((2, 3, 64), 10)
    ids = head.sample(x, temperature=0.8, top_k=20, seed=3)
    assert ids.shape == (2, 3) and ids.dtype == torch.int32
    assert int(ids.min()) >= 0 and int(ids.max()) < 301
    flat = head.sample(x.reshape(6, 64), temperature=0.8, top_k=20, seed=3)
    assert torch.equal(ids.reshape(6), flat)


def test_fake_and_opcheck():
    from torch._subclasses.fake_tensor import FakeTensorMode
    t = qt.QuantTable.from_dense(random_weight(37, 64, 12), "w4g32a")
    tensors, kw = t.op_args()
    x = random_x((3, 64), 13, torch.float16)
    torch.library.opcheck(torch.ops.qhead.sample.default, (*tensors, x, 0.0, 0, 1.0, 0.0, 0, 0), kw)
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        ft = [None if a is None else mode.from_tensor(a) for a in tensors]
        out = torch.ops.qhead.sample(*ft, torch.empty((5, 64), dtype=torch.bfloat16), 1.0, 0, 1.0, 0.0, 0, 0, **kw)
        assert out.shape == (5,) and out.dtype == torch.int32


@pytest.mark.parametrize("kw,needle", [
    (dict(temperature=-1.0), "temperature"),
    (dict(temperature=float("nan")), "temperature"),
    (dict(top_k=38), "top_k"),
    (dict(top_p=0.0), "top_p"),
    (dict(min_p=1.0), "min_p"),
    (dict(seed=-1), "seed"),
])
def test_bad_settings(kw, needle):
    t = qt.QuantTable.from_dense(random_weight(37, 64, 14), "w4g32")
    x = random_x((2, 64), 15)
    with pytest.raises(qhead.InvalidArgumentError, match=needle):
        call(t, x, **kw)


@needs_cuda
@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: f"T{s[0]}_k{s[1]}_p{s[2]}_minp{s[3]}")
def test_cuda_distribution_and_cpu_agreement(small, setting):
    t, x1, l = small
    td = t.to("cuda")
    counts = draws(td, x1.to(torch.float16), setting, 4096, 64, device="cuda")
    probs = contract_probs(l, *setting)
    stat, df, outside = chi2(counts, probs, 4096 * 64)
    assert outside == 0 and stat < critical(df), (stat, df, outside)
    big = qt.QuantTable.from_dense(random_weight(50257, 128, 16), "w4g64")
    x = random_x((17, 128), 17, torch.bfloat16)
    a = call(big, x, *setting, seed=9, offset=1)
    b = call(big.to("cuda"), x.cuda(), *setting, seed=9, offset=1).cpu()
    assert int((a == b).sum()) >= 16


def test_core_api_sample_on_numpy_and_torch():
    """qhead.sample (the core API, no torch ops): numpy and torch inputs, ids allocated like x."""
    import numpy as np

    t = qhead.quantize(random_weight(301, 64, 20).numpy(), "w4g64")
    x = random_x((4, 64), 21).numpy()
    a = qhead.sample(t, x, temperature=0.8, top_p=0.9, seed=2, offset=1)
    assert isinstance(a, np.ndarray) and a.dtype == np.int32 and a.shape == (4,)
    b = qhead.sample(t, torch.from_numpy(x), temperature=0.8, top_p=0.9, seed=2, offset=1)
    assert torch.equal(torch.from_numpy(a), b)
    assert int(a.min()) >= 0 and int(a.max()) < 301
    with pytest.raises(qhead.InvalidArgumentError, match="top_p"):
        qhead.sample(t, x, top_p=2.0)
