"""What grows with a session: persistent collections that read like the dicts and tuples
they replaced."""

from __future__ import annotations

from pydantic import TypeAdapter

from helmline.contracts import StepState, Table, Vector


def test_a_table_keeps_the_order_keys_were_first_set_in_and_never_changes() -> None:
    first = Table({"b": 1, "a": 2})
    second = first.set("a", 3).set("c", 4)
    assert list(second.items()) == [("b", 1), ("a", 3), ("c", 4)]
    assert list(reversed(second.values())) == [4, 3, 1]
    assert first == {"b": 1, "a": 2}
    assert list(first) == ["b", "a"]
    assert first.update({"c": 5, "b": 6}) == {"b": 6, "a": 2, "c": 5}
    assert (first.get("z"), first.get("z", 0), "z" in first, len(second)) == (None, 0, False, 3)


def test_a_table_validates_and_serialises_as_the_dict_it_replaced() -> None:
    # Stored states, the API's documents and the exported schemas read as they did.
    tables, dicts = TypeAdapter(Table[str, StepState]), TypeAdapter(dict[str, StepState])
    steps = {"b": StepState(id="b", status="running"), "a": StepState(id="a")}
    assert tables.dump_json(Table(steps)) == dicts.dump_json(steps)
    assert list(tables.validate_json(dicts.dump_json(steps))) == ["b", "a"]
    for mode in ("validation", "serialization"):
        assert tables.json_schema(mode=mode) == dicts.json_schema(mode=mode)


def test_a_vector_appends_without_changing_and_serialises_as_the_tuple_it_replaced() -> None:
    first = Vector(("a", "b"))
    second = first.append("c")
    assert (list(first), list(second), list(reversed(second))) == (
        ["a", "b"],
        ["a", "b", "c"],
        ["c", "b", "a"],
    )
    assert (second[-1], second[1:], second[:2] == first) == ("c", Vector(("b", "c")), True)
    vectors, tuples = TypeAdapter(Vector[str]), TypeAdapter(tuple[str, ...])
    assert vectors.dump_json(second) == tuples.dump_json(("a", "b", "c"))
    assert vectors.validate_json(b'["a","b"]') == first
    for mode in ("validation", "serialization"):
        assert vectors.json_schema(mode=mode) == tuples.json_schema(mode=mode)
