#!/usr/bin/env bash
# The GPU benchmarks (ours against timm, torchvision and Hugging Face), in phases that each fit a command of under
# ten minutes on a machine with a time limit. docs/benchmarks.md, "GPU runbook", says what each phase measures and
# how to read the result.
#
# Phase 1 (budget 420 s, so the command ends in about 7.5 min) holds every performance target; phase 2 gets the
# time left (BUDGET_S=<seconds left minus 120>) on the same machine; phase 3 runs later, on another machine if need
# be (SKIP= what phases 1 and 2 finished).
#
#   bash scripts/gpu_bench.sh 1           phase 1: bf16 inference end to end (the targets): 8 models x 4 backends
#                                           vs timm eager / compiled (HF for ViTDet), DeiT-Ti / Swin-T compiled, iGPT
#   BUDGET_S=300 bash scripts/gpu_bench.sh 2
#                                           phase 2: per-mechanism backends, bf16 training, fp32 inference, natten
#   bash scripts/gpu_bench.sh 3           leftovers (run later): fp32 training, mechanisms in training
#   bash scripts/gpu_bench.sh all         1, 2 and 3 in a row (not in one device command: over 20 min)
#   bash scripts/gpu_bench.sh 1 --smoke   the same steps on CPU at tiny sizes (SMOKE=1 works too; minutes)
#
# Environment: OUT (default ./gpu_out), PYTHON (default python3; e.g. /tmp/ref/bin/python for a smoke run here),
# BUDGET_S (seconds a phase may start steps in; default 420, smoke 200; a step is cut at the budget, so a phase
# ends within about BUDGET_S + 20 s), SKIP (comma-separated step names not to run: those an earlier phase finished;
# phase 3 repeats the tails of phases 1 and 2 for what their budget cut).
# Every phase writes under $OUT/phaseN/: one log and (where the tool has one) one JSON per step, steps.tsv (each
# step's status, seconds and command) and summary.md; $OUT/gpu_report.md is the table over every phase run so far.
# A step that fails or times out is recorded and the phase goes on; a step that would start past the budget is
# recorded as skipped.
set -u

PHASE=""
SMOKE=${SMOKE:-0}
for arg in "$@"; do
  case "$arg" in
    --smoke) SMOKE=1 ;;
    1|2|3|all) PHASE=$arg ;;
    -h|--help) sed -n 2,26p "$0"; exit 0 ;;
    *) echo "gpu_bench.sh: unknown argument '$arg' (expected a phase 1, 2, 3 or all, and optionally --smoke)" >&2
       exit 2 ;;
  esac
done
if [ -z "$PHASE" ]; then
  echo "gpu_bench.sh: give a phase: 1, 2, 3 or all (each phase is one device command; --help)" >&2
  exit 2
fi

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT" || exit 2
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
PY=${PYTHON:-python3}
OUT=${OUT:-./gpu_out}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
VA=("$PY" -m vit_attention.cli)

if [ "$SMOKE" = 1 ]; then
  BUDGET_S=${BUDGET_S:-200}
  DEV=cpu
  # one thread: on a shared CPU every parallel region's barrier waits for a descheduled thread (a tiny model's
  # training step took 2.5 s with 2 threads at load 3.7, 0.05 s with one; docs/benchmarks.md, "Compiled against eager on CPU")
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
  # every family in its reduced form, batch 2, one round: proves each step runs, measures nothing
  BENCH=(--device cpu --batch-size 2 --rounds 1 --iters 1 --warmup 0 --peak-size 64 --compile-backend eager
         --keep-going --recompile-limit 64)
  REDUCED=(--reduced)        # end to end: each family's reduced form (timm's weights then do not fit: "unavailable");
  #                            the compiled DeiT-Ti / Swin-T steps run the real models, vs timm for real
  VITDET_INFER=(--batch-size 2); VITDET_TRAIN=(--batch-size 2)
  RO=()                      # the eager compile backend takes no mode
  MECH=(--device cpu --smoke --batch 2 --rounds 1 --iters 1 --warmup 1)
  LOCAL=(--sizes 14 --dilations 1 2 --rounds 1)
  IGPT=(igpt_digits --num 2 --device cpu)
  IGPT_MODE=default
  MIN_S=5
