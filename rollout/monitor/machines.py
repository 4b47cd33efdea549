"""The Machines view: the services and their health, the engines (what each serves, awake or asleep, its
prefix cache's hit rate and its requests in flight), the Temporal workers polling each queue, sandboxes and
their claims, leases and their holders, and each run's workflows (the run, its supply, episodes, agents,
training) with links into the Temporal web UI."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import streamlit as st

from rollout.control.reads import engines, leases, list_runs, sandbox_claim, sandbox_host_lease
from rollout.monitor.plain import plain
from rollout.serving.engine_load import EngineLoad, fetch_engine_load

if TYPE_CHECKING:
    from rollout.control.reads import LedgerReader
    from rollout.monitor.context import Monitor

WORKFLOWS = 200  # the newest workflow executions listed, and runs offered to pick from


def render(monitor: Monitor) -> None:
    st.title("Machines")
    st.subheader("Services")
    st.dataframe(_services(monitor), hide_index=True, width="stretch")

    async def read(ledger: LedgerReader) -> tuple[Any, ...]:
        return await engines(ledger), await leases(ledger), await list_runs(ledger, limit=WORKFLOWS)

    engine_rows, lease_rows, runs = monitor.read(read)
    _workflows(monitor, [r.run for r in runs])
    st.subheader("Engines")
    if engine_rows:
        loads = _loads(monitor, [e.url for e in engine_rows])
        st.dataframe(
            [
                {
                    "engine": e.engine,
                    "url": e.url,
                    "state": "asleep" if e.sleeping else "awake",
                    "prefix cache hits": _hits(loads.get(e.url)),
                    "in flight": _in_flight(loads.get(e.url)),
                    "serves": ", ".join(e.serving) or "the base model",
                    "opponents held": f"{', '.join(e.opponents) or 'none'} (budget {e.opponent_budget})",
                    "last failed load": (e.failed or {}).get("error", ""),
                    "since": e.recorded_at.strftime("%H:%M:%S"),
                }
                for e in engine_rows
            ],
            hide_index=True,
            width="stretch",
        )
    else:
        st.caption("No engine has said what it serves yet.")
    st.subheader("Temporal workers")
    st.dataframe(_pollers(monitor), hide_index=True, width="stretch")
    st.subheader("Sandboxes")
    hosts = [lease for lease in lease_rows if sandbox_host_lease(lease.resource) is not None]
    claims = [lease for lease in lease_rows if sandbox_claim(lease.resource)]
    if hosts or claims:
        st.dataframe(
            [
                {
                    "sandbox": sandbox_host_lease(lease.resource),
                    "address": lease.holder.partition("@")[2] or lease.holder,  # holder: SEATS@ADDRESS
                    "in the pool": lease.live,
                    "claimed by": next(
                        (
                            c.holder
                            for c in claims
                            if c.live and c.resource.endswith(lease.resource.split("/", 1)[1])
                        ),
                        "",
                    ),
                }
                for lease in hosts
            ],
            hide_index=True,
            width="stretch",
        )
    else:
        st.caption("No sandbox server has registered.")
    st.subheader("Leases")
    st.dataframe(
        [
            {
                "resource": lease.resource,
                "holder": lease.holder,
                "epoch": lease.epoch,
                "live": lease.live,
                "expires": lease.expires_at.strftime("%H:%M:%S"),
            }
            for lease in lease_rows
        ],
        hide_index=True,
        width="stretch",
    )


def _loads(monitor: Monitor, urls: list[str]) -> dict[str, EngineLoad | None]:
    """Each engine's prefix cache and load, as its /metrics says (asked with the stack's engine key)."""
    from concurrent.futures import ThreadPoolExecutor

    from rollout.serving.keys import known_engine_api_key

    key = known_engine_api_key(monitor.settings.data_path)
    with ThreadPoolExecutor(max_workers=8) as pool:
        found = pool.map(lambda url: fetch_engine_load(url, key, timeout_s=1.0), urls)
    return dict(zip(urls, found, strict=True))


def _in_flight(load: EngineLoad | None) -> int | None:
    return None if load is None else load.in_flight


def _hits(load: EngineLoad | None) -> str:
    if load is None:
        return "not answering /metrics"
    if load.cache_off is not None:
        return f"off: {load.cache_off}"
    return "no prompt yet" if load.hit_rate is None else f"{load.hit_rate:.0%} of {load.queried:,} tokens"


def _services(monitor: Monitor) -> list[dict[str, Any]]:
    from rollout.stack.embedded import Stack

    return [
        {
            "service": s.name,
            "mode": s.mode,
            "address": s.address,
            "healthy": s.healthy,
            "restarts": s.restarts,
            "detail": s.detail,
        }
        for s in Stack(monitor.settings).status()
    ]


def _pollers(monitor: Monitor) -> list[dict[str, Any]]:
    from rollout.control.workflow_reads import queue_pollers

    namespace = monitor.settings.services.temporal.namespace
    try:
        found = monitor.temporal(lambda client: queue_pollers(client, namespace))
    except RuntimeError as error:
        return [
            {"queue": "—", "polls for": "—", "workers": 0, "identities": f"Temporal unreachable: {error}"}
        ]
    return [
        {
            "queue": q.queue,
            "polls for": q.polls_for,
            "workers": q.workers,
            "identities": ", ".join(q.identities),
        }
        for q in found
    ]


def _workflows(monitor: Monitor, runs: list[str]) -> None:
    st.subheader("Workflows")
    if (ui := monitor.settings.temporal_ui_url) is not None:
        st.markdown(f"[The Temporal web UI]({ui})")
    if not runs:
        st.caption("No run yet.")
        return
    run = st.selectbox("workflows of run", runs, key="workflows_of")
    if run is None:
        return
    from temporalio.service import RPCError

    from rollout.control.workflow_reads import run_workflows

    try:
        found = monitor.temporal(lambda client: run_workflows(client, run, WORKFLOWS))
    except (RuntimeError, RPCError) as error:
        st.warning(
            plain(f"Temporal at {monitor.settings.temporal_address} did not list the workflows: {error}")
        )
        return
    rows = [
        {
            "workflow": w.workflow_id,
            "type": w.workflow_type,
            "state": w.state,
            "started": w.started.strftime("%Y-%m-%d %H:%M:%S"),
            "Temporal web UI": monitor.workflow_url(w.workflow_id),
        }
        for w in found
    ]
    if not rows:
        st.caption(
            f"Temporal has no workflow of run {plain(repr(run))} (its history may have passed retention)."
        )
        return
    st.dataframe(
        rows,
        hide_index=True,
        width="stretch",
        column_config={"Temporal web UI": st.column_config.LinkColumn(display_text="open")},
    )
    if len(rows) == WORKFLOWS:
        st.caption(f"The newest {WORKFLOWS} of the run's workflows.")
