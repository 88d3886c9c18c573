"""qhead.hf on the real SmolLM2-135M-Instruct (Q4_1 GGUF, tied 49152 x 576 table).

The model comes from scripts/fetch_models.sh (PyPI, into $QHEAD_MODEL_CACHE, default
~/.cache/qhead/models) and is read by transformers' own GGUF loader (dequantized to f32);
scripts/generate_compare.py keeps a converted copy in the cache so later runs load fast.
Skipped, with the reason, when the model or the loader's packages are missing.

Asserted: greedy decoding (32 new tokens) with head "w8" + rescore=8 equals the dense model's
on every one of the 10 prompts (the embedding reads the rows kept for rescoring, so it is exact;
the head's top 8 are rescored from them). Measured and printed, not asserted: "w4g64" with and without
rescoring. Also runs the README's Python example.
"""
import os
import re
import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

os.environ.setdefault("HF_HUB_OFFLINE", "1")

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "scripts"))
import generate_compare as gcmp  # noqa: E402

NEW_TOKENS = 32
MIN_PROMPTS = 8


@pytest.fixture(scope="module")
def smollm2():
    why = gcmp.available("smollm2")
    if why:
        pytest.skip(f"SmolLM2-135M-Instruct: {why}")
    import transformers

    import qhead

    transformers.logging.set_verbosity_error()
    # One thread each for torch and qhead: a 2-core machine, often shared, is not oversubscribed.
    threads = (torch.get_num_threads(), qhead.num_threads())
    gcmp.set_threads(1)
    model, tok = gcmp.load("smollm2")
    dense = gcmp.greedy(model, tok, gcmp.PROMPTS, NEW_TOKENS)
    yield model, tok, dense
    torch.set_num_threads(threads[0])
    qhead.set_num_threads(threads[1])


def _agreement(model, tok, dense, **kw):
    import qhead.hf as qh

    qh.quantize_model(model, **kw)
    got = gcmp.greedy(model, tok, gcmp.PROMPTS, NEW_TOKENS)
    firsts = [next((i for i, (a, b) in enumerate(zip(d, g)) if a != b), None) for d, g in zip(dense, got)]
    return sum(f is None for f in firsts), firsts


def test_smollm2_w8_rescore_greedy_equals_dense(smollm2):
    _, tok, dense = smollm2
    model, _ = gcmp.load("smollm2")
    assert all(len(d) == NEW_TOKENS for d in dense) and len(dense) >= MIN_PROMPTS
    agree, firsts = _agreement(model, tok, dense, head="w8", rescore=8)
    e, h = model.get_input_embeddings(), model.get_output_embeddings()
    assert e.table is h.table and h.table.scheme == "w8" and h.rescore == 8
    assert e._dense_rows is not None and e._dense_rows() is h._dense()  # one set of dense rows
    print(f"\nSmolLM2 w8 + rescore=8: {agree}/{len(dense)} prompts equal the dense model over {NEW_TOKENS} "
          f"new tokens (first differing token per prompt: {firsts})")
    assert agree == len(dense), firsts


@pytest.mark.parametrize("rescore", [0, 8])
def test_smollm2_w4g64_measured(smollm2, rescore):
    _, tok, dense = smollm2
    model, _ = gcmp.load("smollm2")
    agree, firsts = _agreement(model, tok, dense, head="w4g64", rescore=rescore)
    print(f"\nSmolLM2 w4g64 rescore={rescore}: {agree}/{len(dense)} prompts equal the dense model over "
          f"{NEW_TOKENS} new tokens (first differing token per prompt: {firsts})")
    assert model.get_output_embeddings().table.scheme == "w4g64"


def test_readme_python_example(smollm2, capfd):
    """The README's Python section runs as written (it loads the GGUF file itself)."""
    import importlib.util

    for mod in ("gguf", "accelerate"):
        if importlib.util.find_spec(mod) is None:
            pytest.skip(f"the README example loads a GGUF file: transformers needs the {mod} package")
    with open(os.path.join(REPO, "README.md")) as f:
        readme = f.read()
    section = readme.split("\n## Python", 1)
    assert len(section) == 2, "README.md has no '## Python' section"
    blocks = re.findall(r"```python\n(.*?)```", section[1].split("\n## ", 1)[0], re.S)
    assert blocks, "README.md's Python section has no python example"
    exec(compile(blocks[0], "README.md", "exec"), {"__name__": "readme_example"})
    out = capfd.readouterr().out
    assert "Paris" in out, out
