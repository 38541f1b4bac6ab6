-- Every statement the operational store runs. Sections are named `-- name --`; the
-- repository method of the same name runs it. Lease arithmetic uses the database clock
-- (now()) only, never the client's.

-- reserve --
-- The unique partial index ux_ingestion_batches_running_scope is the arbiter: of N
-- concurrent inserts for one scope exactly one returns a row, the rest wait for it to
-- commit and then do nothing. The id's first 8 hex digits are the next batch number, the
-- rest the random %(id)s: ids sort by creation (the warehouse's slice index appends them
-- at its right edge) and their 8-digit prefixes are unique (migration 0006).
INSERT INTO ingestion_batches (
    id, tenant_id, company_id, tenant_database, mode, source_type, business_date,
    pipeline_stage, source_scope, delivery_key, status, details, is_current
)
VALUES (
    CAST(lpad(to_hex(nextval('ingestion_batch_number')), 8, '0')
         || substr(CAST(%(id)s AS text), 9) AS uuid),
    %(tenant_id)s, %(company_id)s, %(tenant_database)s, %(mode)s, %(source_type)s, NULL,
    %(pipeline_stage)s, %(source_scope)s, %(delivery_key)s, 'running', %(details)s, false
)
ON CONFLICT (tenant_id, source_scope) WHERE status = 'running' AND source_scope IS NOT NULL
DO NOTHING
RETURNING *

-- delivery_batch --
-- The batch this delivery already made for the scope, unless it failed: a duplicate
-- delivery continues it (running) or does no work (succeeded), never reloads. After a
-- failure the same delivery (a UI rerun of the flow run) starts a fresh batch.
SELECT *
FROM ingestion_batches
WHERE tenant_id = %(tenant_id)s AND source_scope = %(source_scope)s
  AND delivery_key = %(delivery_key)s AND status <> 'failed'
ORDER BY created_at DESC
LIMIT 1

-- running_holder --
SELECT *
FROM ingestion_batches
WHERE tenant_id = %(tenant_id)s AND source_scope = %(source_scope)s AND status = 'running'

-- acquire_lease --
-- Under READ COMMITTED a contender blocked on the row re-checks this WHERE against the
-- winner's committed version, so exactly one of them gets a row back.
UPDATE ingestion_batches
SET execution_lease_id = %(owner)s,
    execution_lease_expires_at = now() + make_interval(secs => %(ttl)s),
    updated_at = now()
WHERE id = %(batch_id)s
  AND status = 'running'
  AND (execution_lease_id IS NULL
       OR execution_lease_id = %(owner)s
       OR execution_lease_expires_at <= now())
RETURNING execution_lease_expires_at

-- lock_lease --
-- The lease as it stands, locked for the acquisition that follows in this transaction.
SELECT status, execution_lease_id, execution_lease_expires_at,
       ingestion_batch_abandoned(b, %(ttl)s) AS abandoned
FROM ingestion_batches AS b
WHERE id = %(batch_id)s
FOR UPDATE

-- end_claims_of_other_owners --
-- A step claim belongs to the lease it was made under (only the lease holder claims): once
-- the lease changes hands the old holder's claims end now, and the next claim of the step
-- counts the interrupted attempt.
UPDATE publication_outbox
SET claimed_until = now(), updated_at = now()
WHERE batch_id = %(batch_id)s AND status = 'claimed'
  AND claimed_by IS DISTINCT FROM %(owner)s AND claimed_until > now()

-- abandoned_uncommitted --
-- Running batches nobody executes whose slice was never recorded as committed: the drain
-- takes them over (committed ones it publishes through batches_with_open_steps).
SELECT id
FROM ingestion_batches AS b
WHERE status = 'running' AND source_scope IS NOT NULL
  AND COALESCE(details ->> 'warehouse_committed', details ->> 'redshift_committed')::boolean IS NOT TRUE
  AND ingestion_batch_abandoned(b, %(ttl)s)
ORDER BY updated_at, id
LIMIT %(limit)s

-- lease_state --
SELECT status, execution_lease_id, execution_lease_expires_at
FROM ingestion_batches
WHERE id = %(batch_id)s

-- renew_lease --
UPDATE ingestion_batches
SET execution_lease_expires_at = now() + make_interval(secs => %(ttl)s), updated_at = now()
WHERE id = %(batch_id)s AND status = 'running' AND execution_lease_id = %(owner)s
RETURNING execution_lease_expires_at

-- release_lease --
UPDATE ingestion_batches
SET execution_lease_id = NULL, execution_lease_expires_at = NULL, updated_at = now()
WHERE id = %(batch_id)s AND execution_lease_id = %(owner)s

