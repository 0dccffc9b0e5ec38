"""``load_tools``: the tools of ``actor_rollout_ref.rollout.multi_turn.tool_config_path`` (verl's
``verl/tools/tool_registry.py:initialize_tools_from_config``).

The file is verl's::

    tools:
      - class_name: verl.tools.gsm8k.Gsm8kTool     # a dotted import path; verl's own paths are accepted too
        config: {type: native, timeout: 30}        # passed to the class; `type` must be native (or absent)
        tool_schema: {type: function, function: {name: ..., description: ..., parameters: {...}}}

``tool_schema`` may be left out when the class has a ``default_tool_schema``.
"""

from __future__ import annotations

from pathlib import Path

from verl.tools._loading import entry_mapping, import_class, read_entries
from verl.tools.base import BaseTool
from verl.tools.schemas import ToolSchema

__all__ = ["describe_isolation", "load_tools"]

_EXAMPLE = """  - class_name: verl.tools.gsm8k.Gsm8kTool
    config: {type: native}
    tool_schema: {type: function, function: {name: calc_gsm8k_reward, description: ..., parameters: ...}}"""


def load_tools(path: str | Path) -> list[BaseTool]:
    """Build every tool of a tool YAML file, in file order.

    Raises:
        ValueError: naming the file, the entry (``tools[i]``) and the fix: an unreadable file or wrong shape, an
            entry that is not a mapping or has no ``class_name``, a class that does not import or is not a
            :class:`BaseTool` subclass, ``config.type`` other than ``native`` (verl's MCP tools are not built
            here), a bad ``tool_schema``, a constructor that raises, or two tools with the same name.
    """
    file, entries = read_entries(path, "tools", _EXAMPLE)
    tools: list[BaseTool] = []
    seen: dict[str, int] = {}
    for i, entry in enumerate(entries):
        where = f"{file}: tools[{i}]"
        if not isinstance(entry, dict):
            raise ValueError(f"{where} must be a mapping with class_name, config, tool_schema; got {entry!r}")
        unknown = sorted(set(entry) - {"class_name", "config", "tool_schema"})
        if unknown:
            raise ValueError(f"{where}: unknown key(s) {unknown}; an entry has class_name, config, tool_schema")
        if "class_name" not in entry:
            raise ValueError(
                f"{where} has no class_name: give the tool's dotted class path, e.g. verl.tools.gsm8k.Gsm8kTool"
            )
        cls = import_class(entry["class_name"], base=BaseTool, where=where)
        config = entry_mapping(entry, "config", where)
        kind = config.get("type", "native")
        if kind != "native":
            raise ValueError(f"{where}.config.type={kind!r}: only native tools (Python classes) are built; use native")
        schema = None
        if entry.get("tool_schema") is not None:
            schema = ToolSchema.from_dict(entry["tool_schema"], where=f"{where}.tool_schema")
        try:
            tool = cls(config=config, tool_schema=schema)
        except Exception as exc:  # the class's own validation: say which entry it was
            raise ValueError(f"{where} ({cls.__qualname__}): {type(exc).__name__}: {exc}") from exc
        if tool.name in seen:
            raise ValueError(
                f"{where}: tool name {tool.name!r} is already used by tools[{seen[tool.name]}]; "
                "each tool needs its own function name (tool_schema.function.name)"
            )
        seen[tool.name] = i
        tools.append(tool)
    return tools


def describe_isolation(path: str | Path) -> list[str]:
    """``"<tool name>: <isolation>"`` for each tool of the file that runs model-written code locally (the code
    interpreter): what ``verl train`` prints at start. Builds the tools (their isolation probes are cached).

    Raises:
        ValueError: as :func:`load_tools`.
    """
    from verl.tools.isolation import Isolation

    return [
        f"{tool.name}: {tool.isolation.describe()}"
        for tool in load_tools(path)
        if isinstance(getattr(tool, "isolation", None), Isolation)
    ]