else
  BUDGET_S=${BUDGET_S:-420}
  DEV=cuda
  BENCH=(--device cuda --batch-size 64 --rounds 3 --iters 5 --warmup 2 --keep-going --recompile-limit 64)
  REDUCED=()
  # ViTDet-B at 1024 (4,096 tokens): HF's eager global attention materialises [B*12, 4096, 4096] scores and
  # their softmax; batch 64 does not fit 80 GB, so 16 for inference and 4 for training (fewer iterations too)
  VITDET_INFER=(--batch-size 16 --iters 3); VITDET_TRAIN=(--batch-size 4 --iters 3)
  RO=(--compile-mode reduce-overhead)
  MECH=(--device cuda --batch 64 --rounds 3 --iters 10 --warmup 2)
  LOCAL=(--sizes 56 112 --dilations 1 4 --rounds 3)
  IGPT=(igpt_small --num 8 --device cuda)  # the uncached reference reruns the whole prefix: O(N^2), 1,024 tokens
  IGPT_MODE=reduce-overhead  # CUDA graphs of the one-token step
  MIN_S=30
fi
BACKENDS=auto,flex,sdpa,explicit

PD=""
PHASE_T0=0

# step NAME LIMIT_S CMD...: run CMD with stdout+stderr in $PD/NAME.log under a timeout (the smaller of LIMIT_S and
# what is left of the phase budget); record "NAME<TAB>status<TAB>rc<TAB>seconds<TAB>command" in $PD/steps.tsv.
step() {
  local name=$1 limit=$2
  shift 2
  local left=$((BUDGET_S - (SECONDS - PHASE_T0)))
  local cmd
  cmd=$(printf '%q ' "$@")
  cmd=${cmd//"$ROOT"/.}
  cmd=${cmd//"$OUT"/\$OUT}
  if [[ ",${SKIP:-}," == *",$name,"* ]]; then
    printf '%s\tskipped (SKIP)\t-\t0\t%s\n' "$name" "$cmd" >> "$PD/steps.tsv"
    echo "== $name: skipped (in SKIP)"
    return 0
  fi
  if [ "$left" -lt "$MIN_S" ]; then
    printf '%s\tskipped (phase budget)\t-\t0\t%s\n' "$name" "$cmd" >> "$PD/steps.tsv"
    echo "== $name: skipped (phase budget of ${BUDGET_S} s spent)"
    return 0
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  echo "== $name (limit ${limit} s): $cmd"
  local t0=$SECONDS rc status
  timeout -k 10 "$limit" "$@" > "$PD/$name.log" 2>&1
  rc=$?
  case $rc in
    0) status=ok ;;
    124|137) status="timed out (${limit} s)" ;;
    *) status="failed (rc $rc)" ;;
  esac
  printf '%s\t%s\t%s\t%s\t%s\n' "$name" "$status" "$rc" "$((SECONDS - t0))" "$cmd" >> "$PD/steps.tsv"
  echo "   $status in $((SECONDS - t0)) s"
  [ "$rc" = 0 ] || tail -n 5 "$PD/$name.log" | sed 's/^/   | /'
  return 0
}

env_step() {
  step env 60 "$PY" -m vit_attention.bench.gpu_report --env "$PD/env.json"
}

# bench NAME MODEL PRECISION MODE EXTRA...: one `vit-attention bench` run, its JSON in $PD/bench/NAME.json
# (MODEL may be several names separated by spaces)
bench() {
  local name=$1 prec=$3 mode=$4
  local -a models
  read -r -a models <<< "$2"
  shift 4
  local amp=()
  [ "$prec" = bf16 ] && amp=(--amp bf16)
  step "$name" "${LIMIT:-150}" "${VA[@]}" bench "${models[@]}" "${BENCH[@]}" --mode "$mode" "${amp[@]}" "$@" \
    --json "$PD/bench/$name.json"
}

