"""How the commands agents choose are confined: the records a stack and an environment say it with.

Contract:
- `SandboxIsolation` is one value, named in settings (`sandbox.isolation`), carried to every runner and
  sandbox server, and handed to a Task in its `RunContext` (a grader jails what it grades alike).
  `said(isolation)` is how `rollout status`, the dashboard and a run's settings put it in words.
- `JailLimits` is what every command of one jail may use (rlimits, a cgroup's caps, the workspace's disk).
  Every field is checked once, where the record is made (`ValueError` names it). A sandbox kind has its own
  defaults (rollout.sandbox.limits); an environment's `SandboxSpec.limits` replaces them for its claims.
- `SandboxNetwork` is what a jailed command may reach besides its own loopback: nothing (`none`, the default),
  the gateway's routes of the seat that acts (`gateway`), and `endpoints`, each a `host:port` bridged to the
  same port on the jail's loopback. `SandboxNetwork.parse` takes what an environment writes ("none",
  "gateway", or a list of those and `host:port`) and refuses anything else; `entries()` is the same list back,
  as a claim's `/open` takes it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, fields
from enum import StrEnum

MiB = 1024 * 1024
GiB = 1024 * MiB


class SandboxIsolation(StrEnum):
    bwrap = "bwrap"  # every command an agent chooses runs in a bubblewrap jail (Linux; docs/sandboxes.md)
    none = "none"  # unjailed: agents' commands run as the sandbox's own user, only when a person chose it


def said(isolation: SandboxIsolation) -> str:
    """The isolation in words, for people: an unjailed stack says so loudly."""
    if isolation is SandboxIsolation.bwrap:
        return "agents' commands jailed (bubblewrap)"
    return "agents' commands UNJAILED (sandbox.isolation=none)"


@dataclass(frozen=True)
class JailLimits:
    """What every command of one jail may use. Sizes in bytes, times in seconds."""

    processes: int = 256  # tasks (threads count) of the whole jail at once
    memory_bytes: int = 2 * GiB  # resident memory of the whole jail (cgroup; root only), tmpfs pages included
    address_space_bytes: int = 8 * GiB  # virtual memory of each process (RLIMIT_AS)
    file_bytes: int = 256 * MiB  # the largest file a process may write (RLIMIT_FSIZE)
    open_files: int = 1024  # per process (RLIMIT_NOFILE)
    cpu_s: int = 600  # CPU seconds of each process (RLIMIT_CPU)
    disk_bytes: int = 1 * GiB  # the working directory's size (a tmpfs of this size; root only)
    tmp_bytes: int = 256 * MiB  # the jail's private /tmp (and /dev/shm)

    def __post_init__(self) -> None:
        for field in fields(self):
            value = getattr(self, field.name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"sandbox limit {field.name} must be a positive integer, not {value!r}")
        if self.processes < 8:
            raise ValueError(
                f"sandbox limit processes must be at least 8 (a shell and its pipeline), not {self.processes}"
            )

    def as_json(self) -> dict[str, int]:
        return {field.name: getattr(self, field.name) for field in fields(self)}

    @classmethod
    def from_json(cls, given: object) -> JailLimits:
        """The limits a claim's `/open` names; ValueError for anything but an object of known positive
        integers."""
        if not isinstance(given, dict):
            raise ValueError(f"sandbox limits must be an object of integers, not {given!r}")
        known = {field.name for field in fields(cls)}
        if unknown := sorted(set(given) - known):
            raise ValueError(f"unknown sandbox limits {unknown}: the limits are {sorted(known)}")
        return cls(**given)


_HOST = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?$")


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(frozen=True)
class SandboxNetwork:
    gateway: bool = False  # the acting seat's own gateway routes, at 127.0.0.1:PORT in the jail
    endpoints: tuple[Endpoint, ...] = ()  # each at 127.0.0.1:ITS_PORT in the jail

    @property
    def none(self) -> bool:
        return not self.gateway and not self.endpoints

    def entries(self) -> list[str]:
        return (["gateway"] if self.gateway else []) + [str(endpoint) for endpoint in self.endpoints]

    def said(self) -> str:
        return "no network" if self.none else "reaches " + ", ".join(self.entries())

    @classmethod
    def parse(cls, given: str | Sequence[str]) -> SandboxNetwork:
        """`"none"`, `"gateway"`, or a list of `"gateway"` and `"host:port"` (a name or an IPv4 address)."""
        listed = [given] if isinstance(given, str) else list(given)
        if listed == ["none"] or not listed:
            return cls()
        gateway, endpoints, ports = False, [], set()
        for entry in listed:
            if not isinstance(entry, str):
                raise ValueError(f"a sandbox's network entry must be a string, not {entry!r}")
            if entry == "gateway":
                gateway = True
                continue
            host, _, port = entry.rpartition(":")
            if not _HOST.match(host) or not port.isdigit() or not 1024 <= int(port) <= 65535:
                raise ValueError(
                    f"sandbox network entry {entry!r} is not `none`, `gateway` or `host:port` (a host name or "
                    "IPv4 address, and a port 1024-65535: the jail, without privileges, binds the same port on "
                    "its loopback)"
                )
            if int(port) in ports:
                raise ValueError(
                    f"sandbox network names port {port} twice: each is bridged to that loopback port"
                )
            ports.add(int(port))
            endpoints.append(Endpoint(host.lower(), int(port)))
        return cls(gateway=gateway, endpoints=tuple(endpoints))
