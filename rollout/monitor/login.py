"""The dashboard's login: a shared token, for a dashboard that listens beyond loopback.

Contract: with `ROLLOUT_MONITOR_TOKEN` in the dashboard's environment, `logged_in()` is True only for a
browser session that gave that token, as `?token=` in the URL (dropped from the address bar once read) or
typed into the form it draws; until then the page holds the form and nothing else: no view runs, so nothing
of the ledger or Temporal reaches the browser and no run can be paused. Tokens are compared in constant time.
Without the variable every session is logged in: the dashboard then listens on loopback only (`rollout
monitor` refuses any other address without a token).
"""

from __future__ import annotations

import hmac
import os

import streamlit as st

__all__ = ["TOKEN_VARIABLE", "logged_in"]

TOKEN_VARIABLE = "ROLLOUT_MONITOR_TOKEN"


def logged_in() -> bool:
    expected = os.environ.get(TOKEN_VARIABLE, "")
    if not expected or st.session_state.get("logged_in"):
        return True
    given = st.query_params.get("token")
    if given is not None:
        del st.query_params["token"]  # not left in the address bar, its history or a screenshot
    else:
        st.title("rollout")
        given = st.text_input("The dashboard's token", type="password")
    if given and hmac.compare_digest(given.encode(), expected.encode()):
        st.session_state["logged_in"] = True
        st.rerun()
    if given:
        st.error("That is not the dashboard's token.")
    return False