# e2e PRECISION MODE MODEL...: each model on the four backends vs its references
e2e() {
  local prec=$1 mode=$2
  shift 2
  local m short cmp extra
  if [ "$SMOKE" = 1 ]; then  # one process for all (reduced) models: the smoke run is about the steps, not the timing
    bench "e2e_${prec}_${mode}_${1%%_*}" "$*" "$prec" "$mode" --attn-backend "$BACKENDS" --compare timm,hf \
      "${REDUCED[@]}"
    return
  fi
  for m in "$@"; do
    extra=()
    case $m in
      swin_tiny*) short=swin_t; cmp=timm,timm-compiled ;;
      swinv2_tiny*) short=swinv2_t; cmp=timm,timm-compiled ;;
      deit_tiny*) short=deit_ti; cmp=timm,timm-compiled ;;
      halonet26t) short=halonet26t; cmp=timm,timm-compiled ;;
      # no reference anywhere that runs here: timm has none of the three, transformers has no NAT / ViL and its
      # DiNAT needs natten (not on the device); `--compare timm,hf` would only add the notes saying so
      nat_tiny) short=nat_t; cmp="" ;;
      dinat_tiny) short=dinat_t; cmp="" ;;
      vil_small) short=vil_s; cmp="" ;;
      vitdet_base*) short=vitdet_b; cmp=hf
         if [ "$mode" = train ]; then extra=("${VITDET_TRAIN[@]}"); else extra=("${VITDET_INFER[@]}"); fi ;;
      *) short=$m; cmp=timm,timm-compiled ;;
    esac
    if [ "$mode" = train ]; then
      # flex's backward compiles in the warm-up; timm compiled for training (its own AOT-autograd compile) is a
      # separate step (phase 3), so that a slow compile cannot time out the step holding the eager figures
      [ "$SMOKE" != 1 ] && extra+=(--warmup 1)
      cmp=${cmp/,timm-compiled/}
    fi
    # a step that times out loses its model's rows: a generous limit (the phase budget bounds the phase)
    LIMIT=200 \
      bench "${short}_${prec}_${mode}" "$m" "$prec" "$mode" --attn-backend "$BACKENDS" --compare "$cmp" \
      "${REDUCED[@]}" "${extra[@]}"
  done
}

igpt() {
  local help
  help=$("${VA[@]}" generate --help 2>&1)
  if grep -qE -- "--compile MODE" <<< "$help" && grep -qE -- "--static-cache" <<< "$help"; then
    # one run prints every figure: the dynamic cache, no cache, the static cache eager, and the compiled one-token
    # step over the static cache (CUDA graphs on a GPU); the image grid itself is sampled by the compiled step
    step igpt_sampling 200 "${VA[@]}" generate "${IGPT[@]}" --bench --static-cache --compile "$IGPT_MODE" \
      --output "$PD/igpt.png"
  else  # a checkout without the integrator's compiled / static-cache mode
    step igpt_sampling 150 "${VA[@]}" generate "${IGPT[@]}" --bench --output "$PD/igpt.png"
  fi
}

summary() {
  "$PY" -m vit_attention.bench.gpu_report "$PD" --markdown "$PD/summary.md" > /dev/null 2> "$PD/summary.err" \
    || echo "summary of $PD failed: $(tail -n 3 "$PD/summary.err")"
  "$PY" -m vit_attention.bench.gpu_report "$OUT" --markdown "$OUT/gpu_report.md" > /dev/null 2>> "$PD/summary.err" \
    || echo "summary of $OUT failed"
  echo "== phase $1 done in $((SECONDS - PHASE_T0)) s: $PD/summary.md, $OUT/gpu_report.md"
  cut -f1,2,4 "$PD/steps.tsv" | column -t -s $'\t' 2>/dev/null || cut -f1,2,4 "$PD/steps.tsv"
}

start_phase() {
  PD="$OUT/phase$1"
  mkdir -p "$PD/bench"
  : > "$PD/steps.tsv"
  PHASE_T0=$SECONDS
  echo "== phase $1 ($([ "$SMOKE" = 1 ] && echo smoke, CPU || echo GPU)), budget ${BUDGET_S} s, output $PD"
  if [ "$SMOKE" != 1 ] && ! "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    echo "gpu_bench.sh: no CUDA device visible to $PY (use --smoke on a CPU machine)" >&2
    exit 3
  fi
}

