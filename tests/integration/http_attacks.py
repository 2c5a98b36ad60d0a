"""What a hostile client on the network sends the project's HTTP servers, as raw bytes over TCP
(and TLS where the server speaks it), and a watcher that keeps asking each server for /healthz
meanwhile, in a process of its own so that the attackers' threads never delay its probes.

Each attack returns what the server answered; the tests decide what is right. Every loop here is
bounded in bytes and in time, and every address is on loopback."""

from __future__ import annotations

import json
import os
import select
import selectors
import socket
import ssl
import subprocess
import sys
import time
from dataclasses import dataclass

# A probe of Kubernetes' defaults fails after 1 s (timeoutSeconds), and comes every 10 s
# (periodSeconds).
PROBE_TIMEOUT = 1.0
PROBE_PERIOD = 10.0


@dataclass(frozen=True)
class Target:
    """One server: where it listens, whether it speaks TLS, and the path of its liveness probe."""

    name: str
    port: int
    tls: bool = False
    health_path: str = "/healthz"
    # Where the attacks send their requests, and the header fields they carry (a worker's
    # credential, so that a request gets past the coordinator's check of the head and its body
    # reaches the parser).
    attack_path: str = "/healthz"
    attack_headers: bytes = b""
    # A probe that takes longer fails (Kubernetes' timeoutSeconds; its default unless the
    # server's deployment sets its own).
    probe_timeout: float = PROBE_TIMEOUT

    def head(self, method: str, framing: bytes = b"") -> bytes:
        """A request head to the attack path, with the attack's header fields and FRAMING, not
        yet ended (the caller adds fields, then the blank line)."""
        return (
            b"%s %s HTTP/1.1\r\nHost: x\r\n" % (method.encode(), self.attack_path.encode())
            + self.attack_headers
            + framing
        )

    def spec(self) -> str:
        return "%s,%d,%d,%s,%r" % (
            self.name,
            self.port,
            int(self.tls),
            self.health_path,
            self.probe_timeout,
        )

    @staticmethod
    def parse(text: str) -> Target:
        name, port, tls, path, timeout = text.split(",")
        return Target(name, int(port), tls == "1", path, probe_timeout=float(timeout))


def _tls_context() -> ssl.SSLContext:
    # The attacks need the server's attention, not its identity.
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


def connect(target: Target, timeout: float = 10.0) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", target.port), timeout=timeout)
    if target.tls:
        return _tls_context().wrap_socket(sock, server_hostname="127.0.0.1")
    return sock


def read_answer(sock: socket.socket, timeout: float = 10.0) -> bytes:
    """What the server sends until it closes the connection, `timeout` passes, or one answer
    with its whole Content-Length is in."""
    sock.settimeout(timeout)
    got = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        head_end = got.find(b"\r\n\r\n")
        if head_end >= 0:
            length = 0
            for line in got[:head_end].split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value.strip())
            if len(got) >= head_end + 4 + length:
                return got
        try:
            chunk = sock.recv(65536)
        except (TimeoutError, ConnectionError, ssl.SSLError, OSError):
            return got
        if not chunk:
            return got
        got += chunk
    return got


def status_of(answer: bytes) -> int:
    """The status code of the answer, 0 when none came."""
    if not answer.startswith(b"HTTP/1.") or len(answer) < 12:
        return 0
    return int(answer[9:12])


def _send_then_read(target: Target, data: bytes) -> int:
    with connect(target) as sock:
        try:
            sock.sendall(data)
        except (ConnectionError, ssl.SSLError, OSError):
            pass  # the server may answer and close before it has read everything
        return status_of(read_answer(sock))


def negative_chunk_size(target: Target) -> int:
    return _send_then_read(
        target, target.head("PUT", b"Transfer-Encoding: chunked\r\n") + b"\r\n-2\r\nab\r\n"
    )


def oversized_chunk_size(target: Target) -> int:
    return _send_then_read(
        target,
        target.head("PUT", b"Transfer-Encoding: chunked\r\n")
        + b"\r\nffffffffffffffffffff\r\nab\r\n",
    )


def megabyte_of_headers(target: Target) -> int:
    field = b"X-Filler: " + b"a" * 1014 + b"\r\n"  # 1 KiB a field
    return _send_then_read(target, target.head("GET") + field * 1024 + b"\r\n")


def hundred_megabyte_body(target: Target, chunked: bool) -> tuple[int, int]:
    """Sends up to 100 MB of body for as long as the server reads it, watching for an answer
    between pieces (a server that refuses early answers, then stops reading); returns the
    answer's status and how many bytes of body went out before it came."""
    total = 100 * 1000 * 1000
    framing = b"Transfer-Encoding: chunked\r\n" if chunked else b"Content-Length: %d\r\n" % total
    block = b"x" * (1 << 20)
    piece = (b"100000\r\n" + block + b"\r\n") if chunked else block
    sent = 0
    answer = b""
    deadline = time.monotonic() + 60
    with connect(target) as sock:
        sock.sendall(target.head("PUT", framing) + b"\r\n")
        sock.setblocking(False)
        pending = memoryview(b"")
        while time.monotonic() < deadline and sent < total:
            readable, writable, _ = select.select([sock], [sock] if sent < total else [], [], 1)
            if readable:
                answer = read_answer(sock)
                break
            if writable:
                if not pending:
                    pending = memoryview(piece)
                try:
                    n = sock.send(pending)
                except (BlockingIOError, ssl.SSLWantWriteError):
                    continue
                except OSError:
                    answer = read_answer(sock, timeout=2)
                    break
                pending = pending[n:]
                if not pending:
                    sent += len(block)
        return status_of(answer), sent


