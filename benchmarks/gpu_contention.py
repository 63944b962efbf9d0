"""Why pipelining pays little on one GPU: the policy's act call beside simulator processes rendering through EGL.

The pipeline workload (`gpu_session.sh pipeline`) overlaps simulator slices with acting, yet on one H200
acting took 4x as long beside the renderers. This measures why, in one run on one machine: the 100M ViT's
act call (bf16; the S=2 slice and the whole batch) alone, then beside `--renderers` processes that each step
`--envs` HalfCheetahs and render their camera (84x84, fast profile), each pinned to a core of its own as
m2flow's launcher pins replicas, under these variants:

- `physics`: the processes step physics only (CPU load, no GPU rendering);
- `render`: they render through EGL env by env, one read-back per frame (as m2flow rendered until tiling);
- `yield`: they render with the GL driver told to sleep while it waits (`__GL_YIELD=USLEEP`);
- `low`: they render in EGL contexts created at low priority (EGL_IMG_context_priority), where offered;
- `graph`: they render as in `render`; the act call is replayed as one CUDA graph;
- `tiled`: each process renders all its envs into one frame buffer, tile by tile, and reads it back once per
  step, as m2flow's `CameraRenderer` now does (one synchronous read-back per step, not one per env).

Each variant reports the act latency (median ms) and the renderers' frames/s without and with acting.

    python benchmarks/gpu_contention.py [--renderers 12] [--envs 16] [--seconds 4] [--out benchmarks/results]

Ends with `contention: act beside renderers X.XXx alone (slice); graph ..x; tiled ..x; low ..x; yield ..x; physics ..x`.
"""

from __future__ import annotations

import argparse
import ctypes
import multiprocessing as mp
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from results_io import save_result

VIEW = {"cameras": ["track"], "modalities": ["rgb", "proprio"], "size": [84, 84]}
POLICY = {"env_id": "HalfCheetah-v5", "model": "vit", "size": "100m", "patch": 12, "causal": True, "precision": "bf16"}
FRAME_SKIP = 5
EGL_CONTEXT_PRIORITY_LEVEL_IMG, EGL_CONTEXT_PRIORITY_LOW_IMG, EGL_NONE = 0x3100, 0x3103, 0x3038
VARIANTS = ("physics", "render", "yield", "low", "tiled", "graph")
WARM_UP_CALLS = 20


def _low_priority_contexts() -> None:
    """Make mujoco's EGL contexts ask for low priority (the driver may grant it or ignore it)."""
    from mujoco.egl import egl_ext

    create = egl_ext.eglCreateContext
    attributes = (ctypes.c_int32 * 3)(EGL_CONTEXT_PRIORITY_LEVEL_IMG, EGL_CONTEXT_PRIORITY_LOW_IMG, EGL_NONE)

    def low(display, config, share, _):
        try:
            context = create(display, config, share, attributes)
        except Exception:  # noqa: BLE001 - a driver without the attribute: an ordinary context, reported as such
            context = None
        return context or create(display, config, share, None)

    egl_ext.eglCreateContext = low


def _context_priority() -> str:
    """The priority the driver gave this process's current EGL context, as EGL names it ('n/a' without the
    extension)."""
    from mujoco.egl import EGL_DISPLAY, egl_ext

    extensions = egl_ext.eglQueryString(EGL_DISPLAY, egl_ext.EGL_EXTENSIONS) or b""
    if b"EGL_IMG_context_priority" not in extensions:
        return "n/a"
    value = ctypes.c_int32()
    egl_ext.eglQueryContext(EGL_DISPLAY, egl_ext.eglGetCurrentContext(), EGL_CONTEXT_PRIORITY_LEVEL_IMG, value)
    return {0x3101: "high", 0x3102: "medium", 0x3103: "low"}.get(value.value, hex(value.value))


def simulate(core: int, variant: str, envs: int, frames, ready, stop, priority) -> None:
    """One simulator process: step `envs` HalfCheetahs and render each one's camera until `stop`; count frames."""
    os.sched_setaffinity(0, {core})
    if variant == "yield":
        os.environ["__GL_YIELD"] = "USLEEP"
    import gymnasium
    import mujoco

    from m2flow.workers.env.rendering import CameraRenderer

    xml = Path(gymnasium.__file__).parent / "envs" / "mujoco" / "assets" / "half_cheetah.xml"
    model = mujoco.MjModel.from_xml_path(str(xml))
    datas = [mujoco.MjData(model) for _ in range(envs)]
    rng = np.random.default_rng(core)
    renderer = None
    if variant == "tiled":
        renderer = CameraRenderer([model] * len(datas), VIEW["cameras"], ["rgb"], tuple(VIEW["size"]), "fast")
        render_all = renderer.render
    elif variant != "physics":
        if variant == "low":
            _low_priority_contexts()
        renderer = CameraRenderer([model], VIEW["cameras"], ["rgb"], tuple(VIEW["size"]), "fast")

        def render_all(datas: list) -> list:
            return [renderer.render([data]) for data in datas]

    if renderer is not None:
        render_all(datas)
        priority.value = _context_priority().encode()[:15]
    ready.release()
    while not stop.is_set():
        for data in datas:
            data.ctrl[:] = rng.uniform(-1, 1, model.nu)
            mujoco.mj_step(model, data, FRAME_SKIP)
        if renderer is not None:
            render_all(datas)
        with frames.get_lock():
            frames.value += envs


