"""The dashboard's Streamlit script: five views on one navigation (`streamlit run rollout/monitor/app.py`,
started by `rollout monitor`).

A view that cannot reach the ledger shows a banner naming the address and tries again every few seconds, so
the app recovers by itself when the ledger returns; a run or episode that does not exist is a sentence on the
page. With a token configured, nothing is drawn before the session gives it (rollout.monitor.login).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import streamlit as st

from rollout.control.reads import LedgerUnreachable, list_runs
from rollout.monitor import checkpoints, evals, machines, runs, transcripts
from rollout.monitor.context import Monitor
from rollout.monitor.login import logged_in
from rollout.security.redaction import redact_url

RETRY_S = 3.0


def _monitor() -> Monitor:
    if "monitor" not in st.session_state:
        st.session_state["monitor"] = Monitor.from_environment()
    return st.session_state["monitor"]


def _guarded(render: Callable[[Monitor], None]) -> None:
    monitor = _monitor()
    try:
        render(monitor)
    except LedgerUnreachable as error:
        st.error(
            f"The ledger at {redact_url(monitor.settings.reader_ledger_url)} is not answering ({error}). Trying "
            f"again every {RETRY_S:.0f} s; `rollout status` shows the stack."
        )
        _until_the_ledger_answers(monitor)


@st.fragment(run_every=RETRY_S)
def _until_the_ledger_answers(monitor: Monitor) -> None:
    # Runs again every few seconds on its own; once the ledger answers, the whole page is drawn again.
    try:
        monitor.read(list_runs)
    except LedgerUnreachable:
        st.caption(f"still not answering at {time.strftime('%H:%M:%S')}")
        return
    st.rerun(scope="app")


def runs_page() -> None:
    _guarded(runs.render)


def transcripts_page() -> None:
    _guarded(transcripts.render)


def checkpoints_page() -> None:
    _guarded(checkpoints.render)


def evals_page() -> None:
    _guarded(evals.render)


def machines_page() -> None:
    _guarded(machines.render)


def main() -> None:
    st.set_page_config(page_title="rollout", layout="wide")
    if not logged_in():
        return
    st.navigation(
        [
            st.Page(runs_page, title="Runs", default=True),  # the main page, at /
            st.Page(transcripts_page, title="Transcripts", url_path="transcripts"),
            st.Page(checkpoints_page, title="Checkpoint tree", url_path="checkpoints"),
            st.Page(evals_page, title="Evals", url_path="evals"),
            st.Page(machines_page, title="Machines", url_path="machines"),
        ]
    ).run()


if __name__ == "__main__":  # Streamlit runs this file as the main script; importing it draws nothing
    main()
