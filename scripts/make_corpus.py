#!/usr/bin/env python3
"""Rebuild qhead's evaluation corpus (python/qhead/corpus/) from Debian and PyPI packages.

    python3 scripts/make_corpus.py            # download, cut, write the parts and manifest.json
    python3 scripts/make_corpus.py --check    # rebuild in memory and compare with the committed files
    python3 scripts/make_corpus.py --cache DIR  # keep the downloaded packages in DIR (reused next time)

Every part is cut deterministically from one file of one exactly versioned package:
Debian packages come from `apt-get download PKG=VERSION` and are unpacked with `dpkg-deb -x`,
PyPI projects from `pip download --no-deps PROJECT==VERSION` (sdists are read with tarfile). Neither
needs root. The licence of each package is checked against its /usr/share/doc/PKG/copyright file, the
licence file of the sdist, or the licence header of the file itself, and recorded in the manifest
with the copyright notice the licence asks to keep. prompts.json is written by hand (CC0-1.0); the
script validates it and records its sha256.

Needs: apt-get and dpkg-deb (Debian 12 "bookworm" archive), pip, and PyPI's PyYAML (the chat parts
are YAML). Debian replaces a package version in its archive when a point release updates it; if a
pinned version is gone, the download fails with its name, and the pin has to move (the rebuilt part
then shows up as changed in --check).
"""
from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import re
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
CORPUS_DIR = ROOT / "python" / "qhead" / "corpus"
DOMAINS = ("prose", "dialogue", "code", "technical", "legal", "non-english")

# ---------------------------------------------------------------------------------------------
# Packages, exactly versioned.

DEBIAN = {  # package -> version (Debian 12 "bookworm")
    "base-files": "12.4+deb12u15",
    "manpages": "6.03-2",
    "manpages-de": "4.18.1-1",
    "manpages-fr": "4.18.1-1",
    "manpages-es": "4.18.1-1",
    "manpages-ru": "4.18.1-1",
}
PYPI = {  # project -> version; the sdist is used (it carries the licence file and the test data)
    "brotli": "1.2.1",
    "chatterbot-corpus": "1.3.3",
}
SDIST_ROOT = {"brotli": "brotli-1.2.1", "chatterbot-corpus": "chatterbot_corpus-1.3.3"}


# ---------------------------------------------------------------------------------------------
# roff (man page) to plain text.

ROFF_GLYPHS = {
    "aq": "'", "dq": '"', "em": "\u2014", "en": "\u2013", "hy": "-", "bu": "\u2022", "ti": "~",
    "ha": "^", "lq": "\u201c", "rq": "\u201d", "oq": "\u2018", "cq": "\u2019", "Fo": "\u00ab",
    "Fc": "\u00bb", "bq": "\u201e", "Bq": "\u201e", "co": "\u00a9", "rg": "\u00ae", "de": "\u00b0",
    "mu": "\u00d7", "rs": "\\", "sc": "\u00a7", "at": "@", "sh": "#", "Do": "$", "lB": "[",
    "rB": "]", "lC": "{", "rC": "}", "ga": "`", "pl": "+", "mi": "\u2212", "eq": "=", "ra": "\u2192",
    "la": "\u2190", "->": "\u2192", "<-": "\u2190", "<=": "\u2264", ">=": "\u2265", "ua": "\u2191",
    "da": "\u2193", "ba": "|", "or": "|", "ct": "\u00a2", "Po": "\u00a3", "Eu": "\u20ac",
    "Ye": "\u00a5", "ss": "\u00df", ":a": "\u00e4", ":o": "\u00f6", ":u": "\u00fc", ":A": "\u00c4",
    "'e": "\u00e9", "`e": "\u00e8", "^e": "\u00ea", "`a": "\u00e0", "+-": "\u00b1", "12": "\u00bd",
}
ROFF_SIMPLE = {"-": "-", "e": "\\", "\\": "\\", "&": "", " ": " ", "~": " ", ":": "", "%": "",
               "|": "", "^": "", "c": "", "0": " ", "/": "", ",": "", "'": "'", "`": "`", ".": "."}
IGNORED_MACROS = {"TH", "RS", "RE", "in", "PD", "ad", "na", "hy", "nh", "ne", "ft", "ll", "ta",
                  "UR", "MT", "ps", "vs", "ss", "cs", "ul", "cu", "HP", "TQ", "ti", "fam", "nr",
                  "ds", "so", "hw", "OP"}
CONCAT_FONT_MACROS = {"BR", "RB", "IR", "RI", "BI", "IB"}
SPACED_FONT_MACROS = {"B", "I", "SM", "SB"}