-- withdraw --
-- A fresh batch whose delivery found its content loaded meanwhile, before any work: gone as
-- if never reserved. Only its lease holder, only while nothing is recorded on it.
DELETE FROM ingestion_batches
WHERE id = %(batch_id)s AND status = 'running' AND execution_lease_id = %(owner)s
  AND details->>'phase' = 'reserved'
RETURNING id

-- update_details --
UPDATE ingestion_batches
SET details = details || %(patch)s, updated_at = now()
WHERE id = %(batch_id)s AND status = 'running' AND execution_lease_id = %(owner)s
RETURNING *

-- mark_committed --
UPDATE ingestion_batches
SET details = (details - 'redshift_committed') || %(patch)s
              || jsonb_build_object('phase', 'committed', 'warehouse_committed', true),
    updated_at = now()
WHERE id = %(batch_id)s AND status = 'running' AND execution_lease_id = %(owner)s
RETURNING *

-- enqueue_publication --
INSERT INTO publication_outbox (batch_id, step, seq)
SELECT %(batch_id)s, step, seq
FROM unnest(%(steps)s::text[]) WITH ORDINALITY AS s (step, seq)
ON CONFLICT (batch_id, step) DO NOTHING

-- mark_failed --
-- owner NULL fences a batch nobody leased yet (enqueue_failed): IS NOT DISTINCT FROM.
UPDATE ingestion_batches
SET status = 'failed',
    details = details || jsonb_build_object(
        'failure', %(facts)s::jsonb
                   || jsonb_build_object('kind', %(kind)s::text, 'error', %(error)s::text,
                                         'at', to_char(now() AT TIME ZONE 'UTC',
                                                       'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'))),
    updated_at = now()
WHERE id = %(batch_id)s AND status = 'running'
  AND execution_lease_id IS NOT DISTINCT FROM %(owner)s
RETURNING *

-- mark_succeeded --
UPDATE ingestion_batches
SET status = 'succeeded',
    details = details || %(patch)s || jsonb_build_object('phase', 'published'),
    updated_at = now()
WHERE id = %(batch_id)s AND status = 'running' AND execution_lease_id = %(owner)s
  AND COALESCE(details ->> 'warehouse_committed', details ->> 'redshift_committed')::boolean IS TRUE
RETURNING *

-- lock_batch --
SELECT * FROM ingestion_batches WHERE id = %(batch_id)s FOR UPDATE

-- resume_publication --
UPDATE ingestion_batches
SET status = 'running', execution_lease_id = NULL, execution_lease_expires_at = NULL,
    details = %(details)s, updated_at = now()
WHERE id = %(batch_id)s
RETURNING *

-- get --
SELECT * FROM ingestion_batches WHERE id = %(batch_id)s

-- ids_with_prefix --
-- uuids compare bytewise, as their hex digits do: a prefix is the range low..high.
SELECT id
FROM ingestion_batches
WHERE id BETWEEN %(low)s AND %(high)s
ORDER BY id
LIMIT %(limit)s

-- list --
SELECT *
FROM ingestion_batches
WHERE (%(tenant_id)s::text IS NULL OR tenant_id = %(tenant_id)s::text)
  AND (%(source_scope)s::text IS NULL OR source_scope = %(source_scope)s::text)
  AND (%(status)s::text IS NULL OR status = %(status)s::text)
ORDER BY created_at DESC, id
LIMIT %(limit)s

-- cached_file --
SELECT source_key, etag, contract_version, dataset, output_uri, row_count, reject_count, details
FROM normalized_files
WHERE source_key = %(source_key)s AND etag = %(etag)s AND contract_version = %(contract_version)s

-- store_cached_file --
INSERT INTO normalized_files (source_key, etag, contract_version, dataset, output_uri, row_count,
                              reject_count, details, created_by_batch)
VALUES (%(source_key)s, %(etag)s, %(contract_version)s, %(dataset)s, %(output_uri)s,
        %(row_count)s, %(reject_count)s, %(details)s, %(batch_id)s)
ON CONFLICT (source_key, etag, contract_version) DO UPDATE
SET output_uri = EXCLUDED.output_uri, row_count = EXCLUDED.row_count,
    reject_count = EXCLUDED.reject_count, details = EXCLUDED.details,
    created_by_batch = EXCLUDED.created_by_batch, created_at = now()

-- forget_cached_file --
DELETE FROM normalized_files
WHERE source_key = %(source_key)s AND etag = %(etag)s AND contract_version = %(contract_version)s
