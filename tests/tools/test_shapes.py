"""Shapes (normalization/shapes.py): `$ref`s, `anyOf` and recursion, seen through the normalizer."""

from __future__ import annotations

from tests.support.normalize_cases import mcp_tool, normalize


def test_refs_anyof_and_arrays_of_objects() -> None:
    schema = {
        "type": "object",
        "properties": {
            "rooms": {"type": "array", "items": {"$ref": "#/$defs/Room"}},
            "owner": {"anyOf": [{"$ref": "#/$defs/Person"}, {"type": "null"}]},
        },
        "$defs": {
            "Room": {
                "type": "object",
                "properties": {
                    "roomName": {"type": "string"},
                    "children": {"type": "array", "items": {"$ref": "#/$defs/Room"}},
                },
            },
            "Person": {"type": "object", "properties": {"firstName": {"type": "string"}}},
        },
    }
    out, report = normalize(
        mcp_tool("house", schema),
        {
            "rooms": [{"room_name": "a", "children": [{"RoomName": "b"}]}],
            "owner": {"first_name": "x"},
        },
    )
    assert out == {
        "rooms": [{"roomName": "a", "children": [{"roomName": "b"}]}],
        "owner": {"firstName": "x"},
    }
    assert ("arguments.rooms[0].children[0].RoomName", "RoomName", "roomName", "spelling") in report
