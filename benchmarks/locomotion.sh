#!/usr/bin/env bash
# PPO on Hopper-v5, Walker2d-v5 and Ant-v5 at 300k env steps against CleanRL's defaults, seeds 1-3: one
# `learning.py` run per task and seed, all at once on a many-core machine's CPUs (the lent device's 16 cores;
# no GPU: CUDA hidden). One call per implementation, each under the device's 10-minute limit:
#   bash benchmarks/locomotion.sh m2flow        # carry [".whl"]: m2flow, 2 Ray CPUs per run, unpinned
#   bash benchmarks/locomotion.sh sb3-cleanrl   # carry [".whl-peers"]: SB3 and what it needs, no Ray
# .whl-peers holds the Python 3.12 wheels the device lacks for SB3 (stable-baselines3==2.9.2 cloudpickle pandas
# pytz tzdata python-dateutil six pyyaml gymnasium==1.4.0 farama-notifications mujoco==3.3.0 glfw; built with
# `pip download --only-binary=:all: --python-version 3.12 ...`). Results land in $OUT as
# loco_<implementation>_<task>_<seed>.json; merge them here with
#   python benchmarks/learning.py --merge loco_*_hopper_*.json --name learning_hopper_300k   (and the others)
set -u
implementation=$1
case $implementation in
  m2flow) wheels=.whl; run=(--skip-peers --set cluster.cpus=2 cluster.gpus=0 placement.pin_cpus=false) ;;
  sb3-cleanrl) wheels=.whl-peers; run=(--skip-m2flow --peers sb3-cleanrl --peers-python python3) ;;
  *) echo "locomotion.sh: no implementation '$implementation' (m2flow or sb3-cleanrl)"; exit 2 ;;
esac
rm -rf /tmp/site; python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $wheels/*.whl \
  && export PYTHONPATH=/tmp/site:$PWD
export RAY_DEDUP_LOGS=0 OMP_NUM_THREADS=1 CUDA_VISIBLE_DEVICES="" PYTHONUNBUFFERED=1
cd "$(mktemp -d)" && ln -s "$OLDPWD/configs" configs && ln -s "$OLDPWD/benchmarks" benchmarks
for task in Hopper-v5 Walker2d-v5 Ant-v5; do
  for seed in ${SEEDS:-1 2 3}; do
    name="loco_${implementation}_$(echo "${task%-*}" | tr A-Z a-z)_$seed"
    (timeout "${SECONDS_LIMIT:-560}" python3 benchmarks/learning.py --env "$task" --steps "${STEPS:-300000}" \
       --seeds "$seed" --eval-every 30000 --name "$name" "${run[@]}" > "$OUT/$name.log" 2>&1
     grep -E "^learning|seed $seed:|Error" "$OUT/$name.log" | sed "s/^/$name: /"
     cp "benchmarks/results/$name.json" "$OUT/" 2>/dev/null) &
  done
done
wait
