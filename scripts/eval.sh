#!/usr/bin/env bash
# Regenerate docs/evaluation.md's numbers and plots (`make eval`; takes many minutes).
#
#   pack:   every openb pod list, 10 seeds (42..51), every policy side by side;
#   replay: generated two-day workloads on ~600 GPUs at load 1.0 and 1.2, every policy, with quotas;
#   then the tables, the plots and the targets are written into docs/evaluation.md (between its
#   <!-- eval:... --> markers) and docs/eval/*.png.
#
# Knobs (environment): EVAL_OUT (default build/eval), EVAL_SEEDS (10), EVAL_PROCESSES (CPUs),
# EVAL_PACK_POLICIES, EVAL_REPLAY_POLICIES, EVAL_LISTS (openb list names), EVAL_SKIP_PACK=1,
# EVAL_SKIP_REPLAY=1, EVAL_WORKLOAD_SEED (1).
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
OUT=${EVAL_OUT:-build/eval}
OPENB=${OPENB:-../shared/traces/openb}
[ -d "$OPENB" ] || OPENB=/work/shared/traces/openb
SEEDS=${EVAL_SEEDS:-10}
PROCS=${EVAL_PROCESSES:-$(nproc 2>/dev/null || echo 2)}
PACK_POLICIES=${EVAL_PACK_POLICIES:-tessera,fgd,best-fit,random,fcfs-device}
REPLAY_POLICIES=${EVAL_REPLAY_POLICIES:-tessera,fcfs-node,fcfs-device,random,best-fit,fgd}
LISTS=${EVAL_LISTS:-jobs jobs_gpushare100 jobs_multigpu50 jobs_gpuspec20}
WSEED=${EVAL_WORKLOAD_SEED:-1}
mkdir -p "$OUT"
status=0

if [ "${EVAL_SKIP_PACK:-0}" != 1 ]; then
  for list in $LISTS; do
    echo "== pack $list ($SEEDS seeds: $PACK_POLICIES)" >&2
    "$PY" -m scheduling.sim pack --nodes "$OPENB/nodes.csv" --jobs "$OPENB/$list.csv" \
      --compare "$PACK_POLICIES" --out "$OUT/pack-$list" --seeds "$SEEDS" --processes "$PROCS" \
      || status=1
  done
fi

if [ "${EVAL_SKIP_REPLAY:-0}" != 1 ]; then
  for load in 1.0 1.2; do
    echo "== replay at load $load ($REPLAY_POLICIES)" >&2
    "$PY" -m scheduling.sim generate --out "$OUT/workload-$load" --seed "$WSEED" --days 2 --load "$load"
    # A non-zero exit means the checker found violations: record it, keep going.
    "$PY" -m scheduling.sim replay --nodes "$OUT/workload-$load/nodes.csv" \
      --jobs "$OUT/workload-$load/jobs.csv" --quotas "$OUT/workload-$load/quotas.csv" \
      --compare "$REPLAY_POLICIES" --out "$OUT/replay-$load" || status=1
  done
fi

"$PY" -m scheduling.sim.evaldoc docs/evaluation.md "$OUT" docs/eval
echo "docs/evaluation.md and docs/eval/ updated from $OUT" >&2
exit $status
