#!/usr/bin/env bash
# One call on the lent GPU machine (see ../shared/device/README.md): carry [".whl", ".gl"].
# Runs the camera benchmarks with inference and training on the GPU; results land in $OUT.
# `bash benchmarks/gpu_session.sh modes` runs only the placement-modes benchmark; `backends [option]` the training
# backends benchmark (only the rows with that option); `vit` a ViT PPO run on the Megatron GPT trunk, resumed under FSDP from its checkpoint; `check` the camera
# PPO job (streamed then-edge, filmed evaluations) and the engine-overhead benchmark on 16 cores;
# `multigpu` (on nvidia-h200-x2/x4) FSDP2 and Megatron TP across the GPUs, and the placement modes;
# `hf` the GPU tests, the VLM policy on a camera rollout (hf_policy.py) and weight sync by transport;
# `pipeline` the camera workload with a ViT (SIZE, 100m unless set; MINIBATCH samples a minibatch, 2,048 unless set) acting in bf16 by mode, GPU utilisation sampled each second
# (REPLICAS, ENVS, CHUNK, STALENESS, MODES, ITERATIONS, NAME, SECONDS_LIMIT); `camera_gpu` configs/ppo_camera_gpu.yaml
# (NAME, EXTRA overrides, ITERATIONS, SECONDS_LIMIT);
# `one_off` that workload (12 x 16 envs, chunks of 16) synchronous shared S=1, then one step off by mode with auto, in one
# call: the iteration target of pipelining on one GPU (RESULTS.md, "The thirty-first session"; about 7 minutes; SIZE,
# SYNC_MODES and ONE_OFF_MODES, SYNC_SECONDS and ONE_OFF_SECONDS the two runs' limits, SUFFIX for the files' names); `ablation` the BEHAVIOR
# ablation of that family (12 x 16 envs, CHUNKS (8) chunks of 16 actions, a ViT of SIZE acting in bf16; FIRST_ROW, STAGES: a pipeline row for each stage count); `physics`
# how a core's physics slows with more simulator processes at once (physics_scaling.py) and the cores' topology;
# `accuracy` planner_accuracy.py's camera-vit-gpu sweep (WORKLOADS: another, SECONDS_LIMIT, CALIBRATING, ROUNDS; TRACES=1 keeps each run's trace); `sync` weight_sync.py (100M ViT, the
# source's and destination's part of each sync; first at the commit of .whl/before/, if there) and the CUDA IPC and checksum GPU tests (ITERATIONS);
# `contention` the act call beside EGL renderers by variant (gpu_contention.py); `overlap` a training update beside the act
# call in another process, in a thread, and at a lower stream priority (gpu_training_overlap.py); `tests` only the GPU tests (pytest -m gpu) and the
# tiled renderer's tests on EGL (TESTS_K: only those GPU tests, with tracebacks); `async` synchronous vs one-step-off PPO on HalfCheetah (benchmarks/async.py;
# STALENESS="1 2" adds k-off variants, DROP=1 each with on_stale: drop); `sac_camera` SAC from pixels (metrics.jsonl).
# Each results JSON carries a `meta` block (commit, date, machine: results_io.save_result); each copied metrics.jsonl
# gets one beside it, <stem>.meta.json, which render_results.py reads.
set -u
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export __EGL_VENDOR_LIBRARY_FILENAMES=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json MUJOCO_GL=egl
export PYOPENGL_PLATFORM=egl PYTHONUNBUFFERED=1 RAY_DEDUP_LOGS=0
rm -rf /tmp/site; python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD
# the commit the wheel was built at (`git rev-parse --short HEAD > .whl/COMMIT` when building it): the results' meta
[ -f .whl/COMMIT ] && export M2FLOW_RESULTS_COMMIT="$(cat .whl/COMMIT)"
nvidia-smi --query-gpu=name,memory.total --format=csv | tee "$OUT/gpu.txt"
echo "m2flow wheel built at ${M2FLOW_RESULTS_COMMIT:-an unrecorded commit}" | tee -a "$OUT/gpu.txt"
lscpu | grep -E "^Model name|^CPU\(s\)|MHz|BogoMIPS" | tee -a "$OUT/gpu.txt"  # lent machines of one kind differ in their cores
python3 -c "import torch, ray, mujoco; print(torch.__version__, torch.cuda.is_available(), ray.__version__, mujoco.__version__)" | tee -a "$OUT/gpu.txt"
cd "$(mktemp -d)" && ln -s "$OLDPWD/configs" configs && ln -s "$OLDPWD/benchmarks" benchmarks
if [ "${1:-all}" = backends ]; then
  timeout 500 python3 benchmarks/backends.py ${2:+--only $2} ${SIZES:+--sizes $SIZES} --out "$OUT/backends.json" 2>&1 | grep -v "WARN\|INFO\|warn" | tee "$OUT/backends.txt"
  exit 0
