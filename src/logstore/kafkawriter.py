"""Kafka responses written straight from field mappings, by a plan made once per message class.

A handler answers with a mapping of fields named as in the message's latest version (nested
arrays as sequences of mappings). :func:`write_response` writes it in the wire format of the
version asked for, using the kio class of that version only as the schema: its fields in
order, their Kafka types, which are nullable and which have defaults. A field the version does
not have is left out; a field it needs and the mapping lacks is an error naming it.

Why not kio's own writer: it wants an instance of the generated dataclass (every nested item
built and type-converted first) and then writes field by field, a ``struct.pack`` and a buffer
append each. For a one-partition Produce response that costs about 70 us, more than the append
it reports. The plan here packs each run of fixed-width fields with one precompiled
``struct.Struct``, so a small response costs a few microseconds. The tests compare every
response class served, byte for byte, with kio's writer.

Only non-flexible versions are planned (the only ones :data:`~logstore.kafkawire.SUPPORTED`
lists); a flexible class is refused when its plan is made. Values: integers for Kafka's
integer types, error codes (``int`` or kio's ``ErrorCode``), durations in milliseconds (or
``timedelta``) and timestamps in milliseconds since the epoch, -1 or None for none (or aware
``datetime``); ``bytes``-like values or a :class:`~logstore._fileio.FileRegion` for bytes and
records, the region kept as a buffer of its own so that it can be sent with ``sendfile``.

Thread-safety: every function may be called from any thread (plans are made idempotently).
"""

from __future__ import annotations

import dataclasses
import datetime
import struct
import typing
import uuid
from typing import Any, Callable, Mapping

from ._fileio import FileRegion

__all__ = ["write_response", "plan_of"]

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_FIXED = {"int8": "b", "int16": "h", "int32": "i", "int64": "q", "uint8": "B", "uint16": "H",
          "uint32": "I", "uint64": "Q", "float64": "d", "bool": "?", "error_code": "h",
          "timedelta_i32": "i", "timedelta_i64": "q", "datetime_i64": "q"}
_MISSING = object()


def _millis(value: Any) -> int:
    if isinstance(value, datetime.timedelta):
        return round(value.total_seconds() * 1000)
    return int(value)


def _timestamp(value: Any) -> int:
    if value is None:
        return -1
    if isinstance(value, datetime.datetime):
        return round(value.timestamp() * 1000)
    return int(value)


_CONVERT: dict[str, Callable[[Any], Any] | None] = {
    "error_code": int, "timedelta_i32": _millis, "timedelta_i64": _millis, "datetime_i64": _timestamp,
}


class _Out:
    """Bytes gathered in runs; a file region is a part of its own."""

    __slots__ = ("parts", "run", "size")

    def __init__(self) -> None:
        self.parts: list[Any] = []
        self.run = bytearray(4)  # the frame's size, filled in at the end
        self.size = 0

    def region(self, region: FileRegion) -> None:
        self.parts += [self.run, region]
        self.run = bytearray()
        self.size += len(region)


class _Field:
    """One field of a message class: how to find its value (or its default)."""

    __slots__ = ("name", "default", "factory", "owner")

    def __init__(self, name: str, default: Any, factory: Callable[[], Any] | None, owner: str) -> None:
        self.name = name
        self.default = default  # _MISSING with no factory: required
        self.factory = factory
        self.owner = owner

    def value(self, fields: Mapping[str, Any]) -> Any:
        value = fields.get(self.name, _MISSING)
        if value is _MISSING:
            if self.factory is not None:
                return self.factory()
            if self.default is _MISSING:
                raise KeyError(f"{self.owner} needs the field {self.name!r}")
            return self.default
        return value


class _Plan:
    """How to write one message class: steps, each a run of fixed-width fields packed at once
    or one variable-length field."""

    __slots__ = ("steps",)

    def __init__(self, steps: list[tuple[Any, ...]]) -> None:
        self.steps = steps

    def write(self, out: _Out, fields: Mapping[str, Any]) -> None:
        run = out.run
        for step in self.steps:
            kind = step[0]
            if kind == 0:  # fixed-width fields
                _, packer, members, names, converts = step
                try:
                    values = [fields[name] for name in names]
                except KeyError:  # a field left to its default, or a missing one
                    values = [field.value(fields) for field, _ in members]
                if converts:
                    values = [convert(value) if convert is not None else value
                              for value, (_, convert) in zip(values, members)]
                run += packer.pack(*values)
                out.size += packer.size
            elif kind == 1:  # string
                value = step[1].value(fields)
                if value is None:
                    _null(out, step[1], step[2], b"\xff\xff")
                    continue
                raw = value.encode("utf-8")
                if len(raw) > 0x7FFF:
                    raise ValueError(f"{step[1].owner}.{step[1].name}: {len(raw)} bytes is too long for a string")
                run += _I16.pack(len(raw))
                run += raw
                out.size += 2 + len(raw)
            elif kind == 2:  # bytes, records
                value = step[1].value(fields)
                if value is None:
                    _null(out, step[1], step[2], b"\xff\xff\xff\xff")
                    continue
                run += _I32.pack(len(value))
                out.size += 4
                if isinstance(value, FileRegion):
                    out.region(value)
                    run = out.run
                else:
                    run += value
                    out.size += len(value)
            elif kind == 3:  # array of entities or of primitives
                _, field, nullable, item, _ = step
                items = field.value(fields)
                if items is None:
                    _null(out, field, nullable, b"\xff\xff\xff\xff")
                    continue
                run += _I32.pack(len(items))
                out.size += 4
                if step[4]:  # primitives: each item written as a one-field message
                    for each in items:
                        item.write(out, {"item": each})
                else:
                    for each in items:
                        item.write(out, each)
                run = out.run
            elif kind == 4:  # one nested entity
                _, field, nullable, item = step
                value = field.value(fields)
                if nullable:
                    run += b"\xff" if value is None else b"\x01"
                    out.size += 1
                    if value is None:
                        continue
                item.write(out, value)
                run = out.run
            else:  # uuid
                value = step[1].value(fields)
                run += (value if value is not None else uuid.UUID(int=0)).bytes
                out.size += 16
        out.run = run


