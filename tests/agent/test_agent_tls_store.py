"""The agent server's HTTPS clients with the CA certificates looked up on demand (agent/tls.py), in
the sandbox image itself (its Debian store, its OpenSSL): aiohttp's default context reads no
certificate at import, still trusts a CA the store holds (one added the Debian way, with
update-ca-certificates) and still refuses a certificate no CA in the store signed."""

from __future__ import annotations

import json
from pathlib import Path

import docker

from tests.support.sandbox_helpers import DEFAULT_IMAGE, REPO

MAKE_CERTIFICATES = r"""
set -eu
cd /tmp
ec='-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes'
openssl req -x509 $ec -keyout ca.key -out ca.crt -days 2 -subj /CN=acs-test-ca 2>/dev/null
openssl req $ec -keyout signed.key -out signed.csr -subj /CN=localhost 2>/dev/null
printf 'subjectAltName=DNS:localhost\n' > ext
openssl x509 -req -in signed.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out signed.crt \
    -days 2 -extfile ext 2>/dev/null
openssl req -x509 $ec -keyout self.key -out self.crt -days 2 -subj /CN=localhost \
    -addext subjectAltName=DNS:localhost 2>/dev/null
cp ca.crt /usr/local/share/ca-certificates/acs-test-ca.crt
update-ca-certificates >/dev/null 2>&1
/opt/agent/bin/python -P -c 'import aiohttp.connector as c
print(c._SSL_CONTEXT_VERIFIED.cert_store_stats()["x509_ca"])' > /tmp/eager
/opt/agent/bin/python -P /check/check.py
"""

CHECK = r"""
import asyncio, json, os, ssl

from agent.tls import import_aiohttp

import_aiohttp()
import aiohttp
import aiohttp.connector
from aiohttp import web

# What aiohttp's default client context loaded up front (private, read for this check only).
loaded = aiohttp.connector._SSL_CONTEXT_VERIFIED.cert_store_stats()["x509_ca"]


async def serve(cert):
    app = web.Application()
    app.router.add_get("/", lambda _: web.Response(text="hello"))
    runner = web.AppRunner(app)
    await runner.setup()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(f"/tmp/{cert}.crt", f"/tmp/{cert}.key")
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    await site.start()
    return runner, site._server.sockets[0].getsockname()[1]


async def fetch(port):
    try:
        async with aiohttp.ClientSession() as http:
            async with http.get(f"https://localhost:{port}/") as resp:
                return f"{resp.status} {await resp.text()}"
    except aiohttp.ClientConnectorCertificateError as exc:
        return f"refused: {exc.certificate_error.verify_message}"


async def main():
    signed_runner, signed = await serve("signed")
    self_runner, self_signed = await serve("self")
    try:
        return {
            "loaded_at_import": loaded,
            "loaded_eagerly_without": int(open("/tmp/eager").read()),
            "signed": await fetch(signed),
            "self_signed": await fetch(self_signed),
            "env_left": os.environ.get("SSL_CERT_FILE"),
        }
    finally:
        await signed_runner.cleanup()
        await self_runner.cleanup()


print(json.dumps(asyncio.run(main())))
"""


def test_ca_certificates_looked_up_on_demand_keep_the_same_trust(
    docker_client: docker.DockerClient, test_prefix: str, tmp_path: Path
) -> None:
    (tmp_path / "check.py").write_text(CHECK)
    output = docker_client.containers.run(
        DEFAULT_IMAGE,
        ["sh", "-c", MAKE_CERTIFICATES],
        name=f"{test_prefix}tls",
        user="0",  # update-ca-certificates writes the store
        volumes={
            str(REPO / "agent"): {"bind": "/opt/agent/app/agent", "mode": "ro"},
            str(tmp_path): {"bind": "/check", "mode": "ro"},
        },
        network_mode="none",
        remove=True,
    )
    found = json.loads(output.decode().strip().splitlines()[-1])
    assert found["loaded_eagerly_without"] > 100, found  # a plain import reads the bundle
    assert found["loaded_at_import"] == 0, found
    assert found["signed"] == "200 hello", found
    assert found["self_signed"].startswith("refused: self"), found
    assert found["env_left"] is None, found
