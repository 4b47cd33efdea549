"""Fakes of services rollout cannot reach from CI, named as fakes; each speaks the real service's wire protocol."""
