"""The protocol's models without their constraints, for reading what a Herald server
wrote: the same fields, tags and defaults, no `Meta` pattern or range checked again.

Checking a delivered record's names, id and numbers cost more than decoding it: with
them a `deliver` frame of 100 records decoded at 8.2 µs a record, without them at 2.9
(orjson into dicts, what the SDK did before: 3.4). The server checks what it accepts;
what it sends is its own (issue 29: a faster path kept behind the same types).
"""

from __future__ import annotations

from functools import cache
from typing import Annotated, Any, Literal, TypeVar, Union, get_args, get_origin

import msgspec

T = TypeVar("T")


def unchecked_struct(model: type[T]) -> type[T]:
    """``model`` (a Struct) as a subclass of itself whose fields carry no constraints."""
    made: type[T] = unchecked(model)  # type: ignore[arg-type]  # a class is hashable
    return made


@cache
def unchecked(model: Any) -> Any:
    """``model`` (a Struct, or a type built of Structs: a union, a list) without its
    constraints; a Struct becomes a subclass of itself, so it is still an instance of
    the model."""
    if isinstance(model, type) and issubclass(model, msgspec.Struct):
        config = model.__struct_config__
        fields = [
            (f.name, unchecked(f.type))
            if f.default is msgspec.NODEFAULT
            else (f.name, unchecked(f.type), f.default)
            for f in msgspec.structs.fields(model)
        ]
        return msgspec.defstruct(
            model.__name__,
            fields,
            bases=(model,),
            kw_only=True,
            frozen=config.frozen,
            tag=config.tag,
            tag_field=config.tag_field,
            omit_defaults=config.omit_defaults,
            module=__name__,
        )
    origin = get_origin(model)
    if origin is Annotated:
        return unchecked(get_args(model)[0])
    if origin is None or origin is Literal:
        return model
    args = tuple(unchecked(arg) for arg in get_args(model))
    if origin is Union or type(model).__name__ == "UnionType":
        return Union[args]  # noqa: UP007 (built from its arguments, not written)
    return origin[args]
