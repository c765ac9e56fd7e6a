#!/usr/bin/env bash
# Did a llama.cpp change make speculation faster or slower? Builds specnative against two llama.cpp
# trees, each in its own virtual environment and build folder, runs the same sweep with both
# (interleaved A, B, A, B... one sweep per round, so host drift hits both sides alike), and compares
# the last pair per regime with intervals (`specnative compare`, decided regressions only).
#
#   bash bench/compare_commits.sh LLAMA_TREE_A LLAMA_TREE_B [-- sweep flags]
#   e.g. git clone llama.cpp llama-old && git -C llama-old checkout <commit>   (two checkouts)
#        bash bench/compare_commits.sh ../llama-old ~/llama.cpp -- --ctx-len 0,8192 -np 1,4 -r 3
#
# Environment: OUT (default bench/scratch/compare-commits), ROUNDS (default 1: A then B),
# FAIL_ON (default 5: --fail-on-regression PCT, the exit status of the script).
# Each tree's commit is recorded in its runs' provenance.json (llama_cpp_commit), so the
# database can also answer `specnative compare -b <commit A> -c <commit B> --db $OUT/specnative.sqlite`.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ $# -lt 2 ]; then
  sed -n '2,14p' "$0"
  exit 2
fi
TREE_A=$(cd "$1" && pwd)
TREE_B=$(cd "$2" && pwd)
shift 2
[ "${1:-}" = "--" ] && shift
OUT=${OUT:-bench/scratch/compare-commits}
ROUNDS=${ROUNDS:-1}
FAIL_ON=${FAIL_ON:-5}
mkdir -p "$OUT"

build() {  # side tree: a venv that sees this interpreter's packages, its own build folder
  local side=$1 tree=$2 venv="$OUT/venv-$1"
  if [ ! -x "$venv/bin/python" ]; then
    python -m venv --system-site-packages "$venv"
  fi
  echo "[compare-commits] building specnative against $tree (side $side)" >&2
  LLAMA_CPP_DIR="$tree" "$venv/bin/python" -m pip install --no-build-isolation --no-deps -q \
    -C build-dir="$OUT/build-$side" .
}

build A "$TREE_A"
build B "$TREE_B"
for round in $(seq 1 "$ROUNDS"); do
  for side in A B; do
    run="$OUT/runs/$side-$round"
    rm -rf "$run"
    "$OUT/venv-$side/bin/python" -m specnative.sweep "$@" -o "$run" --db "$OUT/specnative.sqlite" --no-report
  done
done
"$OUT/venv-B/bin/python" -m specnative compare "$OUT/runs/A-$ROUNDS" "$OUT/runs/B-$ROUNDS" \
  --plot "$OUT/compare.png" --fail-on-regression "$FAIL_ON"
