"""A TCP relay the test controls: network faults between two real processes.

    relay = Relay("127.0.0.1", broker.port)
    await relay.start()      # connect to 127.0.0.1:relay.port instead of the target
    await relay.partition()  # a blackhole: nothing crosses, in either direction
    await relay.heal()       # traffic flows again
    await relay.cut()        # every connection closed, new ones refused
    await relay.restore()    # new ones accepted again
    await relay.stop()

`partition()` is what TCP sees of a real partition: nothing. Connections stay open, the
bytes each end sends are held (in the relay's memory) and not forwarded, a new
connection is accepted (its handshake done, so its client sends) but not connected
onward. An end that gives up meanwhile (its keepalive lapsed: it closes its socket) is
not told to the other. `heal()` then closes every connection one of whose ends gave up
(its held bytes dropped: a dead connection delivers nothing stale, such as an old
CONNECT that would take a newer session over), and lets the others flow, held bytes
first, in order, connecting onward those accepted meanwhile.

`cut()` is what TCP sees of a peer that went away: every connection closed at once and
new ones refused (the listening socket closed); `restore()` listens again, on the same
port. An end that closes while traffic flows closes the whole connection (no half-close:
MQTT never uses it).

The relay is a process of its own (`python -m tests.support.relay HOST PORT`), so its
forwarding never waits on a test's event loop busy with a load. Commands go in on its
stdin, one a line; each is answered on its stdout, once done, with a JSON line of its
counts (`accepted`: connections so far, `closed`/`resumed` by a heal).
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

CHUNK = 65536
ANSWER_TIMEOUT_S = 10.0


class Relay:
    """The test's handle on a relay process (see the module's docstring)."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = 0
        self._proc: asyncio.subprocess.Process | None = None

    @property
    def url(self) -> str:
        """The relay as an MQTT broker URL."""
        return f"mqtt://127.0.0.1:{self.port}"

    async def start(self) -> None:
        self._proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests.support.relay",
            self.target[0],
            str(self.target[1]),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        self.port = int((await self._answer())["port"])

    async def partition(self) -> dict[str, Any]:
        return await self._command("partition")

    async def heal(self) -> dict[str, Any]:
        """Once healed: `closed` (connections given up meanwhile), `resumed` (the others)."""
        return await self._command("heal")

    async def cut(self) -> dict[str, Any]:
        return await self._command("cut")

    async def restore(self) -> dict[str, Any]:
        return await self._command("restore")

    async def counts(self) -> dict[str, Any]:
        """`accepted` (connections so far) and `open` (those open now)."""
        return await self._command("counts")

    async def stop(self) -> None:
        if self._proc is None or self._proc.returncode is not None:
            return
        assert self._proc.stdin is not None
        self._proc.stdin.close()  # its end of input: it exits
        try:
            async with asyncio.timeout(ANSWER_TIMEOUT_S):
                await self._proc.wait()
        except TimeoutError:
            self._proc.kill()
            await self._proc.wait()

    async def _command(self, name: str) -> dict[str, Any]:
        assert self._proc is not None and self._proc.stdin is not None
        self._proc.stdin.write(f"{name}\n".encode())
        await self._proc.stdin.drain()
        answer = await self._answer()
        assert answer.get("done") == name, answer
        return answer

    async def _answer(self) -> dict[str, Any]:
        assert self._proc is not None and self._proc.stdout is not None
        async with asyncio.timeout(ANSWER_TIMEOUT_S):
            line = await self._proc.stdout.readline()
        if not line:
            raise AssertionError("the relay exited")
        answer: dict[str, Any] = json.loads(line)
        return answer


