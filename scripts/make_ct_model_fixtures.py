#!/usr/bin/env python3
"""Make the compressed-tensors MODEL DIRECTORY fixtures for qhead's tests.

Each fixture is a tiny Llama-style Hugging Face model directory made by the
real libraries, with no hub access:

  1. transformers builds `LlamaForCausalLM(LlamaConfig(vocab 67, hidden 64,
     intermediate 32 (small to keep the fixtures small), 1 layer, 2 heads, 1 KV head))` with random init from a
     fixed seed, cast to bf16;
  2. compressed-tensors' `apply_quantization_config` attaches the case's
     QuantizationConfig (config_groups, targets, ignore) to the modules;
  3. each quantized module's weight_scale / weight_zero_point are set from
     compressed-tensors' own `calculate_qparams` on per-group (or per-row)
     min/max, as its min-max observer computes them (as make_ct_fixtures.py);
  4. `ModelCompressor.from_pretrained_model(model, "pack-quantized")` and its
     `compress_model(model)` pack the modules in place (the model-level API
     llm-compressor uses on save); the model's state dict is written with
     safetensors' `save_file` to model.safetensors, `model.config.save_pretrained`
     writes config.json and `ModelCompressor.update_config` adds the
     `quantization_config` exactly as the library writes it.

Beside each model, `reference.safetensors` holds what compressed-tensors'
`PackedQuantizationCompressor.decompress` makes of the two roles' packed
tensors (`embedding`, `head`; a dense role is stored as it is), so qhead's
tests compare exactly. `sharded_untied/` is `untied/` with its tensors split
into two shards and a `model.safetensors.index.json`.

Cases:
  untied       embedding: Embedding target, w4 group 32 symmetric;
               lm_head: exact-name target, w8 channel asymmetric
  tied         tie_word_embeddings, one group targeting "Embedding" and
               "lm_head", w4 group 32 symmetric; the checkpoint stores both
               (identical) packed tensors, as the library writes a tied model
  ignore_re    group 0 targets class "Linear" (w4 group 64 asymmetric) with the
               decoder layers' Linears in `ignore` ("re:" entries), so only
               lm_head is quantized through it; group 1 targets the embedding by
               a "re:" regex (w8 channel symmetric)

`--verify DIR...` loads fixture directories through compressed-tensors' own
load lifecycle (apply_quantization_config, compress_model, load_state_dict,
decompress_model) and checks both roles equal reference.safetensors.

Made with: python 3.11, torch 2.15.0 (CPU), compressed-tensors 0.20.0,
transformers 5.24.0, safetensors 0.8.0 — $CTVENV/bin/python
scripts/make_ct_model_fixtures.py [OUT_DIR] (default tests/fixtures/ct_models), where
$CTVENV is the venv tests/fixtures/ct/README.md makes.
"""
import json
import os
import shutil
import sys

import torch
from safetensors.torch import save_file

import compressed_tensors
import transformers
from compressed_tensors.compressors import ModelCompressor
from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
from compressed_tensors.quantization import (QuantizationArgs, QuantizationConfig,
                                             QuantizationScheme, apply_quantization_config)
from compressed_tensors.quantization.utils.helpers import calculate_qparams

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_ct_fixtures import observe  # noqa: E402  (the same per-group min/max as the tensor fixtures)


def args(bits, group, sym):
    if group is None:
        return QuantizationArgs(num_bits=bits, type="int", symmetric=sym, strategy="channel")
    return QuantizationArgs(num_bits=bits, type="int", symmetric=sym, strategy="group", group_size=group)


CASES = {
    "untied": dict(tied=False, seed=11, ignore=[], groups={
        "group_0": (["Embedding"], args(4, 32, True)),
        "group_1": (["lm_head"], args(8, None, False)),
    }),
    "tied": dict(tied=True, seed=12, ignore=[], groups={
        "group_0": (["Embedding", "lm_head"], args(4, 32, True)),
    }),
    "ignore_re": dict(tied=False, seed=13, ignore=["re:.*self_attn\\..*", "re:.*mlp\\..*"], groups={
        "group_0": (["Linear"], args(4, 64, False)),
        "group_1": (["re:.*embed_tokens$"], args(8, None, True)),
    }),
}

ROLES = {"embedding": "model.embed_tokens", "head": "lm_head"}