def roff_inline(s: str, where: str) -> str:
    """Expands the inline escapes of one roff line into plain text (fonts dropped)."""
    out = []
    i = 0
    while i < len(s):
        c = s[i]
        if c != "\\":
            out.append(c)
            i += 1
            continue
        if i + 1 >= len(s):
            i += 1  # a trailing backslash joins the next line; the caller joins with a space
            continue
        e = s[i + 1]
        if e == '"':  # comment to the end of the line
            break
        if e in ("f", "F"):  # font change: \fB, \f(CW, \f[B]
            if s[i + 2:i + 3] == "(":
                i += 5
            elif s[i + 2:i + 3] == "[":
                i = s.index("]", i) + 1
            else:
                i += 3
            continue
        if e == "s":  # size change: \s0, \s-1, \s+2
            m = re.match(r"\\s[-+]?\d", s[i:])
            if not m:
                raise ValueError(f"{where}: unsupported size escape in {s!r}")
            i += len(m.group(0))
            continue
        if e in ("(", "["):
            if e == "(":
                name, i = s[i + 2:i + 4], i + 4
            else:
                j = s.index("]", i)
                name, i = s[i + 2:j], j + 1
            if name.startswith("u") and re.fullmatch(r"u[0-9A-F]{4,5}", name):
                out.append(chr(int(name[1:], 16)))
            elif name in ROFF_GLYPHS:
                out.append(ROFF_GLYPHS[name])
            else:
                raise ValueError(f"{where}: unknown roff glyph \\[{name}] in {s!r}")
            continue
        if e == "*":  # predefined strings
            if s[i + 2:i + 3] == "(":
                name, i = s[i + 3:i + 5], i + 5
            elif s[i + 2:i + 3] == "[":
                j = s.index("]", i)
                name, i = s[i + 3:j], j + 1
            else:
                name, i = s[i + 2], i + 3
            table = {"lq": "\u201c", "rq": "\u201d", "R": "\u00ae", "Tm": "\u2122"}
            if name not in table:
                raise ValueError(f"{where}: unknown roff string \\*[{name}] in {s!r}")
            out.append(table[name])
            continue
        if e in ROFF_SIMPLE:
            out.append(ROFF_SIMPLE[e])
            i += 2
            continue
        raise ValueError(f"{where}: unknown roff escape \\{e} in {s!r}")
    return "".join(out)


def roff_args(s: str) -> list[str]:
    """Splits a macro's arguments the way roff does: blanks separate, "double quotes" group."""
    args, cur, i, quoted, any_char = [], [], 0, False, False
    while i < len(s):
        c = s[i]
        if quoted:
            if c == '"':
                if s[i + 1:i + 2] == '"':
                    cur.append('"')
                    i += 2
                    continue
                quoted = False
            else:
                cur.append(c)
        elif c == '"' and not any_char:
            quoted, any_char = True, True
        elif c in " \t":
            if any_char:
                args.append("".join(cur))
                cur, any_char = [], False
        elif c == "\\" and s[i + 1:i + 2] == '"':
            break
        else:
            if c == "\\" and i + 1 < len(s):  # keep an escape pair together
                cur.append(s[i:i + 2])
                i += 2
                any_char = True
                continue
            cur.append(c)
            any_char = True
        i += 1
    if any_char:
        args.append("".join(cur))
    return args


