"""The Machines view: the services and their health, the engines (what each serves, awake or asleep), the
Temporal workers polling each queue, sandboxes and their claims, leases and their holders, and links into the
Temporal web UI."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import streamlit as st

from rollout.ledger.streams import sandbox_host_leases_prefix, sandbox_leases_prefix
from rollout.ledger.views import engines, leases
from rollout.workflows.names import RUNNER_QUEUE, TRAINER_QUEUE

if TYPE_CHECKING:
    from rollout.ledger import Ledger
    from rollout.monitor.context import Monitor


def render(monitor: Monitor) -> None:
    st.title("Machines")
    st.subheader("Services")
    st.dataframe(_services(monitor), hide_index=True, width="stretch")
    if (ui := monitor.settings.temporal_ui_url) is not None:
        st.markdown(f"[The Temporal web UI]({ui}) · every run's workflows are `run/RUN…`")

    async def read(ledger: Ledger) -> tuple[Any, ...]:
        return await engines(ledger), await leases(ledger)

    engine_rows, lease_rows = monitor.read(read)
    st.subheader("Engines")
    if engine_rows:
        st.dataframe(
            [
                {
                    "engine": e.engine,
                    "url": e.url,
                    "state": "asleep" if e.sleeping else "awake",
                    "serves": ", ".join(e.serving) or "the base model",
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
    hosts = [lease for lease in lease_rows if lease.resource.startswith(sandbox_host_leases_prefix(""))]
    claims = [lease for lease in lease_rows if lease.resource.startswith(sandbox_leases_prefix(""))]
    if hosts or claims:
        st.dataframe(
            [
                {
                    "sandbox": lease.resource.removeprefix(sandbox_host_leases_prefix("")),
                    "address": lease.holder,
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
    from temporalio.api.enums.v1 import TaskQueueType
    from temporalio.api.taskqueue.v1 import TaskQueue
    from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest

    async def describe(client: Any) -> list[dict[str, Any]]:
        rows = []
        for queue in (RUNNER_QUEUE, TRAINER_QUEUE):
            for kind, label in (
                (TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW, "workflows"),
                (TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY, "activities"),
            ):
                found = await client.workflow_service.describe_task_queue(
                    DescribeTaskQueueRequest(
                        namespace=monitor.settings.services.temporal.namespace,
                        task_queue=TaskQueue(name=queue),
                        task_queue_type=kind,
                    )
                )
                rows.append(
                    {
                        "queue": queue,
                        "polls for": label,
                        "workers": len(found.pollers),
                        "identities": ", ".join(sorted({p.identity for p in found.pollers})),
                    }
                )
        return rows

    try:
        return monitor.temporal(describe)
    except RuntimeError as error:
        return [
            {"queue": "—", "polls for": "—", "workers": 0, "identities": f"Temporal unreachable: {error}"}
        ]
