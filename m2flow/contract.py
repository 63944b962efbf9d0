"""What the core reads of a worker class: its ports, its typed arguments, how many items (envs) a
replica serves, its data-parallel width, its memory. A worker stays a plain class; these are optional
declarations beside it:

- `Config`: a pydantic model of its constructor's arguments (`workers.<w>.args`), best derived from
  `m2flow.WorkerConfig` (unknown keys are errors; `items_field` names the field holding the items one
  replica serves; `agreeing_fields`, by edge phase, the fields a worker joined to it by a loop or sync edge must
  give the same value where it declares them too: across the loop the env both act in, across a sync the
  architecture whose weights move; a Config overrides `agreeing(phase, port)` where a port holds other values:
  a simulator's `evaluate` gets the weights of its evaluation policy). Without one, the arguments are checked
  against the constructor's signature.
- `memory_estimate_gb(config, samples) -> float`: device memory of one replica computing on `samples` at
  once (a training rank's share of an iteration, an inference replica's share of a loop step), for the planner.
- `memory_advice(config, samples) -> str`: what lowers that memory, in its args' keys; the planner adds it to a
  placement that does not fit (`PPO`: more minibatches or activation checkpointing, or offloading its state).
- `data_parallel_size(config, replicas, backend) -> int`: how many of its ranks hold distinct data
  (default: all of them; tensor-parallel ranks share theirs); a ValueError reads "<key>: <problem>" and refuses
  a replica count the class cannot run (SAC on more than one rank), as the workflow is validated.
- `port_dispatch: dict[str, Dispatch]`: per port, how its calls are split over the replicas and whose
  outputs stand for it, where the class knows better than its kind's default (a sharded replay buffer:
  each replica adds its block of trajectories, every replica hears every priority update). A workflow's
  `workers.<w>.dispatch` still wins.
- `batch_invariant: frozenset[str]`: ports whose output for each row does not depend on which other rows
  share its call (a policy drawing each env's noise from the env's own stream). The loop may then merge
  pipeline slices into one call of them where that is predicted faster (`planners/merging.py`).
- `rendering_ports: frozenset[str]`: a simulator's ports that render cameras. On a node with a GPU they render
  there (`planners/render.py`), and a cost measured at one batch size is split as a GPU's: mostly per call at the
  small batches measured (`planners/profile.py`).
"""

from __future__ import annotations

import inspect
import typing
from dataclasses import dataclass
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, PydanticUserError, TypeAdapter, ValidationError

from m2flow.config import format_validation_error
from m2flow.dispatch import state_receivers
from m2flow.errors import did_you_mean
from m2flow.kinds import KINDS
from m2flow.resolve import ports_of
from m2flow.spec import Dispatch, WorkerSpec
from m2flow.strict_numbers import NumbersNotBooleans, boolean_for_a_number

PORT_SETS = ("batch_invariant", "rendering_ports")  # declarations naming some of a class's ports


@dataclass(frozen=True)
class Agreed:
    """A value a worker's args give that a worker joined to it by an edge must give too; `key` within its args."""

    key: str
    value: Any


class WorkerConfig(NumbersNotBooleans):
    """Base of a worker's typed arguments: every key declared, unknown ones rejected by name, no boolean taken for
    a number."""

    model_config = ConfigDict(extra="forbid")

    items_field: ClassVar[str | None] = None  # the field that holds the items (envs) one replica serves
    # by edge phase ("loop", "sync"): the fields a worker joined to this one must give the same value, where it
    # declares them too
    agreeing_fields: ClassVar[dict[str, frozenset[str]]] = {}

    def items_per_replica(self) -> int:
        return int(getattr(self, self.items_field)) if self.items_field else 1

    def agreeing(self, phase: str, port: str) -> dict[str, Agreed]:
        """What must agree across a `phase` edge at this worker's `port`: by field name."""
        return {name: Agreed(name, getattr(self, name)) for name in self.agreeing_fields.get(phase, frozenset())}


