"""Channel kinds for the per-step micro flow, measured side by side: one simulated env step and one
policy call in two Ray actors, observation and action crossing between them every step.

  driver      chained Ray actor calls through the driver: policy.act.remote(env.step.remote(a))
  compiled    a Ray Compiled Graph (experimental_compile) of the same two calls
  m2flow      m2flow's worker-to-worker channel (Unix socket, as the loop program uses it)

    python benchmarks/channels.py [--steps 300] [--work-ms 0 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np
import ray
from results_io import save_result


def spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


@ray.remote
class Stage:
    """One side of the loop: spins `work_s` per call, returns an observation-sized array."""

    def __init__(self, work_s: float, name: str):
        self.work_s, self.name, self.mailbox = work_s, name, None

    def call(self, x: np.ndarray) -> np.ndarray:
        spin(self.work_s)
        return x + 1

    # m2flow channel: each actor runs its side of the loop locally, like the loop program
    def open(self, authkey: bytes) -> str:
        from m2flow.runtime.channels import Mailbox, Patience

        self.mailbox, self.patience = Mailbox((self.name, 0), authkey, ["unix"]), Patience.fixed(30)
        return self.mailbox.addresses["unix"]

    def connect(self, peer: str, address: str) -> None:
        self.mailbox.connect((peer, 0), address, 30)
        self.mailbox.wait_inbound([(peer, 0)], 30)

    def run(self, peer: str, steps: int, first: bool) -> float:
        x = np.zeros(17, np.float32)
        start = time.perf_counter()
        for t in range(steps):
            if first:
                self.mailbox.send((peer, 0), (t,), self.call(x))
                x = self.mailbox.recv((peer, 0), (t,), self.patience, "reply")
            else:
                self.mailbox.send(
                    (peer, 0), (t,), self.call(self.mailbox.recv((peer, 0), (t,), self.patience, "request"))
                )
        return time.perf_counter() - start


def through_driver(env, policy, steps: int) -> float:
    x = np.zeros(17, np.float32)
    start = time.perf_counter()
    for _ in range(steps):
        x = ray.get(policy.call.remote(env.call.remote(x)))
    return time.perf_counter() - start


def compiled(env, policy, steps: int) -> float:
    from ray.dag import InputNode

    with InputNode() as inp:
        dag = policy.call.bind(env.call.bind(inp))
    graph = dag.experimental_compile()
    x = np.zeros(17, np.float32)
    try:
        ray.get(graph.execute(x))  # warm up
        start = time.perf_counter()
        for _ in range(steps):
            x = ray.get(graph.execute(x))
        return time.perf_counter() - start
    finally:
        graph.teardown()


def m2flow_channel(env, policy, steps: int) -> float:
    authkey = os.urandom(16)
    a_addr, b_addr = ray.get([env.open.remote(authkey), policy.open.remote(authkey)])
    ray.get([env.connect.remote("policy", b_addr), policy.connect.remote("env", a_addr)])
    a, _ = ray.get([env.run.remote("policy", steps, True), policy.run.remote("env", steps, False)])
    return a


KINDS = {"driver": through_driver, "compiled": compiled, "m2flow": m2flow_channel}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--work-ms", type=float, nargs="+", default=[0.0, 2.0])
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args()
    ray.init(address="local", include_dashboard=False, log_to_driver=False)
    rows = []
    for work_ms in args.work_ms:
        row = {"work_ms": work_ms}
        for kind, measure in KINDS.items():
            env, policy = Stage.remote(work_ms / 1e3, "env"), Stage.remote(work_ms / 1e3, "policy")
            try:
                times = [measure(env, policy, args.steps) for _ in range(3)]
                row[kind] = 1e3 * statistics.median(times) / args.steps
            except Exception as exc:  # noqa: BLE001 - a kind that cannot run here is reported, not fatal
                row[kind] = None
                row[f"{kind}_error"] = str(exc).splitlines()[0][:200]
            finally:
                ray.kill(env)
                ray.kill(policy)
        rows.append(row)
        cells = "  ".join(f"{k} {row[k]:.3f} ms" if row[k] is not None else f"{k} failed" for k in KINDS)
        print(f"work {work_ms:4.1f} ms + {work_ms:4.1f} ms per step:  {cells}", flush=True)
    save_result("channels", {"cores": os.cpu_count(), "rows": rows}, args.out)
    base = rows[0]
    if base["compiled"] and base["m2flow"]:
        print(
            f"compiled/m2flow round trip: {base['compiled'] / base['m2flow']:.1f}x, driver/m2flow:"
            f" {base['driver'] / base['m2flow']:.1f}x (no work, {os.cpu_count()} cores)"
        )
    else:
        failed = ", ".join(kind for kind in KINDS if base[kind] is None)
        print(f"compiled/m2flow round trip: not measured, {failed} failed (no work, {os.cpu_count()} cores)")


if __name__ == "__main__":
    main()
