"""The course's scenario constants, in one place.

Every lesson, check and sweep of the course starts the model clock at
``START`` and leases for ``LEASE_SECONDS``; ``DEMO_JSONL`` is the reference
scenario's input (the same five lines as ``data/demo.jsonl``).
"""

from __future__ import annotations

START = 1000
LEASE_SECONDS = 2
DEMO_JSONL = "\n".join([
    '{"event_id": "E0001", "payload": {"category": "book", "amount_cents": 10000}}',
    '{"event_id": "E0001", "payload": {"amount_cents": 10000, "category": "book"}}',
    '{"event_id": "E0002", "payload": {"category": "pen", "amount_cents": 2000}}',
    '{"event_id": "E0003", "payload": {"category": "book", "amount_cents": 5000}}',
    '{"event_id": "E0004", "payload": {"category": "toy", "amount_cents": 3000}}',
]) + "\n"