def roff_to_text(src: str, where: str) -> str:
    """Renders filled roff text (no .EX/.nf examples: man_to_text splits those off) as plain
    text: one line per paragraph, a blank line between paragraphs, headings and .TP tags on
    their own line, tables (.TS) dropped. Unknown requests raise, so that a changed source
    cannot pass unnoticed."""
    blocks: list[tuple[str, str]] = []  # (text, separator after it)
    cur: list[str] = []
    tag_pending = False
    in_table = False
    in_macro_def = False

    def flush(sep: str = "\n\n") -> None:
        nonlocal cur
        text = re.sub(r"[ \t]+", " ", " ".join(cur)).strip()
        if text:
            blocks.append((text, sep))
        cur = []

    def add(text: str) -> None:
        nonlocal tag_pending
        cur.append(text)
        if tag_pending:
            tag_pending = False
            flush("\n")

    for raw in src.split("\n"):
        line = raw.rstrip()
        if in_macro_def:
            in_macro_def = line != ".."
            continue
        if in_table:
            in_table = not line.startswith(".TE")
            continue
        if line.startswith(('.\\"', "'\\\"", '\\"')) or line in (".", "'"):
            continue
        if line.startswith((".", "'")):
            body = line[1:].lstrip()
            macro, _, rest = body.partition(" ")
            macro, rest = macro.strip(), rest.strip()
            if "\t" in macro:
                macro, _, more = macro.partition("\t")
                rest = (more + " " + rest).strip()
            if macro in ("SH", "SS"):
                flush()
                tag_pending = False
                blocks.append((roff_inline(" ".join(roff_args(rest)), where), "\n\n"))
            elif macro in ("PP", "LP", "P", "sp"):
                flush()
                tag_pending = False
            elif macro == "br":
                flush("\n")
            elif macro == "TP":
                flush()
                tag_pending = True
            elif macro == "IP":
                flush()
                tag_pending = False
                args = roff_args(rest)
                if args and args[0]:
                    cur.append(roff_inline(args[0], where))
            elif macro in SPACED_FONT_MACROS:
                args = roff_args(rest)
                if not args:
                    raise ValueError(f"{where}: font request without text: {line!r}")
                add(" ".join(roff_inline(a, where) for a in args))
            elif macro in CONCAT_FONT_MACROS:
                add("".join(roff_inline(a, where) for a in roff_args(rest)))
            elif macro in ("UE", "ME"):
                args = roff_args(rest)
                if args and cur:
                    cur[-1] += roff_inline(args[0], where)
            elif macro == "TS":
                flush()
                in_table = True
            elif macro == "de":
                in_macro_def = True
            elif macro in IGNORED_MACROS:
                pass
            else:
                raise ValueError(f"{where}: unsupported roff request {line!r}")
            continue
        if line.startswith((" ", "\t")):
            flush("\n")
        if not line.strip():
            flush()
            continue
        add(roff_inline(line, where))
    flush()
    return _join_blocks(blocks)


def _join_blocks(blocks: list[tuple[str, str]]) -> str:
    out = []
    for text, sep in blocks:
        out.append(text)
        out.append(sep)
    return "".join(out).rstrip() + "\n"


def man_to_text(src: str, where: str) -> str:
    """A man page as plain text: examples (.EX/.EE, .nf/.fi) line by line as written, the
    filled text around them through roff_to_text."""
    lines = src.split("\n")
    pieces: list[tuple[bool, list[str]]] = [(False, [])]
    for line in lines:
        if line.startswith((".EX", ".nf")):
            pieces.append((True, []))
        elif line.startswith((".EE", ".fi")):
            pieces.append((False, []))
        else:
            pieces[-1][1].append(line)
    out_blocks: list[str] = []
    for is_example, body in pieces:
        if is_example:
            text = "\n".join(_example_line(l, where) for l in body if _example_keep(l)).rstrip()
            text = "\n".join(l.rstrip() for l in text.split("\n")).strip("\n")
            if text:
                out_blocks.append(text)
        else:
            text = roff_to_text("\n".join(body), where).strip()
            if text:
                out_blocks.append(text)
    return re.sub(r"\n{3,}", "\n\n", "\n\n".join(out_blocks)) + "\n"


def _example_keep(line: str) -> bool:
    if line.startswith(('.\\"', "'\\\"")):
        return False
    if line.startswith((".", "'")):
        macro = line[1:].split(None, 1)[0] if line[1:].strip() else ""
        if macro in ("RS", "RE", "in", "sp", "PP", "br", "ft", ""):
            return False
    return True


def _example_line(line: str, where: str) -> str:
    if line.startswith((".", "'")):
        macro, _, rest = line[1:].partition(" ")
        if macro in SPACED_FONT_MACROS | CONCAT_FONT_MACROS:
            joiner = " " if macro in SPACED_FONT_MACROS else ""
            return joiner.join(roff_inline(a, where) for a in roff_args(rest))
        raise ValueError(f"{where}: unsupported request in an example: {line!r}")
    return roff_inline(line, where)


def sections(text: str, start: str, stop: str | None, where: str) -> str:
    """Cuts rendered man text from the heading line `start` (included) to the heading line
    `stop` (excluded; None: to the end). Each heading must occur exactly once."""
    lines = text.split("\n")

    def find(h: str) -> int:
        hits = [i for i, l in enumerate(lines) if l == h]
        if len(hits) != 1:
            raise ValueError(f"{where}: heading {h!r} found {len(hits)} times, expected once")
        return hits[0]

    a = find(start)
    b = find(stop) if stop is not None else len(lines)
    if b <= a:
        raise ValueError(f"{where}: heading {stop!r} comes before {start!r}")
    return "\n".join(lines[a:b]).strip("\n") + "\n"


# ---------------------------------------------------------------------------------------------
# Plain text cuts.