class _Link:
    """One accepted connection and, once made, its onward connection."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.client = (reader, writer)
        self.onward: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        self.held: dict[bool, list[bytes]] = {True: [], False: []}  # by "from the client"
        self.gave_up = False  # an end closed while partitioned
        self.closed = False
        self.ended = asyncio.Event()  # set by `close`

    def close(self) -> None:
        self.closed = True
        self.ended.set()
        for pair in (self.client, self.onward):
            if pair is not None:
                pair[1].close()

    def send(self, from_client: bool, data: bytes) -> None:
        """Forwarded now (the writer buffers; `pump` drains it)."""
        destination = self.onward if from_client else self.client
        assert destination is not None
        destination[1].write(data)


class _Server:
    """The relay process's side: listening, forwarding, and obeying its stdin."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.links: set[_Link] = set()
        self.tasks: set[asyncio.Task[Any]] = set()  # one a connection, and their pumps
        self.partitioned = False
        self.accepted = 0
        self.listener: asyncio.Server | None = None
        self.port = 0

    async def listen(self) -> None:
        self.listener = await asyncio.start_server(
            self._accepted, "127.0.0.1", self.port, reuse_address=True
        )
        self.port = self.listener.sockets[0].getsockname()[1]

    async def _accepted(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        self._follow(asyncio.current_task())
        link = _Link(reader, writer)
        self.links.add(link)
        try:
            if not self.partitioned:
                await self._connect(link)
            await self._pump(link, from_client=True)
            await link.ended.wait()  # the client gave up while partitioned: until the heal
        finally:
            link.close()
            self.links.discard(link)

    async def _connect(self, link: _Link) -> None:
        """Onward, then what the client sent meanwhile, in order, and the reverse pump."""
        try:
            onward = await asyncio.open_connection(*self.target)
        except OSError:
            link.close()  # the target refuses: so does the relay, by closing
            return
        if link.closed:
            onward[1].close()
            return
        link.onward = onward
        for data in link.held[True]:
            link.send(True, data)
        link.held[True].clear()
        self._follow(asyncio.get_running_loop().create_task(self._pump(link, from_client=False)))

    async def _pump(self, link: _Link, *, from_client: bool) -> None:
        """One direction: read, and forward or hold, until an end closes."""
        reader = link.client[0] if from_client else link.onward[0]  # type: ignore[index]
        while not link.closed:
            try:
                data = await reader.read(CHUNK)
            except OSError:
                data = b""
            if link.closed:
                return
            if not data:  # this end closed
                if self.partitioned:
                    link.gave_up = True  # told to the other end only at the heal
                    return
                link.close()
                return
            if self.partitioned or link.onward is None:
                link.held[from_client].append(data)
                continue
            try:
                link.send(from_client, data)
                destination = link.onward if from_client else link.client
                await destination[1].drain()
            except OSError:
                link.close()
                return

    def _follow(self, task: asyncio.Task[Any] | None) -> None:
        assert task is not None
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def heal(self) -> dict[str, int]:
        self.partitioned = False
        closed = resumed = 0
        for link in list(self.links):
            if link.gave_up:
                link.close()
                closed += 1
                continue
            resumed += 1
            if link.onward is None:
                self._follow(asyncio.get_running_loop().create_task(self._connect(link)))
                continue
            for from_client in (True, False):
                for data in link.held[from_client]:
                    link.send(from_client, data)
                link.held[from_client].clear()
        return {"closed": closed, "resumed": resumed}

    async def cut(self) -> None:
        if self.listener is not None:
            self.listener.close()
            await self.listener.wait_closed()
            self.listener = None
        for link in list(self.links):
            link.close()

    async def obey(self) -> None:
        """Commands from stdin until it ends; each answered on stdout."""
        loop = asyncio.get_running_loop()
        commands = asyncio.StreamReader()
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(commands), sys.stdin)
        _say({"port": self.port})
        while line := (await commands.readline()).decode().strip():
            counts: dict[str, int] = {}
            if line == "partition":
                self.partitioned = True
            elif line == "heal":
                counts = self.heal()
            elif line == "cut":
                await self.cut()
            elif line == "restore":
                if self.listener is None:
                    await self.listen()
            elif line != "counts":
                raise SystemExit(f"unknown command {line!r}")
            _say({"done": line, "accepted": self.accepted, "open": len(self.links), **counts})
        await self.cut()
        if self.tasks:  # each ends once its connection is closed
            await asyncio.wait(self.tasks, timeout=ANSWER_TIMEOUT_S)


def _say(answer: dict[str, Any]) -> None:
    print(json.dumps(answer), flush=True)


async def _main(host: str, port: int) -> None:
    server = _Server(host, port)
    await server.listen()
    await server.obey()


if __name__ == "__main__":
    asyncio.run(_main(sys.argv[1], int(sys.argv[2])))