def act_call(batch: int, graph: bool) -> Callable[[], None]:
    """One act call on `batch` camera observations, from host arrays to host arrays, as the inference worker
    makes it (through pinned memory in, actions back; the runs recorded on 2026-12-03 copied from pageable
    memory, as the worker then did); `graph`: its forward replayed as one CUDA graph."""
    import torch

    from m2flow.workers.models.host_copy import from_host
    from m2flow.workers.rollout.torch_policy import TorchPolicyConfig

    cuda = torch.device("cuda")

    torch.manual_seed(0)
    model = TorchPolicyConfig(**POLICY, observation=VIEW).build().cuda().eval()
    h, w = VIEW["size"]
    rgb = np.random.default_rng(0).integers(0, 255, (batch, 1, h, w, 3), dtype=np.uint8)
    proprio = np.zeros((batch, 17), dtype=np.float32)
    obs = {"rgb": torch.from_numpy(rgb).cuda(), "proprio": torch.from_numpy(proprio).cuda()}
    noise = torch.zeros(batch, model.act_dim, device="cuda")

    def forward():
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False):
            return model.get_action_and_value(obs, noise=noise)

    if not graph:

        def call() -> None:
            obs["rgb"] = from_host(rgb, cuda)
            obs["proprio"] = from_host(proprio, cuda)
            action, *_ = forward()
            action.float().cpu().numpy()

        return call
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            forward()
    torch.cuda.current_stream().wait_stream(side)
    replay = torch.cuda.CUDAGraph()
    with torch.cuda.graph(replay):
        action, *_ = forward()

    def replayed() -> None:
        obs["rgb"].copy_(torch.from_numpy(rgb))
        obs["proprio"].copy_(torch.from_numpy(proprio))
        replay.replay()
        action.float().cpu().numpy()

    return replayed


def latency_ms(call: Callable[[], None], seconds: float) -> float:
    for _ in range(WARM_UP_CALLS):
        call()
    times, end = [], time.monotonic() + seconds
    while time.monotonic() < end:
        began = time.perf_counter()
        call()
        times.append(time.perf_counter() - began)
    return 1e3 * statistics.median(times)


def frames_per_s(frames, seconds: float, during: Callable[[], None] | None = None) -> float:
    before, began = frames.value, time.monotonic()
    if during is None:
        time.sleep(seconds)
    else:
        while time.monotonic() - began < seconds:
            during()
    return (frames.value - before) / (time.monotonic() - began)


def beside(variant: str, args: argparse.Namespace, cores: list[int], calls: dict[str, Callable[[], None]]) -> dict:
    """The act latency by batch and the renderers' frames/s, without and with acting, beside one simulator
    process running `variant` on each of `cores`."""
    context = mp.get_context("spawn")
    frames, ready, stop = context.Value("l", 0), context.Semaphore(0), context.Event()
    priority = context.Array("c", 16)
    procs = [
        context.Process(target=simulate, args=(core, variant, args.envs, frames, ready, stop, priority), daemon=True)
        for core in cores
    ]
    for p in procs:
        p.start()
    for _ in procs:
        if not ready.acquire(timeout=120):
            raise TimeoutError(f"{variant}: a simulator process did not start within 120 s")
    try:
        alone = frames_per_s(frames, args.seconds)
        row = {"variant": variant, "renderers": len(procs), "priority": priority.value.decode(), "fps_alone": alone}
        for name, call in calls.items():
            row[f"act_{name}_ms"] = latency_ms(call, args.seconds)
        row["fps_acting"] = frames_per_s(frames, args.seconds, next(iter(calls.values())))
        return row
    finally:
        stop.set()
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--renderers", type=int, default=12)
    parser.add_argument("--envs", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--name", default="gpu_contention")
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args()
    own, *others = sorted(os.sched_getaffinity(0))
    cores = others[: args.renderers]
    if len(cores) < args.renderers:
        parser.error(f"--renderers {args.renderers}: this machine has {len(others)} cores beside the policy's")
    os.sched_setaffinity(0, {own})  # the inference process's own core
    batches = {"slice": args.renderers * args.envs // 2, "whole": args.renderers * args.envs}
    eager = {name: act_call(n, graph=False) for name, n in batches.items()}
    alone = {f"act_{name}_ms": latency_ms(call, args.seconds) for name, call in eager.items()}
    try:
        graphed = {name: act_call(n, graph=True) for name, n in batches.items()}
    except RuntimeError as exc:  # a model whose forward cannot be captured: the variant is left out, said why
        print(f"graph: not captured ({exc})", flush=True)
        graphed = {}
    alone |= {f"graph_{name}_ms": latency_ms(call, args.seconds) for name, call in graphed.items()}
    print("alone: " + ", ".join(f"{k} {v:.2f}" for k, v in alone.items()), flush=True)
    rows = []
    for variant in VARIANTS if graphed else VARIANTS[:-1]:
        row = beside(variant, args, cores, graphed if variant == "graph" else eager)
        rows.append(row)
        print(
            f"{variant:8s} priority {row['priority'] or '-':6s} act slice {row['act_slice_ms']:7.2f} ms,"
            f" whole {row['act_whole_ms']:7.2f} ms; frames/s {row['fps_alone']:8.0f} alone,"
            f" {row['fps_acting']:8.0f} while acting",
            flush=True,
        )
    by = {r["variant"]: r for r in rows}
    ratios = {v: by[v]["act_slice_ms"] / alone["graph_slice_ms" if v == "graph" else "act_slice_ms"] for v in by}
    save_result(args.name, {"args": vars(args), "alone": alone, "rows": rows, "ratios": ratios}, Path(args.out))
    others = "; ".join(f"{v} {ratios[v]:.2f}x" for v in ("graph", "tiled", "low", "yield", "physics") if v in ratios)
    print(f"contention: act beside renderers {ratios['render']:.2f}x alone (slice); {others}")


if __name__ == "__main__":
    main()
