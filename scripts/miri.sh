#!/usr/bin/env bash
# The unit tests of the CPU kernel crates under Miri (undefined behaviour: out-of-bounds and
# dangling accesses, invalid values, data races, aliasing under Tree Borrows). Miri runs no
# AVX2/AVX-512 code here: its CPU reports only the features the build enables, so runtime
# detection resolves the portable tier and these are the portable paths (plus the unsafe code
# around them: the team's shared regions, the packed layouts, the codecs).
#
# Needs a nightly toolchain with miri (rustup +nightly component add miri rust-src). Not run by
# CI: CI's toolchain is stable only, and the crates' tests take minutes to hours interpreted.
#
#   scripts/miri.sh                # every crate below
#   scripts/miri.sh kernel-quant   # one crate
#
# Tree Borrows rather than Stacked Borrows: crossbeam-epoch (under rayon) trips Stacked
# Borrows' experimental retag rule in its own intrusive list (crossbeam-epoch 0.9.21
# internal.rs:567), which is not our code and is accepted by Tree Borrows. Isolation errors
# are warnings: the team's busy detector reads /proc, and under Miri that open fails and the
# detector carries on without it, as it does on a machine without /proc. Leaks are ignored:
# a local rayon pool's threads outlive the test that built it (rayon does not join them).
set -euo pipefail
cd "$(dirname "$0")/.."
export MIRIFLAGS="${MIRIFLAGS:--Zmiri-tree-borrows -Zmiri-isolation-error=warn-nobacktrace -Zmiri-ignore-leaks}"
crates=("$@")
[ ${#crates[@]} -eq 0 ] && crates=(kernel-common kernel-cpu kernel-quant kernel-paged)
# Tests whose sweeps are too long interpreted (each a dense loop over millions of inputs
# that the native suite runs on every tier; nothing in them is unsafe).
skip=(
    --skip exp_gives_the_bits_of_its_saturating_cast_form
)
for c in "${crates[@]}"; do
    echo "== $c"
    cargo +nightly miri test -p "$c" --lib -- --test-threads=1 "${skip[@]}"
done
