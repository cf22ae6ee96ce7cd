"""docs/kuberay.md's RayCluster manifest: one worker group per node class of deployments/node-catalogue.toml, with the marker
resource trident counts and steers by; and scripts/check_kuberay_manifest.py, which checks it against a KubeRay CRD."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from trident_flows.planning.catalogue import load_catalogue
from trident_flows.planning.scale import NodePool

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("check_kuberay_manifest", ROOT / "scripts" / "check_kuberay_manifest.py")
check = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(check)  # type: ignore[union-attr]


def test_the_manifest_has_a_worker_group_per_catalogue_class_with_its_marker_resource():
    [manifest] = check.manifests((ROOT / "docs" / "kuberay.md").read_text())
    pool = NodePool.from_catalogue(load_catalogue(ROOT / "deployments" / "node-catalogue.toml"))
    groups = {g["groupName"]: g for g in manifest["spec"]["workerGroupSpecs"]}
    assert set(groups) == set(pool.classes.names)
    for name, group in groups.items():
        node = pool.classes.node(name)
        assert json.loads(json.loads(group["rayStartParams"]["resources"])) == {name: 1}
        assert group["maxReplicas"] == node.max_count and float(group["rayStartParams"]["num-cpus"]) == node.cpus
    assert manifest["spec"]["enableInTreeAutoscaling"] is True


# A RayCluster CRD cut down to the fields this test names (the real one is KubeRay's ray.io_rayclusters.yaml)
CRD = {"spec": {"versions": [{"name": "v1", "schema": {"openAPIV3Schema": {
    "type": "object", "properties": {
        "apiVersion": {"type": "string"}, "kind": {"type": "string"}, "metadata": {"type": "object"},
        "spec": {"type": "object", "properties": {
            "workerGroupSpecs": {"type": "array", "items": {
                "type": "object", "required": ["groupName"],
                "properties": {"groupName": {"type": "string"}, "maxReplicas": {"type": "integer"},
                               "template": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}}}}}}}}}]}}


@pytest.mark.parametrize("group, expected", [
    ({"groupName": "cpu16", "maxReplicas": 8, "template": {"anything": 1}}, []),
    ({"groupNme": "cpu16"}, ["spec/workerGroupSpecs/0: 'groupName' is a required property",
                             "spec/workerGroupSpecs/0: Additional properties are not allowed ('groupNme' was unexpected)"]),
    ({"groupName": "cpu16", "maxReplicas": "8"}, ["spec/workerGroupSpecs/0/maxReplicas: '8' is not of type 'integer'"]),
])
def test_the_checker_refuses_unknown_fields_and_wrong_types(group, expected):
    manifest = {"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": "m"}, "spec": {"workerGroupSpecs": [group]}}
    assert check.errors(manifest, CRD) == expected
