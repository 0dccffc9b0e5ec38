"""YAML reading/writing with YAML 1.2 core-schema scalars.

PyYAML implements YAML 1.1, where ``1e-6`` is a *string* (a float needs a dot),
``yes``/``off`` are booleans, ``017`` is octal, ``1:30`` is the integer 90 and
``2024-01-01`` a date. OmegaConf (verl's loader) patches the float case; we go
further and use the YAML 1.2 core schema for every implicit scalar, in both the
loader and the dumper, so that what ``to_yaml`` writes reads back identically and
``lr=1e-6`` on the command line is a float.
"""

from __future__ import annotations

import re
from typing import Any

import yaml
from yaml.resolver import BaseResolver

_INT = re.compile(r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$")
_FLOAT = re.compile(
    r"^(?:[-+]?(?:[0-9]+\.[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?"
    r"|[-+]?[0-9]+[eE][-+]?[0-9]+"
    r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
)
_BOOL = re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$")
_NULL = re.compile(r"^(?:~|null|Null|NULL|)$")


class _Resolver(BaseResolver):
    """Implicit tags of the YAML 1.2 core schema (no timestamps, no sexagesimal, no yes/no)."""


_Resolver.add_implicit_resolver("tag:yaml.org,2002:bool", _BOOL, list("tTfF"))
_Resolver.add_implicit_resolver("tag:yaml.org,2002:int", _INT, list("-+0123456789"))
_Resolver.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT, list("-+0123456789."))
_Resolver.add_implicit_resolver("tag:yaml.org,2002:null", _NULL, ["~", "n", "N", ""])


class _Constructor(yaml.constructor.SafeConstructor):
    def construct_yaml_int(self, node: yaml.Node) -> int:
        text = str(self.construct_scalar(node))
        if text.startswith("0o"):
            return int(text[2:], 8)
        if text.startswith("0x"):
            return int(text[2:], 16)
        return int(text, 10)  # YAML 1.2: "017" is 17, not octal 15

    def construct_yaml_bool(self, node: yaml.Node) -> bool:
        return str(self.construct_scalar(node)).lower() == "true"


_Constructor.add_constructor("tag:yaml.org,2002:int", _Constructor.construct_yaml_int)
_Constructor.add_constructor("tag:yaml.org,2002:bool", _Constructor.construct_yaml_bool)


class Loader(
    yaml.reader.Reader, yaml.scanner.Scanner, yaml.parser.Parser, yaml.composer.Composer, _Constructor, _Resolver
):
    """Safe loader with YAML 1.2 core-schema scalars."""

    def __init__(self, stream: Any) -> None:
        yaml.reader.Reader.__init__(self, stream)
        yaml.scanner.Scanner.__init__(self)
        yaml.parser.Parser.__init__(self)
        yaml.composer.Composer.__init__(self)
        _Constructor.__init__(self)
        _Resolver.__init__(self)


class Dumper(yaml.emitter.Emitter, yaml.serializer.Serializer, yaml.representer.SafeRepresenter, _Resolver):
    """Safe dumper that quotes exactly the strings :class:`Loader` would read as non-strings."""

    def __init__(self, stream: Any, **kwargs: Any) -> None:
        yaml.emitter.Emitter.__init__(
            self,
            stream,
            canonical=kwargs.get("canonical"),
            indent=kwargs.get("indent"),
            width=kwargs.get("width"),
            allow_unicode=kwargs.get("allow_unicode"),
            line_break=kwargs.get("line_break"),
        )
        yaml.serializer.Serializer.__init__(
            self,
            encoding=kwargs.get("encoding"),
            explicit_start=kwargs.get("explicit_start"),
            explicit_end=kwargs.get("explicit_end"),
            version=kwargs.get("version"),
            tags=kwargs.get("tags"),
        )
        yaml.representer.SafeRepresenter.__init__(
            self,
            default_style=kwargs.get("default_style"),
            default_flow_style=kwargs.get("default_flow_style", False),
            sort_keys=kwargs.get("sort_keys", True),
        )
        _Resolver.__init__(self)


def _represent_tuple(dumper: Dumper, data: tuple) -> yaml.Node:
    return dumper.represent_list(list(data))


Dumper.add_representer(tuple, _represent_tuple)


def load_yaml(text: str) -> Any:
    """Parse YAML text with 1.2 core-schema scalars. Raises ``yaml.YAMLError`` on bad syntax."""
    return yaml.load(text, Loader=Loader)  # noqa: S506 - Loader is a safe loader


def dump_yaml(data: Any) -> str:
    """Write plain data (dicts, lists, scalars) as block-style YAML, keys in insertion order."""
    return yaml.dump(data, Dumper=Dumper, sort_keys=False, default_flow_style=False, allow_unicode=True, width=100)


def parse_scalar(text: str) -> Any:
    """Type an override value like Hydra does: YAML scalar/flow typing, raw text if it is not valid YAML.

    ``"4"`` -> 4, ``"1e-6"`` -> 1e-06, ``"true"`` -> True, ``"null"`` -> None,
    ``"[a,b]"`` -> ["a", "b"], ``"'4'"`` -> "4", ``""`` -> "" (Hydra's empty string).
    """
    if text == "":
        return ""
    try:
        return load_yaml(text)
    except yaml.YAMLError:
        return text
