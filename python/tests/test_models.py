"""qhead.models without a downloaded model: spec resolution and the SentencePiece encoder on a
constructed vocabulary whose merges are known (and, where the real Gemma-3 GGUF is there,
against the pairwise-scan reference on real text)."""
import json
import os

import pytest

from qhead import models


def _vocab(tmp_path, tokens, scores, bos=1, eos=2):
    p = tmp_path / "spm_vocab.json"
    p.write_text(json.dumps({"tokens": tokens, "scores": scores, "bos": bos, "eos": eos}))
    return models.SpmEncoder("unused.gguf", str(p))


def _pairwise(enc, text):
    """The plain O(n^2) algorithm: merge the best-scoring adjacent pair (leftmost on equal scores)."""
    syms = list(text.replace(" ", "\u2581"))
    while len(syms) > 1:
        best, at = None, -1
        for i in range(len(syms) - 1):
            j = enc.ids.get(syms[i] + syms[i + 1])
            if j is not None and (best is None or enc.scores[j] > best):
                best, at = enc.scores[j], i
        if at < 0:
            break
        syms[at: at + 2] = [syms[at] + syms[at + 1]]
    out = [enc.bos]
    for s in syms:
        out.extend([enc.ids[s]] if s in enc.ids else [enc.ids[f"<0x{b:02X}>"] for b in s.encode("utf-8")])
    return out


def test_spm_merges_by_score_and_falls_back_to_bytes(tmp_path):
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    tokens = ["<unk>", "<bos>", "<eos>", "a", "b", "c", "\u2581", "ab", "bc", "abc", "\u2581a"] + byte_tokens
    scores = [0.0, 0.0, 0.0, -1, -1, -1, -1, -2.0, -1.5, -0.5, -3.0] + [-10.0] * 256
    enc = _vocab(tmp_path, tokens, scores)
    ids = {t: i for i, t in enumerate(tokens)}
    # "abc": bc (-1.5) merges before ab (-2.0), then a + bc = abc; "abb": only ab applies.
    assert enc.encode("abc") == [1, ids["abc"]]
    assert enc.encode("abb") == [1, ids["ab"], ids["b"]]
    # " a" merges to "\u2581a"; "é" is not in the vocabulary: its two UTF-8 bytes.
    assert enc.encode(" aé", bos=False) == [ids["\u2581a"], ids["<0xC3>"], ids["<0xA9>"]]
    assert enc.decode(enc.encode(" abcé")) == " abcé"
    for text in ("abcabc", " a b c", "cba ab", "", "aaaa bbbb"):
        assert enc.encode(text) == _pairwise(enc, text), text


def test_spm_matches_the_pairwise_scan_on_gemma3(tmp_path):
    ref = models.resolve("gemma3")
    vocab = str(tmp_path / "spm_vocab.json")  # not the model cache: a converted directory holds the model
    if not os.path.isfile(ref.path):
        pytest.skip(f"{ref.path} is not there")
    pytest.importorskip("gguf")
    enc = models.SpmEncoder(ref.path, vocab)
    from qhead import corpus

    for p in corpus.prompts(validation=True):
        assert enc.encode(p.text) == _pairwise(enc, p.text), p.text
        assert enc.decode(enc.encode(p.text)) == p.text
    text = corpus.parts(["non-english"])[0].text[:600]
    assert enc.encode(text) == _pairwise(enc, text)


def test_resolve():
    assert models.resolve("smollm2").kind == "gguf"
    assert models.resolve("x/y/model.gguf").name == "model"
    with pytest.raises(ValueError, match="nosuch"):
        models.resolve("nosuch")
