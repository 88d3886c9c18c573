"""python -m qhead.vllm.compare: one vLLM run of a model, dense or with qhead's head, greedy on the
validation prompts; prints one JSON object.

    python -m qhead.vllm.compare MODEL_DIR [--qhead '{"head": "w8", "rescore": 8}' | --quantization qhead]
                                 [--tokens 64] [--eager] [--out FILE]

Without --qhead the model runs as vLLM serves it (dense); with it, ``quantization="qhead"`` and
the given qhead config (as ``hf_overrides={"quantization_config": {...}}``). The JSON holds the
generated token ids per prompt, the decode throughput (generated tokens / wall seconds of the
generate call, all prompts in one batch), the bytes of the model's parameters and buffers (each
storage once: a tied table counts once), the bytes of its token-table layers, the process's
peak RSS, and what ran (vLLM and torch versions, the CPU, the commit).

The engine runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0) so that the model can be
inspected; run one configuration per process.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from typing import Any, Dict, List, Optional


def _validation_prompts() -> List[str]:
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "corpus", "prompts.json")
    with open(path) as f:
        return [p["text"] for p in json.load(f) if p.get("validation")]


def _model_bytes(model) -> Dict[str, int]:
    from qhead.vllm.table import unique_tensor_bytes
    from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding

    tables = nn_tables = 0
    seen = set()
    for _, m in model.named_modules():
        if isinstance(m, VocabParallelEmbedding):
            for _, t in list(m.named_parameters(recurse=False)) + list(m.named_buffers(recurse=False)):
                key = t.untyped_storage().data_ptr()
                if key not in seen:
                    seen.add(key)
                    tables += t.untyped_storage().nbytes()
            nn_tables += 1
    return {"model_bytes": unique_tensor_bytes(model), "table_bytes": tables, "table_layers": nn_tables}


def run(model_dir: str, qhead_cfg: Optional[Dict[str, Any]], tokens: int, eager: bool,
        quantization: Optional[str] = None) -> Dict[str, Any]:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    import torch
    import vllm
    from vllm import LLM, SamplingParams

    import qhead.vllm
    qhead.vllm.register()  # what vLLM's plugin loader does through the entry point (idempotent)
    kw: Dict[str, Any] = dict(model=model_dir, dtype="float32", max_model_len=512, seed=0, enforce_eager=eager)
    if quantization is not None:
        kw["quantization"] = quantization
    if qhead_cfg is not None:
        kw["quantization"] = "qhead"
        kw["hf_overrides"] = {"quantization_config": {"quant_method": "qhead", **qhead_cfg}}
    t0 = time.perf_counter()
    llm = LLM(**kw)
    load_s = time.perf_counter() - t0
    prompts = _validation_prompts()
    sp = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
    llm.generate(prompts[:1], SamplingParams(temperature=0.0, max_tokens=2))  # warm-up
    t0 = time.perf_counter()
    outs = llm.generate(prompts, sp)
    gen_s = time.perf_counter() - t0
    ids = [list(o.outputs[0].token_ids) for o in outs]
    n = sum(len(i) for i in ids)
    info = llm.apply_model(_model_bytes)[0]
    kinds = llm.apply_model(lambda m: (type(m.lm_head.quant_method).__name__,
                                       type(m.model.embed_tokens.quant_method).__name__))[0]
    try:
        from qhead.models import cpu_name, source_commit
        cpu, commit = cpu_name(), source_commit()
    except Exception:  # noqa: BLE001 - provenance only
        cpu, commit = None, None
    return {"model": os.path.basename(os.path.normpath(model_dir)), "qhead": qhead_cfg,
            "quantization": kw.get("quantization"), "eager": eager,
            "prompts": len(prompts), "new_tokens": tokens, "token_ids": ids,
            "texts": [o.outputs[0].text for o in outs], "generated_tokens": n, "generate_s": gen_s,
            "tokens_per_s": n / gen_s, "load_s": load_s, **info,
            "methods": {"lm_head": kinds[0], "embed_tokens": kinds[1]},
            "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "vllm": vllm.__version__, "torch": torch.__version__, "cpu": cpu, "threads": torch.get_num_threads(),
            "commit": commit, "command": " ".join([os.path.basename(sys.executable), "-m", "qhead.vllm.compare"]
                                                  + sys.argv[1:])}


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m qhead.vllm.compare", description=__doc__.split("\n")[0])
    ap.add_argument("model_dir")
    ap.add_argument("--qhead", default=None, help="qhead config JSON (head, embedding, rescore, ...); absent: dense")
    ap.add_argument("--quantization", default=None,
                    help="vLLM's quantization argument without a qhead config (e.g. qhead: the checkpoint's own "
                         "quantization_config, such as `qhead quantize` output, decides)")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--eager", action="store_true", help="enforce_eager (no torch.compile / graph capture)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    r = run(a.model_dir, None if a.qhead is None else json.loads(a.qhead), a.tokens, a.eager, a.quantization)
    text = json.dumps(r)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
