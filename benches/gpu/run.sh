#!/usr/bin/env bash
# The GPU benchmark: vramfit on its wgpu adapter against PyTorch CUDA (AMP where a config says
# f16), on quickstart, 8gb and 12gb, in one run on one machine. Prints per config: train and
# inference img/s of both and their ratios, and peak device memory (vramfit's measured peak in
# use, its plan's predicted reserved peak, PyTorch's max_memory_allocated).
#
#   benches/gpu/run.sh            # from the repository root or anywhere in it
#
# Needs: an NVIDIA driver with its Vulkan ICD (wgpu reaches the card through Vulkan), the Vulkan
# loader (Debian: libvulkan1), python3 with torch built for CUDA (installed with pip when
# missing), and a Rust toolchain if target/release/vramfit is not built yet. Budget: about
# 8 minutes on an H200-class card after the build (20 timed steps per row).
set -euo pipefail
cd "$(git -C "$(dirname "$0")" rev-parse --show-toplevel)"

if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
fi
[ -x target/release/vramfit ] || cargo build --release
python3 -c 'import torch' 2>/dev/null || python3 -m pip install --quiet torch
python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else "PyTorch sees no CUDA device")'

# Which adapter vramfit will use: the benchmark must run on the card, not on a software fallback
# (lavapipe / llvmpipe / SwiftShader appear when the NVIDIA Vulkan ICD is missing).
target/release/vramfit devices | tee /tmp/vramfit-devices.txt
if ! grep -qi nvidia /tmp/vramfit-devices.txt; then
  echo "vramfit sees no NVIDIA adapter: install the driver's Vulkan ICD (e.g. libnvidia-gl) and the Vulkan loader (libvulkan1)" >&2
  exit 1
fi
timeout 480 python3 benches/pytorch/compare.py --configs quickstart,8gb,12gb --backend gpu --device cuda --steps 20
# Data parallelism: 12gb on the card, then on the card and the CPU (flex) together, the same
# micro-batches a step in both rows; and the plan of each device. With one card the second
# device is the CPU, so the row shows what a slower device sharing the step costs; with two
# cards, `--devices gpu:0,gpu:1` is the row to read.
# Adapter lines start with the index, the default one with `*` before it.
cards=($(awk 'tolower($0) ~ /nvidia/ { sub(/^\*/, "", $1); if ($1 ~ /^[0-9]+$/) print $1 }' /tmp/vramfit-devices.txt))
first=gpu:${cards[0]}
second=cpu
if [ "${#cards[@]}" -ge 2 ]; then second=gpu:${cards[1]}; fi
timeout 240 target/release/vramfit bench devices -c 12gb --devices "$first,$second" --steps 10 --warmup 2
target/release/vramfit plan -c 12gb --devices "$first,$second" | tail -3
