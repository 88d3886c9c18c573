#!/usr/bin/env bash
# Fails (exit 1, printing file:line: text) where the project's code, tests,
# scripts or docs speak of something other than qhead as it is: work sessions,
# issue numbers, kernel version labels, decisions of a document the repository
# does not have, the machine a measurement ran on, machine paths.
# History belongs in commit messages and docs/tuning-notes.md (by topic, with
# commit hashes).
#
#   scripts/check_words.sh            check the tree (tracked and new files)
#   scripts/check_words.sh FILE...    check only these files
#
# What is flagged (extended regular expressions, see PATTERNS):
#   "session 3", "sessions 4", "issue 5", "issue's", "the issue", "DESIGN decision",
#   "DESIGN.md", kernel versions "v5".."v19" (with an optional a-e suffix: "v14a"),
#   "this VM", "earlier version", and /work/ or /tmp/ paths.
# What is not: other projects' issue links written as project#number ("vllm#45535",
# "llm-compressor#1820") — they name a thread of that project, not ours; words such
# as "issue slots" or "issued" (only "issue" followed by a number is flagged).
# Not checked (recorded output, third-party text, or binary):
#   docs/bench/       bench rows exactly as a run printed them (their path names and
#                     notes are those of the binary that ran; scripts/perf_report.py
#                     shows design names)
#   docs/accuracy/*.json  recorded qhead agree / generate output (model-generated text)
#   tests/fixtures/ data files (tool-written configs and tensors; their READMEs are checked)
#   python/qhead/corpus/  the evaluation corpus (third-party texts)
#   binary files, and this script.
set -euo pipefail
cd "$(dirname "$0")/.."

ROOTS=(src include cli tests docs python scripts tools README.md)
PATTERNS=(
  '\b[Ss]essions? [0-9]'
  '\b[Ii]ssues? #?[0-9]'
  "\\b[Ii]ssue's"
  '\b[Tt]he issue\b'
  'DESIGN decision'
  'DESIGN\.md'
  '\bDESIGN *$'
  '\bv([5-9]|1[0-9])[a-e]?\b'
  '\bthis VM\b'
  '\b[Ee]arlier version'
  '/work/'
  '/tmp/'
)

skip() {
  case "$1" in
    scripts/check_words.sh) return 0 ;;
    docs/bench/*) return 0 ;;
    docs/accuracy/*.json) return 0 ;;
    python/qhead/corpus/*) return 0 ;;
    tests/fixtures/*.md | tests/fixtures/*/README*) return 1 ;;
    tests/fixtures/*) return 0 ;;
  esac
  return 1
}

files=()
if [ "$#" -gt 0 ]; then
  files=("$@")
else
  existing=()
  for r in "${ROOTS[@]}"; do [ -e "$r" ] && existing+=("$r"); done
  if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    mapfile -t files < <(git ls-files --cached --others --exclude-standard -- "${existing[@]}")
  else
    mapfile -t files < <(find "${existing[@]}" -type f)
  fi
fi

args=()
for p in "${PATTERNS[@]}"; do args+=(-e "$p"); done

status=0
for f in "${files[@]}"; do
  [ -f "$f" ] || continue
  skip "$f" && continue
  # -I: binary files never match.
  if out=$(grep -n -I -E -H "${args[@]}" -- "$f"); then
    printf '%s\n' "$out"
    status=1
  fi
done
if [ "$status" -ne 0 ]; then
  echo "check_words: history vocabulary above (see scripts/check_words.sh); write history in commit messages or docs/tuning-notes.md" >&2
fi
exit "$status"
