"""The gateway agents sample through: OpenAI Chat, OpenAI Responses and Anthropic Messages in, one engine
protocol out; every turn admitted by staleness, rendered to exact token ids and recorded in the ledger."""
