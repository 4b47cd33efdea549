"""One default per run setting: what a run uses when nobody chose another value.

The configuration (`run.*`, `rollout config show`), the workflows' inputs (`RunInput`, `SupplyInput`) and the
gateway's admission (a seat whose run recorded no max_lag) all take their defaults from here, so `rollout
train`, `rollout run start` and a run started from code agree. So do the trainer and vLLM on the modules a
LoRA adapter targets (`LORA_TARGET_MODULES`). Pure constants, no imports.
"""

MAX_LAG = 1  # checkpoints behind the newest a turn may sample (0: on-policy); changes mid-run
GROUPS_IN_FLIGHT = 4  # episode groups the supply keeps playing at once
# A run pauses itself when more than this share of its last FAILURE_WINDOW episodes failed (1: never).
MAX_FAILURE_RATE = 0.9
FAILURE_WINDOW = 20
# A group running longer than this, or than STRAGGLER_FACTOR times the median time of the run's finished
# groups if that is longer (once STRAGGLER_AFTER groups finished), is a straggler: it plays on to its own
# bound but no longer holds one of groups_in_flight's slots (at most groups_in_flight stragglers at once).
STRAGGLER_FLOOR_S = 30.0
STRAGGLER_FACTOR = 4.0
STRAGGLER_AFTER = 3
MAX_TOKENS = 256  # sampled tokens per turn, at most
EVAL_EPISODES_IN_FLIGHT = 4  # episodes an eval plays at once, across all its environments
PREFIX_CACHE_MB = (
    1024  # the local engine's key/value states kept across requests (services.engine.prefix_cache_mb)
)

# The modules a checkpoint's LoRA adapter trains, in Hugging Face's names: the local trainer's default
# targets, and what vLLM reserves LoRA slots for (--lora-target-modules; without it, every module it
# supports).
LORA_TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")
