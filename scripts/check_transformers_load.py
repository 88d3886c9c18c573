#!/usr/bin/env python3
"""Load `qhead quantize` outputs with transformers and compare the token table's values.

    python scripts/check_transformers_load.py --qhead QHEAD_BINARY   # the cases below
    python scripts/check_transformers_load.py --check OUT_DIR [OUT_DIR ...]

Needs torch, transformers and compressed-tensors (the versions
scripts/verify_ct_model.py names). For each OUT_DIR, the values a correct
reader must give are computed from the packed tensors with
verify_ct_model.py's own bit arithmetic, ((q - z) * s, exact), with the
scheme compressed-tensors' own matching attaches to each module
(apply_quantization_config). Then the directory is loaded with
`AutoModelForCausalLM.from_pretrained` twice:

  default     `from_pretrained(dir)`: transformers applies the config's groups
              to the modules, loads the packed tensors into them, and
              compressed-tensors decompresses on the first forward pass (run
              here on two tokens);
  dequantize  `quantization_config=CompressedTensorsConfig(dequantize=True)`:
              transformers decompresses each module while loading.

Each packed role's weight (`model.embed_tokens`, `lm_head`; a tied head is the
embedding's tensor) is compared with the expected values once rounded to the
scale dtype: "equal", "DIFFERENT" (loaded without an error but wrong: the
silent misread qhead must never write) or "fails" (an error: loud).

--qhead runs the binary on inputs made from tests/fixtures/ct_models (as
verify_ct_model.py makes them) and requires, for every output qhead writes
without --mixed-schemes: never DIFFERENT in either mode, and equal in the
dequantize mode; and that an untied embedding and head of different schemes
are refused unless --mixed-schemes (what transformers then makes of such an
output is printed, not required). Exit status 0 when all hold.

Result (2026-12-01, transformers 5.24.0, compressed-tensors 0.20.0, torch
2.15.0 on the CPU): all hold. The default mode fails (AttributeError
'Embedding' object has no attribute 'weight', from transformers' weight
initialization after compress_model replaced the embedding's weight) for every
output with a quantized embedding, tied or not, and loads a quantized head
alone equal; the dequantize mode loads every single-scheme output equal. With
--mixed-schemes, a w4g32 embedding and a w8 head load without an error and the
head DIFFERENT (relative error 1.01); other pairs fail on a shape or
zero-point error.
"""
import contextlib
import io
import logging
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from verify_ct_model import ROLES, dequant, lifecycle, read_config, read_tensors  # noqa: E402

from transformers import AutoModelForCausalLM, CompressedTensorsConfig  # noqa: E402


def expected(d):
    """{role: (values [V, H] float64, scale dtype)} for each packed role of d."""
    sd = read_tensors(d)
    model, _, _ = lifecycle(d, torch.float32)  # for the scheme the library attaches to each role
    mods = {"embedding": model.model.embed_tokens, "head": model.lm_head}
    out = {}
    for role, mod in ROLES.items():
        if f"{mod}.weight_packed" in sd:
            out[role] = (dequant(sd, mod, mods[role].quantization_scheme.weights), sd[f"{mod}.weight_scale"].dtype)
    return out


def rel_err(got, want):
    got, want = got.to(torch.float64), want.to(torch.float64)
    return float((got - want).norm() / max(float(want.norm()), 1e-30))


def load(d, mode):
    """{role: weight} as transformers gives it in `mode`, or raises."""
    log = io.StringIO()
    handler = logging.StreamHandler(log)
    tlog = logging.getLogger("transformers")
    tlog.addHandler(handler)
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            if mode == "dequantize":
                m = AutoModelForCausalLM.from_pretrained(d, quantization_config=CompressedTensorsConfig(dequantize=True))
            else:
                m = AutoModelForCausalLM.from_pretrained(d)
                with torch.no_grad():
                    m(torch.tensor([[1, 2]]))  # the first forward pass decompresses
    except Exception as e:  # noqa: BLE001  (reported)
        lines = [ln for ln in log.getvalue().splitlines() if ln.startswith(("RuntimeError", "AssertionError", "ValueError"))]
        raise RuntimeError((lines[0] if lines else str(e).strip().splitlines()[0])[:200]) from None
    finally:
        tlog.removeHandler(handler)
    return {"embedding": m.model.embed_tokens.weight.detach(), "head": m.lm_head.weight.detach()}, m