def slow_clients(target: Target, count: int, seconds: float) -> tuple[int, int]:
    """COUNT clients, each sending one byte of an endless request head a second for SECONDS.
    Returns how many the server closed, and how many connected at all."""
    selector = selectors.DefaultSelector()
    socks: list[socket.socket] = []
    for _ in range(count):
        try:
            sock = socket.create_connection(("127.0.0.1", target.port), timeout=5)
        except OSError:
            continue
        sock.setblocking(False)
        socks.append(sock)
        selector.register(sock, selectors.EVENT_READ)
    prefix = b"GET /healthz HTTP/1.1\r\nX-Slow: "
    closed: set[socket.socket] = set()
    end = time.monotonic() + seconds
    sent = 0
    next_byte = time.monotonic()
    while time.monotonic() < end and len(closed) < len(socks):
        if time.monotonic() >= next_byte:
            byte = prefix[sent : sent + 1] if sent < len(prefix) else b"a"
            for sock in socks:
                if sock in closed:
                    continue
                try:
                    sock.send(byte)
                except (BlockingIOError, ConnectionError, OSError):
                    closed.add(sock)
            sent += 1
            next_byte += 1.0
        for key, _ in selector.select(timeout=0.2):
            sock = key.fileobj
            assert isinstance(sock, socket.socket)
            try:
                if not sock.recv(4096):
                    closed.add(sock)
            except (BlockingIOError, InterruptedError):
                pass
            except OSError:
                closed.add(sock)
            if sock in closed:
                selector.unregister(sock)
    for sock in socks:
        sock.close()
    selector.close()
    return len(closed), len(socks)


def stalled_tls_handshakes(target: Target, count: int, seconds: float) -> tuple[int, int]:
    """COUNT clients that connect to a TLS server and send the first bytes of a ClientHello,
    never the rest. Returns how many the server closed within SECONDS, and how many connected."""
    socks = []
    for _ in range(count):
        try:
            sock = socket.create_connection(("127.0.0.1", target.port), timeout=5)
        except OSError:
            continue
        sock.sendall(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03")
        sock.setblocking(False)
        socks.append(sock)
    closed = set()
    end = time.monotonic() + seconds
    while time.monotonic() < end and len(closed) < len(socks):
        for sock in socks:
            if sock in closed:
                continue
            try:
                if not sock.recv(4096):
                    closed.add(sock)
            except BlockingIOError:
                pass
            except OSError:
                closed.add(sock)
        time.sleep(0.1)
    for sock in socks:
        sock.close()
    return len(closed), len(socks)


# ---- Health watcher ----


def probe(target: Target) -> float:
    """Seconds one GET of the target's health path took; raises when no 200 came within the
    target's probe timeout."""
    start = time.monotonic()
    with connect(target, timeout=target.probe_timeout) as sock:
        sock.sendall(
            b"GET %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n" % target.health_path.encode()
        )
        answer = read_answer(sock, timeout=target.probe_timeout)
    seconds = time.monotonic() - start
    if status_of(answer) != 200:
        raise RuntimeError("answered %r" % answer[:80])
    return seconds


class HealthWatch:
    """A process that probes each target every 0.2 s until stopped, then says, per target, how
    many probes it made, the slowest, the failures (a probe over the target's probe timeout is
    one) and the longest gap: the most seconds between the start of the watch, the start of each
    probe and the stop, that is, the longest time the target went unchecked. How many probes
    fit in an attack depends on how busy the machine is; a gap under a kubelet's probe period
    says the target was checked at least as often as a kubelet would."""

    def __init__(self, targets: list[Target]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "watch", *(t.spec() for t in targets)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def stop(self) -> dict[str, dict[str, object]]:
        assert self.proc.stdin is not None
        out, _ = self.proc.communicate(input="stop\n", timeout=60)
        result: dict[str, dict[str, object]] = json.loads(out)
        return result


def _watch(targets: list[Target]) -> None:
    results: dict[str, dict[str, object]] = {
        t.name: {"probes": 0, "slowest": 0.0, "failures": [], "longest_gap": 0.0} for t in targets
    }
    started = time.monotonic()
    last_start = {t.name: started for t in targets}

    def gap(name: str, now: float) -> None:
        entry = results[name]
        entry["longest_gap"] = max(float(entry["longest_gap"]), now - last_start[name])  # type: ignore[arg-type]
        last_start[name] = now

    selector = selectors.DefaultSelector()
    selector.register(sys.stdin, selectors.EVENT_READ)
    while not selector.select(timeout=0.2):
        for target in targets:
            entry = results[target.name]
            gap(target.name, time.monotonic())
            try:
                seconds = probe(target)
                entry["slowest"] = max(float(entry["slowest"]), seconds)  # type: ignore[arg-type]
                if seconds > target.probe_timeout:
                    raise RuntimeError("took %.2f s" % seconds)
            except Exception as e:  # noqa: BLE001 - every failure is a finding to report
                failures = entry["failures"]
                assert isinstance(failures, list)
                failures.append("%s: %s" % (time.strftime("%H:%M:%S"), e))
            entry["probes"] = int(entry["probes"]) + 1  # type: ignore[call-overload]
    stopped = time.monotonic()
    for target in targets:
        gap(target.name, stopped)
    print(json.dumps(results))


if __name__ == "__main__" and len(sys.argv) > 1 and sys.argv[1] == "watch":
    _watch([Target.parse(arg) for arg in sys.argv[2:]])
