"""qhead's head served by vLLM (the qhead.vllm plugin), SmolLM2-135M, greedy on the validation
prompts. Skipped unless vLLM is importable and the converted SmolLM2 is in the model cache
(``python -m qhead.models convert smollm2``); CI installs no vLLM.

Each configuration runs in its own process (``python -m qhead.vllm.compare``: vLLM keeps one
engine per process), in this interpreter, so vLLM must be installed beside qhead.

Asserted:
* ``head="w8"`` + ``rescore=8``: the generated tokens equal vLLM's dense model's, 10 of 10
  prompts x 64 tokens (rows kept in memory, and rows mapped from the checkpoint file);
* one copy of the tied table: the token-table layers' bytes are the packed table's (plus the
  full-precision rows when they are kept in memory), and less than the dense table's without;
* a ``qhead quantize MODEL_DIR --head w8`` checkpoint (compressed-tensors) loads with
  ``quantization="qhead"`` and serves: its tokens equal the RTN-at-load model's.
Measured and printed (not asserted: the machine is shared): tokens/s and peak RSS of each.
"""
import json
import os
import shutil
import subprocess
import sys

import pytest

pytest.importorskip("vllm")
import qhead.models as qm  # noqa: E402

NEW_TOKENS = 64


def _smollm2_dir():
    d = qm.resolve("smollm2").converted_dir
    return d if os.path.isfile(os.path.join(d, "config.json")) else None


pytestmark = pytest.mark.skipif(_smollm2_dir() is None, reason="the converted SmolLM2 is not in the model cache "
                                "(scripts/fetch_models.sh smollm2; python -m qhead.models convert smollm2)")


def _run(tmp_path, name, model_dir, *args):
    out = tmp_path / f"{name}.json"
    cmd = [sys.executable, "-m", "qhead.vllm.compare", model_dir, "--eager", "--tokens", str(NEW_TOKENS),
           "--out", str(out), *args]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    assert p.returncode == 0, f"{' '.join(cmd)} failed:\n{p.stdout[-3000:]}\n{p.stderr[-6000:]}"
    r = json.loads(out.read_text())
    print(f"\n{name}: {r['tokens_per_s']:.2f} tokens/s, table layers {r['table_bytes'] / 2**20:.1f} MiB, "
          f"peak RSS {r['peak_rss_bytes'] / 2**20:.0f} MiB, methods {r['methods']}")
    return r


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("vllm")
    d = _smollm2_dir()
    rows = os.path.join(d, "model.safetensors")
    return {
        "dense": _run(tmp, "dense", d),
        "w8_rescore8": _run(tmp, "w8_rescore8", d, "--qhead", json.dumps({"head": "w8", "rescore": 8})),
        "w8_rescore8_mapped": _run(tmp, "w8_rescore8_mapped", d, "--qhead",
                                   json.dumps({"head": "w8", "rescore": 8, "dense_rows": rows})),
        "w8": _run(tmp, "w8", d, "--qhead", json.dumps({"head": "w8"})),
    }


V, H = 49152, 576
PACKED_W8 = V * H + V * 4 + 16  # int8 codes, f32 per-row scales, weight_shape
DENSE = V * H * 4


@pytest.mark.parametrize("name", ["w8_rescore8", "w8_rescore8_mapped"])
def test_w8_rescore_greedy_equals_dense(runs, name):
    dense, q = runs["dense"], runs[name]
    assert q["methods"] == {"lm_head": "QHeadTableMethod", "embed_tokens": "QHeadTableMethod"}
    assert dense["methods"]["lm_head"] == "UnquantizedEmbeddingMethod"
    same = [a == b for a, b in zip(dense["token_ids"], q["token_ids"])]
    assert len(same) == 10 and all(len(t) == NEW_TOKENS for t in q["token_ids"])
    assert all(same), f"{sum(same)}/10 prompts equal the dense model's"


def test_one_copy_of_the_tied_table(runs):
    assert runs["dense"]["table_bytes"] == DENSE  # vLLM's dense tied table: one f32 copy
    assert runs["w8"]["table_bytes"] == PACKED_W8  # the packed table, once, for both roles
    assert runs["w8_rescore8"]["table_bytes"] == PACKED_W8 + DENSE  # + the rows kept for rescoring
    assert runs["w8_rescore8_mapped"]["table_bytes"] == PACKED_W8  # the rows stay in the file
    assert runs["dense"]["model_bytes"] - runs["w8"]["model_bytes"] == DENSE - PACKED_W8


def test_qhead_quantize_checkpoint_serves(runs, tmp_path):
    cli = os.environ.get("QHEAD_CLI") or shutil.which("qhead")
    if not cli:
        pytest.skip("the qhead CLI is not built (QHEAD_CLI names its path)")
    out = tmp_path / "smollm2-w8"
    subprocess.run([cli, "quantize", _smollm2_dir(), "--head", "w8", "-o", str(out)], check=True,
                   capture_output=True)
    r = _run(tmp_path, "qhead_quantize_w8", str(out), "--quantization", "qhead")
    assert r["methods"] == {"lm_head": "QHeadTableMethod", "embed_tokens": "QHeadTableMethod"}
    assert r["table_bytes"] == PACKED_W8
    # The CLI's RTN and the plugin's RTN at load are the same bytes: the same tokens.
    assert r["token_ids"] == runs["w8"]["token_ids"]


def test_register_is_idempotent():
    """vLLM calls the entry point in every process, possibly more than once: one registration."""
    import importlib.metadata

    import qhead.vllm as qv
    from vllm.model_executor.layers.quantization import QUANTIZATION_METHODS, get_quantization_config

    qv.register()
    qv.register()
    assert qv.registered() and QUANTIZATION_METHODS.count("qhead") == 1
    assert get_quantization_config("qhead").__name__ == "QHeadQuantConfig"
    eps = [e for e in importlib.metadata.entry_points(group="vllm.general_plugins") if e.name == "qhead"]
    assert [e.value for e in eps] == ["qhead.vllm:register"], "qhead is not installed with its entry point"
