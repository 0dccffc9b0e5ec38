"""Tool-call parsers: the registry and the hermes format on good, several, malformed and unclosed blocks."""

from __future__ import annotations

import json

import pytest

from verl.agents.tool_parser import FunctionCall, HermesToolParser, ParsedTurn, ToolParser


@pytest.fixture
def hermes() -> ToolParser:
    return ToolParser.get("hermes", tokenizer=None)


def test_registry_lookup_names_and_errors():
    assert "hermes" in ToolParser.names()
    assert ToolParser.names() == sorted(ToolParser.names())
    parser = ToolParser.get("hermes", "tok")
    assert isinstance(parser, HermesToolParser) and parser.tokenizer == "tok"
    assert parser.stop_token_ids == []
    with pytest.raises(ValueError, match=r"unknown tool parser 'qwen9' \(.*multi_turn.format\); registered: \["):
        ToolParser.get("qwen9", None)


def test_register_a_plugin_parser_and_refuse_a_clash():
    @ToolParser.register("test-upper")
    class Upper(ToolParser):
        def extract_tool_calls(self, text):
            return ParsedTurn(content=text.upper())

    try:
        assert "test-upper" in ToolParser.names()
        assert ToolParser.get("test-upper", None).extract_tool_calls("ab").content == "AB"
        assert ToolParser.register("test-upper")(Upper) is Upper  # the same class again is fine

        with pytest.raises(ValueError, match=r"'test-upper' is already registered by .*Upper; choose another"):

            @ToolParser.register("test-upper")
            class Other(Upper):
                pass

        with pytest.raises(TypeError, match="is not a ToolParser subclass"):
            ToolParser.register("test-x")(dict)
        with pytest.raises(ValueError, match="name must be a non-empty string"):
            ToolParser.register("")
    finally:
        ToolParser._registry.pop("test-upper", None)


def test_one_good_call(hermes):
    text = 'Let me add.\n<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
    turn = hermes.extract_tool_calls(text)
    assert turn == ParsedTurn(content="Let me add.\n", calls=[FunctionCall("add", '{"a": 2, "b": 3}')], errors=[])


def test_several_calls_in_order_with_unicode_kept(hermes):
    text = (
        '<tool_call>{"name": "a", "arguments": {"q": "café"}}</tool_call> and '
        '<tool_call>{"name": "b", "arguments": {}}</tool_call><tool_call>{"name": "c"}</tool_call> done'
    )
    turn = hermes.extract_tool_calls(text)
    assert [c.name for c in turn.calls] == ["a", "b", "c"]
    assert [json.loads(c.arguments) for c in turn.calls] == [{"q": "café"}, {}, {}]  # no arguments = none
    assert turn.calls[0].arguments == '{"q": "café"}'  # ensure_ascii=False, as verl
    assert turn.content == " and  done" and turn.errors == []


def test_text_without_calls(hermes):
    assert hermes.extract_tool_calls("#### 5") == ParsedTurn(content="#### 5")


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            '{"name": "add", "arguments": {"a": 1,}}',
            "tool call 2: invalid JSON (Expecting property name enclosed in double quotes at column 38)",
        ),
        ('["add", {"a": 1}]', "must be a JSON object"),
        ('{"arguments": {"a": 1}}', 'has no "name" (the function to call, a string)'),
        ('{"name": "", "arguments": {}}', 'has no "name"'),
        ('{"name": 3, "arguments": {}}', 'has no "name"'),
        (
            '{"name": "add", "arguments": "{\\"a\\": 1}"}',
            '"arguments" must be a JSON object, got string',
        ),
        ('{"name": "add", "arguments": [1, 2]}', "got array"),
    ],
)
def test_each_malformed_block_is_one_error(hermes, body, message):
    good = '<tool_call>{"name": "ok", "arguments": {"x": 1}}</tool_call>'
    turn = hermes.extract_tool_calls(f"A{good}B<tool_call>{body}</tool_call>C")
    assert turn.calls == [FunctionCall("ok", '{"x": 1}')]
    assert len(turn.errors) == 1
    assert turn.errors[0].startswith("tool call 2")
    assert message in turn.errors[0]
    assert turn.content == "ABC"


def test_unclosed_block_is_an_error_and_dropped_from_content(hermes):
    text = 'Sure. <tool_call>{"name": "a", "arguments": {}}</tool_call> then <tool_call>{"name": "b", "argu'
    turn = hermes.extract_tool_calls(text)
    assert turn.calls == [FunctionCall("a", "{}")]
    assert turn.content == "Sure.  then "
    assert turn.errors == ["a <tool_call> block was not closed with </tool_call>"]


def test_errors_are_short_and_multi_line_json_names_the_line(hermes):
    # The message is a tool response inside the response budget: it does not quote the block back.
    turn = hermes.extract_tool_calls("<tool_call>" + "x" * 1000 + "</tool_call>")
    assert turn.errors == ["tool call 1: invalid JSON (Expecting value at column 1)"]
    turn = hermes.extract_tool_calls('<tool_call>{"name": "a",\n "arguments": {1}}</tool_call>')
    assert turn.errors == [
        "tool call 1: invalid JSON (Expecting property name enclosed in double quotes at line 2 column 16)"
    ]
