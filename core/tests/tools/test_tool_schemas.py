"""``ToolSchema``: validation of verl's OpenAI schema dict (each missing / ill-typed field named), the dict round
trip, and ``check_arguments`` on every JSON type, enum, missing and unknown arguments. ``ToolResponse`` checks."""

from __future__ import annotations

import copy
import json

import pytest

from verl.tools import ToolResponse, ToolSchema

SCHEMA = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "find things",
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "what to find"},
                "limit": {"type": "integer"},
                "score": {"type": "number"},
                "exact": {"type": "boolean"},
                "tags": {"type": "array"},
                "filters": {"type": "object"},
                "mode": {"type": "string", "enum": ["fast", "deep"]},
                "page": {"type": ["integer", "null"]},
            },
            "required": ["query", "limit"],
        },
    },
}


@pytest.fixture
def schema() -> ToolSchema:
    return ToolSchema.from_dict(SCHEMA, where="test.yaml: tools[0].tool_schema")


def test_round_trip_gives_verl_dict_back_and_is_a_copy(schema):
    assert schema.name == "search"
    assert schema.required == ["query", "limit"]
    out = schema.to_dict()
    assert out == SCHEMA
    out["function"]["parameters"]["properties"].clear()
    assert schema.to_dict() == SCHEMA  # the schema is not shared with a caller's dict
    assert json.loads(json.dumps(out)) == out  # plain JSON types, as apply_chat_template needs


def test_parameters_and_required_default_to_an_empty_object():
    schema = ToolSchema.from_dict(
        {"type": "function", "function": {"name": "ping", "description": "no args"}}, where="w"
    )
    assert schema.to_dict()["function"]["parameters"] == {"type": "object", "properties": {}, "required": []}
    assert schema.check_arguments({}) is None
    assert schema.check_arguments({"x": 1}) == "unknown argument(s) 'x' (expected: none)"


def test_strict_is_kept_only_when_true():
    data = copy.deepcopy(SCHEMA)
    data["function"]["strict"] = True
    assert ToolSchema.from_dict(data, where="w").to_dict()["function"]["strict"] is True
    assert "strict" not in ToolSchema.from_dict(SCHEMA, where="w").to_dict()["function"]


def _broken(path: list, value):
    data = copy.deepcopy(SCHEMA)
    node = data
    for key in path[:-1]:
        node = node[key]
    if value is KeyError:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return data


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ([], "tool_schema must be a mapping"),
        (_broken(["type"], "tool"), "type must be 'function'"),
        (_broken(["function"], KeyError), "function is missing"),
        (_broken(["function", "name"], KeyError), "function.name must be a non-empty string"),
        (_broken(["function", "name"], "  "), "function.name must be a non-empty string"),
        (_broken(["function", "description"], KeyError), "function.description is missing or not a string"),
        (_broken(["function", "parameters"], "x"), "function.parameters must be a mapping"),
        (_broken(["function", "parameters", "type"], "array"), "function.parameters.type must be 'object'"),
        (_broken(["function", "parameters", "properties"], []), "function.parameters.properties must be a mapping"),
        (_broken(["function", "parameters", "properties", "limit"], "int"), "properties.limit must be a mapping"),
        (_broken(["function", "parameters", "properties", "limit", "type"], KeyError), "properties.limit.type must"),
        (_broken(["function", "parameters", "properties", "limit", "type"], "int"), "properties.limit.type must"),
        (_broken(["function", "parameters", "properties", "mode", "enum"], "fast"), "properties.mode.enum must"),
        (_broken(["function", "parameters", "required"], "query"), "function.parameters.required must be a list"),
        (_broken(["function", "parameters", "required"], ["query", "nope"]), "names ['nope'], which are not in"),
        (_broken(["function", "strict"], "yes"), "function.strict must be true or false"),
    ],
)
def test_every_bad_field_is_named_with_where(data, field):
    with pytest.raises(ValueError) as info:
        ToolSchema.from_dict(data, where="f.yaml: tools[3].tool_schema")
    assert str(info.value).startswith("f.yaml: tools[3].tool_schema: ")
    assert field in str(info.value)


def test_valid_arguments_pass(schema):
    args = {
        "query": "cats",
        "limit": 3,
        "score": 0.5,
        "exact": False,
        "tags": ["a"],
        "filters": {"k": 1},
        "mode": "deep",
        "page": None,
    }
    assert schema.check_arguments(args) is None
    assert schema.check_arguments({"query": "q", "limit": 2.0, "score": 7, "page": 4}) is None  # 2.0 is an integer


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([1, 2], "the arguments must be a JSON object, got array"),
        ({"limit": 1}, "missing required argument(s) 'query'"),
        ({}, "missing required argument(s) 'query', 'limit'"),
        ({"query": "q", "limit": 1, "size": 2}, "unknown argument(s) 'size' (expected: 'query', 'limit', 'score'"),
        ({"query": 5, "limit": 1}, "argument 'query' must be string, got integer 5"),
        ({"query": "q", "limit": "3"}, "argument 'limit' must be integer, got string '3'"),
        ({"query": "q", "limit": 2.5}, "argument 'limit' must be integer, got number 2.5"),
        ({"query": "q", "limit": True}, "argument 'limit' must be integer, got boolean True"),
        ({"query": "q", "limit": 1, "score": True}, "argument 'score' must be number, got boolean True"),
        ({"query": "q", "limit": 1, "score": "1"}, "argument 'score' must be number, got string '1'"),
        ({"query": "q", "limit": 1, "exact": 1}, "argument 'exact' must be boolean, got integer 1"),
        ({"query": "q", "limit": 1, "tags": "a"}, "argument 'tags' must be array, got string 'a'"),
        ({"query": "q", "limit": 1, "filters": []}, "argument 'filters' must be object, got array []"),
        ({"query": "q", "limit": 1, "mode": "slow"}, "argument 'mode' must be one of ['fast', 'deep'], got 'slow'"),
        ({"query": "q", "limit": 1, "page": "2"}, "argument 'page' must be integer or null, got string '2'"),
    ],
)
def test_each_problem_is_described(schema, args, message):
    assert message in schema.check_arguments(args)


def test_several_problems_are_all_listed(schema):
    problem = schema.check_arguments({"limit": "x", "extra": 1})
    assert problem.split("; ") == [
        "missing required argument(s) 'query'",
        "unknown argument(s) 'extra' (expected: 'query', 'limit', 'score', 'exact', 'tags', 'filters', 'mode', 'page')",
        "argument 'limit' must be integer, got string 'x'",
    ]


def test_long_values_are_shortened_in_messages(schema):
    problem = schema.check_arguments({"query": "q", "limit": "9" * 500})
    assert len(problem) < 150 and problem.endswith("...")


def test_tool_response_fields_and_list_checks():
    assert ToolResponse().is_empty()
    assert not ToolResponse(text="x").is_empty()
    assert ToolResponse(image=[1]).image == [1]
    with pytest.raises(TypeError, match=r"ToolResponse.image must be a list or None, got str; wrap"):
        ToolResponse(image="img.png")
    with pytest.raises(TypeError, match=r"ToolResponse.video must be a list"):
        ToolResponse(video=(1,))
