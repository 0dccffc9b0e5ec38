"""``load_tools`` on verl's YAML: the shipped files, verl's own class paths, and every error path (each message
must name the file, the entry and the fix). ``BaseTool``'s lifecycle defaults."""

from __future__ import annotations

import asyncio
import re
import textwrap
import uuid
from pathlib import Path

import pytest
import yaml

import verl.tools
from verl.tools import BaseTool, ToolResponse, ToolSchema
from verl.tools.code_interpreter import CodeInterpreterTool
from verl.tools.config import load_tools
from verl.tools.gsm8k import Gsm8kTool
from verl.tools.isolation import box_unavailable_reason

CONFIGS = Path(verl.tools.__file__).with_name("configs")


def schema(name: str) -> dict:
    params = {"type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"]}
    return {"type": "function", "function": {"name": name, "description": "d", "parameters": params}}


@pytest.fixture
def module(tmp_path, monkeypatch):
    """An importable module of test tools under a fresh name (so no test sees another's cached import)."""
    name = f"tooltest_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(
        textwrap.dedent(
            """
            from verl.tools import BaseTool, ToolResponse

            class Echo(BaseTool):
                async def execute(self, instance_id, parameters, **kwargs):
                    return ToolResponse(text=parameters["x"]), 0.0, {}

            class Picky(BaseTool):
                def __init__(self, config, tool_schema):
                    super().__init__(config, tool_schema)
                    if "level" not in config:
                        raise KeyError("config needs level")

            class NotATool:
                pass

            raise_on_import = False
            """
        )
    )
    (tmp_path / f"{name}_broken.py").write_text("import does_not_exist_anywhere\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def write(tmp_path: Path, content: str | dict) -> Path:
    path = tmp_path / f"tools_{uuid.uuid4().hex[:6]}.yaml"
    path.write_text(content if isinstance(content, str) else yaml.safe_dump(content))
    return path


def test_shipped_configs_load_with_verl_names_and_schemas():
    if reason := box_unavailable_reason():  # the shipped code interpreter refuses to run without a box
        pytest.skip(reason)
    (gsm,) = load_tools(CONFIGS / "gsm8k_tool_config.yaml")
    assert isinstance(gsm, Gsm8kTool) and gsm.name == "calc_gsm8k_reward"
    assert gsm.get_openai_tool_schema() == Gsm8kTool.default_tool_schema
    (code,) = load_tools(CONFIGS / "code_interpreter_config.yaml")
    assert isinstance(code, CodeInterpreterTool) and code.name == "code_interpreter"
    assert code.get_openai_tool_schema() == CodeInterpreterTool.default_tool_schema
    assert (code.limits.timeout_s, code.limits.memory_mb, code.max_concurrency) == (10.0, 512, 2)


def test_verl_class_path_and_a_missing_schema_use_the_class_default(tmp_path):
    path = write(tmp_path, "tools:\n  - class_name: verl.tools.gsm8k_tool.Gsm8kTool\n    config: {type: native}\n")
    (tool,) = load_tools(path)
    assert type(tool) is Gsm8kTool and tool.tool_schema == ToolSchema.from_dict(Gsm8kTool.default_tool_schema, where="")


def test_user_classes_in_order_with_config_and_timeout(tmp_path, module):
    tools = [
        {"class_name": f"{module}.Echo", "config": {"timeout": 2.5}, "tool_schema": schema("echo")},
        {"class_name": f"{module}.Picky", "config": {"level": 3, "type": "native"}, "tool_schema": schema("picky")},
    ]
    path = write(tmp_path, {"tools": tools})
    echo, picky = load_tools(path)
    assert [echo.name, picky.name] == ["echo", "picky"]
    assert echo.timeout_s == 2.5 and picky.timeout_s == 30.0  # verl's default
    assert picky.config == {"level": 3, "type": "native"}
    response, reward, metrics = asyncio.run(echo.execute("i", {"x": "hi"}))
    assert (response.text, reward, metrics) == ("hi", 0.0, {})


def test_an_empty_list_gives_no_tools(tmp_path):
    assert load_tools(write(tmp_path, "tools: []\n")) == []
    assert load_tools(write(tmp_path, "tools:\n")) == []


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("tools: [\n", "not valid YAML"),
        ("- a\n", "expected a top-level 'tools:' list"),
        ("interaction: []\n", "expected a top-level 'tools:' list"),
        ("tools: {a: 1}\n", "'tools' must be a list of entries, got dict"),
        ("tools:\n  - just-a-string\n", "tools[0] must be a mapping with class_name, config, tool_schema"),
        ("tools:\n  - config: {}\n", "tools[0] has no class_name: give the tool's dotted class path"),
        ("tools:\n  - class_name: Gsm8kTool\n", "tools[0].class_name must be a dotted import path"),
        (
            "tools:\n  - class_name: verl.tools.gsm8k.Gsm8kTool\n    configs: {}\n",
            "tools[0]: unknown key(s) ['configs']",
        ),
        ("tools:\n  - class_name: verl.tools.gsm8k.Gsm8kTool\n    config: [1]\n", "tools[0].config must be a mapping"),
        (
            "tools:\n  - class_name: verl.tools.gsm8k.Gsm8kTool\n    config: {type: mcp}\n",
            "config.type='mcp': only native",
        ),
        (
            "tools:\n  - class_name: verl.tools.gsm8k.Nope\n",
            "verl.tools.gsm8k has no 'Nope' (BaseTool classes defined there: ['Gsm8kTool'])",
        ),
        ("tools:\n  - class_name: no_such_pkg_xyz.mod.Tool\n", "module 'no_such_pkg_xyz.mod' does not import"),
        (
            "tools:\n  - class_name: verl.tools.gsm8k.Gsm8kTool\n    tool_schema: {type: function}\n",
            "tools[0].tool_schema: function is missing",
        ),
        (
            "tools:\n  - class_name: verl.tools.gsm8k.Gsm8kTool\n    config: {timeout: -1}\n",
            "tools[0] (Gsm8kTool): ValueError: Gsm8kTool config.timeout=-1 must be a positive number",
        ),
        (
            "tools:\n  - class_name: verl.tools.code_interpreter.CodeInterpreterTool\n    config: {timout: 3}\n",
            "unknown key(s) ['timout']",
        ),
        (
            "tools:\n  - class_name: verl.tools.gsm8k.Gsm8kTool\n  - class_name: verl.tools.gsm8k.Gsm8kTool\n",
            "tools[1]: tool name 'calc_gsm8k_reward' is already used by tools[0]",
        ),
    ],
)
def test_errors_name_file_entry_and_fix(tmp_path, text, message):
    path = write(tmp_path, text)
    with pytest.raises(ValueError) as info:
        load_tools(path)
    assert str(info.value).startswith(str(path)), str(info.value)
    assert message in str(info.value)


