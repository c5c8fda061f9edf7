#!/usr/bin/env bash
# Builds the harness here (no GPU needed) and leaves a stripped copy at target/gpu/harness,
# small enough to carry to the lent GPU machine, which cannot fetch crates:
#   device run: carry ["target/gpu"], command "bash scripts/gpu-check.sh"
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked -p harness
mkdir -p target/gpu
cp target/release/harness target/gpu/harness
strip target/gpu/harness
ls -la target/gpu/harness