fi
if [ "${1:-all}" = tests ]; then
  cp -r "$OLDPWD/tests" .
  if [ -n "${TESTS_K:-}" ]; then  # only the GPU tests this -k expression selects, with their tracebacks
    timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider tests/unit/test_cuda.py -k "$TESTS_K" --tb=long 2>&1 \
      | grep -v "Warning: \|warn(" | tail -80 | tee "$OUT/gpu_tests_k.txt"  # keeps pytest's summary line
    exit 0
  fi
  timeout 400 python3 -m pytest -q -m gpu -p no:cacheprovider tests/unit/test_cuda.py 2>&1 | tail -8 | tee "$OUT/gpu_tests.txt"
  timeout 120 python3 -m pytest -q -p no:cacheprovider tests/unit/test_rendering.py 2>&1 | tail -4 | tee "$OUT/render_tests.txt"
  exit 0
fi
if [ "${1:-all}" = async ]; then
  timeout 560 python3 benchmarks/async.py --steps "${STEPS:-50000}" --seeds ${SEEDS:-1 2} --staleness ${STALENESS:-1} ${DROP:+--drop} \
    --name "${NAME:-async_halfcheetah_h200}" --out "$OUT" 2>&1 | grep -E "^(sync|[0-9]+-off( drop)?) seed|^async:|Error" | tee "$OUT/async.txt"
  exit 0
fi
if [ "${1:-all}" = sac_camera ]; then  # SAC from pixels (configs/sac_camera.yaml) for as long as the call allows
  timeout "${SECONDS_LIMIT:-530}" python3 -m m2flow.cli run configs/sac_camera.yaml run.iterations="${ITERATIONS:-600}" \
    flow.sync.1.every="${EVERY:-80}" run.checkpoint_every=0 run.progress=false run.output_dir="$OUT/runs" ${EXTRA:-} 2>&1 \
    | grep -v "WARN\|INFO\|warn" | tail -30 | tee "$OUT/sac_camera.txt"
  cp "$OUT"/runs/sac-camera/metrics.jsonl "$OUT/sac_camera_metrics.jsonl" && python3 benchmarks/results_io.py "$OUT/sac_camera_metrics.jsonl"
  rm -rf "$OUT/runs"; exit 0
fi
if [ "${1:-all}" = hf ]; then
  python3 -c "import transformers, peft, accelerate; print('transformers', transformers.__version__, 'peft', peft.__version__, 'accelerate', accelerate.__version__)" | tee -a "$OUT/gpu.txt"
  cp -r "$OLDPWD/tests" . && timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/unit/test_cuda.py 2>&1 | tail -5 | tee "$OUT/gpu_tests.txt"
  timeout 300 python3 benchmarks/hf_policy.py --size 0.7b --steps 8 --envs 16 --out "$OUT" 2>&1 | grep -E "^\{|^loop|^hf policy|Error" | tee "$OUT/hf_policy.txt"
  timeout 200 python3 benchmarks/weight_sync.py --size 100m --iterations 5 --out "$OUT" 2>&1 | grep -v "WARN\|INFO" | tail -6 | tee "$OUT/weight_sync.txt"
  rm -rf "$OUT/tmp"; exit 0
