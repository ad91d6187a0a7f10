"""Kubernetes label selectors, in both forms nodeagent meets them (pure).

* The string form an admin writes in ``[cluster] set_selector``, as ``kubectl -l`` takes it:
  ``env=edge,tier!=test,gpu,!legacy,zone in (a,b),arch notin (s390x)``.
* The object form of ``MachineConfigPool.spec.nodeSelector``: ``matchLabels`` plus
  ``matchExpressions`` with the operators In, NotIn, Exists and DoesNotExist.

Both parse into one ``Selector``: a conjunction of requirements. The empty selector
matches everything; a ``None`` LabelSelector object matches nothing, as in Kubernetes.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from nodeagent.errors import ConfigInvalid
from nodeagent.strict import clip

Operator = Literal["In", "NotIn", "Exists", "DoesNotExist"]
_KEY_RE = re.compile(r"([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
_VALUE_RE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?")
_SET_RE = re.compile(r"\s*(?P<key>[^\s!=(),]+)\s+(?P<op>in|notin)\s*\((?P<values>[^()]*)\)\s*")


@dataclass(frozen=True, slots=True)
class Requirement:
    key: str
    operator: Operator
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        match self.operator:
            case "Exists":
                return present
            case "DoesNotExist":
                return not present
            case "In":
                return present and labels[self.key] in self.values
            case "NotIn":
                return not present or labels[self.key] not in self.values


@dataclass(frozen=True, slots=True)
class Selector:
    requirements: tuple[Requirement, ...] = ()
    is_nothing: bool = False

    def matches(self, labels: Mapping[str, str]) -> bool:
        return not self.is_nothing and all(r.matches(labels) for r in self.requirements)

    def __str__(self) -> str:
        if self.is_nothing:
            return "(nothing)"
        return ",".join(_format(r) for r in self.requirements) or "(everything)"


EVERYTHING = Selector()
NOTHING = Selector(is_nothing=True)


def parse_selector(text: str) -> Selector:
    """The ``kubectl -l`` string form; ``""`` selects everything. Raises ConfigInvalid."""
    requirements: list[Requirement] = []
    for term in _split_terms(text):
        requirements.append(_parse_term(term, text))
    return Selector(tuple(requirements))


def selector_from_object(obj: Any) -> Selector:
    """A ``metav1.LabelSelector`` as decoded JSON. ``None`` selects nothing, ``{}`` everything.

    A malformed selector (the API server validates, but a stale CRD may not) selects
    nothing: a node must never take sets it was not meant to.
    """
    if obj is None or not isinstance(obj, Mapping):
        return NOTHING
    requirements: list[Requirement] = []
    match_labels = obj.get("matchLabels") or {}
    if not isinstance(match_labels, Mapping):
        return NOTHING
    for key, value in sorted(match_labels.items()):
        requirements.append(Requirement(str(key), "In", frozenset({str(value)})))
    expressions = obj.get("matchExpressions") or []
    if not isinstance(expressions, list):
        return NOTHING
    for item in expressions:
        requirement = _expression(item)
        if requirement is None:
            return NOTHING
        requirements.append(requirement)
    return Selector(tuple(requirements))


def _expression(item: Any) -> Requirement | None:
    if not isinstance(item, Mapping):
        return None
    key, operator, values = item.get("key"), item.get("operator"), item.get("values") or []
    if not isinstance(key, str) or not isinstance(values, list):
        return None
    if operator in ("In", "NotIn") and values:
        return Requirement(key, operator, frozenset(str(v) for v in values))
    if operator in ("Exists", "DoesNotExist") and not values:
        return Requirement(key, operator)
    return None


def _split_terms(text: str) -> list[str]:
    """Split on commas outside parentheses."""
    terms: list[str] = []
    depth, start = 0, 0
    for index, char in enumerate(text):
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        elif char == "," and depth == 0:
            terms.append(text[start:index])
            start = index + 1
    last = text[start:]
    if terms or last.strip():
        terms.append(last)
    return terms


def _parse_term(term: str, whole: str) -> Requirement:
    stripped = term.strip()
    if not stripped:
        raise _invalid(whole, "an empty requirement between commas")
    if found := _SET_RE.fullmatch(term):
        values = [v.strip() for v in found["values"].split(",")]
        if not all(values):
            raise _invalid(whole, f"an empty value in '{clip(stripped, 80)}'")
        operator: Operator = "In" if found["op"] == "in" else "NotIn"
        return _checked(Requirement(found["key"], operator, frozenset(values)), whole)
    for token, operator in (("!=", "NotIn"), ("==", "In"), ("=", "In")):
        key, sep, value = stripped.partition(token)
        if sep:
            return _checked(Requirement(key.strip(), operator, frozenset({value.strip()})), whole)
    if stripped.startswith("!"):
        return _checked(Requirement(stripped[1:].strip(), "DoesNotExist"), whole)
    return _checked(Requirement(stripped, "Exists"), whole)


def _checked(requirement: Requirement, whole: str) -> Requirement:
    if _KEY_RE.fullmatch(requirement.key) is None or len(requirement.key) > 316:
        raise _invalid(whole, f"'{clip(requirement.key, 80)}' is not a label key")
    for value in requirement.values:
        if len(value) > 63 or _VALUE_RE.fullmatch(value) is None:
            raise _invalid(whole, f"'{clip(value, 80)}' is not a label value")
    return requirement


def _invalid(whole: str, why: str) -> ConfigInvalid:
    return ConfigInvalid(
        f"label selector '{clip(whole, 200)}': {why}; write it as kubectl -l takes it, "
        "e.g. 'env=edge,tier!=test,zone in (a,b),!legacy'"
    )


def _format(r: Requirement) -> str:
    values = sorted(r.values)
    match r.operator:
        case "Exists":
            return r.key
        case "DoesNotExist":
            return "!" + r.key
        case "In" if len(values) == 1:
            return f"{r.key}={values[0]}"
        case "NotIn" if len(values) == 1:
            return f"{r.key}!={values[0]}"
        case "In":
            return f"{r.key} in ({','.join(values)})"
        case _:
            return f"{r.key} notin ({','.join(values)})"
