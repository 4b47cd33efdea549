"""Serving each checkpoint during the run: what the serving records mean, the keys that sign them and guard
every engine route, the folds of the serving streams, and what an engine says of its load.

The records themselves (`ServingTarget`, `ServingAck`, `ServingRequest`) are rollout.records.serving, the
stream names rollout.ledger.streams; the follower beside an engine (rollout.engines.follower) writes acks, the
gateway routes by them (rollout.gateway.routing). Its modules:
- `keys`: the engine key, the engine API key and the serving key derived from it, which sign and guard.
- `states`: the folds of the serving streams (`EngineStates`, `ServingRequests`) and what an engine should
  serve (`desired`).
- `engine_load`: an engine's load and prefix-cache counters, read from its `/metrics`.

Contract of the streams:
- Targets are appended on one stream, `serving/targets`, keyed `{policy}/{version}/{format}`: one target per
  (checkpoint, format), so a retried publish records once. A target names the checkpoint, its policy and
  version, the format its files are in (`lora`: a peft adapter directory; `full`: full weights; `tinker`: a
  sampler path), and the files themselves (blob keys with hashes). A target whose checkpoint name, file names
  or format could lead outside an engine's folders is refused where it is read.
- A target names the base model its files apply to (`model`): an engine serving another base model never
  loads it (a run whose policies are on several base models; "" loads on any).
- Acks are appended on one stream, `serving/acks`, keyed `{engine}/{incarnation}/{n}`. Each ack is the
  engine's whole state: the base model it serves to every policy (its name in requests, `base`, and which
  model it is, `model`), the checkpoints it serves, whether it
  sleeps, and the last load that failed (the engine keeps serving what it served before). The newest ack of an
  engine is its state; a restarted engine starts a new incarnation whose first ack serves only the base model.
- Requests (`serving/requests`, rollout.ledger.streams.SERVING_REQUESTS) ask for a checkpoint to be served
  beyond the newest ones (an eval of an older checkpoint, a self-play seat's opponent): `ServingRequested`
  keyed `{holder}/{checkpoint}/requested`, then `ServingReleased` keyed `.../released`. `ServingRequests`
  folds them into the checkpoints some holder still wants, and the released ones, most recently requested
  first; engines serve the wanted ones while their targets exist in a format they load.
- Opponents: what an engine holds beyond each policy's newest checkpoints. Every wanted checkpoint is held;
  released ones stay held while the opponents number fewer than the engine's budget, most recently requested
  first (the least recently requested is evicted first), so a league's next episode against a recent
  opponent finds it loaded. An ack lists its opponents and the budget.
- Version 0 of every policy is the base model: a policy with no checkpoint served yet is served by the base.
"""
