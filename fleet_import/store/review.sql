-- The operational store's part in reviewing held batches and retaining what a rollback
-- loads. Sections are named `-- name --`; the ReviewRepository method of the same name
-- runs it.

-- record_review --
-- A held batch is terminal (failed): its one later write is the review's decision, made
-- once. An approval re-recorded by the batch that loaded it is idempotent.
UPDATE ingestion_batches
SET details = details || jsonb_build_object(
        'review', %(review)s::jsonb
                  || jsonb_build_object('at', to_char(now() AT TIME ZONE 'UTC',
                                                      'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'))),
    updated_at = now()
WHERE id = %(batch_id)s
  AND status = 'failed'
  AND details -> 'failure' ->> 'kind' = 'held'
  AND (details -> 'review' IS NULL
       OR (details -> 'review' ->> 'decision' = %(decision)s
           AND details -> 'review' ->> 'batch_id' IS NOT DISTINCT FROM %(by_batch)s::text))
RETURNING *

-- held_batches --
-- What waits for review: held, and neither approved nor rejected yet.
SELECT *
FROM ingestion_batches
WHERE status = 'failed'
  AND details -> 'failure' ->> 'kind' = 'held'
  AND details -> 'review' IS NULL
  AND (%(tenant_id)s::text IS NULL OR tenant_id = %(tenant_id)s::text)
ORDER BY created_at DESC, id
LIMIT %(limit)s

-- retained_batches --
-- Batches of the scope whose normalized files the retention keeps, besides the batch
-- being published (`batch_id`): earlier successes committed within `keep_seconds` of now,
-- the latest earlier success always, and held batches that still wait for review: those
-- made after it (a held batch made before it is overtaken or stale now, as batch_state says:
-- this later delivery listed the folder, so an approval of the held one would be refused).
WITH cur AS (SELECT * FROM ingestion_batches WHERE id = %(batch_id)s),
earlier AS (
    SELECT b.*,
           row_number() OVER (ORDER BY b.created_at DESC, b.id DESC) AS recency
    FROM ingestion_batches b, cur
    WHERE b.tenant_id = cur.tenant_id
      AND b.source_scope = cur.source_scope
      AND b.id <> cur.id
      AND b.created_at < cur.created_at
      AND b.status = 'succeeded'
)
SELECT * FROM earlier
WHERE recency <= %(keep_count)s OR updated_at >= now() - make_interval(secs => %(keep_seconds)s)
UNION ALL
SELECT b.*, NULL AS recency
FROM ingestion_batches b, cur
WHERE b.tenant_id = cur.tenant_id
  AND b.source_scope = cur.source_scope
  AND b.id <> cur.id
  AND b.created_at > cur.created_at
  AND b.status = 'failed'
  AND b.details -> 'failure' ->> 'kind' = 'held'
  AND b.details -> 'review' IS NULL
ORDER BY created_at DESC, id

-- rollback_candidates --
-- Earlier successes of the scope, newest first: what a rollback loads by default (if their
-- files are still retained). A batch's content is its own, or for a rollback that of the
-- batch it rolled back to, followed through rollbacks to rollbacks down to the batch that
-- first loaded it. Left out: the slice's owner (`owner`), every batch whose content the
-- slice shows now (the owner's), and one whose content a succeeded rollback of the scope
-- replaced: an operator removed that on purpose, so only naming it (`--to`) loads it again.
WITH RECURSIVE scoped AS (
    SELECT b.id,
           b.status,
           b.details ->> 'rollback_replaced' AS replaced,
           (b.details ->> 'rolled_back_to')::uuid AS rolled_back_to
    FROM ingestion_batches AS b
    WHERE b.tenant_id = %(tenant_id)s
      AND b.source_scope = %(source_scope)s
),
chain AS (
    -- Each batch, and each batch whose content it loaded again (UNION: a cycle ends).
    SELECT id, id AS loaded, rolled_back_to FROM scoped
    UNION
    SELECT chain.id, s.id, s.rolled_back_to
    FROM chain
    JOIN scoped AS s ON s.id = chain.rolled_back_to
),
contents AS (
    SELECT id, coalesce(rolled_back_to, loaded) AS content_id
    FROM chain
    WHERE rolled_back_to IS NULL OR rolled_back_to NOT IN (SELECT id FROM scoped)
),
hidden AS (
    SELECT removed.content_id
    FROM scoped AS rollback
    JOIN contents AS removed ON removed.id = rollback.replaced::uuid
    WHERE rollback.status = 'succeeded'
    UNION
    SELECT content_id FROM contents WHERE id = %(owner)s::uuid
)
SELECT b.*
FROM ingestion_batches AS b
JOIN scoped AS s ON s.id = b.id
JOIN contents AS c ON c.id = b.id
WHERE s.status = 'succeeded'
  AND s.id IS DISTINCT FROM %(owner)s::uuid
  AND c.content_id NOT IN (SELECT content_id FROM hidden)
ORDER BY b.created_at DESC, b.id
LIMIT %(limit)s

-- held_since --
-- For each held batch named: the newest later batch of its scope that listed the folder
-- (recorded a manifest fingerprint), other than its own approval; whether it saw the held
-- content (same fingerprint, same contract versions) and whether it succeeded.
SELECT h.id AS held_id,
       later.id AS later_id,
       later.status = 'succeeded' AS succeeded,
       coalesce(
           later.fingerprint = h.details -> 'failure' -> 'held' -> 'content' ->> 'fingerprint'
           AND later.contract_versions
               = h.details -> 'failure' -> 'held' -> 'content' -> 'contract_versions',
           false) AS same_content
FROM ingestion_batches AS h
JOIN LATERAL (
    SELECT b.id, b.status,
           b.details -> 'manifest' ->> 'fingerprint' AS fingerprint,
           b.details -> 'contract_versions' AS contract_versions
    FROM ingestion_batches AS b
    WHERE b.tenant_id = h.tenant_id
      AND b.source_scope = h.source_scope
      AND b.created_at > h.created_at
      AND b.details -> 'manifest' ->> 'fingerprint' IS NOT NULL
      AND b.delivery_key <> 'approve:' || h.id::text
    ORDER BY b.created_at DESC, b.id DESC
    LIMIT 1
) AS later ON true
WHERE h.id = ANY(%(ids)s::uuid[])
