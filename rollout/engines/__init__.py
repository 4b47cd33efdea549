"""Inference engines behind one protocol: sample prompt ids into completion ids and logprobs, load a
checkpoint, sleep, wake, report health. See rollout.engines.protocol."""
