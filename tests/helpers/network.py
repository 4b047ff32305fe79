"""A loopback TCP relay that a test can sever, to make a dependency unreachable on purpose;
and `answers_ok`, whether an HTTP endpoint is up yet.

Why: outage tests point a service at the relay instead of Postgres, Kafka or an apiserver;
`sever` closes the listening socket and drops every relayed connection (as a network outage
would), `start` lets connections through again. `freeze` stops forwarding bytes either way
while every socket stays open (a peer that vanished without a FIN, a hung proxy): only timeouts
can tell; `thaw` resumes. Its port is known before it first listens, so a
service can be started while the dependency is still "down".
"""

from __future__ import annotations

import asyncio
import contextlib

import aiohttp

from devstack.ports import free_port


class TcpRelay:
    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = free_port()
        self._server: asyncio.Server | None = None
        self._pipes: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self._flowing = asyncio.Event()
        self._flowing.set()
        # Each connection's stream to the server stops just before these bytes, and the
        # connection freezes both ways until thawed (None: off).
        self._cut_before: bytes | None = None
        self._uncut = asyncio.Event()
        self._uncut.set()

    def freeze(self) -> None:
        self._flowing.clear()

    def freeze_before(self, marker: bytes) -> None:
        """Each connection's stream to the server stops just before the next `marker` it
        sends (e.g. a Postgres Sync message), and that connection then freezes both ways until
        `thaw` (no bytes, no FIN): a connection that dies in the middle of a command, the
        server having read part of it. Connections meanwhile flow on until they send it. (A
        marker split across two reads is not seen.)"""
        self._cut_before = marker
        self._uncut.clear()

    def thaw(self) -> None:
        self._flowing.set()
        self._cut_before = None
        self._uncut.set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", self.port)

    async def sever(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for writer in list(self._writers):
            writer.transport.abort()  # a severed link drops, it does not say goodbye
        for pipe in list(self._pipes):
            pipe.cancel()
        await asyncio.gather(*self._pipes, return_exceptions=True)
        if server is not None:
            await server.wait_closed()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    cut: asyncio.Event, *, to_server: bool) -> None:
        with contextlib.suppress(OSError):
            while True:
                await self._hold(cut)
                chunk = await reader.read(65536)
                if not chunk:
                    return
                await self._hold(cut)  # frozen meanwhile: hold what was read
                if to_server and self._cut_before is not None and not cut.is_set():
                    at = chunk.find(self._cut_before)
                    if at >= 0:
                        chunk = chunk[:at]
                        cut.set()
                writer.write(chunk)
                await writer.drain()

    async def _hold(self, cut: asyncio.Event) -> None:
        await self._flowing.wait()
        if cut.is_set():
            await self._uncut.wait()

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        cut = asyncio.Event()  # cut midway (`freeze_before`): frozen both ways until thawed
        pipes = [asyncio.create_task(self._pipe(reader, upstream_writer, cut, to_server=True)),
                 asyncio.create_task(self._pipe(upstream_reader, writer, cut, to_server=False))]
        self._pipes.update(pipes)
        self._writers.update((writer, upstream_writer))
        try:
            await asyncio.wait(pipes, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for pipe in pipes:
                pipe.cancel()
            await asyncio.gather(*pipes, return_exceptions=True)
            self._pipes.difference_update(pipes)
            self._writers.difference_update((writer, upstream_writer))
            for stream in (writer, upstream_writer):
                stream.close()


async def answers_ok(url: str) -> bool:
    """Whether `url` answers 200; False while nothing listens there yet."""
    try:
        async with aiohttp.ClientSession() as session, session.get(url) as response:
            return response.status == 200
    except aiohttp.ClientError:
        return False
