"""A policy's act call replayed as CUDA graphs: one per batch shape, captured on its first use.

An eager forward of a 100M ViT launches hundreds of small kernels, and on a machine whose cores are busy
stepping simulators the launches, not the kernels, can set its latency: on an H200 the act call on 96
camera observations took 6.5-11.1 ms eager and 4.0 ms replayed as one graph, alone (RESULTS.md, "Why
pipelining does not pay on one GPU"). A graph replays fixed kernels on fixed buffers, so each call's
inputs are copied into the buffers captured with it and its outputs are read from the graph's own (valid
until its next replay). A forward that draws random numbers draws fresh ones at each replay.

Graphs hold the parameters' addresses: loading weights in place keeps them valid, moving the model
(offload) does not — `clear()` then. A forward that cannot be captured (host synchronisation, shapes that
depend on values: some Hugging Face models) runs eager from then on, said once on stderr; the process's random
draws keep working (a failed capture would leave the CUDA generator in capture mode: it is ended).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from m2flow.workers.models.precision import Precision, compute_in

# batch shapes kept: slices of a pipeline give one or two, a ragged last slice one more, merged slices one per
# number of slices merged (up to the stage count); past them, calls run eager
MAX_GRAPHS = 8
WARM_UP_CALLS = 3  # eager calls on a side stream before capture (cuBLAS workspaces, lazy initialisation)


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    inputs: list[torch.Tensor]
    outputs: Any


class CudaGraphs:
    """`run(name, fn, *args)`: `fn(*args)` on CUDA tensors (nested in dicts, lists or tuples), replayed from a
    graph captured for these argument shapes, computing in `precision` (`compute_in`)."""

    def __init__(self, device: torch.device, precision: Precision = "fp32"):
        self.device, self.precision = device, precision
        self.graphs: dict[tuple, _Graph] = {}
        self.pool = torch.cuda.graph_pool_handle()
        self.failed: str | None = None

    def run(self, name: str, fn: Callable[..., Any], *args: Any) -> Any:
        leaves, spec = tree_flatten(args)
        key = (name, str(spec), *((tuple(t.shape), t.dtype) for t in leaves))
        graph = self.graphs.get(key)
        if graph is None:
            if self.failed is not None or len(self.graphs) >= MAX_GRAPHS:
                return self._eager(fn, args)
            graph = self._capture(name, fn, leaves, spec)
            if graph is None:
                return self._eager(fn, args)
            self.graphs[key] = graph
        for buffer, value in zip(graph.inputs, leaves, strict=True):
            buffer.copy_(value, non_blocking=True)
        graph.graph.replay()
        return graph.outputs

    def clear(self) -> None:
        """Forget every graph (the parameters moved)."""
        self.graphs.clear()

    def _capture(self, name: str, fn: Callable[..., Any], leaves: list[torch.Tensor], spec) -> _Graph | None:
        """The forward warmed up eagerly (its errors are the caller's), then captured; None if it cannot be."""
        inputs = [t.clone() for t in leaves]
        call = lambda: self._eager(fn, tree_unflatten(inputs, spec), cache=False)  # noqa: E731
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(WARM_UP_CALLS):
                call()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, pool=self.pool):
                outputs = call()
        except Exception as exc:  # noqa: BLE001 - what a forward may not do while captured: run it eager
            self.failed = f"{type(exc).__name__}: {exc}"
            torch.cuda.synchronize()
            print(
                f"m2flow: {name} runs eager, its forward cannot be replayed as a CUDA graph ({self.failed})",
                file=sys.stderr,
            )
            self._end_generator_capture()
            return None
        return _Graph(graph, inputs, outputs)

    def _end_generator_capture(self) -> None:
        """A failed capture leaves the CUDA generator in capture mode (its epilogue never ran), and every random
        draw outside a graph then fails ("Offset increment outside graph capture encountered unexpectedly"):
        a capture that succeeds ends it."""
        probe = torch.zeros(1, device=self.device)
        try:
            with torch.cuda.graph(torch.cuda.CUDAGraph()):
                probe.add_(1)
        except Exception as exc:  # noqa: BLE001 - the eager fallback stands; only random draws may fail now
            print(f"m2flow: the CUDA generator may stay in capture mode ({type(exc).__name__}: {exc})", file=sys.stderr)

    def _eager(self, fn: Callable[..., Any], args: tuple, cache: bool = True) -> Any:
        with compute_in(self.device, self.precision, cache):
            return fn(*args)
