"""What a run is, in records the workflows, the gateway and the faces share: its settings and how they change
(`settings`), how it was launched (`launches`), the checkpoints its self-play seats pin (`pins`), and why its
episodes failed (`failures`).

Importing the package imports none of its modules, and they import nothing heavier than the configuration's
defaults and overrides: workflow code reads them.
"""
