#!/usr/bin/env bash
# PPO preset variants x seeds on HalfCheetah-v5, in parallel on a many-core machine's CPUs (the device's
# 16 cores): one `learning.py --skip-peers` run per variant and seed, each on 2 Ray CPUs, unpinned, no GPU.
# A guide for choosing a preset (one run per seed), not a benchmark of record. On the device, carry
# [".whl", ".gl"]:  bash benchmarks/preset_sweep.sh zoo:1 zoo:2 mb256lr1e4:1 ...
# Prints `<variant>: m2flow seed <s>: <return> at 100000 steps` and the per-run summary line; logs in $OUT.
set -u
rm -rf /tmp/site; python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD
export RAY_DEDUP_LOGS=0 OMP_NUM_THREADS=1
cd "$(mktemp -d)" && ln -s "$OLDPWD/configs" configs && ln -s "$OLDPWD/benchmarks" benchmarks
common="cluster.cpus=2 cluster.gpus=0 placement.pin_cpus=false"
actor=workers.actor.args
declare -A V
V[zoo]=""
V[mb128]="$actor.minibatch_size=128 $actor.learning_rate=4e-5"
V[mb256]="$actor.minibatch_size=256 $actor.learning_rate=6e-5"
V[mb256lr1e4]="$actor.minibatch_size=256 $actor.learning_rate=1e-4"
V[mb512]="$actor.minibatch_size=512 $actor.learning_rate=1e-4"
V[ep10]="$actor.minibatch_size=256 $actor.learning_rate=1e-4 $actor.update_epochs=10"
for spec in "$@"; do
  v=${spec%:*}; seed=${spec#*:}
  (timeout 570 python3 benchmarks/learning.py --skip-peers --seeds "$seed" --eval-every 20000 --name "sweep_${v}_$seed" \
     --set $common ${V[$v]} > "$OUT/$v-$seed.log" 2>&1; grep -E "^learning|^m2flow seed" "$OUT/$v-$seed.log" | sed "s/^/$v: /") &
done
wait
