"""Fuzz: the node's name from the kubelet's certificate CN (``strict.x509_names``, the PEM
file's bytes) and environment files (``cluster.identity``), its pools (``cluster.pools``)
and the registry pull terms from a Node object (``cluster.readiness``), all from API or
host input.

Contract: the certificate's common names as text, or ``MalformedInput``; a valid Node name
or None; a ``PoolMembership`` or ``PoolMembershipInvalid`` with a
clipped message; ``PullTerms`` whose message is clipped. Nothing else is raised.
"""

from __future__ import annotations

from typing import Any

from cryptography.hazmat.primitives.serialization import Encoding
from hypothesis import example, given
from hypothesis import strategies as st

from nodeagent.cluster.identity import is_node_name, name_from_common_name, override_from_env
from nodeagent.cluster.pools import pools_for_node
from nodeagent.cluster.readiness import pull_terms
from nodeagent.errors import PoolMembershipInvalid
from nodeagent.strict import MalformedInput
from nodeagent.strict.x509_names import pem_subject_common_names, subject_common_names
from tests.fuzz import strategies as s
from tests.fuzz.contract import check_text, outcome
from tests.testenv.pki import Authority

_CNS = ["system:node:worker-0.example.com", "system:node:a", "system:admin"]
_ENV = ['KUBELET_NODE_NAME="ip-10-0-1-2.ec2.internal"\n', "KUBELET_NODE_NAME=\n", "X=1\n"]
labels = st.dictionaries(
    st.one_of(
        st.sampled_from(["node-role.kubernetes.io/master", "kubernetes.io/os"]), s.short_text
    ),
    st.one_of(st.just(""), st.just("windows"), s.short_text),
    max_size=6,
)
selector = st.one_of(
    st.none(),
    s.scalars,
    st.fixed_dictionaries({"matchLabels": st.one_of(labels, s.scalars)}),
    st.fixed_dictionaries(
        {"matchExpressions": st.lists(st.dictionaries(s.short_text, s.scalars), max_size=3)}
    ),
)
pool = st.fixed_dictionaries(
    {
        "metadata": st.fixed_dictionaries({"name": st.one_of(s.short_text, s.scalars)}),
        "spec": st.fixed_dictionaries({"nodeSelector": selector}),
    }
)


_ISSUED = Authority("kubelet-signer").client("worker-0.example.com")
_PEM = _ISSUED.cert_pem + _ISSUED.key_pem  # the kubelet's combined file


@given(st.one_of(s.raw_bytes, s.mutated(st.just(_PEM))))
def test_certificate_common_names(data: bytes) -> None:
    names = outcome(
        "x509_names.pem_subject_common_names",
        lambda: pem_subject_common_names(data),
        allowed=(MalformedInput,),
        is_message_shown=False,
    )
    assert isinstance(names, BaseException) or all(isinstance(n, str) for n in names)


_DER = _ISSUED.certificate.public_bytes(Encoding.DER)


@given(st.one_of(s.raw_bytes, s.mutated(st.just(_DER))))
def test_certificate_der_common_names(data: bytes) -> None:
    names = outcome(
        "x509_names.subject_common_names",
        lambda: subject_common_names(data),
        allowed=(MalformedInput,),
        is_message_shown=False,
    )
    assert isinstance(names, BaseException) or all(isinstance(n, str) for n in names)


@given(st.one_of(s.text, s.edited_text(_CNS)))
@example("system:node:" + "a." * 200)
def test_name_from_common_name(cn: str) -> None:
    name = outcome("identity.name_from_common_name", lambda: name_from_common_name(cn))
    assert name is None or (isinstance(name, str) and is_node_name(name))


@given(st.lists(st.one_of(s.text, s.edited_text(_ENV)), max_size=3))
def test_override_from_env(texts: list[str]) -> None:
    value = outcome("identity.override_from_env", lambda: override_from_env(texts))
    assert value is None or (isinstance(value, str) and "\n" not in value and value)


@given(labels, st.lists(pool, max_size=6))
def test_pools_for_node(node_labels: dict[str, str], pools: list[dict[str, Any]]) -> None:
    outcome(
        "pools.pools_for_node",
        lambda: pools_for_node("n1", node_labels, pools),
        allowed=(PoolMembershipInvalid,),
    )


conditions = st.lists(
    st.one_of(
        s.scalars,
        st.fixed_dictionaries(
            {
                "type": st.sampled_from(["Ready", "DiskPressure"]),
                "status": st.one_of(st.sampled_from(["True", "False", "Unknown"]), s.text),
                "reason": st.one_of(s.text, s.scalars),
            }
        ),
    ),
    max_size=4,
)


@given(st.one_of(s.text, s.scalars), labels, st.one_of(conditions, s.scalars))
def test_pull_terms(name: Any, node_labels: dict[str, str], items: Any) -> None:
    node = {"metadata": {"name": name, "labels": node_labels}, "status": {"conditions": items}}
    terms = outcome("readiness.pull_terms", lambda: pull_terms(node, 1.0))
    assert not isinstance(terms, BaseException)
    check_text(terms.held_message, "readiness.pull_terms message")
