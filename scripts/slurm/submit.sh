#!/usr/bin/env bash
# Submits a workbench sweep to Slurm: an array of N tasks (scripts/slurm/sweep.sbatch, one
# shard each) and a merge job that runs once every task has succeeded
# (--dependency=afterok), writing results/<exp>/<sweep-id>.{csv,json,md,svg}.
#   scripts/slurm/submit.sh NAME N [harness exp arguments]
#   scripts/slurm/submit.sh flash_vs_paged 8 --set dtype=f32,bf16
# `harness plan` checks the request and names the sweep first (nothing is queued if it is
# bad). Run from the checkout, on a filesystem the compute nodes share. Environment:
# WORKBENCH_HARNESS (default target/release/harness here; build it first), WORKBENCH_CPUS
# (CPUs per task, default 1), WORKBENCH_DEVICE=cuda (each task gets --gres=gpu:1 and
# --device cuda), WORKBENCH_SLURM_LOGS (default target/slurm-logs), and Slurm's own SBATCH_*
# variables (SBATCH_PARTITION, SBATCH_ACCOUNT, SBATCH_TIMELIMIT, ...). Prints the sweep id
# and both job ids on the last line.
set -euo pipefail
usage="usage: submit.sh NAME N [harness exp arguments]"
name=${1:?$usage}
n=${2:?$usage}
shift 2
if ! [[ $n =~ ^[1-9][0-9]*$ ]]; then
    echo "error: N must be a positive integer, got '$n' ($usage)" >&2
    exit 2
fi
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
harness=${WORKBENCH_HARNESS:-$PWD/target/release/harness}
if [ ! -x "$harness" ]; then
    echo "error: no harness binary at $harness: cargo build --release -p harness (or set WORKBENCH_HARNESS)" >&2
    exit 2
fi
# The merge reads and writes the folders the shards use.
merge_args=()
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
    case ${args[i]} in
    --results-dir | --experiments-dir) merge_args+=("${args[i]}" "${args[i + 1]:-}") ;;
    --results-dir=* | --experiments-dir=*) merge_args+=("${args[i]}") ;;
    esac
done
plan=$("$harness" plan "$name" --shards "$n" "$@")
echo "$plan" >&2
id=$(sed -n 's/^sweep id: //p' <<<"$plan")
logs=${WORKBENCH_SLURM_LOGS:-$PWD/target/slurm-logs}
mkdir -p "$logs"
gres=()
if [ "${WORKBENCH_DEVICE:-cpu}" = cuda ]; then
    gres=(--gres=gpu:1)
fi
array=$(sbatch --parsable --array="0-$((n - 1))" --cpus-per-task="${WORKBENCH_CPUS:-1}" "${gres[@]}" \
    --output="$logs/%x-%A_%a.out" \
    --export="ALL,WORKBENCH_HARNESS=$harness,WORKBENCH_SHARDS=$n" \
    "$here/sweep.sbatch" "$name" --sweep-id "$id" "$@")
array=${array%%;*}
merge=$(sbatch --parsable --dependency="afterok:$array" --job-name=workbench-merge \
    --output="$logs/%x-%j.out" \
    --wrap="$(printf '%q ' "$harness" merge "$id" "${merge_args[@]}")")
merge=${merge%%;*}
echo "sweep $id: array job $array ($n shards), merge job $merge"
