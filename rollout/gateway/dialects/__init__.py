"""API dialects: each maps its wire format onto `ChatRequest` / `Turn` and back, with its own SSE events and
its own error shape. A dialect is pure translation: no I/O, no state."""
