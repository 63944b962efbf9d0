"""YAML <-> WorkflowSpec, Hydra-style `key=value` overrides, a file that `extends` another, and readable
validation errors."""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from m2flow.errors import SpecError, did_you_mean
from m2flow.spec import WorkflowSpec


def load_spec(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> WorkflowSpec:
    """Read a workflow file (and the files it extends), apply `key=value` overrides, validate; every
    problem names its key."""
    source = str(path)
    return spec_from_dict(apply_overrides(read_workflow(Path(path)), overrides, source), source)


def read_workflow(path: Path, extended_by: tuple[Path, ...] = ()) -> dict[str, Any]:
    """A workflow file's mapping. `extends: <file>` (relative to this one) starts from that file's mapping:
    this file's keys are merged over it, mappings key by key, any other value (a list too) replaced."""
    source = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        where = f" (extended by {extended_by[-1]})" if extended_by else ""
        raise SpecError([f"file not found: {source}{where}"]) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError([f"cannot read {source}: {exc}"]) from None
    raw = parse_yaml(text, source)
    base = raw.pop("extends", None)
    if base is None:
        return raw
    if not isinstance(base, str):
        raise SpecError([f"extends: expected the path of a workflow file, got {_short(base)}"], source)
    base_path = (path.parent / base).resolve()
    if base_path in {p.resolve() for p in (*extended_by, path)}:
        chain = " -> ".join(str(p) for p in (*extended_by, path, base_path))
        raise SpecError([f"extends: the files extend each other in a cycle: {chain}"], source)
    return _merged(read_workflow(base_path, (*extended_by, path)), raw)


def _merged(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in over.items():
        both = isinstance(value, dict) and isinstance(merged.get(key), dict)
        merged[key] = _merged(merged[key], value) if both else value
    return merged


class _UniqueKeys(yaml.SafeLoader):
    """Safe YAML whose mappings refuse a key given twice (YAML says keys are unique; PyYAML would keep the last
    one silently), checked as each mapping is read, before merges (`<<:`, whose keys the mapping's own override)
    are applied."""

    def compose_mapping_node(self, anchor: str | None) -> yaml.MappingNode:
        node = super().compose_mapping_node(anchor)
        first: dict[tuple[str, str], yaml.Mark] = {}
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = (key_node.tag, key_node.value)
            if key in first:
                raise yaml.composer.ComposerError(
                    None,
                    None,
                    f"the key '{key_node.value}' is given twice (first at line {first[key].line + 1})",
                    key_node.start_mark,
                )
            first[key] = key_node.start_mark
        return node


def parse_yaml(text: str, source: str) -> dict[str, Any]:
    """Safe YAML load (no object construction, no key given twice); the top level must be a mapping. Every alias
    (`*policy`) is a copy of its own: an override changes the key it names, not each place the anchor went."""
    try:
        raw = yaml.load(text, Loader=_UniqueKeys)  # noqa: S506 - a SafeLoader
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise SpecError([f"not valid YAML{where}: {getattr(exc, 'problem', exc)}"], source) from None
    if raw is None:
        raise SpecError(["the file is empty: a workflow needs at least 'name' and 'workers'"], source)
    if not isinstance(raw, dict):
        raise SpecError([f"the top level must be a mapping of keys, got {type(raw).__name__}"], source)
    return _unshared(raw)


def _unshared(value: Any) -> Any:
    """`value` with every mapping and list copied, each time it occurs (PyYAML gives an alias the anchor's object)."""
    if isinstance(value, dict):
        return {key: _unshared(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_unshared(item) for item in value]
    return value


def apply_overrides(raw: dict[str, Any], overrides: list[str] | tuple[str, ...], source: str) -> dict[str, Any]:
    """Set dotted keys as Hydra does: `run.iterations=10 workers.env.replicas=2`, list items by index
    (`flow.sync.1.every=5`); `~key` removes one. Values are parsed as YAML."""
    problems = []
    workers = raw.get("workers")
    declared = set(workers) if isinstance(workers, dict) else set()
    for item in overrides:
        if item.startswith("~"):
            _delete(raw, item[1:].split("="), problems, item)
            continue
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            problems.append(f"override '{item}': expected key=value, e.g. run.iterations=10")
            continue
        try:
            value = yaml.safe_load(text) if text.strip() else None
        except yaml.YAMLError:
            value = text
        path = key.strip().split(".")
        node: Any = raw
        for depth, part in enumerate(path[:-1]):
            child = _child(node, part)
            if child is None and isinstance(node, dict):
                child = node[part] = {}
            if not isinstance(child, (dict, list)):
                problems.append(
                    f"override '{item}': '{'.'.join(path[: depth + 1])}' is not a mapping or a list index in range"
                )
                break
            node = child
        else:
            if isinstance(node, list) and not (path[-1].isdigit() and int(path[-1]) < len(node)):
                problems.append(f"override '{item}': '{path[-1]}' is not an index of the list ({len(node)} items)")
            else:
                node[int(path[-1]) if isinstance(node, list) else path[-1]] = value
    problems += _misspelled_workers(raw, declared)
    if problems:
        raise SpecError(problems, source)
    return raw


def _misspelled_workers(raw: dict[str, Any], declared: set[str]) -> list[str]:
    """A worker that overrides made, without a class, and named like a declared one: a misspelling of it."""
    workers = raw.get("workers")
    made = set(workers) - declared if isinstance(workers, dict) else set()
    problems = []
    for name in sorted(made):
        hint = did_you_mean(name, declared)
        if hint and not (isinstance(workers[name], dict) and "class" in workers[name]):
            problems.append(f"workers.{name}: no such worker{hint} (a new worker needs workers.{name}.class)")
    return problems


def _child(node: Any, part: str) -> Any:
    """`part` of a mapping, or item `part` of a list (`flow.sync.1.every=5`, as in Hydra)."""
    if isinstance(node, list):
        return node[int(part)] if part.isdigit() and int(part) < len(node) else None
    return node.get(part)


def _delete(raw: dict[str, Any], parts: list[str], problems: list[str], item: str) -> None:
    """`~key.path` removes a key, as in Hydra."""
    *parents, last = parts[0].split(".")
    node = raw
    for part in parents:
        node = node.get(part) if isinstance(node, dict) else None
    if not isinstance(node, dict) or last not in node:
        problems.append(f"override '{item}': there is no key '{parts[0]}' to remove")
    else:
        del node[last]


def spec_from_dict(raw: dict[str, Any], source: str = "<workflow>") -> WorkflowSpec:
    try:
        return WorkflowSpec.model_validate(raw)
    except ValidationError as exc:
        raise SpecError(format_validation_error(exc), source) from None


def dump_spec(spec: WorkflowSpec) -> str:
    return yaml.safe_dump(spec.to_dict(), sort_keys=False, allow_unicode=True)


def format_validation_error(
    exc: ValidationError, model: type[BaseModel] = WorkflowSpec, prefix: tuple[str, ...] = ()
) -> list[str]:
    """One line per problem: the dotted key, what is wrong, and the fix where we can name it. `model` is
    what was validated, `prefix` where it sits in the workflow (e.g. a worker's args)."""
    lines = []
    for err in _union_members_merged(exc.errors()):
        loc = [str(part) for part in err["loc"] if not str(part).startswith("function-")]
        key = ".".join([*prefix, *loc]) or "<top level>"
        kind = err["type"]
        if kind == "extra_forbidden":
            lines.append(f"{key}: unknown key{_unknown_key_hint(model, loc)}")
        elif kind == "missing":
            lines.append(f"{key}: required key is missing")
        else:
            message = err["msg"].removeprefix("Value error, ")
            lines.append(f"{key}: {message} (got {_short(err.get('input'))})")
    return lines


# how pydantic names the member of a union a value failed to match, in the error's location
_UNION_MEMBER = re.compile(r"(int|float|str|bool|none|bytes|(literal|list|dict|tuple|set|frozenset)\[.*\])")


def _union_members_merged(errors: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A value that matches no member of a union is reported once per member, under the member's name
    (`placement.pipeline_stages.int`, `placement.pipeline_stages.literal['auto']`): one error at the key instead,
    saying what the value may be ("should be a valid integer or 'auto'")."""
    members: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for err in errors:
        if err["loc"] and _UNION_MEMBER.fullmatch(str(err["loc"][-1])):
            members[tuple(err["loc"][:-1])].append(err)
    merged, said = [], set()
    for err in errors:
        at = tuple(err["loc"][:-1])
        if len(members.get(at, ())) < 2 or err not in members[at]:
            merged.append(err)
        elif at not in said:
            said.add(at)
            may_be = [e["msg"].removeprefix("Input should be ").split(", ")[0] for e in members[at]]
            merged.append({**err, "loc": at, "type": "union", "msg": f"should be {' or '.join(may_be)}"})
    return merged


def _unknown_key_hint(model: type[BaseModel], loc: list[str]) -> str:
    known = _fields_at(model, loc[:-1])
    if not known:
        return ""
    return f"{did_you_mean(loc[-1], known) or ';'} allowed here: {', '.join(sorted(known))}"


def _fields_at(model: type[BaseModel], loc: list[str]) -> list[str]:
    """The field names (YAML spelling) of the model found at `loc` inside `model`, if any."""
    for part in loc:
        field = _field_by_name(model, part)
        if field is None:
            continue  # a dict key such as a worker's name: stay on the value's model
        model = _model_of(field.annotation)
        if model is None:
            return []
    return [f.alias or name for name, f in model.model_fields.items()]


def _field_by_name(model: type[BaseModel], name: str):
    for field_name, field in model.model_fields.items():
        if name in (field_name, field.alias):
            return field
    return None


def _model_of(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model inside an annotation such as `Model`, `Model | None`, `dict[str, Model]`."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in reversed(getattr(annotation, "__args__", ()) or ()):
        found = _model_of(arg)
        if found is not None:
            return found
    return None


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
