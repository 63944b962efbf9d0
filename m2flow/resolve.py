"""Find a worker's class or function from its dotted path, and the ports it exposes."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import traceback
from pathlib import Path
from typing import Any

from m2flow.errors import SpecError

FUNCTION_PORT = "call"

_defined: dict[str, Any] = {}


def register_object(path: str, obj: Any) -> None:
    """Remember an object defined through the Python API, so its path resolves without importing."""
    _defined[path] = obj


def dotted_path(obj: Any) -> str:
    return f"{obj.__module__}.{obj.__qualname__}"


def resolve(path: str, key: str) -> Any:
    """Import `package.module.Name` (or `package.module:Name`); errors name the key and what was tried."""
    if path in _defined:
        return _defined[path]
    module_name, sep, attr = path.partition(":")
    if not sep:
        module_name, _, attr = path.rpartition(".")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise SpecError(
            [f"{key}: cannot import module '{module_name}' for '{path}': {exc}{_search_hint(exc)}"]
        ) from None
    except Exception as exc:  # noqa: BLE001 - the module itself failed as it ran: said, with where
        failed = _where_failed(exc, module_name)
        raise SpecError([f"{key}: importing module '{module_name}' failed: {failed}"]) from None
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise SpecError([f"{key}: module '{module_name}' has no attribute '{attr}' (from '{path}')"]) from None
    if not callable(obj):
        raise SpecError([f"{key}: '{path}' is a {type(obj).__name__}, expected a class or a function"])
    return obj


def _search_hint(exc: ImportError) -> str:
    """Where a module the user wrote lies in the working directory, which the `m2flow` command does not search."""
    top = (exc.name or "").split(".")[0]
    if top and ((Path(top).with_suffix(".py")).is_file() or (Path(top) / "__init__.py").is_file()):
        return f" ('{top}' is in the working directory, which the m2flow command does not search: set PYTHONPATH=.)"
    return ""


def _where_failed(exc: Exception, module_name: str) -> str:
    """`exc` as raised as `module_name` was imported, with the line of that module's own file it was raised from
    (where a library it called raised it: the call), else the deepest."""
    if isinstance(exc, SyntaxError):
        return f"SyntaxError: {exc.msg} ({exc.filename}, line {exc.lineno})"
    frames = traceback.extract_tb(exc.__traceback__)
    try:
        origin = importlib.util.find_spec(module_name).origin
    except (ImportError, ValueError, AttributeError):
        origin = None
    frame = next((f for f in reversed(frames) if f.filename == origin), frames[-1])
    return f"{type(exc).__name__}: {exc} ({frame.filename}, line {frame.lineno})"


# what a worker class may declare for the planner (m2flow.contract): not ports
DECLARATIONS = frozenset({"Config", "memory_estimate_gb", "memory_advice", "data_parallel_size"})


def ports_of(obj: Any) -> set[str]:
    """A class exposes its public methods as ports (not nested classes, not its declarations for the
    planner); a function exposes the single port `call`."""
    if not inspect.isclass(obj):
        return {FUNCTION_PORT}
    return {
        name
        for name, member in inspect.getmembers(obj, callable)
        if not name.startswith("_") and name not in DECLARATIONS and not inspect.isclass(member)
    }
