-- What the freshness check asks and remembers. Sections are named `-- name --`; the
-- FreshnessRepository method of the same name runs them.

-- succeeded_batches --
-- The succeeded fleet batches of these tenants started from `since` to `until`, newest first,
-- with the datasets they loaded (the keys of their row counts). A batch started after
-- `until` (the moment judged) did not exist then. Served by ix (tenant_id, created_at).
SELECT
    b.tenant_id,
    b.source_scope,
    b.id AS batch_id,
    b.created_at AS started_at,
    ARRAY(
        SELECT jsonb_object_keys(coalesce(b.details -> 'row_counts', '{}'::jsonb))
    ) AS datasets
FROM ingestion_batches AS b
WHERE b.tenant_id = ANY(%(tenant_ids)s)
  AND b.created_at >= %(since)s
  AND b.created_at <= %(until)s
  AND b.status = 'succeeded'
  AND b.source_type = 'fleet_s3'
ORDER BY b.created_at DESC

-- last_succeeded --
-- Each tenant's newest succeeded fleet batch started by `until`, however old (what "last
-- loaded" shows at the moment judged).
SELECT t.tenant_id, last.id AS batch_id, last.created_at AS started_at
FROM unnest(%(tenant_ids)s::text[]) AS t(tenant_id)
JOIN LATERAL (
    SELECT b.id, b.created_at
    FROM ingestion_batches AS b
    WHERE b.tenant_id = t.tenant_id AND b.status = 'succeeded' AND b.source_type = 'fleet_s3'
      AND b.created_at <= %(until)s
    ORDER BY b.created_at DESC
    LIMIT 1
) AS last ON true

-- known_tenants --
-- Without a tenant registry: the tenants that ever imported a fleet folder.
SELECT DISTINCT tenant_id FROM ingestion_batches WHERE source_type = 'fleet_s3' ORDER BY 1

-- ensure_state --
INSERT INTO freshness_states (tenant_id, dataset) VALUES (%(tenant_id)s, %(dataset)s)
ON CONFLICT (tenant_id, dataset) DO NOTHING

-- lock_state --
SELECT state, late, expected_at, found, checked_at, changed_at
FROM freshness_states
WHERE tenant_id = %(tenant_id)s AND dataset = %(dataset)s
FOR UPDATE

-- write_state --
UPDATE freshness_states
SET state = %(state)s,
    late = %(late)s,
    expected_at = %(expected_at)s,
    found = %(found)s,
    checked_at = %(checked_at)s,
    changed_at = CASE WHEN %(changed)s THEN %(checked_at)s ELSE changed_at END
WHERE tenant_id = %(tenant_id)s AND dataset = %(dataset)s

-- states --
SELECT tenant_id, dataset, state, late, expected_at, found, checked_at, changed_at
FROM freshness_states
ORDER BY tenant_id, dataset