@dataclass(frozen=True)
class WorkerInfo:
    name: str
    spec: WorkerSpec
    target: Any
    ports: frozenset[str]
    config: BaseModel | None
    data_parallel: int

    @property
    def kind(self) -> str:
        return self.spec.kind

    @property
    def replicas(self) -> int:
        return self.spec.count

    @property
    def items_per_replica(self) -> int:
        items = getattr(self.config, "items_per_replica", None)
        return items() if callable(items) else 1

    @property
    def items_field(self) -> str | None:
        return getattr(type(self.config), "items_field", None)

    @property
    def group(self) -> bool:
        """Its replicas are ranks of one process group (checkpointed together, rank 0 speaks for them)."""
        return KINDS[self.kind].group

    def batch_invariant(self, port: str) -> bool:
        """Whether a call of `port` gives each row the same output whatever rows share the call."""
        return port in getattr(self.target, "batch_invariant", frozenset())

    @property
    def rendering_ports(self) -> frozenset[str]:
        """Its ports that render cameras (on the node's GPU, where it has one): as its class declares them."""
        return frozenset(getattr(self.target, "rendering_ports", frozenset()))

    def renders(self, port: str) -> bool:
        """Whether a call of `port` renders cameras."""
        return port in self.rendering_ports

    def dispatch(self, port: str) -> Dispatch:
        declared = getattr(self.target, "port_dispatch", {})
        return self.spec.dispatch.get(port) or declared.get(port) or KINDS[self.kind].dispatch

    def state_receivers(self, port: str) -> list[int]:
        """The replicas a sync edge copies its state to through `port` (`Dispatch.split`: `first`, or every one)."""
        return state_receivers(self.dispatch(port), self.replicas)


def describe_worker(name: str, spec: WorkerSpec, target: Any) -> tuple[WorkerInfo | None, list[str]]:
    """The worker's contract, or the problems with its declaration (each naming its key)."""
    key = f"workers.{name}"
    config, problems = _validate_args(target, spec.args, (*key.split("."), "args"))
    ports = frozenset(ports_of(target))
    for declared in ("dispatch", "profile"):
        for port in sorted(set(getattr(spec, declared)) - ports):
            problems.append(
                f"{key}.{declared}.{port}: '{name}' has no port '{port}'{did_you_mean(port, ports)}"
                f" (its ports: {', '.join(sorted(ports))})"
            )
    problems += [f"{key}: {problem}" for problem in _check_port_dispatch(target, ports, spec.cls)]
    for declaration in PORT_SETS:
        problems += [f"{key}: {problem}" for problem in _check_port_set(target, declaration, ports, spec.cls)]
    if getattr(target, "rendering_ports", frozenset()) and not KINDS[spec.kind].renders:
        rendering = " or ".join(kind for kind, traits in KINDS.items() if traits.renders)
        problems.append(
            f"{key}: {spec.cls}.rendering_ports: only a {rendering} worker renders cameras, and this worker's kind"
            f" is '{spec.kind}'; set workers.{name}.kind: {rendering}, or remove the declaration"
        )
    items_field = getattr(config, "items_field", None)
    if items_field and not KINDS[spec.kind].slices:
        slicing = " or ".join(kind for kind, traits in KINDS.items() if traits.slices)
        problems.append(
            f"{key}.kind: {spec.cls} serves envs (its Config's items_field: {items_field}), which a {slicing} worker"
            f" does and a '{spec.kind}' worker does not; set workers.{name}.kind: {slicing}"
        )
    if problems:
        return None, problems
    data_parallel = spec.count
    sizer = getattr(target, "data_parallel_size", None)
    if callable(sizer):
        try:
            data_parallel = int(sizer(config, spec.count, spec.backend))
        except ValueError as exc:  # the message names the key within the worker, e.g. "backend: ..."
            return None, [f"{key}.{exc}"]
        except Exception as exc:  # noqa: BLE001 - the class's own declaration failed: said, not a traceback
            return None, [f"{key}: {spec.cls}.data_parallel_size failed: {type(exc).__name__}: {exc}"]
    return WorkerInfo(name, spec, target, ports, config, data_parallel), []


