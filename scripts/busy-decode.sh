#!/usr/bin/env bash
# Decode on a quiet and on a busy machine, side by side: SmolLM2 (models/cache, from
# scripts/fetch-models.sh) greedy for 256 tokens with our harness at 1 thread, 2 threads, and
# 2 threads with the busy-machine fallback off (WORKBENCH_TEAM=fixed); llama.cpp's llama-bench
# -n 128 at 1 and 2 threads on the same file when scripts/fetch-peers.sh built it; and
# BEFORE=<another harness binary> at 2 threads if given (an older build to compare with).
# Each round runs every contender once, quiet, then again beside one `yes > /dev/null`;
# ROUNDS rounds (default 5). Prints one line per round and condition, tokens/s.
#   cargo build --release -p harness && scripts/busy-decode.sh
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
model=models/cache/SmolLM2-135M-Instruct.Q4_1.gguf
ours=target/release/harness
rounds="${ROUNDS:-5}"
[ -x "$ours" ] || { echo "error: build first: cargo build --release -p harness" >&2; exit 2; }
[ -f "$model" ] || { echo "error: $model is missing: run scripts/fetch-models.sh" >&2; exit 2; }
llama=""
for b in native avx512 avx2; do
    if [ -x "target/peers/llama.cpp/build-$b/bin/llama-bench" ]; then
        llama="target/peers/llama.cpp/build-$b/bin/llama-bench"
        break
    fi
done
gen=(generate --model "$model" --prompt "The history of the city" --max-new-tokens 256 --format json)
# tokens/s, and for our builds that report it, the share of parallel regions the team ran
# solo because it found the machine busy.
tok() {
    "$@" 2>/dev/null | python3 -c 'import json,sys
d = json.load(sys.stdin); t = d.get("team")
solo = "" if t is None else "(solo %.0f%%)" % (100.0 * t["solo_regions"] / max(t["regions"], 1))
print("%.1f%s" % (d["tokens_per_s"], solo))'
}
bench() {
    [ -n "$llama" ] || { echo "-"; return; }
    "$llama" -m "$model" -t "$1" -p 0 -n 128 -r 1 -o csv 2>/dev/null |
        python3 -c 'import sys,csv; print("%.1f" % float(list(csv.DictReader(sys.stdin))[0]["avg_ts"]))'
}
hog=""
trap '[ -n "$hog" ] && kill "$hog" 2>/dev/null || true' EXIT
for round in $(seq 1 "$rounds"); do
    for cond in quiet busy; do
        if [ "$cond" = busy ]; then
            yes > /dev/null &
            hog=$!
            sleep 1
        fi
        t1=$(tok "$ours" "${gen[@]}" --threads 1)
        t2=$(tok "$ours" "${gen[@]}" --threads 2)
        fixed=$(WORKBENCH_TEAM=fixed tok "$ours" "${gen[@]}" --threads 2)
        before="-"
        [ -n "${BEFORE:-}" ] && before=$(tok "$BEFORE" "${gen[@]}" --threads 2)
        l1=$(bench 1)
        l2=$(bench 2)
        echo "round $round $cond: ours_1t $t1 ours_2t $t2 ours_2t_fixed $fixed before_2t $before llamacpp_1t $l1 llamacpp_2t $l2"
        if [ "$cond" = busy ]; then
            kill "$hog"
            wait "$hog" 2>/dev/null || true
            hog=""
        fi
    done
done
