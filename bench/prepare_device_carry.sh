#!/usr/bin/env bash
# Packs what bench/gpu_check.sh needs on a machine without network into .carry/ (git-ignored):
# the pinned llama.cpp tree without its model vocabularies, docs and tests (they are not built),
# and wheels of the Python dependencies that machine may lack. Run here, then pass `.carry` as a
# carried path to the device tool and run `bash bench/gpu_check.sh` there.
set -euo pipefail
cd "$(dirname "$0")/.."
python vendor/fetch_llama_cpp.py
mkdir -p .carry/wheels
tar -C vendor -czf .carry/llama.cpp-trimmed.tar.gz \
    --exclude='llama.cpp/models' --exclude='llama.cpp/docs' --exclude='llama.cpp/tests' \
    --exclude='llama.cpp/benches' --exclude='llama.cpp/media' --exclude='llama.cpp/gguf-py/tests' \
    llama.cpp
# gguf is pure Python; the device image has the rest (numpy, pandas, matplotlib, scipy, pybind11,
# scikit-build-core, pytest).
python -m pip download --quiet --no-deps --only-binary=:all: -d .carry/wheels "gguf==0.19.0"
du -sh .carry/* .carry/wheels/*
