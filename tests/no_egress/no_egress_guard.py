"""The tests' no-egress guard: an audit hook that refuses every socket operation aimed at a
non-loopback address, before the operation runs (so nothing is sent, not even a DNS query).

Installed in the pytest process by `tests/gcs_fixtures.py` and in every Python subprocess started
with the GCS fixtures' environment (this directory's `sitecustomize.py` is on their PYTHONPATH).
A refused attempt raises an OSError subclass, as a firewall would, so that the library's own
failure path runs; because a library may swallow that error, every refusal is also recorded (in
`BLOCKED`, and appended to the file named by `$XLSCALE_EGRESS_LOG` when set) for the fixtures to
fail the test on. Native code that opens sockets itself (tensorstore's curl, gRPC) is outside an
audit hook's reach: the fixtures point those at 127.0.0.1 through their environment instead.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import sys

LOG_ENV = "XLSCALE_EGRESS_LOG"
LOOPBACK_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"}
# Events whose arguments name a remote host: socket.* events of CPython's socket module.
_HOST_EVENTS = {
    "socket.connect",
    "socket.sendto",
    "socket.sendmsg",
    "socket.getaddrinfo",
    "socket.gethostbyname",
    "socket.gethostbyaddr",
    "socket.getnameinfo",
}

BLOCKED: list[str] = []
_installed = False


class EgressBlockedError(ConnectionRefusedError):
    """A connect or send to a non-loopback address, refused by the tests' guard."""


class LookupBlockedError(socket.gaierror, EgressBlockedError):
    """A name lookup of a non-loopback host, refused by the tests' guard (a `gaierror`, as
    callers that handle failed lookups expect)."""


def is_loopback(host) -> bool:
    """Whether `host` (a name or an address, str or bytes, or None for "any") stays on this
    machine: loopback names and addresses, IPv4-mapped loopback, the unspecified address."""
    if host is None:
        return True
    if isinstance(host, bytes):
        host = host.decode("ascii", "replace")
    host = str(host).strip("[]").split("%")[0].rstrip(".").lower()
    if host in LOOPBACK_NAMES or host == "":
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)
    return address.is_loopback or address.is_unspecified or bool(mapped and mapped.is_loopback)


def _host_of(event: str, args: tuple):
    """(host, refusable) for an audited socket event."""
    if event in ("socket.connect", "socket.sendto", "socket.sendmsg"):
        sock, address = args[0], args[-1]
        if getattr(sock, "family", None) not in (socket.AF_INET, socket.AF_INET6):
            return None, False  # unix sockets, netlink: local by construction
        if not isinstance(address, tuple) or not address:
            return None, False
        return address[0], True
    if event == "socket.getnameinfo":
        return args[0][0] if args and isinstance(args[0], tuple) else None, True
    return (args[0] if args else None), True


def _record(line: str) -> None:
    BLOCKED.append(line)
    path = os.environ.get(LOG_ENV)
    if path:
        try:
            with open(path, "a") as f:
                f.write(line + "\n")
        except OSError:
            pass


def _hook(event: str, args: tuple) -> None:
    if event not in _HOST_EVENTS:
        return
    host, refusable = _host_of(event, args)
    if not refusable or is_loopback(host):
        return
    line = f"pid {os.getpid()}: {event} to {host!r} refused (tests reach 127.0.0.1 only)"
    _record(line)
    if event.startswith(("socket.getaddrinfo", "socket.gethostby", "socket.getnameinfo")):
        raise LookupBlockedError(socket.EAI_NONAME, line)
    raise EgressBlockedError(line)


def install() -> None:
    """Adds the audit hook to this process (once; audit hooks cannot be removed)."""
    global _installed
    if not _installed:
        sys.addaudithook(_hook)
        _installed = True
