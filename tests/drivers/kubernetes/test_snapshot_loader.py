"""The loader of drivers/files_helper.py (what fills a restored sandbox's claim on Kubernetes),
run as the helper pod runs it (`python3 -I -S -c <program>`), fed a hostile stream directly: the
driver checks paths before it sends them (drivers/kubernetes/files.py), and the loader must hold
on its own too. Nothing may be written through a link, beneath a file, or outside its root. And
the helper pod itself, as the driver writes it, fits the Restricted Pod Security profile the
sandbox namespace is labelled with (docs/security.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from drivers.helper_answers import SCRIPT
from drivers.kubernetes.objects import helper_manifest
from drivers.kubernetes.settings import KubernetesSettings
from tests.support.pod_security import profile, violations


def frame(kind: bytes, payload: bytes) -> bytes:
    return kind + len(payload).to_bytes(4, "big") + payload


def entry(path: str, kind: str, mode: int = 0o644, **more: Any) -> bytes:
    return frame(b"E", json.dumps({"d": path, "k": kind, "m": mode, "mt": 10**18, **more}).encode())


def load(root: Path, stream: bytes) -> dict[str, Any]:
    request = frame(b"J", json.dumps({"op": "load", "root": str(root)}).encode())
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-c", SCRIPT],
        input=request + stream + frame(b"Z", b""),
        capture_output=True,
        timeout=30,
        check=True,
    )
    assert done.stdout[:1] == b"J", done
    answer: dict[str, Any] = json.loads(done.stdout[5:])
    return answer


def test_a_hostile_stream_writes_nothing_outside_its_root(tmp_path: Path) -> None:
    root, outside = tmp_path / "claim", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    stream = b"".join(
        [
            entry("workspace", "dir", 0o755),
            entry("workspace/kept.txt", "file", 0o640),
            frame(b"F", b"kept\n"),
            # A link out of the root, then files "beneath" it: never written through it.
            entry("workspace/out", "symlink", 0o777, l=str(outside)),
            entry("workspace/out/planted", "file"),
            frame(b"F", b"planted\n"),
            entry("workspace/out/sub", "dir"),
            # Paths that climb out, or name nothing.
            entry("workspace/../escaped", "file"),
            frame(b"F", b"escaped\n"),
            entry("/abs", "file"),
            entry("workspace//double", "file"),
            entry("workspace/./dot", "dir"),
            # A file, then something beneath it.
            entry("workspace/kept.txt/below", "file"),
            # A directory that refuses writes: its children are still made, then it is closed.
            entry("workspace/ro", "dir", 0o555),
            entry("workspace/ro/inner", "file", 0o600),
            frame(b"F", b"inner\n"),
            # Not kept at all.
            entry("workspace/dev", "deleted"),
        ]
    )
    answer = load(root, stream)
    assert answer == {"loaded": 5, "skipped": 8, "carried": 0}, answer
    assert os.listdir(outside) == []
    assert not (tmp_path / "escaped").exists()
    ws = root / "workspace"
    assert sorted(os.listdir(ws)) == ["kept.txt", "out", "ro"]
    assert (ws / "kept.txt").read_text() == "kept\n"
    assert (ws / "kept.txt").stat().st_mode & 0o777 == 0o640
    assert (ws / "kept.txt").stat().st_mtime_ns == 10**18
    assert os.readlink(ws / "out") == str(outside)
    assert (ws / "ro" / "inner").read_text() == "inner\n"
    assert (ws / "ro").stat().st_mode & 0o777 == 0o555


def test_a_setuid_bit_is_not_restored(tmp_path: Path) -> None:
    stream = entry("tool", "file", 0o4755) + frame(b"F", b"#!/bin/sh\n")
    assert load(tmp_path, stream) == {"loaded": 1, "skipped": 0, "carried": 0}
    assert (tmp_path / "tool").stat().st_mode & 0o7777 == 0o755


def test_the_helper_pods_fit_the_restricted_profile() -> None:
    settings = KubernetesSettings(kube_control_plane_url="http://10.0.0.1:3001")
    for node, read_only in ((None, False), ("node-1", True)):
        pod = helper_manifest(
            "acs-files-x",
            "acs-1-workspace",
            settings,
            "acs-",
            image="acs-base:bookworm",
            run_as=(1000, 1000),
            node=node,
            read_only=read_only,
        )
        assert violations(pod, profile("restricted")) == []
        (container,) = pod["spec"]["containers"]
        assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
        assert pod["spec"]["automountServiceAccountToken"] is False
        assert "acs/prefix" not in pod["metadata"]["labels"]  # never listed as a sandbox
