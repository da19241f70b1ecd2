"""The worker loop's step as ONE call of a function of the schema (``STEP_FUNCTION``).

Its statements are the protocol's own texts (``transitions``), the call's
arguments in place of their parameters; each schema version that changed
the function keeps its text here (``_step_function(version)``), since the
migration step to that version creates it.
"""

from __future__ import annotations

from ..handler import EFFECT_INSERT
from ..priority import CLAIM_ORDER
from ..transitions import (ACK, CLAIM, CLAIMED_ORDER, DUE, DUE_BEFORE_PRIORITY, FAIL, RECOVER,
                           picking)
from .connection import _bound, _journalled, picked
from .schema import EXPIRED_READ, SCHEMA_VERSION

STEP_FUNCTION_NAME = "queue_core_step"
# The claim as schema 3 to 5 spelled it in the step, before a message had a priority.
CLAIM_BEFORE_PRIORITY = CLAIM.replace(f", {CLAIM_ORDER} AS claim_order", "", 1)
assert CLAIM_BEFORE_PRIORITY != CLAIM
# The stored payload's SHA-256, computed by the server from the payload as it is
# stored now (the same bytes Python hashes: ``ingest.payload_digest``).
STORED_DIGEST = "sha256(convert_to(payload, 'UTF8'))"
# The ACK for an effect computed from the payload the claim returned, in schema
# 3: also guarded by that payload's digest, so that an effect of anything but
# the stored payload is never marked done. Parameters: finished_at, the guard's,
# the digest of the payload the effect was computed from.
ACK_OF_PAYLOAD_3 = ACK.replace(" RETURNING ", f" AND {STORED_DIGEST} = ? RETURNING ", 1)
# The same ACK in schema 4: the payload the effect was computed from must be the
# one the message was enqueued with (its digest, ``payload_sha256``), and so
# must the payload stored now. Same parameters.
ACK_OF_PAYLOAD = ACK.replace(
    " RETURNING ", f" AND payload_sha256 = ? AND {STORED_DIGEST} = payload_sha256 RETURNING ", 1)
# leased -> dead, the lease held and the stored payload no longer the enqueued
# one (edited by hand): the ACK's refusal, in the ACK's own transaction, as
# ``Queue._fail`` writes a permanent failure. Parameters: FAIL's.
DEAD_LETTER_EDITED = FAIL.replace(
    " RETURNING ", f" AND {STORED_DIGEST} <> payload_sha256 RETURNING ", 1)


def _into(statement: str, target: str) -> str:
    """A journalled statement (``_journalled``) whose changed rows go INTO
    ``target``: PL/pgSQL runs a data-modifying statement only with a destination."""
    return statement.replace("SELECT * FROM changed", f"SELECT * INTO {target} FROM changed", 1)


# The step's answer when its ACK changed no row, in schema 3: the stored message,
# and whether its payload is the one the effect was computed from.
_REFUSAL_3 = """RETURN QUERY SELECT CASE WHEN sha256(convert_to(m.payload, 'UTF8')) = p_digest
                                 THEN 'refused' ELSE 'payload_differs' END,
                            m.event_id, m.generation, m.attempts, m.lease_until, m.state,
                            NULL::text, v_now
                     FROM messages AS m WHERE m.event_id = p_event_id;"""
# The same in schema 4: a held lease whose stored payload was edited is first
# moved to ``dead`` (``DEAD_LETTER_EDITED``, journalled) and answered as
# 'payload_edited'; else the stored message, and whether the effect was computed
# from the payload enqueued.
_REFUSAL = """{dead_letter};
        IF FOUND THEN
            RETURN QUERY SELECT 'payload_edited', p_event_id, v_edited.generation,
                                v_edited.attempts, NULL::bigint, 'dead', NULL::text, v_now;
            RETURN;
        END IF;
        RETURN QUERY SELECT CASE WHEN m.payload_sha256 = p_digest
                                 THEN 'refused' ELSE 'payload_differs' END,
                            m.event_id, m.generation, m.attempts, m.lease_until, m.state,
                            NULL::text, v_now
                     FROM messages AS m WHERE m.event_id = p_event_id;"""


# Schema 7's step claims at most ONE message, the worker loop's next, with a
# constant ``LIMIT 1`` where 3 to 6 had ``LIMIT p_claim``. PL/pgSQL keeps each
# statement's plan in the session's plan cache and uses one generic plan once it
# costs no more than the plans made for each call's values; a generic plan cannot
# know a LIMIT given as a parameter and prices the claim as if it took a tenth of
# the ready rows, so the server planned the claim afresh at every step: about
# 100 us of the step's 500-600 us of server time here (perf: ``BuildCachedPlan``
# in 15 % of the backend's samples; none with the constant). ``p_claim`` keeps
# its place in the call (an earlier engine's worker calls the new function with
# the same arguments): 0 claims nothing, any other value the next message.
NEXT_ONLY = 7


