"""The PostgreSQL store's multi-step statements: enqueue, dequeue and claim, each one round trip to the database."""

from __future__ import annotations

from agentlightning.store._sql_rows import ATTEMPT_COLUMNS, ROLLOUT_COLUMNS

__all__ = ["CLAIM_MANY", "DEQUEUE", "INSERT_ATTEMPT", "INSERT_ROLLOUTS"]

INSERT_ROLLOUTS = (
    f"INSERT INTO agl_rollouts ({ROLLOUT_COLUMNS}) "
    "SELECT r, 'queuing', i, m, g, s, 0, %s, %s, d FROM unnest(%b::text[], %b::text[], %b::text[], %b::text[], "
    "%b::text[], %b::text[]) WITH ORDINALITY AS t(r, i, m, g, s, d, n) ORDER BY n "
    f"ON CONFLICT (rollout_id) DO NOTHING RETURNING {ROLLOUT_COLUMNS}"
)
# A dequeue is this one statement (its own transaction, one round trip): claim the oldest queuing rollout nobody
# else is claiming right now (a concurrent claim skips the locked row and takes the next one instead of waiting
# for it), start its attempt, and remember the answer under the request id. A request id already answered claims
# nothing and reads the answer back instead (the last column, from before the statement); two tries of one request
# racing through two servers collide on the request's primary key, and the loser's statement changes nothing.
DEQUEUE = f"""
WITH claimed AS (
    UPDATE agl_rollouts SET status = 'running', updated_at = %(t)s WHERE seq = (
        SELECT seq FROM agl_rollouts WHERE status = 'queuing'
            AND NOT EXISTS (SELECT 1 FROM agl_requests WHERE request_id = %(key)s)
        ORDER BY seq LIMIT 1 FOR UPDATE SKIP LOCKED)
    RETURNING {ROLLOUT_COLUMNS}
), attempt AS (
    INSERT INTO agl_attempts ({ATTEMPT_COLUMNS}, mode)
    SELECT rollout_id, %(attempt_id)s, retry_count + 1, %(worker)s, 'running', %(t)s, NULL, %(t)s, NULL, mode
    FROM claimed
), remembered AS (
    INSERT INTO agl_requests (request_id, result, created_at)
    SELECT %(key)s, COALESCE((SELECT json_build_array(rollout_id, %(attempt_id)s::text)::text FROM claimed), 'null'),
        %(t)s
    WHERE %(key)s::text IS NOT NULL AND NOT EXISTS (SELECT 1 FROM agl_requests WHERE request_id = %(key)s)
)
SELECT {ROLLOUT_COLUMNS}, NULL FROM claimed
UNION ALL SELECT {", ".join(["NULL"] * 10)}, result FROM agl_requests WHERE request_id = %(key)s
"""
# `dequeue_many`: claim the n oldest queuing rollouts nobody else is claiming (``seq`` last: the queue order)
CLAIM_MANY = f"""
UPDATE agl_rollouts SET status = 'running', updated_at = %(t)s WHERE seq IN (
    SELECT seq FROM agl_rollouts WHERE status = 'queuing' ORDER BY seq LIMIT %(n)s FOR UPDATE SKIP LOCKED)
RETURNING {ROLLOUT_COLUMNS}, seq
"""
INSERT_ATTEMPT = (
    f"INSERT INTO agl_attempts ({ATTEMPT_COLUMNS}, mode) VALUES (%s, %s, %s, %s, 'running', %s, NULL, %s, NULL, %s)"
)
