"""Which endpoints a probe may send load to: one policy, used by the CLI and the MCP server.

A probe is a load generator, so a caller must not be able to aim it at
whatever a URL names. The rules, in order:

1. The URL must be http(s) with a host.
2. Names are resolved first and every address is checked, so a DNS name
   pointing at a forbidden address is refused too; the probe then connects to
   the approved address (no second lookup an attacker could change).
3. Link-local and cloud metadata addresses are always refused
   (169.254.0.0/16, fe80::/10, fd00:ec2::254, metadata.google.internal, ...),
   whatever any allowlist says.
4. ``default`` mode: loopback is allowed; a private or public host only when
   allowed by host name or CIDR (flag ``--allow-hosts``, env
   ``INFERWISE_ALLOW_HOSTS``, or the config file
   ``$XDG_CONFIG_HOME/inferwise/allow_hosts`` with one entry per line).
5. ``strict`` mode (MCP): only the operator's allowlist counts, loopback
   included; the caller cannot add hosts.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal
from urllib.parse import SplitResult, urlsplit, urlunsplit

from inferwise.calculators.errors import InputError

METADATA_HOSTS = frozenset(
    {
        "metadata.google.internal",
        "metadata.goog",
        "metadata",
        "instance-data",
        "instance-data.ec2.internal",
        "metadata.azure.internal",
        "metadata.platformequinix.com",
    }
)
ALWAYS_REFUSED = tuple(
    ipaddress.ip_network(n)
    for n in (
        "169.254.0.0/16",  # IPv4 link-local, AWS/GCP/Azure/OpenStack metadata
        "fe80::/10",  # IPv6 link-local
        "fd00:ec2::254/128",  # AWS IMDS over IPv6
        "100.100.100.200/32",  # Alibaba Cloud metadata
        "0.0.0.0/8",
        "::/128",
    )
)
ENV_ALLOW = "INFERWISE_ALLOW_HOSTS"

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


def config_allow_file() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "inferwise" / "allow_hosts"


def _split(entries: Iterable[str]) -> list[str]:
    out: list[str] = []
    for e in entries:
        out.extend(p.strip() for p in str(e).replace("\n", ",").split(",") if p.strip())
    return out


@dataclass
class TargetPolicy:
    """Refuses targets a probe must not load. `check` raises InputError('url', ...)."""

    mode: Literal["default", "strict"] = "default"
    allow_hosts: list[str] = field(default_factory=list)
    allow_cidrs: list[str] = field(default_factory=list)

    @classmethod
    def from_environment(
        cls, extra_allow: Iterable[str] = (), mode: Literal["default", "strict"] = "default"
    ):
        """Allowlist from the config file and env, plus `extra_allow` (CLI flag; ignored in strict mode)."""
        entries: list[str] = []
        path = config_allow_file()
        if path.is_file():
            entries += [ln.split("#")[0] for ln in path.read_text().splitlines()]
        entries += _split([os.environ.get(ENV_ALLOW, "")])
        if mode == "default":
            entries += list(extra_allow)
        return cls.from_entries(entries, mode=mode)

    @classmethod
    def from_entries(cls, entries: Iterable[str], mode: Literal["default", "strict"] = "default"):
        hosts: list[str] = []
        cidrs: list[str] = []
        for e in _split(entries):
            try:
                ipaddress.ip_network(e, strict=False)
                cidrs.append(e)
            except ValueError:
                hosts.append(e.lower().rstrip("."))
        return cls(mode=mode, allow_hosts=hosts, allow_cidrs=cidrs)

    def _networks(self) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
        nets = []
        for c in self.allow_cidrs:
            try:
                nets.append(ipaddress.ip_network(c, strict=False))
            except ValueError:
                raise InputError("allow_hosts", f"not a host or CIDR: {c!r}") from None
        return nets

    def check(self, url: str) -> list[str]:
        """Refuse or approve `url`; returns the approved addresses to connect to."""
        parts = _http_parts(url)
        host = (parts.hostname or "").lower().rstrip(".")
        if host in METADATA_HOSTS or host.startswith("metadata."):
            raise InputError("url", f"refusing cloud metadata host {host!r}")
        addrs = self._resolve(host)
        for a in addrs:
            for inner in (a, *embedded_ipv4(a)):
                if any(inner in net for net in ALWAYS_REFUSED if inner.version == net.version):
                    raise InputError(
                        "url",
                        f"refusing link-local or cloud metadata address {a} (from {host!r})",
                    )
        nets = self._networks()
        host_allowed = host in self.allow_hosts or any(
            h.startswith("*.") and host.endswith(h[1:]) for h in self.allow_hosts
        )
        for a in addrs:
            if host_allowed or any(a in n for n in nets if a.version == n.version):
                continue
            if self.mode == "default" and a.is_loopback:
                continue
            where = "private" if a.is_private else "remote"
            how = (
                "ask the server operator to add it to the allowlist"
                if self.mode == "strict"
                else f"allow it with --allow-hosts {host}, env {ENV_ALLOW} or {config_allow_file()}"
            )
            raise InputError("url", f"{where} host {host!r} ({a}) is not allowed; {how}")
        return [str(a) for a in addrs]

    @staticmethod
    def _resolve(host: str) -> list[IPAddress]:
        try:
            return [_unmap(ipaddress.ip_address(host.strip("[]")))]
        except ValueError:
            pass
        try:
            infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
        except (socket.gaierror, UnicodeError) as exc:
            raise InputError(
                "url", f"cannot resolve host {host!r}: {getattr(exc, 'strerror', exc)}"
            ) from None
        out: list[IPAddress] = []
        for info in infos:
            addr = _unmap(ipaddress.ip_address(str(info[4][0]).split("%")[0]))
            if addr not in out:
                out.append(addr)
        if not out:
            raise InputError("url", f"host {host!r} has no address")
        return out


NAT64_PREFIXES = tuple(
    ipaddress.ip_network(n) for n in ("64:ff9b::/96", "64:ff9b:1::/48")
)  # RFC 6052 well-known prefix and RFC 8215 local-use prefix
IPV4_COMPATIBLE = ipaddress.ip_network("::/96")  # deprecated ::a.b.c.d (RFC 4291)


def embedded_ipv4(addr: IPAddress) -> list[ipaddress.IPv4Address]:
    """IPv4 addresses an IPv6 address reaches through a translator or tunnel: NAT64
    (the last 32 bits), 6to4 (2002:AABB:CCDD::), Teredo (the client's, obfuscated) and
    the old IPv4-compatible form. Each must pass the same refusals as the address itself:
    64:ff9b::a9fe:a9fe is the metadata service behind a NAT64 gateway."""
    if not isinstance(addr, ipaddress.IPv6Address):
        return []
    out: list[ipaddress.IPv4Address] = []
    low32 = ipaddress.IPv4Address(int(addr) & 0xFFFFFFFF)
    if any(addr in net for net in NAT64_PREFIXES):
        out.append(low32)
    if addr in IPV4_COMPATIBLE and int(addr) > 1:
        out.append(low32)
    if addr.sixtofour is not None:
        out.append(addr.sixtofour)
    if addr.teredo is not None:
        out += list(addr.teredo)
    return out


def _unmap(addr: IPAddress) -> IPAddress:
    """::ffff:169.254.169.254 is 169.254.169.254: judge the IPv4 address inside."""
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return addr.ipv4_mapped
    return addr


def _http_parts(url: str, field: str = "url") -> SplitResult:
    """`url` split, if it is an http(s) URL with a host and a valid port (rule 1)."""
    parts = urlsplit(url)
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        raise InputError(
            field, f"not an http(s) URL with a host: {url!r}", "http://host:port or https://host/v1"
        )
    try:
        _ = parts.port
    except ValueError:
        raise InputError(field, f"bad port in {url!r}") from None
    return parts


def command_url(url: str, field: str = "url") -> str:
    """`url` as it may be printed into a command a user runs: an http(s) URL with a host and
    a valid port, without user:password, query or fragment, and with no character a shell
    would read (whitespace, quotes, ``;``, ``$``, backticks ...). Only the form is checked:
    nothing connects here, so names are not resolved; the probe that runs the command
    applies the rest of the policy."""
    parts = _http_parts(url, field)
    host = parts.hostname or ""
    netloc = f"[{host}]" if ":" in host else host
    if parts.port:
        netloc += f":{parts.port}"
    out = urlunsplit((parts.scheme.lower(), netloc, parts.path, "", ""))
    if any(c.isspace() or c in _SHELL_CHARS for c in out):
        raise InputError(
            field,
            f"{url!r} holds a space or shell character",
            "http://host:port or https://host/v1 (letters, digits and . - _ : / [ ] % in the path)",
        )
    return out


_SHELL_CHARS = frozenset("'\"`$;&|<>(){}*?!#\\")