def _step_function(version: int = SCHEMA_VERSION) -> str:
    """The text of the worker's step on the server (see ``STEP_FUNCTION``), as
    schema ``version`` (3, 4, 6 or 7; 5 kept 4's) has it."""
    ack = _bound(_journalled(ACK_OF_PAYLOAD if version >= 4 else ACK_OF_PAYLOAD_3, ()),
                 ("v_now", "p_event_id", "p_generation", "v_now", "p_digest", "v_now"))
    edited = _bound(_journalled(DEAD_LETTER_EDITED, ()),
                    ("'dead'", "v_now", "'payload_differs'", "p_event_id", "p_generation",
                     "v_now", "'payload_differs'", "v_now"))
    refusal = (_REFUSAL.format(dead_letter=_into(edited, "v_edited")) if version >= 4
               else _REFUSAL_3)
    declared = "\n    v_edited record;" if version >= 4 else ""
    recover = _bound(_journalled(picking(RECOVER, EXPIRED_READ, picked), ()),
                     ("p_max_attempts", "p_max_attempts", "v_now", "v_now"))
    if version >= 6:  # the claim's order, with the priority's head start
        # From 7 on, the next message, one: a constant LIMIT (see ``NEXT_ONLY``).
        claimed_rows = "1" if version >= NEXT_ONLY else "p_claim"
        claim = _bound(_journalled(picking(CLAIM, DUE, picked), CLAIMED_ORDER),
                       ("v_now + p_lease_seconds", "v_now", "v_now", claimed_rows, "v_now"))
    else:
        claim = _bound(_journalled(picking(CLAIM_BEFORE_PRIORITY, DUE_BEFORE_PRIORITY, picked),
                                   ("available_at", "event_id")),
                       ("v_now + p_lease_seconds", "v_now", "p_claim", "v_now"))
    claimed = claim.replace("SELECT * FROM changed ORDER BY",
                            "SELECT 'claimed', event_id, generation, attempts, lease_until, "
                            "'leased', payload, v_now FROM changed ORDER BY", 1)
    # Handler.apply's INSERT, its VALUES taken from the row the ACK changed: none if it was refused
    into, values = EFFECT_INSERT.split(" VALUES ")
    effect = f", effected AS ({into} SELECT p_event_id, p_category, p_amount_cents FROM changed) "
    assert values == "(?, ?, ?)", EFFECT_INSERT
    ack = ack.replace(") SELECT * FROM changed", ")" + effect + "SELECT * FROM changed", 1)
    return f"""CREATE FUNCTION {STEP_FUNCTION_NAME}(
    p_event_id text, p_generation bigint, p_digest bytea, p_category text,
    p_amount_cents bigint, p_now bigint, p_lease_seconds bigint, p_max_attempts bigint,
    p_claim integer)
RETURNS TABLE (kind text, event_id text, generation bigint, attempts bigint,
               lease_until bigint, state text, payload text, at bigint)
LANGUAGE plpgsql AS $step$
#variable_conflict use_column
DECLARE
    v_now bigint := coalesce(p_now, floor(extract(epoch FROM clock_timestamp()))::bigint);
    v_acked record;
    v_recovered record;{declared}
BEGIN
    {_into(ack, "v_acked")};
    IF NOT FOUND THEN
        {refusal}
        RETURN;
    END IF;
    RETURN QUERY SELECT 'done', p_event_id, v_acked.generation, v_acked.attempts,
                        NULL::bigint, 'done', NULL::text, v_now;
    IF p_claim > 0 THEN
        {_into(recover, "v_recovered")};
        RETURN QUERY {claimed};
    END IF;
END
$step$"""

# The worker loop's step as ONE call (schema version 3, and 4): the ACK of one
# lease, and the claim of the next due message, in one transaction that
# ``PostgresStore.step`` begins and commits in the same message as the call. The
# handler computes the effect in Python from the payload the claim returned;
# the server writes it, guarded as every ACK is (``transitions.ACK``) and by the
# payload's digest: the payload the effect was computed from, and the payload
# stored now, must both be the one the message was enqueued with (its SHA-256,
# ``payload_sha256``); so one round trip per message is the steady state.
# The statements are the protocol's own texts, the call's arguments in place of
# their parameters; each journals its rows as the client's do.
#   - The ACK's guarded UPDATE runs first, its journal row and the effect's
#     INSERT in the same statement, written only for the row it changed: a
#     refused ACK writes no effect and claims nothing.
#   - A refused ACK whose lease holds and whose stored payload was edited moves
#     the message to ``dead`` (reason ``payload_differs``), journalled, and
#     answers 'payload_edited'. Any other refusal writes nothing and answers
#     one row (the stored state, generation and deadline, and whether the
#     effect's payload was the enqueued one) from which the client says why
#     (``check_fence``), with the codes of every other ACK, or
#     ``payload_differs``.
#   - ``p_now`` NULL reads the server's clock when the call runs
#     (``DatabaseClock``'s time): such a client needs no round trip for it.
# Rows (kind, event_id, generation, attempts, lease_until, state, payload, at):
# ('done', the ACKed event), then ('claimed', ...) for each lease taken; or one
# row ('refused', 'payload_differs' or 'payload_edited': the stored message);
# none for an event that is not stored. ``at`` is the time the call judged by.
STEP_FUNCTION = _step_function()
STEP_CALL = (f"SELECT * FROM {STEP_FUNCTION_NAME}(%s::text, %s::bigint, %s::bytea, %s::text, "
             "%s::bigint, %s::bigint, %s::bigint, %s::bigint, %s::integer)")
# The step's one message: its transaction, whole (``PostgresStore.step``).
STEP_MESSAGE = f"BEGIN ISOLATION LEVEL READ COMMITTED; {STEP_CALL}; COMMIT"
