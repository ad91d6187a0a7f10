"""YAML as Kubernetes reads it, bounded: the loader behind ``strict.load_yaml``.

Three passes, each linear in the input: the token stream gives the nesting depth (so the
recursive composer never meets a stack it cannot hold); the composed node graph gives the
size after alias expansion (shared nodes are counted as often as they would be expanded,
without expanding them; a cycle is refused); only then are values constructed.

Values are plain: timestamps stay strings (``release: 2024-02-30`` is a label value, not
a date), an explicit tag must fit its value (``!!int x`` is refused, not a crash), a key
given twice in one mapping is refused (as kubectl does), and ``!!binary``, ``!!set``,
``!!omap``, ``!!pairs`` and Python tags are refused.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import yaml
from yaml.constructor import ConstructorError
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from nodeagent.strict import MAX_INT_DIGITS, MalformedInput, _check_strings, clip, quoted

_TIMESTAMP = "tag:yaml.org,2002:timestamp"
_MERGE = "tag:yaml.org,2002:merge"
_BASE: type[Any] = yaml.CSafeLoader if yaml.__with_libyaml__ else yaml.SafeLoader
_OPENS = (
    yaml.BlockSequenceStartToken,
    yaml.BlockMappingStartToken,
    yaml.FlowSequenceStartToken,
    yaml.FlowMappingStartToken,
)
_CLOSES = (yaml.BlockEndToken, yaml.FlowSequenceEndToken, yaml.FlowMappingEndToken)


class _Loader(_BASE):  # type: ignore[misc]  # PyYAML's loader classes come as Any
    """SafeLoader without timestamps and with checked scalars."""

    yaml_implicit_resolvers: ClassVar[dict[str, list[tuple[str, Any]]]] = {
        first: [(tag, regexp) for tag, regexp in resolvers if tag != _TIMESTAMP]
        for first, resolvers in _BASE.yaml_implicit_resolvers.items()
    }

    def construct_yaml_int(self, node: ScalarNode) -> int:
        digits = str(node.value).replace("_", "").lstrip("+-")
        if len(digits) > MAX_INT_DIGITS:
            raise ConstructorError(
                None, None, f"an integer of {len(digits)} digits", node.start_mark
            )
        try:
            return int(super().construct_yaml_int(node))
        except (ValueError, IndexError):  # IndexError: PyYAML reads value[0] of "" and "+"
            raise ConstructorError(
                None, None, f"{quoted(node.value, 40)} is not an integer", node.start_mark
            ) from None

    def construct_yaml_float(self, node: ScalarNode) -> float:
        try:
            value = float(super().construct_yaml_float(node))
        except (ValueError, IndexError):  # IndexError: as for integers
            raise ConstructorError(
                None, None, f"{quoted(node.value, 40)} is not a number", node.start_mark
            ) from None
        if not math.isfinite(value):
            raise ConstructorError(None, None, "NaN and infinity are refused", node.start_mark)
        return value

    def construct_yaml_bool(self, node: ScalarNode) -> bool:
        value = self.construct_scalar(node)
        if str(value).lower() not in self.bool_values:
            raise ConstructorError(
                None, None, f"{quoted(value, 40)} is not a boolean", node.start_mark
            )
        return bool(self.bool_values[str(value).lower()])

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        """A mapping whose own keys are unique (merged ``<<`` keys may be overridden)."""
        if not isinstance(node, MappingNode):  # ``!!map 0``: a tag that does not fit
            raise ConstructorError(
                None,
                None,
                f"a {node.id} tagged {clip(node.tag, 60)} is no mapping",
                node.start_mark,
            )
        seen: set[tuple[str, str]] = set()
        for key_node, _ in node.value:
            if isinstance(key_node, ScalarNode) and key_node.tag != _MERGE:
                key = (key_node.tag, key_node.value)
                if key in seen:
                    raise ConstructorError(
                        None,
                        None,
                        f"duplicate key {quoted(key_node.value, 80)}",
                        key_node.start_mark,
                    )
                seen.add(key)
        return dict(super().construct_mapping(node, deep=deep))

    def construct_as_string(self, node: Node) -> str:
        return str(self.construct_scalar(node))

    def refuse(self, node: Node) -> Any:
        raise ConstructorError(
            None, None, f"the tag {clip(node.tag, 60)} is refused", node.start_mark
        )


_Loader.add_constructor("tag:yaml.org,2002:int", _Loader.construct_yaml_int)
_Loader.add_constructor("tag:yaml.org,2002:float", _Loader.construct_yaml_float)
_Loader.add_constructor("tag:yaml.org,2002:bool", _Loader.construct_yaml_bool)
_Loader.add_constructor(_TIMESTAMP, _Loader.construct_as_string)
for _tag in ("binary", "set", "omap", "pairs"):
    _Loader.add_constructor(f"tag:yaml.org,2002:{_tag}", _Loader.refuse)
_Loader.add_constructor(None, _Loader.refuse)


def load_documents(text: str, *, what: str, max_depth: int, max_nodes: int) -> list[Any]:
    try:
        _check_depth(text, what, max_depth)
        loader = _Loader(text)
        try:
            nodes = []
            while loader.check_node():
                nodes.append(loader.get_node())
            for node in nodes:
                _check_expansion(node, what, max_nodes)
            documents = [loader.construct_document(node) for node in nodes]
        finally:
            loader.dispose()
    except yaml.YAMLError as exc:
        raise MalformedInput(f"{what} is not valid YAML: {_describe(exc)}") from None
    except RecursionError:
        raise MalformedInput(f"{what} is nested too deep") from None
    _check_strings(documents, what)
    return documents


def _check_depth(text: str, what: str, max_depth: int) -> None:
    depth = 0
    for token in yaml.scan(text, Loader=_BASE):
        if isinstance(token, _OPENS):
            depth += 1
            if depth > max_depth:
                raise MalformedInput(f"{what} is nested more than {max_depth} deep")
        elif isinstance(token, _CLOSES):
            depth -= 1


def _check_expansion(root: Node, what: str, max_nodes: int) -> None:
    """Values after alias expansion, counted on the shared graph; cycles are refused."""
    weight: dict[int, int] = {}
    visiting: set[int] = set()
    stack: list[tuple[Node, bool]] = [(root, False)]
    while stack:
        node, is_expanded = stack.pop()
        key = id(node)
        if is_expanded:
            visiting.discard(key)
            weight[key] = 1 + sum(weight[id(child)] for child in _children(node))
            if weight[key] > max_nodes:
                raise MalformedInput(
                    f"{what} expands to more than {max_nodes} values (aliases of aliases)"
                )
            continue
        if key in weight:
            continue
        if key in visiting:
            raise MalformedInput(f"{what} contains an alias that refers to itself")
        visiting.add(key)
        stack.append((node, True))
        stack.extend((child, False) for child in _children(node) if id(child) not in weight)


def _children(node: Node) -> list[Node]:
    if isinstance(node, SequenceNode):
        return list(node.value)
    if isinstance(node, MappingNode):
        return [part for pair in node.value for part in pair]
    return []


def _describe(exc: yaml.YAMLError) -> str:
    if isinstance(exc, yaml.MarkedYAMLError):
        problem = clip(exc.problem or exc.context or "invalid", 160)
        mark = exc.problem_mark or exc.context_mark
        if mark is not None:
            return f"{problem} at line {mark.line + 1}, column {mark.column + 1}"
        return problem
    return clip(exc, 160)
