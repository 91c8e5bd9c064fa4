"""The merged report's exit code on made-up runs (no Ray)."""

from __future__ import annotations

import json
from types import SimpleNamespace

from cluster.report import exit_code_of


def test_a_node_whose_outputs_were_refused_makes_the_run_exit_4_naming_it():
    node = SimpleNamespace(label="node-1", gone="")
    said = "PermissionError: Access Denied writing s3://o/r/images/a.jpg"
    refused = {"exit_code": 4, "stdout": json.dumps({"reason": said})}
    cluster = SimpleNamespace(interrupted_by=0, nodes=[node], runs=[SimpleNamespace(node=node, result=refused)])
    frames = {"failed": 0, "lost": 0}
    assert exit_code_of(cluster, frames, False) == (4, f"node-1: {said}")
    refused["exit_code"] = 0
    assert exit_code_of(cluster, frames, False) == (0, "finished")
