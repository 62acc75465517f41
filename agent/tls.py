"""The system's CA certificates, looked up when a TLS peer is verified rather than all read at
boot.

aiohttp makes its two client TLS contexts (verified and not) when it is imported, and each reads
the whole CA bundle (``/etc/ssl/certs/ca-certificates.crt``, some 140 certificates): ~50 ms of
CPU of a boot of ~350 here, for a server that may never call an HTTPS peer (the first command,
the webhooks to the control plane over HTTP). OpenSSL can instead find a certificate in the
hashed directory of the same store (``/etc/ssl/certs/<subject hash>.0``, which Debian's
``update-ca-certificates`` keeps beside the bundle) when a chain needs it. Trust is the same:
the directory holds the bundle's certificates, local additions included.

The bundle file is skipped only for that one import, only when the operator set neither
``SSL_CERT_FILE`` nor ``SSL_CERT_DIR`` and the directory holds hashed links; every context made
later (the MCP SDK's, a command's) reads the defaults as usual.
"""

from __future__ import annotations

import contextlib
import os
import ssl
from collections.abc import Iterator
from pathlib import Path

FILE_ENV = "SSL_CERT_FILE"
DIR_ENV = "SSL_CERT_DIR"


def hashed_directory() -> Path | None:
    """The store's hashed directory when it holds certificates to look up, else None."""
    paths = ssl.get_default_verify_paths()
    if not paths.capath:
        return None
    directory = Path(paths.capath)
    try:
        with os.scandir(directory) as entries:
            if any(entry.name.endswith(".0") for entry in entries):
                return directory
    except OSError:
        return None
    return None


@contextlib.contextmanager
def certificates_looked_up_on_demand() -> Iterator[bool]:
    """Within it, a default TLS context verifies through the hashed directory alone (yields
    True), where that gives the same trust; otherwise nothing changes (yields False)."""
    if FILE_ENV in os.environ or DIR_ENV in os.environ or hashed_directory() is None:
        yield False
        return
    # OpenSSL skips a default file that holds no certificate and keeps the directory lookup.
    os.environ[FILE_ENV] = os.devnull
    try:
        yield True
    finally:
        os.environ.pop(FILE_ENV, None)


def import_aiohttp() -> None:
    """Import aiohttp (its default client TLS context) with the CAs looked up on demand."""
    with certificates_looked_up_on_demand():
        import aiohttp  # noqa: F401, PLC0415 - the import is the point: its context made here