def normalise(text: str) -> str:
    """CRLF to LF, trailing blanks off every line, no blank lines at either end."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    return "\n".join(l.rstrip() for l in text.split("\n")).strip("\n") + "\n"


def between(text: str, start: str, stop: str | None, where: str, stop_nth: int = 1,
            keep_lines: int | None = None) -> str:
    """Lines from the line equal to `start` (included, must be unique) to the `stop_nth`
    line equal to `stop` after it (excluded), or `keep_lines` lines from `start`."""
    lines = text.split("\n")
    hits = [i for i, l in enumerate(lines) if l == start]
    if len(hits) != 1:
        raise ValueError(f"{where}: line {start!r} found {len(hits)} times, expected once")
    a = hits[0]
    if keep_lines is not None:
        b = a + keep_lines
        if b > len(lines):
            raise ValueError(f"{where}: fewer than {keep_lines} lines after {start!r}")
    else:
        after = [i for i in range(a + 1, len(lines)) if lines[i] == stop]
        if len(after) < stop_nth:
            raise ValueError(f"{where}: line {stop!r} not found {stop_nth} times after {start!r}")
        b = after[stop_nth - 1]
    return "\n".join(lines[a:b]).strip("\n") + "\n"


def chat_text(yaml_texts: list[str], where: str, first: int | None = None) -> str:
    """Renders ChatterBot corpus YAML conversations as turns "A: ..." / "B: ...", one
    conversation per paragraph (the first `first` conversations of the concatenation)."""
    import yaml  # PyYAML; imported here so the rest of the script runs without it

    convs = []
    for t in yaml_texts:
        doc = yaml.safe_load(t)
        if not isinstance(doc, dict) or not isinstance(doc.get("conversations"), list):
            raise ValueError(f"{where}: no conversations list")
        convs.extend(doc["conversations"])
    if first is not None:
        convs = convs[:first]
    paras = []
    for conv in convs:
        if not isinstance(conv, list) or not all(isinstance(t, str) for t in conv):
            raise ValueError(f"{where}: a conversation is not a list of strings: {conv!r}")
        turns = [f"{'AB'[k % 2]}: {' '.join(t.split())}" for k, t in enumerate(conv)]
        paras.append("\n".join(turns))
    return "\n\n".join(paras) + "\n"


# ---------------------------------------------------------------------------------------------
# Package access.

@dataclass
class Packages:
    work: Path
    cache: Path
    debs: dict[str, Path] = field(default_factory=dict)
    sdists: dict[str, Path] = field(default_factory=dict)

    def deb(self, pkg: str) -> Path:
        """The unpacked tree of a Debian package (downloaded once)."""
        if pkg in self.debs:
            return self.debs[pkg]
        ver = DEBIAN[pkg]
        found = [p for p in self.cache.glob(f"{pkg}_*.deb") if _deb_version(p) == ver]
        if not found:
            r = subprocess.run(["apt-get", "download", f"{pkg}={ver}"], cwd=self.cache,
                               capture_output=True, text=True)
            found = [p for p in self.cache.glob(f"{pkg}_*.deb") if _deb_version(p) == ver]
            if r.returncode != 0 or not found:
                sys.exit(f"make_corpus: apt-get download {pkg}={ver} failed:\n{r.stderr.strip()}")
        dest = self.work / "deb" / pkg
        dest.mkdir(parents=True)
        subprocess.run(["dpkg-deb", "-x", str(found[0]), str(dest)], check=True)
        self.debs[pkg] = dest
        return dest

    def sdist(self, project: str) -> Path:
        """The unpacked tree of a PyPI sdist (downloaded once)."""
        if project in self.sdists:
            return self.sdists[project]
        ver = PYPI[project]
        root = SDIST_ROOT[project]
        name = root + ".tar.gz"
        archive = self.cache / name
        if not archive.exists():
            r = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps",
                                "--no-binary", ":all:", "-d", str(self.cache),
                                f"{project}=={ver}"], capture_output=True, text=True)
            if r.returncode != 0 or not archive.exists():
                sys.exit(f"make_corpus: pip download {project}=={ver} failed:\n"
                         f"{r.stdout.strip()}\n{r.stderr.strip()}")
        dest = self.work / "sdist" / project
        dest.mkdir(parents=True)
        with tarfile.open(archive) as tf:
            tf.extractall(dest, filter="data")
        self.sdists[project] = dest / root
        return self.sdists[project]


def _deb_version(p: Path) -> str:
    r = subprocess.run(["dpkg-deb", "-f", str(p), "Version"], capture_output=True, text=True,
                       check=True)
    return r.stdout.strip()


def read_text(p: Path) -> str:
    data = p.read_bytes()
    if p.suffix == ".gz":
        data = gzip.decompress(data)
    return data.decode("utf-8")


def require(text: str, needle: str, where: str) -> None:
    if needle not in text:
        raise ValueError(f"{where}: expected licence statement {needle!r} not found")


def man_header_licence(src: str, where: str) -> tuple[str, str]:
    """(SPDX id, copyright or author lines) from an English man page's header comment."""
    head = [l[3:].strip() for l in src.split("\n") if l.startswith('.\\"')][:40]
    ids = [l.split(":", 1)[1].strip() for l in head if l.startswith("SPDX-License-Identifier:")]
    if len(ids) != 1:
        raise ValueError(f"{where}: expected one SPDX-License-Identifier in the header, got {ids}")
    cr = [l for l in head if l.startswith(("Copyright", "Written by"))]
    if not cr:
        raise ValueError(f"{where}: no Copyright or 'Written by' line in the header")
    return ids[0], "; ".join(cr)