def _null(out: _Out, field: _Field, nullable: bool, marker: bytes) -> None:
    """Write a null (length -1) where the field allows one."""
    if not nullable:
        raise TypeError(f"{field.owner}.{field.name} may not be null")
    out.run += marker  # (the same buffer as the caller's run: extended in place)
    out.size += len(marker)


_PLANS: dict[type, _Plan] = {}


def plan_of(cls: type) -> _Plan:
    """The plan of a kio message class (made once)."""
    plan = _PLANS.get(cls)
    if plan is None:
        plan = _PLANS[cls] = _make_plan(cls)
    return plan


def _make_plan(cls: type) -> _Plan:
    if getattr(cls, "__flexible__", False):
        raise ValueError(f"{cls.__module__}.{cls.__qualname__} is a flexible version: not planned")
    hints = typing.get_type_hints(cls)
    owner = f"{cls.__module__}.{cls.__qualname__}"
    steps: list[tuple[Any, ...]] = []
    fixed: list[tuple[_Field, Any]] = []
    formats: list[str] = []

    def close_fixed() -> None:
        if fixed:
            steps.append((0, struct.Struct(">" + "".join(formats)), tuple(fixed), tuple(f.name for f, _ in fixed),
                          any(convert is not None for _, convert in fixed)))
            fixed.clear()
            formats.clear()

    for f in dataclasses.fields(cls):
        default = _MISSING if f.default is dataclasses.MISSING else f.default
        factory = None if f.default_factory is dataclasses.MISSING else f.default_factory
        field = _Field(f.name, default, factory, owner)
        kind = f.metadata.get("kafka_type", "")
        hint = hints[f.name]
        nullable = _nullable(hint)
        array, item_cls = _shape(hint)
        if item_cls is not None:
            close_fixed()
            steps.append((3, field, nullable, plan_of(item_cls), False) if array else (4, field, nullable, plan_of(item_cls)))
            continue
        if array:
            close_fixed()
            item = _Plan([_primitive_step(kind, _Field("item", _MISSING, None, owner))])
            steps.append((3, field, nullable, item, True))
            continue
        if kind in _FIXED:
            fixed.append((field, _CONVERT.get(kind)))
            formats.append(_FIXED[kind])
            continue
        close_fixed()
        steps.append(_primitive_step(kind, field, nullable))
    close_fixed()
    return _Plan(steps)


def _primitive_step(kind: str, field: _Field, nullable: bool = False) -> tuple[Any, ...]:
    if kind in _FIXED:
        convert = _CONVERT.get(kind)
        return (0, struct.Struct(">" + _FIXED[kind]), ((field, convert),), (field.name,), convert is not None)
    if kind == "string":
        return (1, field, nullable)
    if kind in ("bytes", "records"):
        return (2, field, nullable)
    if kind == "uuid":
        return (5, field)
    raise ValueError(f"{field.owner}.{field.name}: no writer for the Kafka type {kind!r}")


def _nullable(hint: Any) -> bool:
    return type(None) in typing.get_args(hint)


def _shape(hint: Any) -> tuple[bool, type | None]:
    """(is an array, the entity class of the field or of its items, or None for primitives)."""
    for arg in (hint, *typing.get_args(hint)):
        if typing.get_origin(arg) is tuple:
            item = typing.get_args(arg)[0]
            return True, item if dataclasses.is_dataclass(item) else None
        if dataclasses.is_dataclass(arg):
            return False, arg  # type: ignore[return-value]
    return False, None


def write_response(correlation_id: int, cls: type, fields: Mapping[str, Any]) -> list[Any]:
    """A response frame (size, response header v0, body) as buffers to write in order; a
    :class:`~logstore._fileio.FileRegion` among the fields stays a buffer of its own.

    Raises:
        KeyError: a field the version needs is missing from ``fields``.
        TypeError, ValueError, struct.error: a value that the field's type cannot hold.
    """
    plan = plan_of(cls)
    out = _Out()
    out.run += _I32.pack(correlation_id)
    out.size = 4
    plan.write(out, fields)
    if not out.parts:
        _I32.pack_into(out.run, 0, out.size)
        return [bytes(out.run)]
    parts = out.parts + ([out.run] if out.run else [])
    _I32.pack_into(parts[0], 0, out.size)
    return [p if isinstance(p, FileRegion) else bytes(p) for p in parts]
