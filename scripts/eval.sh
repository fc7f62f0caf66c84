#!/usr/bin/env bash
# Regenerate docs/evaluation.md's numbers and plots (`make eval`; takes many minutes).
#
#   pack:   every openb pod list, 10 seeds (42..51), every policy side by side (tessera, fgd,
#           best-fit, random, fcfs-device: ~2 minutes for all four lists on 2 cores);
#   replay: generated two-day workloads on ~600 GPUs at load 1.0 and 1.2, every policy, with quotas
#           (tessera's start estimates scored too: --eta);
#   seeds:  the replay targets on workload seeds 1..5 (tessera and fcfs-device);
#   adjust: tessera with `replay --adjust off` and `on` on workload seeds 1 and 2 at both loads (the
#           adjustment pass's table, printed and written to docs/evaluation.md);
#   then the tables, the plots and the targets are written into docs/evaluation.md (between its
#   <!-- eval:... --> markers) and docs/eval/*.png.
#
# Knobs (environment): TESSERA_TRACES or OPENB (where the openb traces are), EVAL_OUT (default
# build/eval), EVAL_SEEDS (10), EVAL_PROCESSES (CPUs), EVAL_PACK_POLICIES, EVAL_REPLAY_POLICIES, EVAL_LISTS (openb list names), EVAL_SKIP_PACK=1,
# EVAL_SKIP_REPLAY=1, EVAL_WORKLOAD_SEED (1), EVAL_LOADS ("1.0 1.2"), EVAL_RESUME=1 (keep the runs
# already in EVAL_OUT and do only the missing ones), EVAL_MATRIX_SEEDS ("1-5": tessera and
# fcfs-device on each of these workload seeds), EVAL_SKIP_SEEDS=1, EVAL_ADJUST_SEEDS ("1,2"),
# EVAL_SKIP_ADJUST=1.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
OUT=${EVAL_OUT:-build/eval}
# The openb traces (README.md, "Traces"): OPENB, or TESSERA_TRACES/openb.
OPENB=${OPENB:-${TESSERA_TRACES:+$TESSERA_TRACES/openb}}
if [ "${EVAL_SKIP_PACK:-0}" != 1 ] && [ ! -f "${OPENB:-/nonexistent}/nodes.csv" ]; then
  echo "eval.sh: the packing benchmark needs the openb traces: set TESSERA_TRACES=DIR (the folder" >&2
  echo "holding openb/) or OPENB=DIR; README.md, \"Traces\", says where to get them." >&2
  echo "EVAL_SKIP_PACK=1 runs the rest without them." >&2
  exit 2
fi
SEEDS=${EVAL_SEEDS:-10}
PROCS=${EVAL_PROCESSES:-$(nproc 2>/dev/null || echo 2)}
PACK_POLICIES=${EVAL_PACK_POLICIES:-tessera,fgd,best-fit,random,fcfs-device}
REPLAY_POLICIES=${EVAL_REPLAY_POLICIES:-tessera,greedy-quota,greedy,fcfs-device,fcfs-node,best-fit,fgd,random}
LISTS=${EVAL_LISTS:-jobs jobs_gpushare100 jobs_multigpu50 jobs_gpuspec20}
WSEED=${EVAL_WORKLOAD_SEED:-1}
LOADS=${EVAL_LOADS:-1.0 1.2}
mkdir -p "$OUT"
status=0

if [ "${EVAL_SKIP_PACK:-0}" != 1 ]; then
  for list in $LISTS; do
    if [ "${EVAL_RESUME:-0}" = 1 ] && [ -f "$OUT/pack-$list/compare.md" ]; then continue; fi
    echo "== pack $list ($SEEDS seeds: $PACK_POLICIES)" >&2
    "$PY" -m scheduling.sim pack --nodes "$OPENB/nodes.csv" --jobs "$OPENB/$list.csv" \
      --compare "$PACK_POLICIES" --out "$OUT/pack-$list" --seeds "$SEEDS" --processes "$PROCS" \
      || status=1
  done
fi

if [ "${EVAL_SKIP_REPLAY:-0}" != 1 ]; then
  IFS=, read -ra policies <<< "$REPLAY_POLICIES"
  for load in $LOADS; do
    echo "== replay at load $load ($REPLAY_POLICIES)" >&2
    "$PY" -m scheduling.sim generate --out "$OUT/workload-$load" --seed "$WSEED" --days 2 --load "$load"
    for policy in "${policies[@]}"; do
      run="$OUT/replay-$load/$policy"
      if [ "${EVAL_RESUME:-0}" = 1 ] && [ -f "$run/summary.json" ]; then continue; fi
      "$PY" -m scheduling.sim replay --nodes "$OUT/workload-$load/nodes.csv" \
        --jobs "$OUT/workload-$load/jobs.csv" --quotas "$OUT/workload-$load/quotas.csv" \
        --policy "$policy" --out "$run" $([ "$policy" = tessera ] && echo --eta) || status=1
    done
    "$PY" -c "import sys; from scheduling.sim.runner import write_replay_compare as w; \
w(sys.argv[1], sys.argv[2].split(','), sys.argv[3])" "$OUT/replay-$load" "$REPLAY_POLICIES" \
      "replay workload-$load (seed $WSEED)"
  done
fi

if [ "${EVAL_SKIP_SEEDS:-0}" != 1 ]; then
  # The replay targets on several workloads (tessera and the JCT baseline only): a policy that
  # meets them on one seed and not the next does not meet them.
  echo "== seed matrix: seeds ${EVAL_MATRIX_SEEDS:-1-5} at loads $LOADS" >&2
  [ "${EVAL_RESUME:-0}" = 1 ] || rm -rf "$OUT/seeds"
  "$PY" -m scheduling.sim.seedmatrix "$OUT/seeds" --seeds "${EVAL_MATRIX_SEEDS:-1-5}" \
    --loads "$(echo $LOADS | tr ' ' ,)" --policies tessera,fcfs-device --processes "$PROCS" || status=1
fi

if [ "${EVAL_SKIP_ADJUST:-0}" != 1 ]; then
  # The adjustment pass: busy utilisation, JCT and lost work with --adjust on against off.
  echo "== adjust on/off: seeds ${EVAL_ADJUST_SEEDS:-1,2} at loads $LOADS" >&2
  [ "${EVAL_RESUME:-0}" = 1 ] || rm -rf "$OUT/adjust"
  "$PY" -m scheduling.sim.adjusteval "$OUT/adjust" --seeds "${EVAL_ADJUST_SEEDS:-1,2}" \
    --loads "$(echo $LOADS | tr ' ' ,)" --processes "$PROCS" || status=1
fi

"$PY" -m scheduling.sim.evaldoc docs/evaluation.md "$OUT" docs/eval
echo "docs/evaluation.md and docs/eval/ updated from $OUT" >&2
exit $status
