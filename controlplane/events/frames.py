"""An event's WebSocket frame, made once per replica however many sockets send it.

Every socket of a replica watching a conversation sends each of its events as the same bytes:
a text frame (RFC 6455 5.2: FIN, opcode 1, unmasked as a server's are, uncompressed) whose
payload is the event's JSON as stored. events/fanout.py makes that frame once when its shared
read hands the event out, and events/routes.py writes it as it is to each uncompressed socket;
aiohttp would encode the text and build the header again for each socket and frame. A socket
whose client asked for compression (permessage-deflate: its own compressor state) is sent the
text through aiohttp, which compresses it for that socket.
"""

from __future__ import annotations

import struct

FIN_TEXT = 0x81
"""FIN set, RSV bits clear (no compression), opcode 1 (text)."""


def text_frame(stored: str) -> bytes:
    """The whole frame of one event (header and payload) as a server sends it."""
    payload = stored.encode()
    size = len(payload)
    if size < 126:
        return struct.pack("!BB", FIN_TEXT, size) + payload
    if size < 65536:
        return struct.pack("!BBH", FIN_TEXT, 126, size) + payload
    return struct.pack("!BBQ", FIN_TEXT, 127, size) + payload


def header_size(frame: bytes) -> int:
    """How many of the frame's first bytes are its header (the length field's size)."""
    marker = frame[1]
    return 2 if marker < 126 else 4 if marker == 126 else 10


def frame_text(frame: bytes) -> str:
    """The event's JSON that `frame` carries (for a socket sent through aiohttp)."""
    return frame[header_size(frame) :].decode()
