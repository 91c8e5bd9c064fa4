#!/usr/bin/env bash
# Everything a GPU machine is needed for, in one command: the machine, the CUDA tests, the GPU
# benchmark (bare model loop, python -m yolo, the pipeline matrix) and the CPU scaling benchmark.
#
#   bash benchmarks/gpu_check.sh                 # all steps, --device cuda
#   bash benchmarks/gpu_check.sh tests gpu       # only these steps (env, tests, gpu, cores)
#   bash benchmarks/gpu_check.sh --dry           # the same steps on the CPU, tiny runs: checks the script
#
# Wheels in .whl/ (packages the GPU machine lacks, e.g. pyzmq, setproctitle, pycocotools) are
# installed into /tmp/site first, where those packages are missing. The fixtures come from ../shared/fixtures, or from
# .gpu/fixtures where ../shared does not travel. Output goes to $OUT (default results/gpu-check):
# env.txt, tests.log, gpu.log + gpu.json, cores.log + cores.json. Each step has its own time
# limit (seconds, overridable: TESTS_S, GPU_S, CORES_S); a failed step does not stop the next.
# TESTS=paths narrows the CUDA tests, ONLY=keys the GPU benchmark's contenders (bench_gpu.py --only;
# by default the issue-30 set: the bare loop, python -m yolo, batch 1 and 32 on the device data path,
# batch 32 and 1 on the host path, the design card's command, and --cuda-graphs at batch 1 and 32;
# ONLY=all runs every contender).
#
# Before sending the tree to a GPU machine that has no package index (both folders are ignored):
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#     --platform manylinux1_x86_64 --platform manylinux_2_5_x86_64 -d .whl pyzmq setproctitle pycocotools
#   mkdir -p .gpu/fixtures && cp ../shared/fixtures/* .gpu/fixtures/   # (.gpu/ in .git/info/exclude)
set -u
cd "$(dirname "$0")/.."
DEVICE=cuda
DRY=()
STEPS=()
for arg in "$@"; do
  case "$arg" in
    --dry) DEVICE=cpu; DRY=(--dry) ;;
    env|tests|gpu|cores) STEPS+=("$arg") ;;
    *) echo "error: expected --dry or steps among env, tests, gpu, cores; got '$arg'" >&2; exit 2 ;;
  esac
done
[ ${#STEPS[@]} -eq 0 ] && STEPS=(env tests gpu cores)
OUT=${OUT:-results/gpu-check}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1

if compgen -G ".whl/*.whl" >/dev/null && ! "$PY" -c "import zmq, setproctitle, pycocotools" 2>/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "error: the wheels in .whl/ did not install" >&2; exit 1; }
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
if [ ! -d ../shared/fixtures ] && [ -d .gpu/fixtures ]; then
  mkdir -p ../shared && ln -sfn "$PWD/.gpu/fixtures" ../shared/fixtures
fi

wants() { [[ " ${STEPS[*]} " == *" $1 "* ]]; }
status=0

if wants env; then
  {
    date -u
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1 || echo "no nvidia-smi"
    "$PY" -c "import torch, torchvision, cv2, zmq; print('torch', torch.__version__, 'torchvision', torchvision.__version__,
'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version(), 'gpus', torch.cuda.device_count(),
'opencv', cv2.__version__, 'pyzmq', zmq.__version__)"
    echo "cores usable: $(nproc)"; grep -m1 'model name' /proc/cpuinfo
    grep -m1 -o -w -E 'avx512_bf16|amx_bf16|amx_tile|avx512f|avx2' /proc/cpuinfo | sort -u | tr '\n' ' '; echo
    df -h /dev/shm | tail -1; free -g | head -2
  } > "$OUT/env.txt" 2>&1
  cat "$OUT/env.txt"
fi

if wants tests; then
  echo "== CUDA tests (pytest -m gpu)"
  # shellcheck disable=SC2086  # TESTS: test paths, split on purpose
  timeout "${TESTS_S:-240}" "$PY" -m pytest -q -m gpu -p no:cacheprovider ${TESTS:-} > "$OUT/tests.log" 2>&1 || status=1
  tail -25 "$OUT/tests.log"
fi

if wants gpu; then
  echo "== GPU benchmark"
  [ "${ONLY:-}" = all ] && ONLY=""
  if [ -z "${ONLY+set}" ]; then
    if [ "$DEVICE" = cuda ]; then B1=1 BT=32 H=fp16; else B1=1 BT=2 H=fp32; fi
    grep -q -w -E 'avx512_bf16|amx_bf16' /proc/cpuinfo && [ "$DEVICE" != cuda ] && H=bf16
    ONLY="bare,yolo_$H,pipe_b${B1}_$H,pipe_b${BT}_${H}_host,pipe_b${BT}_${H}_device,pipe_b1_${H}_hostb1,card"
    [ "$DEVICE" = cuda ] && ONLY="$ONLY,pipe_b1_${H}_graphs,pipe_b${BT}_${H}_graphs"
  fi
  timeout "${GPU_S:-360}" "$PY" benchmarks/bench_gpu.py --device "$DEVICE" --budget-s $(( ${GPU_S:-360} - 60 )) \
    --out "$OUT/gpu.json" ${ONLY:+--only "$ONLY"} "${DRY[@]}" > "$OUT/gpu.log" 2>&1 || status=1
  grep -v '^round ' "$OUT/gpu.log" | tail -60
fi

if wants cores; then
  echo "== CPU scaling benchmark"
  CORES=$(nproc); LIST=""
  for n in 2 4 8 16 32 64; do [ "$n" -lt "$CORES" ] && [ "$n" -ge 4 ] && LIST="$LIST$n,"; done
  timeout "${CORES_S:-200}" "$PY" benchmarks/bench_cores.py --cores "${LIST}${CORES}" --budget-s $(( ${CORES_S:-200} - 50 )) \
    --out "$OUT/cores.json" "${DRY[@]}" > "$OUT/cores.log" 2>&1 || status=1
  grep -v '^round ' "$OUT/cores.log" | tail -15
fi
exit $status
