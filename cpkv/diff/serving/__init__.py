"""Two serving runs compared: ``verdict`` (one verdict ranked on goodput, requests lost,
latency and cost), ``requests`` (request by request, from ``requests.jsonl``) and ``render``
(their table, request rows and JSON)."""
