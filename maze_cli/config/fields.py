"""How a config key is declared: its type (with its limits), its default and its help, side by side.

    lr: PositiveFloat = key(3e-4, "Adam's learning rate")

The schemas are plain dataclasses, so Hydra composes them (OmegaConf reads the plain type under
`Annotated`); pydantic checks the limits (`annotated_types`' Gt, Ge, Le and `OneOf`) and the types
when a run starts, and the help (`key`'s description) is what the configuration reference prints.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any

from annotated_types import Ge, Gt, Le
from pydantic import GetCoreSchemaHandler
from pydantic_core import PydanticCustomError, core_schema

__all__ = ["Fraction", "Ge", "Gt", "Le", "NonNegativeFloat", "NonNegativeInt", "OneOf", "PositiveFloat", "PositiveInt",
           "key"]

PositiveInt = Annotated[int, Ge(1)]
NonNegativeInt = Annotated[int, Ge(0)]
PositiveFloat = Annotated[float, Gt(0)]
NonNegativeFloat = Annotated[float, Ge(0)]
Fraction = Annotated[float, Ge(0), Le(1)]


@dataclasses.dataclass(frozen=True)
class OneOf:
    """`Annotated[str, OneOf("a", "b")]`: a value among `choices` (OmegaConf takes no `Literal`)."""

    choices: tuple[Any, ...]

    def __init__(self, *choices: Any) -> None:
        object.__setattr__(self, "choices", tuple(choices))

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        def check(value: Any) -> Any:
            if value not in self.choices:
                raise PydanticCustomError("one_of", "must be one of {choices}",
                                          {"choices": ", ".join(map(str, self.choices))})
            return value

        return core_schema.no_info_after_validator_function(check, handler(source))


def key(default: Any = dataclasses.MISSING, help: str = "") -> Any:
    """A config key's default and its help, in one place (a list or dict default is copied per instance).
    A subclass that changes only a key's default may leave the help out: the base class's stands."""
    metadata = {"description": help}
    if isinstance(default, (list, dict)):
        return dataclasses.field(default_factory=lambda: type(default)(default), metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)
