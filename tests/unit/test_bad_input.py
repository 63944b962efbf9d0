"""Property-based: malformed workflows, files and API calls end in an M2FlowError naming the key —
never a raw traceback, never a hang."""

from __future__ import annotations

import contextlib
import copy

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import m2flow as mf
from m2flow.cluster import Cluster
from m2flow.config import load_spec, spec_from_dict
from m2flow.errors import M2FlowError
from m2flow.graph import build_graph
from m2flow.planners import make_plan

BASE = {
    "name": "fuzz",
    "workers": {
        "env": {
            "kind": "simulator",
            "class": "tests.workers_for_tests.Counter",
            "replicas": 2,
            "args": {"num_envs": 4},
        },
        "policy": {"kind": "inference", "class": "tests.workers_for_tests.PlusOne"},
        "learner": {"kind": "training", "class": "tests.workers_for_tests.Collect"},
    },
    "flow": {
        "loop": {"horizon": 4, "edges": ["env.obs -> policy.act", "policy.act -> env.step"]},
        "then": ["env.trajectory -> learner.train"],
    },
    "placement": {"mode": "auto"},
    "cluster": {"cpus": 2, "gpus": 0},
}

PATHS = [
    ("name",),
    ("workers",),
    ("workers", "env"),
    ("workers", "env", "replicas"),
    ("workers", "env", "kind"),
    ("workers", "env", "class"),
    ("workers", "env", "args"),
    ("workers", "policy", "resources"),
    ("workers", "learner", "backend"),
    ("flow",),
    ("flow", "loop"),
    ("flow", "loop", "horizon"),
    ("flow", "loop", "edges"),
    ("flow", "then"),
    ("flow", "sync"),
    ("placement", "mode"),
    ("placement", "pipeline_stages"),
    ("placement", "devices"),
    ("cluster", "cpus"),
    ("cluster", "gpus"),
    ("run",),
    ("run", "iterations"),
    ("run", "timeouts"),
]

junk = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True)
    | st.text(max_size=30)
    | st.sampled_from(
        ["env.step -> policy.act", "a.b -> c.d", "env.obs", "0-99", "all", "x" * 500, "环境.步", "-1", "1e309"]
    ),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=8,
)


def check(raw, path: tuple[str, ...] = ()) -> None:
    """Validate, build the graph and plan; success is fine, any failure must be an M2FlowError whose
    message names the key that was changed (or the mapping that holds it)."""
    try:
        spec = spec_from_dict(raw, "fuzz.yaml")
        graph = build_graph(spec)
        make_plan(graph, Cluster.from_spec(spec.cluster))
    except M2FlowError as exc:
        named = {".".join(path[:n]) for n in range(min(2, len(path)), len(path) + 1)}
        assert not path or any(key in str(exc) for key in named), f"{sorted(named)} not named in: {exc}"


def set_path(raw: dict, path: tuple[str, ...], value) -> dict:
    raw = copy.deepcopy(raw)
    node = raw
    for key in path[:-1]:
        node = node.setdefault(key, {}) if isinstance(node, dict) else node
    node[path[-1]] = value
    return raw


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(path=st.sampled_from(PATHS), value=junk)
def test_any_value_anywhere_is_a_plan_or_an_error_naming_its_key(path, value):
    check(set_path(BASE, path, value), path)


@settings(max_examples=100, deadline=None)
@given(
    extra=st.dictionaries(st.text(min_size=1, max_size=15), junk, min_size=1, max_size=3),
    where=st.sampled_from([(), ("workers", "env"), ("flow",), ("placement",), ("run",)]),
)
def test_unknown_keys_are_named(extra, where):
    raw = copy.deepcopy(BASE)
    node = raw
    for key in where:
        node = node.setdefault(key, {})
    fresh = {k: v for k, v in extra.items() if k not in node and k not in ("class", "cls")}
    node.update(fresh)
    if not fresh:
        return
    with pytest.raises(M2FlowError) as info:
        check_strict(raw)
    assert any(repr(k)[1:-1] in str(info.value) or k in str(info.value) for k in fresh)


def check_strict(raw) -> None:
    spec = spec_from_dict(raw, "fuzz.yaml")
    build_graph(spec)


@settings(max_examples=100, deadline=None)
@given(data=st.binary(max_size=300) | st.text(max_size=300).map(str.encode))
def test_any_bytes_as_a_workflow_file(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("fuzz") / "wf.yaml"
    path.write_bytes(data)
    with contextlib.suppress(M2FlowError):
        load_spec(path)


def test_yaml_cannot_construct_objects(tmp_path):
    path = tmp_path / "wf.yaml"
    path.write_text("name: !!python/object/apply:os.system ['echo pwned > " + str(tmp_path / "pwned") + "']\n")
    with pytest.raises(M2FlowError):
        load_spec(path)
    assert not (tmp_path / "pwned").exists()


@pytest.mark.parametrize(
    "call",
    [
        lambda: mf.define_worker("w"),
        lambda: mf.define_worker("w", cls=int, func=len),
        lambda: mf.define_worker("w", func=dict),
        lambda: mf.define_worker("bad name", func=len).port() >> "not a port",
        lambda: mf.Workflow("wf", workers=[mf.define_worker("a", func=len)]).loop(horizon=-3).spec(),
        lambda: mf.run(workers=["never-defined", "also-not"]),
        lambda: mf.run(workers=[mf.define_worker("only", func=len)]),
        lambda: mf.run(),
        lambda: mf.plan(mf.Workflow("wf", workers=[mf.define_worker("a", func=len, replicas=0)])),
        lambda: mf.plan("/no/such/file.yaml"),
    ],
)
def test_api_misuse_is_an_m2flow_error(call):
    with pytest.raises(M2FlowError):
        call()


def test_a_huge_replica_count_is_refused_before_anything_starts():
    raw = copy.deepcopy(BASE)
    raw["workers"]["env"]["replicas"] = 10**9
    with pytest.raises(M2FlowError, match="workers.env.replicas"):
        check_strict(raw)
    raw["workers"]["env"]["replicas"] = 64
    with pytest.raises(M2FlowError, match=r"workers\.env\.replicas: 64 replicas need 64 cpu devices"):
        check(raw) or make_plan(build_graph(spec_from_dict(raw)), Cluster.from_spec(spec_from_dict(raw).cluster))


def test_yaml_round_trip_of_the_base(tmp_path):
    path = tmp_path / "wf.yaml"
    path.write_text(yaml.safe_dump(BASE))
    assert load_spec(path).name == "fuzz"