LINUX_MAN_PAGES_COPYLEFT = (
    "Permission is granted to make and distribute verbatim copies of this manual provided the "
    "copyright notice and this permission notice are preserved on all copies. Permission is "
    "granted to copy and distribute modified versions of this manual under the conditions for "
    "verbatim copying, provided that the entire resulting derived work is distributed under the "
    "terms of a permission notice identical to this one.")
GPL_OR_LATER = re.compile(r"GPL-([123])\.0-or-later")


def licence_notice(spdx: str, where: str) -> str:
    """The permission notice a man page licence asks to keep with a modified copy."""
    if spdx == "Linux-man-pages-copyleft":
        return LINUX_MAN_PAGES_COPYLEFT
    m = GPL_OR_LATER.fullmatch(spdx)
    if m:
        return (f"This is free documentation; you can redistribute it and/or modify it under the "
                f"terms of the GNU General Public License as published by the Free Software "
                f"Foundation; either version {m.group(1)} of the License, or (at your option) any "
                f"later version (on Debian: /usr/share/common-licenses/GPL-{m.group(1)}).")
    raise ValueError(f"{where}: licence {spdx}: this script has no notice for it")


# ---------------------------------------------------------------------------------------------
# The parts. Each builder returns (text, metadata); metadata has source, licence, licence_note,
# copyright, excerpt.

@dataclass(frozen=True)
class Spec:
    name: str
    domain: str
    language: str
    build: Callable[[Packages], tuple[str, dict]]


def deb_source(pkg: str, path: str) -> str:
    return f"Debian {pkg} {DEBIAN[pkg]}: {path}"


def pypi_source(project: str, path: str) -> str:
    return f"PyPI {project} {PYPI[project]} (sdist): {path}"


def brotli_mit(p: Packages) -> tuple[str, str]:
    """(copyright line, licence text) of the Brotli sdist, checked to be MIT."""
    require((p.sdist("brotli") / "PKG-INFO").read_text(), "\nLicense: MIT\n", "brotli PKG-INFO")
    lic = (p.sdist("brotli") / "LICENSE").read_text()
    require(lic, "Permission is hereby granted, free of charge, to any person obtaining a copy",
            "brotli LICENSE")
    require(lic, "The above copyright notice and this permission notice shall be included",
            "brotli LICENSE")
    return lic.split("\n", 1)[0].strip(), normalise(lic)


def brotli_testdata(fname: str, cut: Callable[[str, str], str], excerpt: str, note: str):
    def build(p: Packages) -> tuple[str, dict]:
        path = f"tests/testdata/{fname}"
        text = normalise(read_text(p.sdist("brotli") / path))
        return cut(text, path), {
            "source": pypi_source("brotli", path),
            "licence": "LicenseRef-public-domain",
            "licence_note": note,
            "copyright": "none (public domain)",
            "excerpt": excerpt,
        }
    return build


def brotli_code(path: str, cut: Callable[[str], str] | None, excerpt: str):
    def build(p: Packages) -> tuple[str, dict]:
        cr, lic = brotli_mit(p)
        text = normalise(read_text(p.sdist("brotli") / path))
        if cut is not None:
            text = cut(text)
        return text, {
            "source": pypi_source("brotli", path),
            "licence": "MIT",
            "licence_note": "MIT: copying permitted with the copyright and permission notice, "
                            "which the manifest carries (notice)",
            "copyright": cr,
            "notice": lic,
            "excerpt": excerpt,
        }
    return build