phase1() {
  start_phase 1
  env_step
  # the steps that carry the performance targets first, the short ones before ViTDet-B at 1024 (HF's eager global
  # attention over 4,096 tokens and four backends of ours: the longest step): Swin-T, DeiT-Ti eager and compiled,
  # iGPT, then ViTDet vs HF
  e2e bf16 infer swin_tiny_patch4_window7_224 deit_tiny_patch16_224
  # launch-bound DeiT-Ti: ours compiled with CUDA graphs vs timm eager and timm compiled alike
  bench deit_ti_bf16_infer_compiled deit_tiny_patch16_224 bf16 infer --compile "${RO[@]}" --compare timm,timm-compiled
  igpt
  e2e bf16 infer vitdet_base_patch16_1024
  # ours compiled vs timm compiled (the like-for-like reading of "Swin-T >= 1.0x timm compiled")
  bench swin_t_bf16_infer_compiled swin_tiny_patch4_window7_224 bf16 infer --compile --compare timm,timm-compiled
  e2e bf16 infer nat_tiny dinat_tiny swinv2_tiny_window8_256 halonet26t vil_small
  summary 1
}

phase2() {
  start_phase 2
  env_step
  step mechanisms_bf16_infer 120 "$PY" -m vit_attention.bench.mechanisms "${MECH[@]}" --amp bf16 --mode infer \
    --json "$PD/mechanisms_bf16_infer.json" --markdown "$PD/mechanisms_bf16_infer.md"
  # the headline models first in each precision / mode, then the others (what the budget cuts is the tail)
  e2e bf16 train swin_tiny_patch4_window7_224 deit_tiny_patch16_224 nat_tiny vitdet_base_patch16_1024
  e2e fp32 infer swin_tiny_patch4_window7_224 deit_tiny_patch16_224 vitdet_base_patch16_1024 nat_tiny
  step natten_local 60 "$PY" -m vit_attention.bench.local "${LOCAL[@]}" --json "$PD/natten_local.json"
  e2e bf16 train swinv2_tiny_window8_256 dinat_tiny halonet26t vil_small
  e2e fp32 infer swinv2_tiny_window8_256 dinat_tiny halonet26t vil_small
  summary 2
}

phase3() {
  start_phase 3
  env_step
  # the tails of phases 1 and 2 again (SKIP= the steps they finished), then what no other phase has
  e2e bf16 infer nat_tiny dinat_tiny swinv2_tiny_window8_256 halonet26t vil_small
  e2e bf16 train swinv2_tiny_window8_256 dinat_tiny halonet26t vil_small
  e2e fp32 infer swinv2_tiny_window8_256 dinat_tiny halonet26t vil_small
  step mechanisms_bf16_train 150 "$PY" -m vit_attention.bench.mechanisms "${MECH[@]}" --amp bf16 --mode train \
    --json "$PD/mechanisms_bf16_train.json" --markdown "$PD/mechanisms_bf16_train.md"
  step mechanisms_fp32_infer 120 "$PY" -m vit_attention.bench.mechanisms "${MECH[@]}" --mode infer \
    --json "$PD/mechanisms_fp32_infer.json" --markdown "$PD/mechanisms_fp32_infer.md"
  e2e fp32 train swin_tiny_patch4_window7_224 deit_tiny_patch16_224 nat_tiny vitdet_base_patch16_1024
  # training vs timm compiled (ours on its default backend)
  bench swin_t_bf16_train_compiled swin_tiny_patch4_window7_224 bf16 train --warmup 1 --compare timm,timm-compiled
  bench deit_ti_bf16_train_compiled deit_tiny_patch16_224 bf16 train --warmup 1 --compare timm,timm-compiled
  summary 3
}

case $PHASE in
  1) phase1 ;;
  2) phase2 ;;
  3) phase3 ;;
  all) phase1; phase2; phase3 ;;
esac
exit 0