fi
if [ "${1:-all}" = sync ]; then  # weight sync of the 100M ViT by transport, where each sync goes; the CUDA IPC tests
  sync_run() {  # $1: the commit of the m2flow installed: weight_sync_<commit>.json and .log, a cost cache of its own
    M2FLOW_COST_CACHE="$(mktemp -d)" timeout 180 python3 benchmarks/weight_sync.py --size 100m --iterations "${ITERATIONS:-6}" \
      --out "$OUT" > "$OUT/weight_sync_$1.log" 2>&1
    mv "$OUT/weight_sync.json" "$OUT/weight_sync_$1.json"; grep -v "WARN\|INFO\|warn" "$OUT/weight_sync_$1.log" | tail -4
    rm -rf "$OUT/tmp"
  }
  before="$OLDPWD/.whl/before"  # an m2flow wheel of an earlier commit and its COMMIT: that commit's run first, on this machine
  if [ -f "$before/COMMIT" ]; then
    rm -rf /tmp/site_before && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site_before \
      "$before"/*.whl && PYTHONPATH="/tmp/site_before:$PYTHONPATH" M2FLOW_RESULTS_COMMIT="$(cat "$before/COMMIT")" \
      sync_run "$(cat "$before/COMMIT")"
  fi
  sync_run "${M2FLOW_RESULTS_COMMIT:-unrecorded}"
  cp -r "$OLDPWD/tests" . && timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/unit/test_cuda.py \
    -k "cuda_ipc or checksum" 2>&1 | tail -5 | tee "$OUT/sync_tests.txt"
  rm -rf "$OUT/tmp"; exit 0
fi
if [ "${1:-all}" = accuracy ]; then  # planner_accuracy.py's GPU workload: no costs declared, every candidate measured
  timeout "${SECONDS_LIMIT:-560}" python3 benchmarks/planner_accuracy.py --workloads ${WORKLOADS:-camera-vit-gpu} --iterations 4 \
    --calibration-iterations "${CALIBRATING:-9}" --rounds "${ROUNDS:-1}" ${TRACES:+--keep-traces} --out "$OUT" > "$OUT/accuracy_gpu.log" 2>&1
  grep -E "predicted .* measured|^planner accuracy|Error" "$OUT/accuracy_gpu.log" | tail -10
  if [ -d "$OUT/traces" ]; then tar czf "$OUT/traces.tgz" -C "$OUT" traces && rm -rf "$OUT/traces"; fi  # 8 files come back at most
  rm -rf "$OUT/tmp"; exit 0
fi
if [ "${1:-all}" = contention ]; then  # the act call beside EGL renderers, by variant (benchmarks/gpu_contention.py)
  ls /usr/lib/x86_64-linux-gnu | grep -i -E "osmesa|EGL_mesa|gallium|libLLVM" | tee "$OUT/mesa.txt"
  timeout 400 python3 benchmarks/gpu_contention.py --renderers ${RENDERERS:-12} --envs ${ENVS:-16} --name "${NAME:-gpu_contention}" --out "$OUT" 2>&1 | grep -v "WARN\|INFO\|warn" \
    | tail -12 | tee "$OUT/${NAME:-gpu_contention}.txt"
  exit 0
fi
if [ "${1:-all}" = overlap ]; then  # a training update beside the act call on one GPU, by process and stream priority
  timeout 400 python3 benchmarks/gpu_training_overlap.py --seconds "${SECONDS_EACH:-6}" --minibatch "${MINIBATCH:-2048}" \
    --name "${NAME:-gpu_training_overlap}" --out "$OUT" > "$OUT/${NAME:-gpu_training_overlap}.log" 2>&1
  grep -v "WARN\|INFO\|warn" "$OUT/${NAME:-gpu_training_overlap}.log" | tail -12
  exit 0
fi
if [ "${1:-all}" = one_off ]; then  # at most 8 files come back: 2 runs x (json, log), the GPU's utilisation, gpu.txt
  nvidia-smi --query-gpu=timestamp,index,utilization.gpu,memory.used --format=csv -l 1 > "$OUT/gpu_util.csv" &
  sampler=$!
  for run in "sync_shared${SUFFIX:-} ${SYNC_MODES:-shared:1} 6 0 ${SYNC_SECONDS:-110}" \
             "one_off_k1${SUFFIX:-} ${ONE_OFF_MODES:-shared:1,hybrid:2,hybrid:4,auto:auto} 7 1 ${ONE_OFF_SECONDS:-380}"; do
    set -- $run  # name, modes, iterations, staleness, seconds
    timeout "$5" python3 benchmarks/modes.py --workload camera --policy vit --size "${SIZE:-100m}" --minibatch "${MINIBATCH:-2048}" \
      --replicas 12 --envs 16 --chunk 16 \
      --staleness "$4" --horizon 64 --iterations "$3" --modes "$2" --name "$1" --out "$OUT" > "$OUT/$1.log" 2>&1
    grep -v "WARN\|INFO\|warn" "$OUT/$1.log" | grep -E "^(shared|hybrid|auto|mode)|auto picked|Error" | tail -8
    rm -rf "$OUT/tmp"
  done
  kill "$sampler"; exit 0
fi
if [ "${1:-all}" = physics ]; then  # HalfCheetah physics in 1..16 processes at once, a core each; the cores' topology
  lscpu > "$OUT/lscpu.txt"
  timeout 200 python3 benchmarks/physics_scaling.py --processes 1 2 4 8 12 16 --out "$OUT" 2>&1 | tee "$OUT/physics_scaling.txt"
  exit 0
fi
if [ "${1:-all}" = ablation ]; then
  name="simulator_ablation_cheetah_vit${SUFFIX:-}"
  timeout "${SECONDS_LIMIT:-400}" python3 benchmarks/simulator_ablation.py --task cheetah --replicas 12 --envs 16 --chunks "${CHUNKS:-8}" \
    --chunk 16 --policy vit --vit-size "${SIZE:-100m}" --iterations "${ITERATIONS:-3}" --first-row "${FIRST_ROW:-baseline}" \
    --stages ${STAGES:-2} --out "$OUT" > "$OUT/$name.log" 2>&1
  [ -n "${SUFFIX:-}" ] && mv "$OUT/simulator_ablation_cheetah_vit.json" "$OUT/$name.json"
  grep -v "WARN\|INFO\|warn" "$OUT/$name.log" | tail -12
  rm -rf "$OUT/tmp"; exit 0
fi
if [ "${1:-all}" = pipeline ]; then
  nvidia-smi --query-gpu=timestamp,index,utilization.gpu,memory.used --format=csv -l 1 > "$OUT/gpu_util.csv" &
  sampler=$!
  name="${NAME:-modes_camera_vit_bf16}"
  timeout "${SECONDS_LIMIT:-480}" python3 benchmarks/modes.py --workload camera --policy vit --size "${SIZE:-100m}" --minibatch "${MINIBATCH:-2048}" \
    --replicas "${REPLICAS:-12}" \
    --envs "${ENVS:-16}" --chunk "${CHUNK:-1}" ${STALENESS:+--staleness $STALENESS} --horizon 64 --iterations "${ITERATIONS:-4}" \
    --modes "${MODES:-shared:1,disaggregated:1,hybrid:2,hybrid:4,auto:auto}" --name "$name" --out "$OUT" > "$OUT/$name.log" 2>&1
  kill "$sampler"
  grep -v "WARN\|INFO\|warn" "$OUT/$name.log" | grep -E "render:|bound by|^(shared|hybrid|disagg|auto|mode)" | tail -24
  rm -rf "$OUT/tmp"; exit 0
fi
if [ "${1:-all}" = camera_gpu ]; then  # the GPU pipeline config as users run it: auto placement, costs measured
  name="${NAME:-ppo_camera_gpu}"  # EXTRA: more overrides (e.g. flow.async.max_staleness=1)
  timeout "${SECONDS_LIMIT:-200}" python3 -m m2flow.cli run configs/ppo_camera_gpu.yaml run.iterations="${ITERATIONS:-5}" \
    run.checkpoint_every=0 run.progress=false run.output_dir="$OUT/runs" ${EXTRA:-} 2>&1 | grep -v "WARN\|INFO\|warn" | tail -70 \
    | tee "$OUT/$name.txt"
  cp "$OUT"/runs/ppo-camera-gpu/metrics.jsonl "$OUT/${name}_metrics.jsonl" && python3 benchmarks/results_io.py "$OUT/${name}_metrics.jsonl"
  rm -rf "$OUT/runs"; exit 0
fi
if [ "${1:-all}" = multigpu ]; then  # on nvidia-h200-x2 (or x4)
  nvidia-smi --query-gpu=index,name --format=csv | tee -a "$OUT/gpu.txt"
  timeout 220 python3 benchmarks/multigpu.py --out "$OUT" 2>&1 | grep -E "^multigpu|^fsdp|^megatron|summary|FAILED|Error|error" \
    | tee "$OUT/multigpu.txt"
  [ -z "${2:-}" ] && timeout 270 python3 benchmarks/modes.py --workload camera --measure --replicas 8 --horizon 64 --iterations 4 \
    --out "$OUT" 2>&1 | grep -v "WARN\|INFO" | tail -16 | tee "$OUT/modes.txt"
  rm -rf "$OUT/tmp"; exit 0
fi
if [ "${1:-all}" = check ]; then
  timeout 200 python3 -m m2flow.cli run configs/ppo_camera.yaml run.iterations=6 flow.sync.1.every=3 workers.env.args.video.format=gif run.progress=false \
    run.output_dir="$OUT/runs" 2>&1 | grep -v "WARN\|INFO\|warn" | tail -22 | tee "$OUT/ppo_camera_check.txt"
  cp "$OUT"/runs/ppo-camera/metrics.jsonl "$OUT/ppo_camera_check_metrics.jsonl" && python3 benchmarks/results_io.py "$OUT/ppo_camera_check_metrics.jsonl"
  ls -la "$OUT"/runs/ppo-camera/videos/env/ | tee -a "$OUT/ppo_camera_check.txt"
  cp "$OUT"/runs/ppo-camera/videos/env/eval_v00003_episode0.gif "$OUT/" 2>/dev/null; rm -rf "$OUT/runs"
  timeout 330 python3 benchmarks/engine_overhead.py --out "$OUT" 2>&1 | grep -E "steps/s|m2flow/hand" | tee "$OUT/engine_overhead.txt"
  rm -rf "$OUT/tmp"; exit 0
fi
if [ "${1:-all}" = vit ]; then
  vit=(model=vit size=10m patch=12 causal=true)
  args=(configs/ppo_camera.yaml placement.mode=shared run.progress=false run.output_dir="$OUT/runs" run.checkpoint_every=1
        workers.actor.args.update_epochs=2 workers.actor.args.precision=bf16 "${vit[@]/#/workers.rollout.args.}" "${vit[@]/#/workers.actor.args.}"
        "${vit[@]/#/workers.env.args.evaluation.policy.}")
  timeout 200 python3 -m m2flow.cli run "${args[@]}" run.iterations=3 workers.actor.backend=megatron 2>&1 \
    | grep -v "WARN\|INFO\|warn" | tail -20 | tee "$OUT/vit_megatron.txt"
  timeout 200 python3 -m m2flow.cli run "${args[@]}" run.iterations=5 run.resume=true workers.actor.backend=fsdp 2>&1 \
    | grep -v "WARN\|INFO\|warn" | tail -20 | tee "$OUT/vit_resumed_fsdp.txt"
  cp "$OUT"/runs/ppo-camera/metrics.jsonl "$OUT/vit_metrics.jsonl" && python3 benchmarks/results_io.py "$OUT/vit_metrics.jsonl"
  rm -rf "$OUT/runs"; exit 0
fi
if [ "${1:-all}" = all ]; then
timeout 150 python3 benchmarks/simulator_ablation.py --task cheetah --envs 8 --chunks 8 --chunk 8 --out "$OUT" 2>&1 \
  | grep -v "WARN\|INFO" | tail -12 | tee "$OUT/ablation.txt"
fi
timeout 240 python3 benchmarks/modes.py --workload camera --measure --replicas 8 --horizon 64 --iterations 4 \
  --out "$OUT" 2>&1 | grep -v "WARN\|INFO" | tail -16 | tee "$OUT/modes.txt"
[ "${1:-all}" = all ] && timeout 150 python3 -m m2flow.cli run configs/ppo_camera.yaml run.iterations=30 placement.offload=always \
  run.progress=false run.output_dir="$OUT/runs" 2>&1 | grep -v "WARN\|INFO" | tail -25 | tee "$OUT/ppo_camera.txt"
cp "$OUT"/runs/ppo-camera/metrics.jsonl "$OUT/ppo_camera_metrics.jsonl" 2>/dev/null && python3 benchmarks/results_io.py "$OUT/ppo_camera_metrics.jsonl"
rm -rf "$OUT/runs" "$OUT/tmp"