def chat(lang: str, files: list[str], first: int | None, excerpt: str):
    def build(p: Packages) -> tuple[str, dict]:
        root = p.sdist("chatterbot-corpus")
        require((root / "PKG-INFO").read_text(), "License :: OSI Approved :: BSD License",
                "chatterbot-corpus PKG-INFO")
        lic = (root / "license.md").read_text()
        require(lic, "Copyright (c) 2017, Gunther Cox", "chatterbot-corpus license.md")
        require(lic, "Neither the name of chatterbot nor the names of its contributors",
                "chatterbot-corpus license.md")
        paths = [f"chatterbot_corpus/data/{lang}/{f}" for f in files]
        text = chat_text([read_text(root / q) for q in paths], ", ".join(paths), first)
        return text, {
            "source": pypi_source("chatterbot-corpus", ", ".join(paths)),
            "licence": "BSD-3-Clause",
            "licence_note": "BSD-3-Clause: redistribution permitted with the copyright notice, "
                            "conditions and disclaimer, which the manifest carries (notice)",
            "copyright": "Copyright (c) 2017, Gunther Cox",
            "notice": normalise(lic),
            "excerpt": excerpt,
        }
    return build


def common_licence(fname: str, spdx: str, first_line: str, copyright: str, needle: str,
                   note: str):
    def build(p: Packages) -> tuple[str, dict]:
        root = p.deb("base-files")
        cr = read_text(root / "usr/share/doc/base-files/copyright")
        path = f"usr/share/common-licenses/{fname}"
        text = (root / path).read_bytes().decode("utf-8")  # verbatim, byte for byte
        if text.strip().split("\n", 1)[0].strip() != first_line:
            raise ValueError(f"{path}: expected it to start with {first_line!r}")
        require(text, needle, path)
        if "GNU" in first_line:
            require(cr, "The GNU Public Licenses in /usr/share/common-licenses were taken from",
                    "base-files copyright")
        return text, {
            "source": deb_source("base-files", "/" + path),
            "licence": spdx,
            "licence_note": "the licence document itself, shipped whole and byte for byte as "
                            "in the package; " + note,
            "copyright": copyright,
            "excerpt": "whole file",
        }
    return build


TRANSLATION_HEADINGS = ("\u00dcBERSETZUNG", "TRADUCTION", "TRADUCCI\u00d3N", "\u041f\u0415\u0420\u0415\u0412\u041e\u0414")


def translation_credits(text: str, where: str) -> tuple[str, str]:
    """(translators, licence statement): the first two paragraphs of a manpages-l10n page's
    translation section, as the page states them."""
    paras = text.split("\n\n")
    hits = [i for i, t in enumerate(paras) if t.strip() in TRANSLATION_HEADINGS]
    if len(hits) != 1 or hits[0] + 2 >= len(paras):
        raise ValueError(f"{where}: no translation section")
    translators, permission = paras[hits[0] + 1].strip(), paras[hits[0] + 2].strip()
    if "GNU General Public License" not in permission and "GNU" not in permission:
        raise ValueError(f"{where}: translation section names no GNU licence: {permission!r}")
    if "3" not in permission:
        raise ValueError(f"{where}: translation licence is not version 3: {permission!r}")
    return translators, permission


def man_page(pkg: str, lang: str, page: str, start: str, stop: str | None, excerpt: str):
    """A man page from `manpages` (lang "en") or a manpages-l10n translation."""
    def build(p: Packages) -> tuple[str, dict]:
        en_path = f"usr/share/man/{page}.gz"
        en_src = read_text(p.deb("manpages") / en_path)
        mcr = "usr/share/doc/manpages/copyright"
        require(read_text(p.deb("manpages") / mcr), "Upstream-Name: man-pages", mcr)
        spdx, cr = man_header_licence(en_src, en_path)
        notice = licence_notice(spdx, en_path)
        if pkg == "manpages":
            path, src = en_path, en_src
            meta = {
                "licence": spdx,
                "licence_note": f"{spdx}: a modified version (this plain-text rendering) may "
                                "be distributed with the page's permission notice, which the "
                                "manifest carries (notice)",
                "copyright": cr,
                "notice": notice + "\n",
            }
        else:
            path = f"usr/share/man/{lang}/{page}.gz"
            src = read_text(p.deb(pkg) / path)
            cpath = f"usr/share/doc/{pkg}/copyright"
            crf = read_text(p.deb(pkg) / cpath)
            require(crf, "Files: *\nCopyright: \u00a9 2010-2020 Dr. Tobias Quathamer", cpath)
            require(crf, "License: GPL-3+", cpath)
            translators, permission = translation_credits(man_to_text(src, path), path)
            meta = {
                "licence": f"GPL-3.0-or-later AND {spdx}",
                "licence_note": "the translation is GPL-3.0-or-later (debian/copyright of "
                                f"manpages-l10n and the page's own statement), the English "
                                f"original {spdx}; both permit distributing this rendering with "
                                "their notices, which the manifest carries (notice)",
                "copyright": f"translation: {translators} / original: {cr}",
                "notice": f"Translation: {permission}\nOriginal: {notice}\n",
            }
        text = sections(man_to_text(src, path), start, stop, path)
        meta = {"source": deb_source(pkg, "/" + path), **meta, "excerpt": excerpt}
        return text, meta
    return build