def _check_port_dispatch(target: Any, ports: frozenset[str], cls: str) -> list[str]:
    """A class's `port_dispatch` declaration: a mapping of its own ports to `m2flow.Dispatch` rules."""
    declared = getattr(target, "port_dispatch", {})
    if not isinstance(declared, dict):
        return [f"{cls}.port_dispatch: expected a dict of port -> m2flow.Dispatch, got {type(declared).__name__}"]
    problems = []
    for port, rule in declared.items():
        if port not in ports:
            problems.append(f"{cls}.port_dispatch: '{port}' is not one of its ports ({', '.join(sorted(ports))})")
        elif not isinstance(rule, Dispatch):
            problems.append(f"{cls}.port_dispatch['{port}']: expected m2flow.Dispatch(split=..., gather=...)")
    return problems


def _check_port_set(target: Any, declaration: str, ports: frozenset[str], cls: str) -> list[str]:
    """A class's declaration of some of its ports (`batch_invariant`, `rendering_ports`): a set of its own port
    names."""
    declared = getattr(target, declaration, frozenset())
    if not isinstance(declared, (set, frozenset)):
        return [f"{cls}.{declaration}: expected a frozenset of port names, got {type(declared).__name__}"]
    return [
        f"{cls}.{declaration}: '{port}' is not one of its ports ({', '.join(sorted(ports))})"
        for port in sorted(map(str, declared))
        if port not in ports
    ]


def _validate_args(target: Any, args: dict[str, Any], prefix: tuple[str, ...]) -> tuple[BaseModel | None, list[str]]:
    key = ".".join(prefix)
    if not inspect.isclass(target):
        if args:
            return None, [f"{key}: a function worker takes no args (got {', '.join(sorted(args))}); remove them"]
        return None, []
    model = getattr(target, "Config", None)
    if isinstance(model, type) and issubclass(model, BaseModel):
        try:
            return model.model_validate(args), []
        except ValidationError as exc:
            return None, format_validation_error(exc, model, prefix)
    return None, _check_signature(target, args, key)


def _check_signature(target: type, args: dict[str, Any], key: str) -> list[str]:
    """For a class without a `Config`: the keys must be arguments its constructor takes, and each value of the type
    its annotation gives (where pydantic can check that type)."""
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):
        return []
    try:
        signature.bind(**args)
    except TypeError as exc:
        names = [p for p in signature.parameters if p != "self"]
        taken = ", ".join(names) or "no arguments"
        unknown = [a for a in args if a not in signature.parameters]
        hints = {name: did_you_mean(name, names) or ";" for name in unknown}
        return [
            f"{key}.{name}: unknown argument of {target.__name__}{hint} it takes: {taken}"
            for name, hint in hints.items()
        ] or [f"{key}: {target.__name__}{signature}: {exc}"]
    annotations = _annotations(target)
    return [
        f"{key}.{name}: {problem} ({target.__name__} takes {name}: {_type_name(annotations[name])}; got {value!r})"
        for name, value in args.items()
        if name in annotations
        and value != signature.parameters[name].default  # its own default: `seed: int = None` given null
        and (problem := _type_problem(annotations[name], value))
    ]


def _annotations(target: type) -> dict[str, Any]:
    """The constructor's parameter annotations, resolved; none where one cannot be (a name not importable here)."""
    try:
        return typing.get_type_hints(target.__init__)
    except Exception:  # noqa: BLE001 - annotations are code of the user's module; unresolved, they go unchecked
        return {}


def _type_problem(annotation: Any, value: Any) -> str | None:
    """Why `value` is not of `annotation`'s type (a number is not a boolean), or None; None also for a type pydantic
    cannot check."""
    if why := boolean_for_a_number(annotation, value):
        return why
    try:
        TypeAdapter(annotation).validate_python(value)
    except ValidationError as exc:
        return exc.errors()[0]["msg"]
    except PydanticUserError:
        return None
    return None


def _type_name(annotation: Any) -> str:
    """A type as written: a plain class by its name, anything with arguments (`list[int]`, `Optional[int]`) whole."""
    if isinstance(annotation, type) and typing.get_origin(annotation) is None:
        return annotation.__name__
    return str(annotation).replace("typing.", "")
