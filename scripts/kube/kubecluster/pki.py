"""The cluster's certificates (openssl, ECDSA P-256) and kubeconfigs."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

from kubecluster.host import run
from kubecluster.layout import Layout


def openssl_cert(
    pki: Path, name: str, subject: str, extensions: list[str], ca: bool = False
) -> None:
    argv = [
        "openssl", "req", "-config", str(pki / "openssl.cnf"), "-x509", "-nodes",
        "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
        "-keyout", str(pki / f"{name}.key"), "-out", str(pki / f"{name}.crt"),
        "-subj", subject, "-days", "30",
    ]  # fmt: skip
    if not ca:
        argv += ["-CA", str(pki / "ca.crt"), "-CAkey", str(pki / "ca.key")]
    for extension in extensions:
        argv += ["-addext", extension]
    run(argv)


def make_pki(layout: Layout) -> Path:
    """A CA, the API server's serving certificate, one client certificate per identity (the
    Node authorizer needs system:node:<name> in system:nodes) and the service-account key."""
    pki = layout.state_dir / "pki"
    pki.mkdir(parents=True)
    (pki / "openssl.cnf").write_text("[req]\ndistinguished_name=dn\nprompt=no\n[dn]\n")
    leaf = "basicConstraints=critical,CA:FALSE"
    client = [leaf, "keyUsage=critical,digitalSignature", "extendedKeyUsage=clientAuth"]
    openssl_cert(
        pki,
        "ca",
        f"/CN=acs-kube-{layout.slot}-ca",
        ["basicConstraints=critical,CA:TRUE", "keyUsage=critical,keyCertSign,cRLSign"],
        ca=True,
    )
    names = [
        "kubernetes", "kubernetes.default", "kubernetes.default.svc",
        "kubernetes.default.svc.cluster.local", "localhost",
    ]  # fmt: skip
    alt = ",".join(
        [f"IP:{layout.api_ip}", f"IP:{layout.api_service_ip}", "IP:127.0.0.1"]
        + [f"DNS:{name}" for name in names]
    )
    openssl_cert(
        pki,
        "apiserver",
        "/CN=kube-apiserver",
        [leaf, "keyUsage=critical,digitalSignature", "extendedKeyUsage=serverAuth",
         f"subjectAltName={alt}"],
    )  # fmt: skip
    identities = {
        "admin": "/O=system:masters/CN=acs-kube-admin",
        "apiserver-kubelet-client": "/CN=kube-apiserver-kubelet-client",
        "controller-manager": "/O=system:masters/CN=system:kube-controller-manager",
        "scheduler": "/CN=system:kube-scheduler",
        "kube-proxy": "/CN=system:kube-proxy",
    }
    for index in layout.node_indexes():
        identities[f"kubelet-{index}"] = f"/O=system:nodes/CN=system:node:{layout.node_name(index)}"
    for name, subject in identities.items():
        openssl_cert(pki, name, subject, client)
    run(["openssl", "ecparam", "-name", "prime256v1", "-genkey", "-noout",
         "-out", str(pki / "sa.key")])  # fmt: skip
    run(["openssl", "ec", "-in", str(pki / "sa.key"), "-pubout", "-out", str(pki / "sa.pub")])
    return pki


def kubeconfig(layout: Layout, user: str, *, embed: bool = False) -> dict[str, Any]:
    pki = layout.state_dir / "pki"

    def field(kind: str, path: Path) -> dict[str, str]:
        if embed:
            return {f"{kind}-data": base64.b64encode(path.read_bytes()).decode()}
        return {kind: str(path)}

    name = f"acs-kube-{layout.slot}"
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": name,
                "cluster": {
                    "server": layout.server,
                    **field("certificate-authority", pki / "ca.crt"),
                },
            }
        ],
        "users": [
            {
                "name": user,
                "user": {
                    **field("client-certificate", pki / f"{user}.crt"),
                    **field("client-key", pki / f"{user}.key"),
                },
            }
        ],
        "contexts": [{"name": name, "context": {"cluster": name, "user": user}}],
        "current-context": name,
    }
