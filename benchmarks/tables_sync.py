"""Tables of benchmarks/RESULTS.md on weight sync: weight_sync.py by transport and by commit, and the camera
workload by the sync's transport."""

from __future__ import annotations

from results_io import Results
from tables_format import Block, count, fixed, table, times

SYNC_CPU, SYNC_H200, SYNC_X2 = "weight_sync_cpu.json", "gpu13/weight_sync.json", "gpu12/weight_sync_x2.json"
CAMERA_VIT_STORE, CAMERA_VIT = "gpu12/modes_camera_vit_store.json", "gpu12/modes_camera_vit.json"


def weight_sync(rels: list[str], res: Results) -> Block:
    """Each machine's run: object store beside the transport the placement allows, same workflow."""
    rows = []
    for rel in rels:
        data = res.json(rel)
        base = data["rows"][0]["sync_s"]
        for r in data["rows"]:
            where = ", ".join(f"{w} {'+'.join(d)}" for w, d in r["devices"].items() if w != "data")
            rows.append(
                [f"{data['gpus']} GPU(s)" if data["gpus"] else "2 CPU cores", data["size"], where, r["transport"]]
                + [f"{r['sync_s'] * 1e3:,.1f}"]
                + [times(base / r["sync_s"], 1), f"{r['sync_share']:.1%}", f"{r['bytes'] / 2**20:,.0f}"]
            )
    caption = (
        "*a ViT policy (fp32) synced actor -> rollout every iteration; median over iterations 2-5 of the sync"
        " phase (`actor.weights`, the transfer, `rollout.load_weights` with its checksum check)*"
    )
    header = ["machine", "policy", "placement", "transport", "ms / sync", "vs object store", "of the iteration", "MiB"]
    return Block([caption, "", *table(header, rows, "llllrrrr")], rels)


def weight_sync_by_commit(rels: list[str], res: Results) -> Block:
    """The same benchmark at two commits, one after the other on one machine: where each sync goes."""
    rows = []
    for rel in rels:
        data = res.json(rel)
        for r in data["rows"]:
            parts = [fixed(r[key] * 1e3, 1) for key in ("sync_s", "source_s", "destination_s")]
            rows.append([data["meta"]["commit"], r["transport"], *parts, f"{r['sync_share']:.1%}"])
    data = res.json(rels[0])
    caption = (
        f"*a ViT {data['size']} policy (fp32) synced actor -> rollout every iteration, each commit's run"
        f" after the other's on one machine; medians over iterations 2-{len(data['rows'][0]['versions'])}: the sync"
        " phase, the source's part (`actor.weights`,"
        " packing) and the destination's (receiving, the checksum check, loading), from the runs' traces*"
    )
    header = ["commit", "transport", "ms / sync", "source ms", "destination ms", "of the iteration"]
    return Block([caption, "", *table(header, rows, "llrrrr")], rels)


def camera_vit_sync(rels: list[str], res: Results) -> Block:
    """The camera workload with the 100M ViT on one H200, by the weight sync's transport and the mode."""
    rows = [r for rel in rels for r in res.rows(rel) if "measured_s" in r]
    base = next(r for r in rows if r["transport"] == "object_store")["measured_s"]
    cells = [
        [r["label"], r["transport"], fixed(r["measured_s"]), fixed(r["loop_s"]), fixed(r["sync_s"])]
        + [count(r["env_steps_per_s"]), times(base / r["measured_s"])]
        for r in sorted(rows, key=lambda r: r["transport"] != "object_store")
    ]
    args = res.json(rels[0])["args"]
    caption = (
        f"*{args['replicas']} camera simulator processes x 8 envs (84x84 RGB + proprioception, EGL on the GPU),"
        f" ViT {args['size']} policy (patch 12, causal), PPO in bf16 (1 epoch, 2 minibatches); horizon"
        f" {args['horizon']}, {args['iterations']} iterations, medians after the first; no costs declared*"
    )
    header = ["mode", "weight sync", "iteration s", "loop s", "sync s", "env steps/s", "vs object store"]
    return Block([caption, "", *table(header, cells, "llrrrrr")], rels)
