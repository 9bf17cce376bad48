"""A TCP relay in front of a redis-server that can turn into a Redis answering one error reply
to every command: what Redis answers while it loads its data after a restart (``LOADING``), to
a connection whose password it no longer takes (``NOAUTH``, ``WRONGPASS``), as a replica after
a failover (``READONLY``), at maxmemory (``OOM``).

Until :meth:`ErrorRelay.refuse` every command is relayed to Redis; from then on, on every link
(those open included), each is answered here: the commands a client sends while it sets a
connection up (``HELLO``, ``CLIENT ...``, ``SELECT``) get their usual answer, every other command
gets the error, each in order, so the connection stays in step.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading

from tests.redis_server import free_port

SETUP = (b"CLIENT", b"SELECT")


def _command(buf: bytearray) -> list[bytes] | None:
    """The first whole request in ``buf`` (taken out of it), or None while it is incomplete."""
    end = buf.find(b"\r\n")
    if end < 0:
        return None
    n, pos, parts = int(buf[1:end]), end + 2, []
    for _ in range(n):
        end = buf.find(b"\r\n", pos)
        if end < 0:
            return None
        size = int(buf[pos + 1 : end])
        start = end + 2
        if len(buf) < start + size + 2:
            return None
        parts.append(bytes(buf[start : start + size]))
        pos = start + size + 2
    del buf[:pos]
    return parts


def _abort(sock: socket.socket) -> None:
    """Close with a reset (SO_LINGER 0), as a killed server's links end."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()


class ErrorRelay:
    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = free_port()
        self.reply: str | None = None  # the error line (no leading "-"); None: relay
        self.refused: list[bytes] = []  # the name of each command answered with the error
        self._links: list[socket.socket] = []
        self._sock = socket.create_server(("127.0.0.1", self.port))
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def refuse(self, reply: str) -> None:
        """Answer ``reply`` (``"LOADING Redis is loading ..."``) to every command from now on,
        on the links already open too (call it while no command is in flight)."""
        self.reply = reply

    def close(self) -> None:
        self._sock.close()
        for s in list(self._links):
            _abort(s)

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:  # closed
                return
            up = socket.create_connection(("127.0.0.1", self.target_port))
            self._links += [conn, up]
            threading.Thread(target=self._requests, args=(conn, up), daemon=True).start()
            threading.Thread(target=self._replies, args=(up, conn), daemon=True).start()

    @staticmethod
    def _replies(up: socket.socket, conn: socket.socket) -> None:
        try:
            while data := up.recv(65536):
                conn.sendall(data)
        except OSError:
            pass
        _abort(conn)

    def _answer(self, cmd: list[bytes], reply: str) -> bytes:
        name = cmd[0].upper()
        if name == b"HELLO":  # (the protocol asked for, as Redis answers it)
            return b"%1\r\n$5\r\nproto\r\n:" + cmd[1] + b"\r\n"
        if name in SETUP:
            return b"+OK\r\n"
        self.refused.append(name)
        return b"-" + reply.encode() + b"\r\n"

    def _requests(self, conn: socket.socket, up: socket.socket) -> None:
        buf = bytearray()
        try:
            while data := conn.recv(65536):
                buf += data
                fwd, out = bytearray(), bytearray()
                while True:
                    size = len(buf)
                    head = bytes(buf)
                    cmd = _command(buf)
                    if cmd is None:
                        break
                    reply = self.reply
                    if reply is None:
                        fwd += head[: size - len(buf)]
                    else:
                        out += self._answer(cmd, reply)
                if fwd:
                    up.sendall(fwd)
                if out:
                    conn.sendall(out)
        except OSError:
            pass
        _abort(up)
