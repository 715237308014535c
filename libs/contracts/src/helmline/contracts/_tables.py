"""What grows with a session, as persistent (structure-sharing) collections.

A session's steps, calls and approval requests are looked up by id and read in the order
they were first recorded (the plan's order, for steps); its checkpoints and thoughts are
read in the order they were made. A collection changed by one entry shares everything else
with the one it came from: folding one more event then costs O(log n) however long the
session, where copying a dict or a tuple cost O(n), and a collection handed out in a state
never changes.

Neither persistent map on offer keeps the order of its keys (both are hash tries), so a
`Table` is three collections: positions by key (`immutables.Map`, a hash trie in C) and the
keys and values in order (`pyrsistent` vectors, in C); a `Vector` is one such vector.
"""

from __future__ import annotations

from collections.abc import Callable, ItemsView, Iterable, Iterator, Mapping, Sequence, ValuesView
from typing import Any, TypeVar, get_args, overload

import immutables
from pydantic import GetCoreSchemaHandler
from pydantic_core import CoreSchema, core_schema
from pyrsistent import PVector, pvector

K = TypeVar("K")
V = TypeVar("V")
D = TypeVar("D")
T = TypeVar("T")


class Table(Mapping[K, V]):
    """An immutable mapping that keeps the order its keys were first set in, as a dict does.

    `set` and `update` return a new table and leave this one as it was. It equals any mapping
    with the same entries (a dict too), and validates from and serialises to a JSON object,
    with the schema of a dict of the same types.
    """

    __slots__ = ("_keys", "_positions", "_values")

    _positions: immutables.Map[K, int]
    _keys: PVector[K]
    _values: PVector[V]

    def __init__(self, entries: Mapping[K, V] | Iterable[tuple[K, V]] = ()) -> None:
        ordered = dict(entries)
        self._positions = immutables.Map(zip(ordered, range(len(ordered)), strict=True))
        self._keys = pvector(ordered)
        self._values = pvector(ordered.values())

    def __getitem__(self, key: K) -> V:
        return self._values[self._positions[key]]

    @overload
    def get(self, key: K, /) -> V | None: ...
    @overload
    def get(self, key: K, default: D, /) -> V | D: ...
    def get(self, key: K, default: object = None, /) -> object:
        # Mapping's own `get` catches a KeyError: twice as slow when the key is missing.
        position = self._positions.get(key)
        return default if position is None else self._values[position]

    def __contains__(self, key: object) -> bool:
        return key in self._positions

    def __iter__(self) -> Iterator[K]:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    def values(self) -> TableValues[V]:
        return TableValues(self)

    def items(self) -> TableItems[K, V]:
        return TableItems(self)

    def __repr__(self) -> str:
        return f"Table({dict(self.items())!r})"

    def set(self, key: K, value: V) -> Table[K, V]:
        """This table with `key` set to `value`: in its place if the key is known, else last."""
        position = self._positions.get(key)
        if position is None:
            return self._made(
                self._positions.set(key, len(self._keys)),
                self._keys.append(key),
                self._values.append(value),
            )
        return self._made(self._positions, self._keys, self._values.set(position, value))

    def update(self, entries: Mapping[K, V]) -> Table[K, V]:
        """This table with every entry of `entries` set, in their order."""
        table = self
        for key, value in entries.items():
            table = table.set(key, value)
        return table

    @classmethod
    def _made(
        cls, positions: immutables.Map[K, int], keys: PVector[K], values: PVector[V]
    ) -> Table[K, V]:
        table: Table[K, V] = object.__new__(cls)
        table._positions, table._keys, table._values = positions, keys, values
        return table

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        key, value = get_args(source) or (Any, Any)
        plain = dict[key, value]  # type: ignore[valid-type]
        return _read_and_written_as(plain, cls, _as_dict, handler)


def _as_dict(table: Table[Any, Any]) -> dict[Any, Any]:
    return dict(table.items())


class TableValues(ValuesView[V]):
    """A table's values in order, read from their vector rather than looked up key by key."""

    __slots__ = ("_table",)

    def __init__(self, table: Table[Any, V]) -> None:
        super().__init__(table)
        self._table = table

    def __iter__(self) -> Iterator[V]:
        return iter(self._table._values)

    def __reversed__(self) -> Iterator[V]:
        return reversed(self._table._values)


class TableItems(ItemsView[K, V]):
    """A table's entries in order, paired from its vectors rather than looked up key by key."""

    __slots__ = ("_table",)

    def __init__(self, table: Table[K, V]) -> None:
        super().__init__(table)
        self._table = table

    def __iter__(self) -> Iterator[tuple[K, V]]:
        return zip(self._table._keys, self._table._values, strict=True)


class Vector(Sequence[T]):
    """An immutable sequence, read like the tuple it replaced, that `append` extends by
    sharing the rest. It equals another vector of the same items (not a tuple), and validates
    from and serialises to a JSON array, with the schema of a tuple of the same items."""

    __slots__ = ("_items",)

    _items: PVector[T]

    def __init__(self, items: Iterable[T] = ()) -> None:
        self._items = pvector(items)

    @overload
    def __getitem__(self, index: int) -> T: ...
    @overload
    def __getitem__(self, index: slice) -> Vector[T]: ...
    def __getitem__(self, index: int | slice) -> T | Vector[T]:
        if isinstance(index, slice):
            return self._made(self._items[index])
        return self._items[index]

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[T]:
        return iter(self._items)

    def __reversed__(self) -> Iterator[T]:
        return reversed(self._items)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Vector) and self._items == other._items

    def __hash__(self) -> int:
        return hash(self._items)

    def __repr__(self) -> str:
        return f"Vector({list(self._items)!r})"

    def append(self, item: T) -> Vector[T]:
        """This vector with `item` after its last."""
        return self._made(self._items.append(item))

    @classmethod
    def _made(cls, items: PVector[T]) -> Vector[T]:
        vector: Vector[T] = object.__new__(cls)
        vector._items = items
        return vector

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        (item,) = get_args(source) or (Any,)
        plain = tuple[item, ...]  # type: ignore[valid-type]
        return _read_and_written_as(plain, cls, tuple, handler)


def _read_and_written_as(
    plain: Any,
    made: Callable[[Any], Any],
    unmade: Callable[[Any], Any],
    handler: GetCoreSchemaHandler,
) -> CoreSchema:
    """Validation that reads a `plain` dict or tuple type and `made` a persistent collection
    of it, and serialisation that writes the collection `unmade` back as that type: stored
    states, the API's documents and the schemas read exactly as they did before."""
    schema = handler.generate_schema(plain)
    return core_schema.no_info_after_validator_function(
        made,
        schema,
        serialization=core_schema.plain_serializer_function_ser_schema(
            unmade, return_schema=schema
        ),
    )