def test_class_errors_from_user_modules(tmp_path, module):
    for cls, message in [
        ("NotATool", "is not a subclass of verl.tools.base.BaseTool; derive it from BaseTool"),
        ("Picky", "tools[0] (Picky): KeyError: 'config needs level'"),
    ]:
        path = write(tmp_path, {"tools": [{"class_name": f"{module}.{cls}", "tool_schema": schema("t")}]})
        with pytest.raises(ValueError, match=re.escape(message)):
            load_tools(path)
    path = write(tmp_path, f"tools:\n  - class_name: {module}_broken.Tool\n")
    with pytest.raises(ValueError, match=r"does not import \(ModuleNotFoundError: No module named 'does_not_exist"):
        load_tools(path)


def test_missing_file_is_named(tmp_path):
    with pytest.raises(ValueError, match=r"nope\.yaml: no such file"):
        load_tools(tmp_path / "nope.yaml")


def test_base_tool_lifecycle_defaults():
    class Plain(BaseTool):
        pass

    tool = Plain({"timeout": 4}, {"type": "function", "function": {"name": "p", "description": "d"}})
    assert tool.name == "p" and tool.timeout_s == 4.0
    instance, response = asyncio.run(tool.create())
    assert len(instance) == 36 and response == ToolResponse()  # a uuid4
    assert asyncio.run(tool.create("mine"))[0] == "mine"
    assert asyncio.run(tool.calc_reward("mine")) == 0.0
    assert asyncio.run(tool.release("mine")) is None
    with pytest.raises(NotImplementedError, match="Plain must implement execute"):
        asyncio.run(tool.execute("mine", {}))
    assert repr(tool) == "Plain(name='p', timeout_s=4)"


def test_base_tool_input_errors():
    schema = {"type": "function", "function": {"name": "p", "description": "d"}}
    with pytest.raises(ValueError, match="BaseTool: no tool_schema: give one in the tool's YAML entry"):
        BaseTool({}, None)
    with pytest.raises(TypeError, match="config must be a mapping"):
        BaseTool([1], schema)
    with pytest.raises(TypeError, match="tool_schema must be a ToolSchema or its dict, got str"):
        BaseTool({}, "calc")
    with pytest.raises(ValueError, match=r"BaseTool config.timeout='10' must be a positive number"):
        BaseTool({"timeout": "10"}, schema)
    with pytest.raises(ValueError, match="BaseTool tool_schema: function.description is missing"):
        BaseTool({}, {"type": "function", "function": {"name": "p"}})
