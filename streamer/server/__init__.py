"""The WebSocket server: one route table, one connection runner, the native ``/v1/listen`` adapter, the
scheduler in front of the engine, and what operators read (metrics, status, logs)."""
