"""Every stage's replicas land on the node type the config pins them to, on a three-node cluster."""

from __future__ import annotations

from typing import Any

import ray
from ray._private import state

from tests.integration.support import NODES, STAGE_NODE


def node_types() -> dict[str, str]:
    """Node id -> the simulated node type it advertises."""
    types = {}
    for node in ray.nodes():  # type: ignore[no-untyped-call]
        if node["Alive"]:
            (kind,) = [name for name in NODES if name in node["Resources"]]
            types[node["NodeID"]] = kind
    return types


def serve_actors() -> list[dict[str, Any]]:
    return [a for a in state.actors().values()
            if a["State"] == "ALIVE" and a["ActorClassName"].startswith(("ServeReplica:", "ServeController",
                                                                           "ProxyActor"))]  # fmt: skip


def test_each_stage_runs_on_its_node_type(graph: str) -> None:
    types = node_types()
    assert sorted(types.values()) == sorted(NODES)
    landed: dict[tuple[str, str], set[str]] = {}
    for actor in serve_actors():
        name = actor["ActorClassName"]
        node = types[actor["Address"]["NodeID"]]
        if name.startswith("ServeReplica:"):
            _, app, deployment = name.split(":")
            stage = deployment.rsplit("-", 1)[-1]  # `<model>-<stage>` (deployments/graph.py), or a bare stage
            landed.setdefault((app, stage), set()).add(node)
        else:
            landed.setdefault(("serve", name), set()).add(node)
    print("\nwhere each replica landed:")
    for (app, stage), nodes in sorted(landed.items()):
        print(f"  {app:12} {stage:28} {', '.join(sorted(nodes))}")
    wrong = {key: nodes for key, nodes in landed.items() if key[0] != "serve" and nodes != {STAGE_NODE[key[1]]}}
    assert wrong == {}
    stages = {stage for app, stage in landed if app != "serve"}
    assert stages == set(STAGE_NODE)
    # proxy_location: HeadOnly and Serve's controller both stay on the head node.
    assert all(nodes == {"head_node"} for (app, _), nodes in landed.items() if app == "serve")