PD_GUTENBERG = ("public domain: published before 1900; Project Gutenberg etext carried as test "
                "data of the Brotli sdist (the Canterbury corpus)")

PARTS = [
    Spec("alice", "prose", "en", brotli_testdata(
        "alice29.txt",
        lambda t, w: between(t, "                            CHAPTER I",
                             "                           CHAPTER II", w),
        "Chapter I 'Down the Rabbit-Hole', whole (Lewis Carroll, 1865)",
        PD_GUTENBERG)),
    Spec("paradise-lost", "prose", "en", brotli_testdata(
        "plrabn12.txt",
        lambda t, w: between(t, "Book I", None, w, keep_lines=127),
        "Book I: its heading and the lines up to the end of Satan's first speech, 'Sole "
        "reigning holds the tyranny of Heaven.' (John Milton, 1667)",
        PD_GUTENBERG)),
    Spec("as-you-like-it", "dialogue", "en", brotli_testdata(
        "asyoulik.txt",
        lambda t, w: between(t, "SCENE I\tOrchard of Oliver's house.", "\tAS YOU LIKE IT", w),
        "Act I, Scene I, whole (William Shakespeare, 1599)",
        "public domain: published 1623; Project Gutenberg etext carried as test data of the "
        "Brotli sdist (the Canterbury corpus)")),
    Spec("chat", "dialogue", "en", chat(
        "english", ["conversations.yml"], None,
        "all conversations of conversations.yml, turns as 'A:'/'B:' lines")),
    Spec("bro-py", "code", "en", brotli_code(
        "python/bro.py", None, "whole file")),
    Spec("huffman-c", "code", "en", brotli_code(
        "c/dec/huffman.c",
        lambda t: between(t, "/* Returns reverse(num >> BROTLI_REVERSE_BITS_BASE, "
                             "BROTLI_REVERSE_BITS_MAX),",
                          "#if defined(__cplusplus) || defined(c_plusplus)", "c/dec/huffman.c"),
        "every function, from the comment of BrotliReverseBits up to the closing extern \"C\" "
        "guard (excluded); the licence header, includes and the 256-entry bit-reversal table "
        "are left out")),
    Spec("pipe-7", "technical", "en", man_page(
        "manpages", "en", "man7/pipe.7", "NAME", "SEE ALSO",
        "pipe(7) rendered to plain text, NAME up to SEE ALSO (excluded)")),
    Spec("utf-8-7", "technical", "en", man_page(
        "manpages", "en", "man7/utf-8.7", "NAME", "SEE ALSO",
        "utf-8(7) rendered to plain text, NAME up to SEE ALSO (excluded)")),
    Spec("apache-2.0", "legal", "en", common_licence(
        "Apache-2.0", "Apache-2.0", "Apache License", "The Apache Software Foundation",
        "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION",
        "licence texts are meant to be copied unchanged into every work that uses them, and "
        "Debian ships this one for that purpose")),
    Spec("lgpl-3", "legal", "en", common_licence(
        "LGPL-3", "LGPL-3.0-only", "GNU LESSER GENERAL PUBLIC LICENSE",
        "Copyright (C) 2007 Free Software Foundation, Inc. <https://fsf.org/>",
        "Everyone is permitted to copy and distribute verbatim copies",
        "its own header: 'Everyone is permitted to copy and distribute verbatim copies of this "
        "license document, but changing it is not allowed.'")),
    Spec("de-intro-1", "non-english", "de", man_page(
        "manpages-de", "de", "man1/intro.1", "Pfadnamen und das aktuelle Verzeichnis",
        "SIEHE AUCH", "intro(1) in German rendered to plain text, from 'Pfadnamen und das "
        "aktuelle Verzeichnis' up to SIEHE AUCH (excluded)")),
    Spec("fr-pipe-7", "non-english", "fr", man_page(
        "manpages-fr", "fr", "man7/pipe.7", "DESCRIPTION", "Fichiers /proc",
        "pipe(7) in French rendered to plain text, DESCRIPTION up to 'Fichiers /proc' "
        "(excluded)")),
    Spec("es-boot-7", "non-english", "es", man_page(
        "manpages-es", "es", "man7/boot.7", "DESCRIPCIÓN", "Proceso base en espacio de usuario",
        "boot(7) in Spanish rendered to plain text, DESCRIPCIÓN up to 'Proceso base en "
        "espacio de usuario' (excluded)")),
    Spec("ru-unicode-7", "non-english", "ru", man_page(
        "manpages-ru", "ru", "man7/unicode.7", "Юникод в Linux", "Литература",
        "unicode(7) in Russian rendered to plain text, section 'Юникод в Linux' up to "
        "'Литература' (excluded)")),
    Spec("ja-chat", "non-english", "ja", chat(
        "japanese", ["conversations.yml"], None,
        "all conversations of conversations.yml, turns as 'A:'/'B:' lines")),
]


