"""Each writer kind's login as the party that must be refused: a taken-over gateway, runner, trainer or engine
appends only its own event kinds to its own streams and holds only its own leases (migration 0010).

The appends go to a ledger database of this module's own on the session's server (roles are the server's,
grants the database's): the bare events written here would otherwise be read by the dashboard's and
serving's readers of the session's ledger, which read some kinds across every stream."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from dataclasses import replace

import psycopg
import pytest

from rollout.config import LedgerWriter, Settings
from rollout.ledger import Ledger, NewEvent, migrate
from rollout.ledger.errors import StaleFenceError
from rollout.ledger.queries import read_all
from rollout.ledger.streams import (
    SERVING_ACKS,
    SERVING_REQUESTS,
    SERVING_TARGETS,
    gpu_lease,
    policy_checkpoints_stream,
    sandbox_lease,
    trainer_lease,
)

# What each writer appends in its work (kind, stream), and what a taken-over one would forge.
OWN: dict[LedgerWriter, list[tuple[str, str]]] = {
    LedgerWriter.gateway: [("TurnRecorded", "seat/{x}/e/a"), ("SeatOpened", "seat/manual/{x}")],
    LedgerWriter.runner: [
        ("RunCreated", "run/{x}"),
        ("SettingsChanged", "run/{x}"),
        ("EpisodeFinished", "run/{x}/episodes"),
        ("SeatOpened", "seat/{x}/e/a"),
        ("SeatClosed", "seat/{x}/e/a"),
        ("EvalResult", "evals/{x}/results"),  # the runner hosts evals' activities
        ("ServingRequested", SERVING_REQUESTS),
    ],
    LedgerWriter.trainer: [
        ("BatchAssembled", "run/{x}/batches/{x}/p"),
        ("CheckpointConverted", "policy/{x}/p/bridges"),
        ("ServingTarget", SERVING_TARGETS),
    ],
    LedgerWriter.serving: [("ServingAck", SERVING_ACKS)],
}
FORGED: dict[LedgerWriter, list[tuple[str, str]]] = {
    # A gateway that pays itself: a reward, a finished episode, a seat of a run's, a run's settings.
    LedgerWriter.gateway: [
        ("EpisodeFinished", "run/{x}/episodes"),
        ("RewardAssigned", "seat/{x}/e/a"),
        ("SeatOpened", "seat/{x}/e/a"),
        ("SettingsChanged", "run/{x}"),
        ("CheckpointCreated", "policy/{x}/p/checkpoints"),
    ],
    # A runner that writes the model's side: turns, checkpoints, what engines serve.
    LedgerWriter.runner: [
        ("TurnRecorded", "seat/{x}/e/a"),
        ("CheckpointCreated", "policy/{x}/p/checkpoints"),
        ("ServingTarget", SERVING_TARGETS),
        ("ServingAck", SERVING_ACKS),
        ("BatchAssembled", "run/{x}/batches/{x}/p"),
    ],
    # A trainer that writes the data it trains on, or a run's settings, or an engine's ack.
    LedgerWriter.trainer: [
        ("TurnRecorded", "seat/{x}/e/a"),
        ("EpisodeFinished", "run/{x}/episodes"),
        ("SettingsChanged", "run/{x}"),
        ("SeatOpened", "seat/manual/{x}"),
        ("ServingAck", SERVING_ACKS),
        ("BatchAssembled", "seat/{x}/e/a"),  # its own kind on another's stream
    ],
    LedgerWriter.serving: [
        ("ServingTarget", SERVING_TARGETS),
        ("ServingAck", SERVING_TARGETS),  # its own kind on another's stream
        ("TurnRecorded", "seat/{x}/e/a"),
        ("EvalResult", "evals/{x}/results"),
        ("Test", "test/{x}"),
    ],
}


def _login(stack_settings: Settings, writer: LedgerWriter, database: str) -> str:
    return migrate._with_database(stack_settings.writer_ledger_url(writer), database)


@pytest.fixture
async def owner(stack_settings: Settings, database: str) -> AsyncIterator[Ledger]:
    async with await Ledger.connect(migrate._with_database(stack_settings.ledger_url, database)) as opened:
        yield opened


def _named(stream: str, unique: str) -> str:
    return stream.replace("{x}", unique)


def _payload(kind: str, stream: str) -> dict[str, object]:
    """What the projections need of the kinds they project (a run's row, a seat's row)."""
    name = stream.split("/", 1)[1]
    if kind == "RunCreated":
        return {"run": name, "environment": "e", "settings": {}}
    if kind == "SettingsChanged":
        return {"run": name, "changes": {}}
    if kind in ("SeatOpened", "SeatClosed"):
        token = secrets.token_hex(32)
        return {"seat": name, "token_sha256": token, "agent": "a", "policy": "p"}
    return {}


@pytest.mark.parametrize("writer", list(LedgerWriter))
async def test_a_writer_logs_in_as_its_own_role_only_with_its_password(
    stack_settings: Settings, writer: LedgerWriter
) -> None:
    url = stack_settings.writer_ledger_url(writer)
    assert url.startswith(f"postgresql://{writer.role}:")  # the embedded server's, with its password
    with psycopg.connect(url, connect_timeout=5) as conn:
        assert conn.execute("SELECT session_user").fetchone() == (writer.role,)
    postgres = stack_settings.services.postgres
    anyone = f"postgresql://{writer.role}:not-it@{postgres.host}:{postgres.port}/{postgres.database}"
    with pytest.raises(psycopg.OperationalError, match="password"):
        psycopg.connect(anyone, connect_timeout=5, passfile="/nonexistent").close()


@pytest.mark.parametrize("writer", list(LedgerWriter))
async def test_a_writer_appends_its_own_kinds_and_no_one_elses(
    stack_settings: Settings, owner: Ledger, database: str, writer: LedgerWriter
) -> None:
    unique = f"w{secrets.token_hex(6)}"
    async with await Ledger.connect(_login(stack_settings, writer, database)) as login:
        for kind, stream in OWN[writer]:
            named = _named(stream, unique)
            (result,) = await login.append(named, [NewEvent(f"{kind}-{unique}", kind, _payload(kind, named))])
            assert result.appended, (writer, kind, stream)
        for kind, stream in FORGED[writer]:
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match="only its own event kinds"):
                await login.append(
                    _named(stream, unique), [NewEvent(f"forged-{unique}", kind, {"reward": 1})]
                )
        # One forged event among allowed ones: the whole batch is refused.
        kind, stream = OWN[writer][0]
        forged_kind = FORGED[writer][0][0]
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            await login.append(
                _named(stream, unique),
                [
                    NewEvent(f"ok-{unique}", kind, _payload(kind, stream)),
                    NewEvent(f"forged-{unique}", forged_kind, {}),
                ],
            )
    for kind, stream in FORGED[writer]:
        keys = [e.key for e in await read_all(owner, _named(stream, unique))]
        assert not any(key.startswith(("forged", "ok")) for key in keys), (writer, kind, stream, keys)


@pytest.mark.parametrize(
    ("writer", "own", "forged"),
    [
        (LedgerWriter.runner, [sandbox_lease("shell", "{x}")], [trainer_lease("{x}/p"), gpu_lease("{x}")]),
        (LedgerWriter.trainer, [trainer_lease("{x}/p"), gpu_lease("{x}")], [sandbox_lease("shell", "{x}")]),
        (LedgerWriter.gateway, [], [sandbox_lease("shell", "{x}"), trainer_lease("{x}/p")]),
        (LedgerWriter.serving, [], [gpu_lease("{x}"), trainer_lease("{x}/p")]),
    ],
)
async def test_a_writer_holds_only_its_own_leases(
    stack_settings: Settings, database: str, writer: LedgerWriter, own: list[str], forged: list[str]
) -> None:
    unique = f"w{secrets.token_hex(6)}"
    async with await Ledger.connect(_login(stack_settings, writer, database)) as login:
        for resource in own:
            held = await login.claim(_named(resource, unique), "holder", ttl_s=30)
            assert held is not None and await login.renew(held, ttl_s=30) is not None
            await login.release(held)
        for resource in forged:
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match="only its own leases"):
                await login.claim(_named(resource, unique), "holder", ttl_s=30)


async def test_a_trainer_login_cannot_write_checkpoints_of_a_lease_it_does_not_hold(
    stack_settings: Settings, database: str
) -> None:
    """Its own kind, but fenced by another trainer's lease: the fence's secret still decides."""
    policy = f"w{secrets.token_hex(6)}/p"
    async with await Ledger.connect(_login(stack_settings, LedgerWriter.trainer, database)) as trainer:
        held = await trainer.claim(trainer_lease(policy), "trainer-a", ttl_s=30)
        assert held is not None
        (written,) = await trainer.append(
            policy_checkpoints_stream(policy), [NewEvent("step/1", "CheckpointCreated", {})], fence=held.fence
        )
        assert written.appended
        with pytest.raises(StaleFenceError, match="does not hold lease"):
            await trainer.append(
                policy_checkpoints_stream(policy),
                [NewEvent("step/2", "CheckpointCreated", {})],
                fence=replace(held.fence, secret="x" * 64),
            )
