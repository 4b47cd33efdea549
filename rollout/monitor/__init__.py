"""`rollout monitor`: the Streamlit dashboard (runs, transcripts, the checkpoint tree, evals, machines).

`app.py` is the Streamlit script (`streamlit run rollout/monitor/app.py`); each view is a module with a
`render(monitor)` function; `context.Monitor` is what they read through (the ledger, Temporal, the stack). The
dashboard keeps no state of its own: every view reads the ledger (rollout.control.reads) and Temporal afresh.
"""
