-- What the landing-zone sweep asks the operational store. Sections are named `-- name --`;
-- the SweepRepository method of the same name runs it.

-- folder_batches --
-- One row per folder the sweep found ready: the scope's running batch (whatever its content:
-- an event-triggered import has no fingerprint until it has listed the folder), the scope's
-- newest succeeded batch (the one whose slice is current) and the newest batch that
-- discovered this very content (the same fingerprint, read with the same contract versions). One round trip for the whole sweep; the arrays are aligned.
WITH wanted AS (
    SELECT *
    FROM unnest(
        %(tenant_ids)s::text[],
        %(source_scopes)s::text[],
        %(fingerprints)s::text[],
        %(contract_versions)s::text[]
    ) AS w(tenant_id, source_scope, fingerprint, contract_versions)
)
SELECT
    w.tenant_id,
    w.source_scope,
    w.fingerprint,
    w.contract_versions,
    running.id AS running_id,
    running.delivery_key AS running_delivery_key,
    coalesce(running.abandoned, false) AS running_abandoned,
    latest.id AS latest_succeeded_id,
    latest.fingerprint AS latest_succeeded_fingerprint,
    latest.contract_versions AS latest_succeeded_contract_versions,
    same.id AS same_content_id,
    same.status AS same_content_status,
    same.failure_kind AS same_content_failure_kind
FROM wanted AS w
LEFT JOIN LATERAL (
    SELECT b.id, b.delivery_key, ingestion_batch_abandoned(b, %(lease_ttl)s) AS abandoned
    FROM ingestion_batches AS b
    WHERE b.tenant_id = w.tenant_id AND b.source_scope = w.source_scope
      AND b.status = 'running'
    LIMIT 1
) AS running ON true
LEFT JOIN LATERAL (
    SELECT
        b.id,
        b.details -> 'manifest' ->> 'fingerprint' AS fingerprint,
        b.details -> 'contract_versions' AS contract_versions
    FROM ingestion_batches AS b
    WHERE b.tenant_id = w.tenant_id AND b.source_scope = w.source_scope
      AND b.status = 'succeeded'
    ORDER BY b.created_at DESC
    LIMIT 1
) AS latest ON true
LEFT JOIN LATERAL (
    SELECT b.id, b.status, b.details -> 'failure' ->> 'kind' AS failure_kind
    FROM ingestion_batches AS b
    WHERE b.tenant_id = w.tenant_id AND b.source_scope = w.source_scope
      AND b.details -> 'manifest' ->> 'fingerprint' = w.fingerprint
      AND b.details -> 'contract_versions' = w.contract_versions::jsonb
      AND b.status IN ('running', 'succeeded', 'failed')
    ORDER BY b.created_at DESC
    LIMIT 1
) AS same ON true
