"""`m2flow run|plan|profile|validate FILE.yaml [key=value ...]` — user errors print without a traceback."""

from __future__ import annotations

import argparse
import contextlib
import logging
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from m2flow.config import load_spec
from m2flow.durable import output_folder
from m2flow.errors import M2FlowError, SpecError, WaitTimeout

console = Console(stderr=True, soft_wrap=True)
EVAL_TIMEOUT_S = 1800  # `m2flow eval`'s deadline unless --timeout says otherwise


def _positive(text: str) -> int:
    """An argument that counts something: a whole number of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected at least 1, got {value}")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="m2flow", description="Declarative macro-to-micro RL workflows on Ray.")
    sub = parser.add_subparsers(dest="command", required=True)

    def command(name: str, handler, help: str) -> argparse.ArgumentParser:
        """A subcommand on a workflow file, with `key=value` overrides after it."""
        cmd = sub.add_parser(name, help=help)
        cmd.add_argument("file")
        cmd.add_argument(
            "overrides", nargs="*", default=[], help="key=value, e.g. run.iterations=10 placement.mode=hybrid"
        )
        cmd.set_defaults(handler=handler)
        return cmd

    run = command("run", _run, "plan the workflow and run it on Ray")
    run.add_argument("--address", help="join this Ray cluster (as cluster.address), e.g. auto or host:6379")
    plan = command("plan", _plan, "show the plan and write its pictures; starts nothing")
    plan.add_argument("--dry-run", action="store_true", help="accepted for clarity: plan never runs anything")
    plan.add_argument("--out", help="folder for plan.json and pictures (default: <output_dir>/<name>/plan)")
    profile = command("profile", _profile, "measure each port of the real workers and fit a cost profile")
    profile.add_argument("--from-trace", help="refit from a run's trace.json instead of measuring")
    profile.add_argument("--out", help="where to write the profile (default: <output_dir>/profiles/<name>.json)")
    command("validate", _validate, "check the workflow file and print every problem")
    evaluate = sub.add_parser("eval", help="deterministic episodes of a run's latest checkpoint, on fresh seeds")
    evaluate.add_argument("run_dir", help="the run's folder, e.g. runs/ppo-mujoco")
    evaluate.add_argument("--episodes", type=_positive, default=10, help="episodes to play (at least 1)")
    evaluate.add_argument("--video", action="store_true", help="film each episode under <run dir>/eval/videos")
    evaluate.add_argument(
        "--timeout", type=_positive, default=EVAL_TIMEOUT_S, help="seconds before a hung evaluation is given up"
    )
    evaluate.set_defaults(handler=_eval, overrides=[])
    export = sub.add_parser("export", help="write a run's trained policy as a Hugging Face checkpoint (model: hf)")
    export.add_argument("run_dir")
    export.add_argument("--to", required=True, help="the folder to write (it loads again as model: hf, path: <it>)")
    export.set_defaults(handler=_export, overrides=[])
    return parser


def _run(args: argparse.Namespace) -> int:
    from m2flow.runtime.executor import execute

    overrides = list(args.overrides) + ([f"cluster.address={args.address}"] if args.address else [])
    spec = load_spec(args.file, overrides)
    result = execute(spec, source=args.file)
    console.print(f"[green]done[/]: {result.iterations} iterations; outputs in {result.run_dir}")
    return 0


def _plan(args: argparse.Namespace) -> int:
    from m2flow.cluster import Cluster
    from m2flow.graph import build_graph
    from m2flow.planners import compare_with_auto, make_plan
    from m2flow.viz import write_dry_run

    spec = load_spec(args.file, args.overrides)
    graph = build_graph(spec, args.file)
    cluster = Cluster.from_spec(spec.cluster)
    plan = make_plan(graph, cluster)
    if spec.placement.devices:
        plan = compare_with_auto(graph, cluster, plan)
    where = ("--out", args.out) if args.out else ("run.output_dir", Path(spec.run.output_dir) / spec.name / "plan")
    written = write_dry_run(graph, plan, output_folder(where[1], where[0]), Console())
    console.print("wrote " + ", ".join(str(p) for p in written))
    return 0


def _profile(args: argparse.Namespace) -> int:
    from rich.table import Table

    from m2flow.graph import build_graph
    from m2flow.planners import profile_path
    from m2flow.planners.fit import fit_trace_file, save_profile

    spec = load_spec(args.file, args.overrides)
    graph = build_graph(spec, args.file)
    path = Path(args.out or profile_path(spec))
    output_folder(path.parent, "--out" if args.out else "run.output_dir")  # before measuring, not after
    if args.from_trace:
        ports = {f"{name}.{port}" for name, info in graph.info.items() for port in info.ports}
        profile = fit_trace_file(args.from_trace, ports)
        profile["workflow"] = spec.name
    else:
        from m2flow.runtime.profiling import measure_profile
        from m2flow.runtime.ray_cluster import connect_ray

        connect_ray(spec.cluster)
        profile = measure_profile(spec)
    save_profile(profile, path)
    table = Table(title=f"profile of {spec.name} ({profile['source']})")
    for column in ("port", "fixed ms", "per item ms", "calls", "batch sizes"):
        table.add_column(column)
    for port, fit in profile["ports"].items():
        table.add_row(
            port,
            f"{fit.fixed_s * 1e3:.3f}",
            f"{fit.per_item_s * 1e3:.4f}",
            str(fit.calls),
            ",".join(map(str, fit.batch_sizes)),
        )
    Console().print(table)
    console.print(f"wrote {path}; `m2flow plan` and `m2flow run` use it")
    return 0


def _eval(args: argparse.Namespace) -> int:
    from m2flow.offline import evaluate_run

    if args.overrides:
        raise SpecError([f"m2flow eval takes no key=value overrides (got {' '.join(args.overrides)})"])
    with _within(args.timeout, f"m2flow eval: {args.episodes} episode(s) of {args.run_dir}", "raise --timeout"):
        evaluation = evaluate_run(args.run_dir, args.episodes, args.video)
    console.print(evaluation.summary())
    return 0


@contextlib.contextmanager
def _within(seconds: float, what: str, fix: str) -> Iterator[None]:
    """Run the block, in the main thread, with a deadline of `seconds`: past it a watchdog thread interrupts it
    (SIGINT to the main thread; no timer of the process is touched), and it raises a `WaitTimeout` naming `what`,
    not a hang. A call in native code that holds the GIL is interrupted once it returns to Python."""
    expired, main = threading.Event(), threading.main_thread().ident

    def expire() -> None:
        expired.set()
        signal.pthread_kill(main, signal.SIGINT)  # a real signal: a blocking call in the main thread returns too

    watchdog = threading.Timer(seconds, expire)
    watchdog.daemon = True
    watchdog.start()
    try:
        yield
    except KeyboardInterrupt:
        if not expired.is_set():
            raise
        raise WaitTimeout(f"{what} did not finish within {seconds:g} s; a simulator may be hung, or {fix}") from None
    finally:
        watchdog.cancel()


def _export(args: argparse.Namespace) -> int:
    from m2flow.offline import export_run

    console.print(f"wrote {export_run(args.run_dir, args.to)}; load it with model: hf, path: {args.to}")
    return 0


def _validate(args: argparse.Namespace) -> int:
    from m2flow.graph import build_graph

    spec = load_spec(args.file, args.overrides)
    graph = build_graph(spec, args.file)
    loop = f"loop of {len(graph.loop.ports)} ports x{graph.loop.horizon}" if graph.loop else "no loop"
    console.print(
        f"[green]valid[/]: {spec.name}: {len(spec.workers)} workers, {loop}, {len(graph.then)} then-edges,"
        f" {len(graph.sync)} sync edges"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    parser = _parser()
    args, extra = parser.parse_known_args(argv)
    unknown = [x for x in extra if x.startswith("-") or "=" not in x]
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    args.overrides = [*args.overrides, *extra]  # key=value may also follow the options
    try:
        return args.handler(args)
    except M2FlowError as exc:
        said = "\n".join([str(exc), *getattr(exc, "__notes__", [])])  # a note: where to look further
        console.print(f"[bold red]error[/]: {escape(said)}", markup=True, highlight=False)
        return 2
    except KeyboardInterrupt:
        console.print("[yellow]interrupted[/]")
        return 130


if __name__ == "__main__":
    sys.exit(main())
