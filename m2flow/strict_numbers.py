"""Numbers written as numbers: pydantic reads `true` as 1 for an int or float field (its lax mode), so a YAML
`num_envs: true` would run one env. Models of the workflow and of workers' arguments refuse a boolean where only a
number is taken, in a field or among the items of a list or tuple of numbers."""

from __future__ import annotations

import collections.abc
import types
import typing
from typing import Any

from pydantic import BaseModel, ValidationInfo, field_validator

SEQUENCES = (list, tuple, set, frozenset, collections.abc.Sequence)


def takes(annotation: Any, kind: type) -> bool:
    """Whether a field of this type takes values of `kind` (a union or Literal member, Any, or the type itself)."""
    if annotation is Any or annotation is kind:
        return True
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return any(takes(member, kind) for member in typing.get_args(annotation))
    if origin is typing.Literal:
        return any(isinstance(value, kind) for value in typing.get_args(annotation))
    if origin is typing.Annotated:
        return takes(typing.get_args(annotation)[0], kind)
    return False


def boolean_for_a_number(annotation: Any, value: Any) -> str | None:
    """Why `value` is refused: a boolean where `annotation` takes a number and no boolean, itself or as an item of a
    list or tuple; None where it is not."""
    if isinstance(value, bool):
        if not takes(annotation, bool) and (takes(annotation, int) or takes(annotation, float)):
            return f"expected a number, not the boolean {str(value).lower()}"
        return None
    if isinstance(value, list | tuple):
        items = _item_types(annotation)
        for i, item in enumerate(value):
            if items and all(boolean_for_a_number(kind, item) for kind in items):
                return f"item {i}: expected a number, not the boolean {str(item).lower()}"
    return None


def _item_types(annotation: Any) -> list[Any]:
    """The types a list or tuple field's items may have (each union member's), none where it takes no sequence."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return [item for member in typing.get_args(annotation) for item in _item_types(member)]
    if origin is typing.Annotated:
        return _item_types(typing.get_args(annotation)[0])
    if origin in SEQUENCES:
        return [item for item in typing.get_args(annotation) if item is not Ellipsis]
    return []


class NumbersNotBooleans(BaseModel):
    """Refuses `true`/`false` for a field that takes a number and no boolean (or for an item of its list)."""

    @field_validator("*", mode="before")
    @classmethod
    def _no_boolean_for_a_number(cls, value: Any, info: ValidationInfo) -> Any:
        if info.field_name is not None:
            why = boolean_for_a_number(cls.model_fields[info.field_name].annotation, value)
            if why:
                raise ValueError(why)
        return value
