"""A canary: stands where the control plane must never connect for a user, counts the
connections it accepts and answers any HTTP request with a chat completion carrying its token.

Standard library only, so that the same file runs where the tests' code is not: inside a
sandbox as its agent user, in a pod, in a network namespace standing for a LAN machine.

    python3 canary_server.py PORT TOKEN [LOG] [HOST]

Each accepted connection appends a line `connection` to LOG (default: stdout), before anything
is read from it.
"""

from __future__ import annotations

import json
import socketserver
import sys


def completion(token: str) -> bytes:
    """A well-formed chat completion whose content is `token`."""
    message = {"role": "assistant", "content": token}
    body = {
        "id": "chatcmpl-canary",
        "object": "chat.completion",
        "created": 0,
        "model": "canary",
        "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }
    return json.dumps(body).encode()


def serve(port: int, token: str, log: str | None, host: str = "0.0.0.0") -> None:  # noqa: S104 (where it stands: a sandbox, a namespace)
    answer = completion(token)

    def note() -> None:
        if log is None:
            print("connection", flush=True)
        else:
            with open(log, "a") as out:
                out.write("connection\n")

    class Handler(socketserver.StreamRequestHandler):
        def handle(self) -> None:
            note()
            length = 0
            for raw in iter(self.rfile.readline, b""):
                line = raw.strip()
                if not line:
                    break
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value.strip() or 0)
            if length:
                self.rfile.read(length)
            head = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            head += f"Content-Length: {len(answer)}\r\nConnection: close\r\n\r\n"
            self.wfile.write(head.encode() + answer)

    socketserver.ThreadingTCPServer.allow_reuse_address = True
    with socketserver.ThreadingTCPServer((host, port), Handler) as server:
        if log is not None:
            with open(log, "a"):
                pass  # the log exists once the canary listens
        else:
            print("listening", flush=True)
        server.serve_forever()


if __name__ == "__main__":
    args = sys.argv[1:]
    serve(
        int(args[0]),
        args[1],
        args[2] if len(args) > 2 and args[2] != "-" else None,
        args[3] if len(args) > 3 else "0.0.0.0",  # noqa: S104 (see serve)
    )