# ---------------------------------------------------------------------------------------------

def sha256_bytes(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def check_prompts(data: bytes) -> int:
    prompts = json.loads(data.decode("utf-8"))
    if not isinstance(prompts, list):
        raise ValueError("prompts.json: expected a list")
    ids, texts = set(), set()
    for p in prompts:
        if set(p) != {"id", "domain", "text", "validation"} or not isinstance(p["validation"], bool):
            raise ValueError(f"prompts.json: unexpected keys in {p!r}")
        if p["domain"] not in DOMAINS or not p["text"].strip():
            raise ValueError(f"prompts.json: bad prompt {p!r}")
        if p["id"] in ids or p["text"] in texts:
            raise ValueError(f"prompts.json: duplicate prompt {p!r}")
        ids.add(p["id"])
        texts.add(p["text"])
    return len(prompts)


def build_all(pk: Packages) -> dict[str, bytes]:
    """Every file of the corpus directory this script owns: the parts and manifest.json."""
    files: dict[str, bytes] = {}
    entries = []
    for spec in PARTS:
        if spec.domain not in DOMAINS:
            raise ValueError(f"{spec.name}: unknown domain {spec.domain}")
        text, meta = spec.build(pk)
        data = text.encode("utf-8")
        fname = f"{spec.domain}-{spec.name}.txt"
        files[fname] = data
        entries.append({
            "name": spec.name,
            "domain": spec.domain,
            "language": spec.language,
            "file": fname,
            "sha256": sha256_bytes(data),
            "bytes": len(data),
            "source": meta["source"],
            "licence": meta["licence"],
            "licence_note": meta["licence_note"],
            "copyright": meta["copyright"],
            "excerpt": meta["excerpt"],
            **({"notice": meta["notice"]} if "notice" in meta else {}),
        })
    pdata = (CORPUS_DIR / "prompts.json").read_bytes()
    manifest = {
        "corpus": "qhead evaluation corpus",
        "generator": "scripts/make_corpus.py",
        "domains": list(DOMAINS),
        "parts": entries,
        "prompts": {
            "file": "prompts.json",
            "sha256": sha256_bytes(pdata),
            "bytes": len(pdata),
            "count": check_prompts(pdata),
            "source": "all written for qhead (none is cut from the parts); the ten with "
                      "validation true are the validation prompts of scripts/generate_compare.py",
            "licence": "CC0-1.0",
            "licence_note": "written for qhead and dedicated to the public domain",
        },
    }
    files["manifest.json"] = (json.dumps(manifest, indent=2, ensure_ascii=False) + "\n").encode()
    return files


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true",
                    help="compare the rebuilt files with the committed ones; write nothing")
    ap.add_argument("--cache", type=Path, help="keep downloaded packages in this directory")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="qhead-corpus-") as tmp:
        work = Path(tmp)
        cache = args.cache.resolve() if args.cache else work / "dl"
        cache.mkdir(parents=True, exist_ok=True)
        files = build_all(Packages(work, cache))
    owned = {p.name for p in CORPUS_DIR.glob("*.txt")}
    if args.check:
        bad = []
        for name, data in files.items():
            path = CORPUS_DIR / name
            if not path.exists() or path.read_bytes() != data:
                bad.append(f"differs: {name}")
        bad += [f"not rebuilt: {n}" for n in sorted(owned - set(files))]
        for b in bad:
            print(b)
        print(f"make_corpus --check: {len(files)} files rebuilt, {len(bad)} differ")
        return 1 if bad else 0
    for stale in sorted(owned - set(files)):
        (CORPUS_DIR / stale).unlink()
    for name, data in files.items():
        (CORPUS_DIR / name).write_bytes(data)
    total = sum(len(d) for n, d in files.items() if n.endswith(".txt"))
    print(f"make_corpus: wrote {len(files) - 1} parts ({total} bytes) and manifest.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
