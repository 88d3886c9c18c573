#!/usr/bin/env python3
"""Load `qhead quantize` outputs with transformers and compare the token table's values.

    python scripts/check_transformers_load.py OUT_DIR [OUT_DIR ...]

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
embedding's tensor) must equal the expected values once rounded to the scale
dtype. Prints one line per directory and mode with the largest relative error
per role (0 when equal) and exits 1 if any load fails or differs.
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


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    good = True
    for d in sys.argv[1:]:
        want = expected(d)
        tied = bool(read_config(d).get("tie_word_embeddings"))
        for mode in ("default", "dequantize"):
            try:
                got, m = load(d, mode)
            except RuntimeError as e:
                good = False
                print(f"{d} [{mode}]: FAILS to load: {e}")
                continue
            parts, ok = [], True
            for role, (w, sdt) in want.items():
                e = rel_err(got[role].to(sdt), w.to(sdt))
                ok &= e == 0.0
                parts.append(f"{role} rel. error {e:.3g}")
            if tied:
                same = m.lm_head.weight.data_ptr() == m.model.embed_tokens.weight.data_ptr() or torch.equal(
                    m.lm_head.weight, m.model.embed_tokens.weight)
                ok &= same
                parts.append("head is the embedding" if same else "head is NOT the embedding")
            good &= ok
            print(f"{d} [{mode}]: {'equal' if ok else 'DIFFERENT'}: " + "; ".join(parts))
    print("ALL EQUAL" if good else "SOME DIFFER OR FAIL")
    sys.exit(0 if good else 1)


if __name__ == "__main__":
    main()
