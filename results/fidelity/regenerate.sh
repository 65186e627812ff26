#!/usr/bin/env bash
# Re-measure every profile in results/profiles and every report in results/fidelity on this machine.
# One intra-op thread and the CPU clock: the figures of a shared 2-core machine. Each command measures
# its workload's profile again (--reprofile) and rewrites results/fidelity/summary.md.
# Usage: results/fidelity/regenerate.sh [base|variants|concurrent|large|gpu|all]   (default: base, variants, concurrent)
# base: about 25 minutes; variants: about 35 minutes; concurrent: about 15 minutes (wall clock: run it on an
# idle machine); large: 50-60 minutes each and about 20 GB of memory; gpu: about 1 minute, needs a CUDA GPU.
set -euo pipefail
what="${1:-default}"
one_cpu=(--logical-cpus 1 --clock cpu --threads 1 --splits 0 --random 0 --placer none --rounds 1 --reprofile)
two_cpu=(--logical-cpus 2 --clock cpu --threads 1 --reprofile)

base() {
  for w in resnet50-b32 bert_base-12x768-s128-b8 rnnlm-2x2048-b64 inception_v3-b32 nmt-2x1024-b64; do
    placebench fidelity "$w" "${one_cpu[@]}" --methodology v1-fidelity-light
  done
}

variants() {
  placebench fidelity resnet50-b1-infer "${two_cpu[@]}"
  placebench fidelity resnet50-b1-infer --logical-cpus 2 --clock cpu --threads 1 --backend onnxruntime
  placebench fidelity inception_v3-b1-infer "${two_cpu[@]}"
  placebench fidelity bert_base-12x768-s128-b1-infer "${two_cpu[@]}"
  placebench fidelity nmt-2x1024-b64 --set batch_size=1 --mode inference "${two_cpu[@]}"
  placebench fidelity rnnlm-2x2048-b64 --set batch_size=1 --mode inference "${two_cpu[@]}"
  placebench fidelity bert_base-12x768-s128-b8 --set batch_size=2 --set num_layers=4 --set seq_len=64 "${two_cpu[@]}"
  placebench fidelity resnet50-b32 --set batch_size=2 --set image_size=112 "${two_cpu[@]}"
  placebench fidelity nmt-2x1024-b64 --set batch_size=16 --set hidden_size=256 --set src_steps=10 \
    --set tgt_steps=10 "${two_cpu[@]}"
  placebench fidelity rnnlm-2x2048-b64 --set batch_size=16 --set hidden_size=512 --set num_steps=10 \
    "${two_cpu[@]}"
}

concurrent() {
  # One thread per logical device, timed by the wall clock; its profile is a wall-clock one, kept apart
  # from the CPU-clock profiles above (one file per workload and device holds one clock).
  placebench fidelity nmt-2x1024-b64 --set batch_size=1 --mode inference --logical-cpus 2 --threads 1 \
    --concurrent on --profiles results/profiles/wall --reprofile
}

gpu() {
  # On a machine with a CUDA GPU (not run by "all"): this machine's cluster is one logical CPU and the GPU,
  # by the wall clock, one lane per device. The committed report was measured on an H200 host, 16 cores.
  placebench fidelity resnet50-b32 --set batch_size=8 --mode inference --threads 4 \
    --profiles results/profiles/gpu --reprofile
}

large() {
  for w in rnnlm-4x6144-b64 nmt-4x4096-b64; do
    placebench fidelity "$w" "${one_cpu[@]}" --methodology v1-fidelity-large
  done
}

case "$what" in
  base) base ;;
  variants) variants ;;
  concurrent) concurrent ;;
  large) large ;;
  gpu) gpu ;;
  all) base; variants; concurrent; large ;;
  default) base; variants; concurrent ;;
  *) echo "usage: $0 [base|variants|concurrent|large|gpu|all]" >&2; exit 2 ;;
esac
