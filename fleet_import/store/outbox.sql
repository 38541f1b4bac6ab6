-- Every statement of the publication outbox. Sections are named `-- name --`; the
-- OutboxRepository method of the same name runs it. Claims and backoff use the database
-- clock (now()) only, never the client's.

-- claim_next --
-- Only the batch's head step (the lowest seq that is not done) may be claimed, so step N
-- never starts before every step < N is done, whichever drain ran them and across any
-- number of drain cycles. SKIP LOCKED applies to the head alone: a head that another drain
-- is claiming right now means "nothing for you", never "take the next step instead".
-- A contender that finds the head already updated re-checks the WHERE against the committed
-- version (READ COMMITTED), so of two drains exactly one gets the row.
-- An expired claim is taken over and counted as an attempt: its worker died mid-step.
WITH head AS (
    SELECT o.id
    FROM publication_outbox o
    JOIN ingestion_batches b ON b.id = o.batch_id
    WHERE o.batch_id = %(batch_id)s
      AND o.status <> 'done'
      AND b.status = 'running'
      AND (%(lease_owner)s::text IS NULL OR b.execution_lease_id = %(lease_owner)s::text)
    ORDER BY o.seq
    LIMIT 1
),
claimable AS (
    SELECT o.id, o.status AS previous_status, o.claimed_by AS previous_worker
    FROM publication_outbox o
    WHERE o.id = (SELECT id FROM head)
      AND ((o.status IN ('pending', 'failed') AND o.available_at <= now())
           OR (o.status = 'claimed' AND o.claimed_until <= now()))
    FOR UPDATE SKIP LOCKED
)
UPDATE publication_outbox o
SET status = 'claimed',
    claimed_by = %(worker)s,
    claimed_until = now() + make_interval(secs => %(ttl)s),
    attempts = o.attempts + CASE WHEN c.previous_status = 'claimed' THEN 1 ELSE 0 END,
    last_error = CASE
        WHEN c.previous_status = 'claimed'
        THEN 'the claim of ' || coalesce(c.previous_worker, '?') || ' expired before the step finished'
        ELSE o.last_error
    END,
    updated_at = now()
FROM claimable c
WHERE o.id = c.id
RETURNING o.*

-- complete --
-- Fenced by the claim: a worker whose claim was taken over may not record the result.
UPDATE publication_outbox
SET status = 'done', claimed_until = NULL, updated_at = now()
WHERE id = %(step_id)s AND status = 'claimed' AND claimed_by = %(worker)s
RETURNING *

-- lock_claimed_step --
SELECT attempts
FROM publication_outbox
WHERE id = %(step_id)s AND status = 'claimed' AND claimed_by = %(worker)s
FOR UPDATE

-- fail --
UPDATE publication_outbox
SET status = CASE WHEN %(dead)s THEN 'dead' ELSE 'pending' END,
    attempts = %(attempts)s,
    last_error = %(error)s,
    claimed_by = CASE WHEN %(dead)s THEN claimed_by END,
    claimed_until = NULL,
    available_at = now() + make_interval(secs => %(delay)s),
    updated_at = now()
WHERE id = %(step_id)s AND status = 'claimed' AND claimed_by = %(worker)s
RETURNING *

-- release --
-- Give a claimed step back untouched (it did not run): no attempt is counted.
UPDATE publication_outbox
SET status = 'pending', claimed_by = NULL, claimed_until = NULL, updated_at = now()
WHERE id = %(step_id)s AND status = 'claimed' AND claimed_by = %(worker)s
RETURNING *

-- reopen_dead_steps --
-- An operator's explicit resume gives dead steps a fresh set of attempts, and waiting ones
-- no more backoff: a person asked for it now.
UPDATE publication_outbox
SET status = 'pending', attempts = 0, claimed_by = NULL, claimed_until = NULL,
    available_at = now(), updated_at = now()
WHERE batch_id = %(batch_id)s
  AND (status IN ('dead', 'failed') OR (status = 'pending' AND available_at > now()))
RETURNING id

-- step_state --
SELECT step, status, claimed_by FROM publication_outbox WHERE id = %(step_id)s

-- steps --
SELECT *
FROM publication_outbox
WHERE batch_id = %(batch_id)s
ORDER BY seq

-- batches_with_open_steps --
-- Running, committed batches: their publication is unfinished by definition (success ends
-- it). Left out: batches whose executor's lease is alive, and batches whose head step is
-- waiting out a backoff. Included: a batch whose steps are all done but which never reached
-- mark_succeeded (its worker died), and one with a dead step (it must be marked failed).
SELECT b.id
FROM ingestion_batches b
WHERE b.status = 'running'
  AND COALESCE(b.details ->> 'warehouse_committed', b.details ->> 'redshift_committed')::boolean IS TRUE
  AND (b.execution_lease_id IS NULL OR b.execution_lease_expires_at <= now())
  AND NOT EXISTS (
      SELECT 1
      FROM (
          SELECT o.status, o.available_at
          FROM publication_outbox o
          WHERE o.batch_id = b.id AND o.status <> 'done'
          ORDER BY o.seq
          LIMIT 1
      ) AS head
      WHERE head.status IN ('pending', 'failed') AND head.available_at > now()
  )
ORDER BY b.updated_at, b.id
LIMIT %(limit)s

-- mark_superseded --
-- One of the two writes to a terminal row (supersede_failed_publications is the other): a
-- succeeded batch learns which batch replaced its slice. Set once (idempotent for the same
-- successor), and only by a later batch of the same scope.
UPDATE ingestion_batches prev
SET details = prev.details || jsonb_build_object('superseded_by', %(superseded_by)s::text),
    updated_at = now()
