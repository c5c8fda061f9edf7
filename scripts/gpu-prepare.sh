#!/usr/bin/env bash
# Builds the harness here (no GPU needed) and leaves a stripped copy at target/gpu/harness,
# small enough to carry to the lent GPU machine, which cannot fetch crates:
#   device run: carry ["target/gpu"], command "bash scripts/gpu-check.sh"
# Also a git bundle of the last commits (GPU_BUNDLE_BASE.., default HEAD~60..): the device
# machine's copy of the repository was seen (2026-12-04) to carry the session's starting
# commit under the current working tree, so every run there recorded that commit, dirty.
# gpu-check.sh fetches the bundle and moves HEAD to its commit when the tree is exactly it.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked -p harness
mkdir -p target/gpu
cp target/release/harness target/gpu/harness
strip target/gpu/harness
ls -la target/gpu/harness
base=${GPU_BUNDLE_BASE:-HEAD~60}
git rev-parse -q --verify "$base^{commit}" >/dev/null || base=$(git rev-list --max-parents=0 HEAD | tail -1)
git bundle create target/gpu/head.bundle "$base..HEAD" 2>/dev/null || git bundle create target/gpu/head.bundle HEAD
ls -la target/gpu/head.bundle
