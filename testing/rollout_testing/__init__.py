"""What rollout's tests and benchmarks share, never shipped inside `rollout`: fakes of services CI cannot
reach (named as fakes; each speaks the real service's wire protocol: `tinker_service`, `tinker_training`), and
the harness that starts rollout's own services as real processes (`cluster`, `stacks`), and a loopback OTLP
trace receiver built on OpenTelemetry's protocol classes (`otlp_receiver`)."""