def check_dir(d):
    """[(mode, verdict, detail)] for OUT_DIR d; verdict is equal | DIFFERENT | fails."""
    want = expected(d)
    tied = bool(read_config(d).get("tie_word_embeddings"))
    res = []
    for mode in ("default", "dequantize"):
        try:
            got, m = load(d, mode)
        except RuntimeError as e:
            res.append((mode, "fails", str(e)))
            continue
        parts, ok = [], True
        for role, (w, sdt) in want.items():
            e = rel_err(got[role].to(sdt), w.to(sdt))
            ok &= e == 0.0
            parts.append(f"{role} rel. error {e:.3g}")
        if tied:
            same = torch.equal(m.lm_head.weight, m.model.embed_tokens.weight)
            ok &= same
            parts.append("head is the embedding" if same else "head is NOT the embedding")
        res.append((mode, "equal" if ok else "DIFFERENT", "; ".join(parts)))
    return res


# (name, input, qhead arguments); inputs as verify_ct_model.py makes them
CASES = [
    ("untied_one_scheme", "dense_untied", "--embedding w4g32 --head w4g32"),
    ("untied_one_scheme_asym", "dense_untied", "--embedding w8a --head w8a"),
    ("untied_head_only", "dense_untied", "--head w8a"),
    ("untied_embedding_only", "dense_untied", "--embedding w8"),
    ("tied", "dense_tied", "--embedding w4g32a"),
    ("tied_stored_twice", "dense_tied_twice", "--head w8"),
    ("requant_head_kept_groups_scheme", "untied", "--head w4g32 --requantize"),
]
MIXED = [  # refused without --mixed-schemes
    ("mixed_w4g32_w8", "dense_untied", "--embedding w4g32 --head w8"),
    ("mixed_w8_w4g32", "dense_untied", "--embedding w8 --head w4g32"),
    ("mixed_requant_head_w4g64", "untied", "--head w4g64 --requantize"),
]


def run_cases(qhead):
    import shutil
    import subprocess
    import tempfile
    from verify_ct_model import FIX, make_dense
    work = tempfile.mkdtemp(prefix="qhead_tf_")
    inputs = {
        "dense_untied": make_dense(os.path.join(FIX, "untied"), os.path.join(work, "dense_untied")),
        "dense_tied": make_dense(os.path.join(FIX, "tied"), os.path.join(work, "dense_tied")),
        "dense_tied_twice": make_dense(os.path.join(FIX, "tied"), os.path.join(work, "dense_tied_twice"), tied_twice=True),
        "untied": os.path.join(FIX, "untied"),
    }
    good = True

    def quantize(name, inp, flags):
        out = os.path.join(work, "out_" + name)
        r = subprocess.run([qhead, "quantize", inputs[inp], *flags.split(), "-o", out, "--force"],
                           capture_output=True, text=True)
        return out, r

    for name, inp, flags in CASES:
        out, r = quantize(name, inp, flags)
        if r.returncode != 0:
            good = False
            print(f"{name} ({flags}): qhead FAILED: {r.stderr.strip()}")
            continue
        for mode, verdict, detail in check_dir(out):
            ok = verdict != "DIFFERENT" and (mode != "dequantize" or verdict == "equal")
            good &= ok
            print(f"{name} ({flags}) [{mode}]: {verdict}: {detail} -> {'ok' if ok else 'NOT OK'}")
    for name, inp, flags in MIXED:
        _, r = quantize(name, inp, flags)
        ok = r.returncode != 0 and "--mixed-schemes" in r.stderr
        good &= ok
        print(f"{name} ({flags}): {'refused' if r.returncode else 'WRITTEN'} -> {'ok' if ok else 'NOT OK'}")
        out, r = quantize(name + "_forced", inp, flags + " --mixed-schemes")
        if r.returncode != 0:
            good = False
            print(f"{name} --mixed-schemes: qhead FAILED: {r.stderr.strip()}")
            continue
        for mode, verdict, detail in check_dir(out):
            print(f"{name} --mixed-schemes [{mode}]: {verdict}: {detail} (informational)")
    shutil.rmtree(work, ignore_errors=True)
    return good


def main():
    import argparse
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    ap.add_argument("--qhead", help="qhead binary: run the cases")
    ap.add_argument("--check", nargs="+", help="only check these OUT_DIRs")
    a = ap.parse_args()
    if a.check:
        good = True
        for d in a.check:
            for mode, verdict, detail in check_dir(d):
                good &= verdict == "equal"
                print(f"{d} [{mode}]: {verdict}: {detail}")
    elif a.qhead:
        good = run_cases(a.qhead)
    else:
        ap.error("give --qhead BINARY or --check OUT_DIR ...")
    print("ALL OK" if good else "SOME CHECKS FAILED")
    sys.exit(0 if good else 1)


if __name__ == "__main__":
    main()
