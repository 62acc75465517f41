"""A DNS server whose answer for one name changes: the first A query gets `first`, every later
one `then` (what an attacker's name server does to a client that checks a name, then looks it
up again to connect: DNS rebinding). Other names: NXDOMAIN. Real UDP on a loopback address of
its own, port 53 (the only port a resolv.conf can name; needs root); dnspython packs and parses
the messages.

    dns = await RebindingDns("rebind.acs.test", first="93.184.216.34", then="127.0.0.1").start()
    ... a process whose /etc/resolv.conf says `nameserver {dns.address}` ...
"""

from __future__ import annotations

import asyncio
import secrets

import dns.message
import dns.name
import dns.rcode
import dns.rdatatype
import dns.rrset


class RebindingDns(asyncio.DatagramProtocol):
    def __init__(self, name: str, *, first: str, then: str) -> None:
        self.name = dns.name.from_text(name)
        self.first, self.then = first, then
        self.address = f"127.53.{secrets.randbelow(250) + 1}.{secrets.randbelow(250) + 1}"
        self.a_queries = 0
        self._transport: asyncio.DatagramTransport | None = None

    async def start(self) -> RebindingDns:
        loop = asyncio.get_running_loop()
        self._transport, _ = await loop.create_datagram_endpoint(
            lambda: self, local_addr=(self.address, 53)
        )
        return self

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    def resolv_conf(self) -> str:
        return f"nameserver {self.address}\noptions attempts:1 timeout:2\n"

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        try:
            query = dns.message.from_wire(data)
        except dns.exception.DNSException:
            return
        response = dns.message.make_response(query)
        question = query.question[0]
        if question.name != self.name:
            response.set_rcode(dns.rcode.NXDOMAIN)
        elif question.rdtype == dns.rdatatype.A:
            self.a_queries += 1
            address = self.first if self.a_queries == 1 else self.then
            response.answer.append(dns.rrset.from_text(question.name, 0, "IN", "A", address))
        assert self._transport is not None
        self._transport.sendto(response.to_wire(), addr)
