-- running_batches --
-- A tenant is purged only while none of its batches runs.
SELECT id FROM ingestion_batches
WHERE tenant_id = %(tenant_id)s AND status = 'running'
ORDER BY created_at, id

-- cached_files --
-- Normalized files the tenant's batches staged (the cache's creator is a batch of it).
SELECT n.source_key, n.etag, n.contract_version, n.dataset, n.output_uri, n.row_count,
       n.reject_count, n.details
FROM normalized_files n
JOIN ingestion_batches b ON b.id = n.created_by_batch
WHERE b.tenant_id = %(tenant_id)s
ORDER BY n.source_key, n.etag, n.contract_version

-- rejects_uris --
-- The rejects files the tenant's batches wrote (one per batch that had rejects).
SELECT DISTINCT details -> 'rejects' ->> 'uri' AS uri
FROM ingestion_batches
WHERE tenant_id = %(tenant_id)s AND details -> 'rejects' ->> 'uri' IS NOT NULL
ORDER BY 1

-- forget_cached_files --
DELETE FROM normalized_files n
USING ingestion_batches b
WHERE b.id = n.created_by_batch AND b.tenant_id = %(tenant_id)s

-- record_purge --
-- Numbered like every batch (migration 0006); never running, so nothing ever claims it.
INSERT INTO ingestion_batches (
    id, tenant_id, company_id, tenant_database, mode, source_type, business_date,
    pipeline_stage, source_scope, delivery_key, status, details, is_current
)
VALUES (
    CAST(lpad(to_hex(nextval('ingestion_batch_number')), 8, '0')
         || substr(CAST(%(id)s AS text), 9) AS uuid),
    %(tenant_id)s, %(company_id)s, %(tenant_database)s, 'file_upload', 'tenant_purge', NULL,
    'tenant_purge', %(source_scope)s, %(delivery_key)s, %(status)s, %(details)s, false
)
RETURNING id