FROM ingestion_batches successor
WHERE prev.id = %(batch_id)s
  AND successor.id = %(superseded_by)s
  AND successor.id <> prev.id
  AND successor.tenant_id = prev.tenant_id
  AND successor.source_scope = prev.source_scope
  AND successor.created_at > prev.created_at
  AND prev.status = 'succeeded'
  AND (prev.details ->> 'superseded_by' IS NULL
       OR prev.details ->> 'superseded_by' = %(superseded_by)s::text)
RETURNING prev.id

-- mark_publication_expired --
-- Fenced by the caller's lease, like every transition of a running batch.
UPDATE ingestion_batches
SET status = 'failed',
    details = details || jsonb_build_object(
        'publication_expired', true,
        'failure', jsonb_build_object('kind', 'failed_publication', 'error', %(error)s::text,
                                      'at', to_char(now() AT TIME ZONE 'UTC',
                                                    'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'))),
    updated_at = now()
WHERE id = %(batch_id)s AND status = 'running' AND execution_lease_id = %(owner)s
RETURNING *

-- supersede_failed_publications --
-- Every earlier batch of the scope that failed its publication committed a slice that this
-- batch has now replaced, whether or not a success came between: each learns which batch
-- superseded it (resume refuses a superseded batch) and its open outbox rows are retired.
-- Retired, not deleted: the rows keep the batch's story (which step failed, how often, why),
-- while the terminal status takes them out of every claim, reopen and drain. Open means
-- pending, failed or dead, or claimed under a claim that has run out (its worker is gone).
-- Set once (idempotent for the same successor): a retried retire step finds the batches it
-- superseded again and retires nothing twice.
WITH superseded AS (
    UPDATE ingestion_batches prev
    SET details = prev.details || jsonb_build_object('superseded_by', cur.id::text),
        updated_at = now()
    FROM ingestion_batches cur
    WHERE cur.id = %(batch_id)s
      AND prev.tenant_id = cur.tenant_id
      AND prev.source_scope = cur.source_scope
      AND prev.id <> cur.id
      AND prev.created_at < cur.created_at
      AND prev.status = 'failed'
      AND prev.details -> 'failure' ->> 'kind' = 'failed_publication'
      AND (prev.details ->> 'superseded_by' IS NULL
           OR prev.details ->> 'superseded_by' = cur.id::text)
    RETURNING prev.id
),
retired AS (
    UPDATE publication_outbox o
    SET status = 'retired', claimed_by = NULL, claimed_until = NULL, updated_at = now()
    FROM superseded s
    WHERE o.batch_id = s.id
      AND (o.status IN ('pending', 'failed', 'dead')
           OR (o.status = 'claimed' AND o.claimed_until <= now()))
)
SELECT id FROM superseded ORDER BY id

-- previous_batch --
-- The batch whose slice this one replaced: the latest earlier success of the scope that no
-- other batch has superseded (one superseded by this very batch still counts, so a retried
-- retire step finds the same batch again).
SELECT prev.*
FROM ingestion_batches cur
JOIN ingestion_batches prev
  ON prev.tenant_id = cur.tenant_id AND prev.source_scope = cur.source_scope
WHERE cur.id = %(batch_id)s
  AND prev.id <> cur.id
  AND prev.status = 'succeeded'
  AND prev.created_at < cur.created_at
  AND (prev.details ->> 'superseded_by' IS NULL
       OR prev.details ->> 'superseded_by' = cur.id::text)
ORDER BY prev.created_at DESC, prev.id DESC
LIMIT 1

-- cache_entries_only_used_by --
-- Entries that only batches older than this one used: created by a finished batch of its
-- scope (a cache hit keeps the creator), whether it succeeded, failed its publication or
-- failed before committing, and not among the files this batch was loaded from (a key it
-- still reads with other content, or under another contract version, is not). This batch
-- committed the slice that replaced all of theirs. Entries of other scopes, and of running
-- batches (this one), are never candidates. A NULL etag or version to keep matches any.
SELECT n.source_key, n.etag, n.contract_version, n.dataset, n.output_uri, n.row_count,
       n.reject_count, n.details
FROM normalized_files n
JOIN ingestion_batches creator ON creator.id = n.created_by_batch
JOIN ingestion_batches cur ON cur.id = %(batch_id)s
WHERE creator.tenant_id = cur.tenant_id
  AND creator.source_scope = cur.source_scope
  AND creator.created_at < cur.created_at
  AND creator.status <> 'running'
  AND NOT EXISTS (
      SELECT 1
      FROM unnest(%(keep_keys)s::text[], %(keep_etags)s::text[], %(keep_versions)s::text[])
           AS k (source_key, etag, contract_version)
      WHERE k.source_key = n.source_key
        AND (k.etag IS NULL OR k.etag = n.etag)
        AND (k.contract_version IS NULL OR k.contract_version = n.contract_version))
ORDER BY n.source_key, n.etag, n.contract_version

-- forget_cache_entries --
-- The same fence as cache_entries_only_used_by: an entry another batch re-stored in the
-- meantime (its creator is now that batch) stays.
DELETE FROM normalized_files n
USING unnest(%(source_keys)s::text[], %(etags)s::text[], %(contract_versions)s::text[])
      AS f (source_key, etag, contract_version),
      ingestion_batches creator,
      ingestion_batches cur
WHERE n.source_key = f.source_key
  AND n.etag = f.etag
  AND n.contract_version = f.contract_version
  AND creator.id = n.created_by_batch
  AND cur.id = %(batch_id)s
  AND creator.tenant_id = cur.tenant_id
  AND creator.source_scope = cur.source_scope
  AND creator.created_at < cur.created_at
  AND creator.status <> 'running'
RETURNING n.source_key, n.etag, n.contract_version, n.dataset, n.output_uri, n.row_count,
          n.reject_count, n.details
