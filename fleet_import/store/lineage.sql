-- Every statement of the lineage outbox (OpenLineage RunEvents, issue #29). Sections are
-- named `-- name --`; the LineageOutbox method of the same name runs it. Claims and backoff
-- use the database clock (now()) only.

-- enqueue_lineage --
-- Run in mark_committed's transaction. One row per (run id, event type): a commit recorded
-- again (a rerun that finds the stamp) keeps the events first written, so every delivery
-- of a run's event carries the same event time.
INSERT INTO lineage_outbox (batch_id, run_id, job_name, event_type, event_time, event)
SELECT %(batch_id)s, e.run_id, e.job_name, e.event_type, e.event_time, e.event
FROM unnest(%(run_ids)s::uuid[], %(job_names)s::text[], %(event_types)s::text[],
            %(event_times)s::timestamptz[], %(events)s::jsonb[])
     AS e (run_id, job_name, event_type, event_time, event)
ON CONFLICT (run_id, event_type) DO NOTHING

-- claim_next --
-- The earliest due event (of one batch, or of any), and only if every earlier event of its
-- run is delivered: COMPLETE never reaches a catalog before its START. A claim that ran out
-- (its worker died between sending and recording) is taken over: the event may then be sent
-- twice, with the same run id, type and time, which receivers treat as one.
WITH candidate AS (
    SELECT l.id
    FROM lineage_outbox l
    WHERE (%(batch_id)s::uuid IS NULL OR l.batch_id = %(batch_id)s::uuid)
      AND ((l.status = 'pending' AND l.available_at <= now())
           OR (l.status = 'claimed' AND l.claimed_until <= now()))
      AND NOT EXISTS (
          SELECT 1 FROM lineage_outbox e
          WHERE e.run_id = l.run_id AND e.status <> 'delivered'
            AND (e.event_time, e.id) < (l.event_time, l.id))
    ORDER BY l.available_at, l.event_time, l.id
    LIMIT 1
    FOR UPDATE SKIP LOCKED
)
UPDATE lineage_outbox l
SET status = 'claimed', claimed_by = %(worker)s,
    claimed_until = now() + make_interval(secs => %(ttl)s)
FROM candidate c
WHERE l.id = c.id
RETURNING l.*

-- delivered --
-- Fenced by the claim: a worker whose claim was taken over records nothing.
UPDATE lineage_outbox
SET status = 'delivered', delivered_at = now(), claimed_until = NULL, last_error = NULL
WHERE id = %(id)s AND status = 'claimed' AND claimed_by = %(worker)s
RETURNING id

-- failed --
UPDATE lineage_outbox
SET status = 'pending', attempts = attempts + 1, last_error = %(error)s,
    claimed_by = NULL, claimed_until = NULL,
    available_at = now() + make_interval(secs => %(delay)s)
WHERE id = %(id)s AND status = 'claimed' AND claimed_by = %(worker)s
RETURNING attempts

-- of_batch --
SELECT id, batch_id, run_id, job_name, event_type, event_time, status, attempts, last_error,
       available_at, delivered_at
FROM lineage_outbox
WHERE batch_id = %(batch_id)s
ORDER BY event_time, id

-- event --
SELECT event FROM lineage_outbox WHERE id = %(id)s
