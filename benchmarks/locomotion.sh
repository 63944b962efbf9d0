#!/usr/bin/env bash
# PPO on MuJoCo locomotion at 300k env steps against CleanRL's defaults, seeds 1-3: one `learning.py` run per
# task and seed, all at once on a many-core machine's CPUs (the lent device's 16 cores; no GPU: CUDA hidden).
# One call per implementation, each under the device's 10-minute limit:
#   bash benchmarks/locomotion.sh m2flow Hopper-v5 Walker2d-v5 Ant-v5   # carry [".whl"]; 2 Ray CPUs per run
#   bash benchmarks/locomotion.sh sb3-cleanrl Hopper-v5 ...             # carry [".whl-peers"]; no Ray
# m2flow runs the task's preset, configs/ppo_<task>.yaml, where there is one (else configs/ppo_mujoco.yaml);
# `<task>:<variant>` runs a variant (VARIANTS below): another config, overrides of the preset, or both. The
# peers are evaluated on the grid of the task's preset (learning.py's `evaluation_grid`: m2flow computes it).
# .whl-peers holds the Python 3.12 wheels the device lacks for SB3 (stable-baselines3==2.9.2 cloudpickle pytz
# tzdata python-dateutil six pyyaml pandas gymnasium==1.4.0 farama-notifications mujoco==3.3.0 glfw; `pip download
# --only-binary=:all: --python-version 3.12 ...`) and m2flow's with pydantic's (pydantic-core annotated-types
# typing-inspection): the peers' evaluation grid is m2flow's, read from its spec. Results come back as
# $OUT/loco_<implementation>.tar.gz (loco_<implementation>_<task>[_<variant>]_<seed>.json and .log). STEPS
# (default 300000) and EVAL_EVERY (30000) set the budget and the evaluation interval; SECONDS_LIMIT (default
# 540) bounds each run, so that the archive is written inside the device's 10 minutes. The device's copy of the
# repository does not know the commit the wheel was built from: pass M2FLOW_RESULTS_COMMIT=<it> for the
# results' meta. Merge them here, per task, with
#   python benchmarks/learning.py --merge loco_*_hopper_?.json --name learning_hopper_300k
set -u
implementation=$1; shift
case $implementation in
  m2flow) wheels=.whl; run=(--skip-peers) ;;
  sb3-cleanrl) wheels=".whl .whl-peers"; run=(--skip-m2flow --peers sb3-cleanrl --peers-python python3) ;;
  *) echo "locomotion.sh: no implementation '$implementation' (m2flow or sb3-cleanrl)"; exit 2 ;;
esac
declare -A VARIANTS  # [config in configs/] [key=value ...]
VARIANTS[cleanrl]=ppo_mujoco_cleanrl.yaml
VARIANTS[halfcheetah]=ppo_mujoco.yaml
VARIANTS[one-env]="workers.env.replicas=1 workers.env.args.num_envs=1 flow.loop.horizon=2048"  # CleanRL's layout
VARIANTS[shared-obs-statistics]="workers.env.args.share_obs_statistics=true"                   # SB3's VecNormalize
site=$(mktemp -d)  # the implementation's own: two invocations may run at once
for dir in $wheels; do  # a folder not carried is skipped; a wheel an earlier folder installed is kept
  [ -d "$dir" ] || continue
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" "$dir"/*.whl || exit 1
done
export PYTHONPATH=$site:$PWD
export RAY_DEDUP_LOGS=0 OMP_NUM_THREADS=1 CUDA_VISIBLE_DEVICES="" PYTHONUNBUFFERED=1
unset MUJOCO_GL  # nothing renders here; with CUDA hidden, EGL would find no device
repo=$PWD results=$(mktemp -d)
cd "$(mktemp -d)" && ln -s "$repo/configs" configs && ln -s "$repo/benchmarks" benchmarks
for spec in "$@"; do
  task=${spec%%:*} variant=${spec#"$task"} variant=${variant#:}
  short=$(echo "${task%-*}" | tr A-Z a-z)
  options=("${run[@]}")
  if [ -n "$variant" ] && [ -z "${VARIANTS[$variant]:-}" ]; then
    echo "locomotion.sh: no variant '$variant' (${!VARIANTS[*]})"; exit 2
  fi
  read -r -a words <<< "${VARIANTS[${variant:-none}]:-}"
  config=ppo_$short.yaml overrides=()
  for word in "${words[@]}"; do
    case $word in *.yaml) config=$word ;; *) overrides+=("$word") ;; esac
  done
  # m2flow's workflow; for the peers, the one whose iteration sets the evaluation grid they share with it
  [ -f "configs/$config" ] && options+=(--config "$config")
  options+=(--set cluster.cpus=2 cluster.gpus=0 placement.pin_cpus=false "${overrides[@]}")
  for seed in ${SEEDS:-1 2 3}; do
    name="loco_${implementation}_${short}${variant:+_$variant}_$seed"
    (timeout "${SECONDS_LIMIT:-540}" python3 benchmarks/learning.py --env "$task" --steps "${STEPS:-300000}" \
       --seeds "$seed" --eval-every "${EVAL_EVERY:-30000}" --name "$name" "${options[@]}" > "$results/$name.log" 2>&1
     grep -E "^learning|seed $seed:|Error" "$results/$name.log" | sed "s/^/$name: /"
     cp "benchmarks/results/$name.json" "$results/" 2>/dev/null) &
  done
done
wait
tar -czf "$OUT/loco_$implementation.tar.gz" -C "$results" .
