"""m2flow: declare RL workers and their dataflow; a planner compiles it into a micro-execution schedule."""

from m2flow.api import Workflow, define_worker, plan, run
from m2flow.config import dump_spec, load_spec
from m2flow.context import WorkerContext, context
from m2flow.contract import Agreed, WorkerConfig
from m2flow.errors import EnvFailed, M2FlowError, MissingDependency, PlanError, SpecError, WaitTimeout, WorkerError
from m2flow.spec import Dispatch, WorkflowSpec

__version__ = "0.1.0"

__all__ = [
    "Dispatch",
    "Agreed",
    "EnvFailed",
    "M2FlowError",
    "MissingDependency",
    "PlanError",
    "SpecError",
    "WaitTimeout",
    "WorkerConfig",
    "WorkerContext",
    "WorkerError",
    "Workflow",
    "WorkflowSpec",
    "context",
    "define_worker",
    "dump_spec",
    "load_spec",
    "plan",
    "run",
]