def make(out_root, name, case):
    cfg = transformers.LlamaConfig(vocab_size=67, hidden_size=64, intermediate_size=32, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=1,
                                   tie_word_embeddings=case["tied"])
    torch.manual_seed(case["seed"])
    model = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
    if case["tied"]:
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    else:
        # Untied heads must differ from the embedding (random init does that).
        assert not torch.equal(model.lm_head.weight, model.model.embed_tokens.weight)

    qcfg = QuantizationConfig(
        config_groups={g: QuantizationScheme(targets=t, weights=a) for g, (t, a) in case["groups"].items()},
        ignore=case["ignore"], format="pack-quantized")
    apply_quantization_config(model, qcfg, show_progress=False)

    schemes = {}
    with torch.no_grad():
        for mname, module in model.named_modules():
            scheme = getattr(module, "quantization_scheme", None)
            if scheme is None or scheme.weights is None:
                continue
            w = module.weight
            mn, mx = observe(w, scheme.weights)
            scale, zp = calculate_qparams(mn, mx, scheme.weights)
            module.weight_scale.data = scale.to(w.dtype).reshape(module.weight_scale.shape)
            module.weight_zero_point.data = zp.to(module.weight_zero_point.dtype).reshape(module.weight_zero_point.shape)
            schemes[mname] = scheme
    assert set(schemes) <= set(ROLES.values()), f"{name}: unexpected quantized modules {sorted(schemes)}"

    compressor = ModelCompressor.from_pretrained_model(model, "pack-quantized")
    compressor.compress_model(model)
    sd = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    if case["tied"]:
        sd = {k: v.clone() for k, v in sd.items()}  # safetensors refuses shared storage

    d = os.path.join(out_root, name)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    save_file(sd, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    model.config.save_pretrained(d)
    # save_pretrained may write its own (pre-compression) quantization_config; the
    # library's update_config writes the one a compressed checkpoint carries.
    with open(os.path.join(d, "config.json")) as f:
        cj = json.load(f)
    cj.pop("quantization_config", None)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cj, f, indent=2, sort_keys=True)
    compressor.update_config(d)

    ref = {}
    for role, mod in ROLES.items():
        if mod in schemes:
            comp = {k[len(mod) + 1:]: v for k, v in sd.items() if k.startswith(mod + ".weight_")}
            ref[role] = PackedQuantizationCompressor.decompress(comp, schemes[mod])["weight"].contiguous()
        else:
            ref[role] = sd[mod + ".weight"]
    save_file(ref, os.path.join(d, "reference.safetensors"),
              metadata={"compressed_tensors": compressed_tensors.__version__, "torch": torch.__version__,
                        "transformers": transformers.__version__})
    print(f"{name}: " + ", ".join(f"{k} {tuple(v.shape)} {str(v.dtype)[6:]}" for k, v in sd.items()
                                  if k.startswith(("model.embed", "lm_head"))))
    return d, sd


def shard(out_root, src_name, name, sd):
    """Splits a fixture's tensors into two shards with an index, as save_pretrained does."""
    d = os.path.join(out_root, name)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    keys = sorted(sd)
    first = [k for k in keys if k.startswith("model.embed_tokens") or k.startswith("model.layers")]
    parts = {"model-00001-of-00002.safetensors": first,
             "model-00002-of-00002.safetensors": [k for k in keys if k not in first]}
    weight_map = {}
    for fname, ks in parts.items():
        save_file({k: sd[k] for k in ks}, os.path.join(d, fname), metadata={"format": "pt"})
        weight_map.update({k: fname for k in ks})
    total = sum(v.numel() * v.element_size() for v in sd.values())
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2, sort_keys=True)
    for fname in ("config.json", "reference.safetensors"):
        shutil.copy(os.path.join(out_root, src_name, fname), os.path.join(d, fname))


def verify(d):
    """Loads a fixture directory the way compressed-tensors' ModelCompressor
    docstring describes a load (config -> apply_quantization_config ->
    compress_model for the compressed parameters -> load the state dict ->
    decompress_model) and checks both roles equal reference.safetensors."""
    from safetensors.torch import load_file
    cfg = transformers.AutoConfig.from_pretrained(d)
    with open(os.path.join(d, "config.json")) as f:
        qc = QuantizationConfig.model_validate(json.load(f)["quantization_config"])
    model = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16)
    apply_quantization_config(model, qc, show_progress=False)
    comp = ModelCompressor(quantization_config=qc)
    comp.compress_model(model)
    idx = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(idx):
        with open(idx) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    sd = {}
    for fname in files:
        sd.update(load_file(os.path.join(d, fname)))
    _, unexpected = model.load_state_dict(sd, strict=False)
    comp.decompress_model(model)
    ref = load_file(os.path.join(d, "reference.safetensors"))
    ok = (not unexpected and torch.equal(model.model.embed_tokens.weight, ref["embedding"])
          and torch.equal(model.lm_head.weight, ref["head"]))
    print(f"{d}: {'OK' if ok else 'DIFFERS'} (unexpected keys: {unexpected})")
    return ok


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--verify":
        sys.exit(0 if all([verify(d) for d in sys.argv[2:]]) else 1)
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures",
                                                            "ct_models")
    os.makedirs(out, exist_ok=True)
    made = {name: make(out, name, case) for name, case in CASES.items()}
    shard(out, "untied", "sharded_untied", made["untied"][1])
    print("versions: compressed-tensors", compressed_tensors.__version__, "torch", torch.__version__,
          "transformers", transformers.__version__)


if __name__ == "__main__":
    main()
