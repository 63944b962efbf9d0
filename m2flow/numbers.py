"""Numbers written as numbers: pydantic reads `true` as 1 for an int or float field (its lax mode), so a YAML
`num_envs: true` would run one env. Models of the workflow and of workers' arguments refuse a boolean where only a
number is taken."""

from __future__ import annotations

import types
import typing
from typing import Any

from pydantic import BaseModel, ValidationInfo, field_validator


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


class NumbersNotBooleans(BaseModel):
    """Refuses `true`/`false` for a field that takes a number and no boolean."""

    @field_validator("*", mode="before")
    @classmethod
    def _no_boolean_for_a_number(cls, value: Any, info: ValidationInfo) -> Any:
        if isinstance(value, bool) and info.field_name is not None:
            annotation = cls.model_fields[info.field_name].annotation
            if not takes(annotation, bool) and (takes(annotation, int) or takes(annotation, float)):
                raise ValueError(f"expected a number, not the boolean {str(value).lower()}")
        return value
