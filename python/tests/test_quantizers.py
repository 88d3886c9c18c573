"""qhead.quantize's quantizers (rtn, mse, gptq, gptq-mse) from Python.

- every quantizer writes a table compressed-tensors reads back to the values qhead dequantizes
  (skips when compressed_tensors is not installed);
- GPTQ needs calibration, and calibration of the wrong width or with a NaN is an error naming it;
- on a few hundred real SmolLM2 decode states (held-out calibration), the best calibrated
  quantizer's w4g64 top-1 agreement is at least RTN's (skips when the model cannot be fetched).
"""
import os

import numpy as np
import pytest

import qhead

torch = pytest.importorskip("torch")

QUANTIZERS = ("rtn", "mse", "gptq", "gptq-mse")


def _table(v, h, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(v, h, generator=g) * (0.05 + torch.rand(v, 1, generator=g))
    w[torch.rand(v, h, generator=g) < 0.02] *= 4
    return w.to(dtype).contiguous()


def _acts(n, h, seed):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(h, h, generator=g) / (1 + 0.3 * torch.arange(h)).unsqueeze(1)
    x = torch.randn(n, h, generator=g) @ a
    x[:, 3::17] *= 6
    return x.contiguous()


@pytest.mark.parametrize("q", QUANTIZERS)
@pytest.mark.parametrize("scheme", ["w4g64", "w8", "w4g32a", "w6g64"])
def test_every_quantizer_gives_a_table_of_its_scheme(q, scheme):
    w, x = _table(96, 128, 1), _acts(256, 128, 2)
    t = qhead.quantize(w, scheme, scale_dtype="f16", quantizer=q, calibration=x if q.startswith("gptq") else None)
    assert t.scheme.name == scheme and t.shape == (96, 128)
    d = torch.from_numpy(t.dequantize())
    assert torch.isfinite(d).all()
    # The weight error of a 4+ bit table is a small fraction of the weights' spread (GPTQ trades
    # weight error for output error: about twice RTN's here).
    assert float((d - w).pow(2).mean() / w.pow(2).mean()) < (0.15 if q.startswith("gptq") else 0.05)


def test_calibrated_quantizers_lower_the_output_error():
    w, x = _table(200, 128, 3), _acts(512, 128, 4)
    ref = x @ w.T
    err = {}
    for q in QUANTIZERS:
        t = qhead.quantize(w, "w4g64", scale_dtype="f32", quantizer=q, calibration=x if q != "rtn" else None)
        err[q] = float((x @ torch.from_numpy(t.dequantize()).T - ref).pow(2).mean())
    assert err["gptq"] < 0.8 * err["rtn"], err
    assert err["gptq-mse"] < 0.8 * err["rtn"], err
    assert err["mse"] < err["rtn"], err


def test_errors_name_the_calibration():
    w = _table(16, 64, 5)
    with pytest.raises(qhead.InvalidArgumentError, match="calibration"):
        qhead.quantize(w, "w4g32", quantizer="gptq")
    with pytest.raises(qhead.InvalidArgumentError, match=r"calibration: \[8, 32\].*hidden size 64"):
        qhead.quantize(w, "w4g32", quantizer="gptq", calibration=_acts(8, 32, 6))
    x = _acts(8, 64, 7)
    x[2, 9] = float("nan")
    with pytest.raises(qhead.InvalidArgumentError, match="row 2 column 9 is not finite"):
        qhead.quantize(w, "w4g32", quantizer="gptq", calibration=x)
    with pytest.raises(qhead.InvalidArgumentError, match="unknown quantizer 'awq'"):
        qhead.quantize(w, "w4g32", quantizer="awq")


def test_rtn_is_unchanged_by_the_quantizer_argument():
    w = _table(33, 128, 8, torch.bfloat16)
    a = qhead.quantize(w, "w4g64", scale_dtype="bf16")
    b = qhead.quantize(w, "w4g64", scale_dtype="bf16", quantizer="rtn", calibration=_acts(4, 128, 9))
    assert np.array_equal(a.dequantize(), b.dequantize())


# ---- compressed-tensors reads every quantizer's output ---------------------------------------


def _cli():
    import pathlib

    p = os.environ.get("QHEAD_CLI") or str(pathlib.Path(__file__).resolve().parents[2] / "build" / "qhead")
    return p if os.path.isfile(p) and os.access(p, os.X_OK) else None


@pytest.mark.parametrize("q", QUANTIZERS)
@pytest.mark.parametrize("scheme,dtype", [("w4g64", torch.bfloat16), ("w8", torch.float32), ("w4g32a", torch.float16),
                                          ("w6g32", torch.bfloat16), ("w5g64", torch.float16)])
def test_compressed_tensors_reads_every_quantizer(tmp_path, q, scheme, dtype):
    """`qhead quantize FILE --quantizer Q` writes pack-quantized tensors that compressed-tensors'
    own decompress turns into exactly the values qhead dequantizes (in the scale dtype, as
    compressed-tensors dequantizes)."""
    ct = pytest.importorskip("compressed_tensors")
    import subprocess

    from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
    from safetensors.torch import load_file, save_file

    cli = _cli()
    if cli is None:
        pytest.skip("the qhead CLI is not built (build/qhead, or set QHEAD_CLI)")
    w, x = _table(37, 128, 10, dtype), _acts(200, 128, 11)
    src, cal, out = tmp_path / "in.safetensors", tmp_path / "states.safetensors", tmp_path / "out.safetensors"
    save_file({"lm_head.weight": w}, str(src))
    save_file({"hidden": x}, str(cal))
    cmd = [cli, "quantize", str(src), "--tensor", "lm_head.weight", "--scheme", scheme, "--quantizer", q,
           "-o", str(out)]
    if q != "rtn":
        cmd += ["--calibration", str(cal)]
    run = subprocess.run(cmd, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    s = qhead.Scheme(scheme)
    args = (QuantizationArgs(num_bits=s.bits, type="int", symmetric=s.symmetric, strategy="channel")
            if s.group_size < 0 else
            QuantizationArgs(num_bits=s.bits, type="int", symmetric=s.symmetric, strategy="group",
                             group_size=s.group_size))
    ours = {k.split(".")[-1]: v for k, v in load_file(str(out)).items() if k.startswith("lm_head.weight_")}
    dec = PackedQuantizationCompressor.decompress(ours, QuantizationScheme(targets=["Linear"], weights=args))["weight"]
    mine = torch.from_numpy(qhead.load_packed(str(out), "lm_head").dequantize())
    assert dec.shape == mine.shape
    assert torch.equal(dec, mine.to(dec.dtype)), (ct.__version__, q, scheme)


def test_cli_damp(tmp_path):
    """`qhead quantize --damp` writes what qhead.quantize(damp=...) makes, a different table from the
    default damping's, says the damping in its JSON, and refuses it where nothing reads calibration
    and for a negative or non-finite value."""
    import json
    import subprocess

    from safetensors.torch import save_file

    cli = _cli()
    if cli is None:
        pytest.skip("the qhead CLI is not built (build/qhead, or set QHEAD_CLI)")
    w, x = _table(37, 128, 12, torch.float32), _acts(200, 128, 13)
    src, cal = tmp_path / "in.safetensors", tmp_path / "states.safetensors"
    save_file({"lm_head.weight": w}, str(src))
    save_file({"hidden": x}, str(cal))

    def run(out, *extra):
        cmd = [cli, "quantize", str(src), "--tensor", "lm_head.weight", "--scheme", "w4g32", "--json",
               "-o", str(tmp_path / out), *extra]
        return subprocess.run(cmd, capture_output=True, text=True)

    got = {}
    for d in (None, 0.5):
        r = run(f"out{d}.safetensors", "--quantizer", "gptq-mse", "--calibration", str(cal),
                *([] if d is None else ["--damp", str(d)]))
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["damp"] == pytest.approx(0.1 if d is None else d)
        got[d] = qhead.load_packed(str(tmp_path / f"out{d}.safetensors"), "lm_head").dequantize()
        want = qhead.quantize(w, "w4g32", scale_dtype="f32", quantizer="gptq-mse", calibration=x,
                              **({} if d is None else {"damp": d})).dequantize()
        assert (got[d] == want).all(), d
    assert (got[None] != got[0.5]).any()
    r = run("rtn.safetensors")
    assert r.returncode == 0 and json.loads(r.stdout)["damp"] is None, r.stderr
    for extra, msg in ((["--damp", "0.2"], "--damp applies to a quantizer that reads --calibration"),
                       (["--quantizer", "mse", "--damp", "0.2"], "without --calibration"),
                       (["--quantizer", "gptq", "--calibration", str(cal), "--damp", "-1"], "finite and >= 0"),
                       (["--quantizer", "gptq", "--calibration", str(cal), "--damp", "nan"], "finite and >= 0")):
        r = run("bad.safetensors", *extra)
        assert r.returncode != 0 and msg in r.stdout + r.stderr, (extra, r.stdout, r.stderr)  # --json: on stdout
        assert not (tmp_path / "bad.safetensors").exists()


# ---- real states: the best calibrated quantizer agrees at least as often as RTN ----------------


def test_best_quantizer_agrees_at_least_as_often_as_rtn_on_smollm2(tmp_path):
    pytest.importorskip("transformers")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from qhead import agree
    from qhead import models as qmodels

    why = qmodels.unavailable(qmodels.resolve("smollm2"))
    if why:
        pytest.skip(f"SmolLM2-135M-Instruct: {why}")
    import transformers

    transformers.logging.set_verbosity_error()
    r = agree.run(["smollm2"], states=str(tmp_path / "s.safetensors"), n=900, schemes=["w4g64"], rescore=[8],
                  quantizer=["rtn", "gptq", "gptq-mse"], calibration_states=300, new_tokens=16,
                  log=lambda m: None)
    recs = {(x["quantizer"], x["rescore"]): x for x in r["records"]}
    meta = r["models"]["smollm2"]
    assert meta["calibration"]["states"] >= 250
    assert meta["states"] + meta["calibration"]["states"] <= meta["states_captured"]
    rtn = recs[("rtn", 0)]["top1_agreement"]
    best = max(recs[(q, 0)]["top1_agreement"] for q in ("gptq", "gptq-mse"))
    assert best >= rtn, {k: v["top1_agreement"] for k, v in recs.items()}
    for q in ("rtn", "gptq", "gptq-mse"):
        assert recs[(q, 8)]["top1_agreement"] >= recs[(q, 0)]["top1_agreement"]
