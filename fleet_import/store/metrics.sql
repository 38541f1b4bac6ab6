-- What the metrics collector (fleet_import.monitoring.collector) reads, all in one
-- transaction per scrape (with review.sql's held batches). Sections are named `-- name --`;
-- MetricsRepository runs them. Every query aggregates, except the failed publications, few
-- by nature, judged in Python by the one rule (store.models.resume_refusal).

-- batches_by_status_phase --
SELECT status, coalesce(details ->> 'phase', 'reserved') AS phase, count(*) AS batches
FROM ingestion_batches
GROUP BY 1, 2

-- failed_publications --
-- Committed, publication failed, and neither finished, superseded nor expired since.
SELECT *
FROM ingestion_batches
WHERE status = 'failed'
  AND details -> 'failure' ->> 'kind' = 'failed_publication'
  AND coalesce(details ->> 'phase', '') <> 'published'
  AND details ->> 'superseded_by' IS NULL
  AND coalesce((details ->> 'publication_expired')::boolean, false) = false

-- expired_leases --
-- Running batches whose lease ran out (database clock): their worker died or froze, and no
-- one has taken them over yet.
SELECT tenant_id, count(*) AS batches,
       max(extract(epoch FROM now() - execution_lease_expires_at))::float8 AS oldest_seconds
FROM ingestion_batches
WHERE status = 'running'
  AND execution_lease_expires_at IS NOT NULL
  AND execution_lease_expires_at < now()
GROUP BY tenant_id

-- publish_latencies --
-- Delivery (the newest file the batch listed, else the batch's start) to success, in
-- seconds: how many took at most each upper bound given (cumulative), the count and sum.
WITH latencies AS (
    SELECT extract(epoch FROM b.updated_at - coalesce(
               (SELECT max((o ->> 'last_modified')::timestamptz)
                FROM jsonb_array_elements(
                    CASE WHEN jsonb_typeof(b.details -> 'manifest' -> 'objects') = 'array'
                         THEN b.details -> 'manifest' -> 'objects' ELSE '[]'::jsonb END) o),
               b.created_at))::float8 AS seconds
    FROM ingestion_batches b
    WHERE b.status = 'succeeded' AND b.source_type = 'fleet_s3'
)
SELECT ARRAY(SELECT (SELECT count(*) FROM latencies WHERE seconds <= bound)
             FROM unnest(%(bounds)s::float8[]) WITH ORDINALITY AS u(bound, n)
             ORDER BY n) AS at_most,
       (SELECT count(*) FROM latencies) AS total,
       (SELECT coalesce(sum(seconds), 0) FROM latencies)::float8 AS total_seconds

-- rows_by_dataset --
-- Rows loaded and rejected by the batches whose slice committed, per dataset.
SELECT f ->> 'dataset' AS dataset,
       sum(coalesce((f ->> 'rows')::bigint, 0))::bigint AS loaded,
       sum(coalesce((f ->> 'rejects')::bigint, 0))::bigint AS rejected,
       sum(coalesce((f ->> 'bytes')::bigint, 0))::bigint AS staged_bytes
FROM ingestion_batches b,
     jsonb_array_elements(CASE WHEN jsonb_typeof(b.details -> 'summary' -> 'files') = 'array'
                               THEN b.details -> 'summary' -> 'files' ELSE '[]'::jsonb END) f
WHERE coalesce((b.details ->> 'warehouse_committed')::boolean,
               (b.details ->> 'redshift_committed')::boolean, false)
GROUP BY 1

-- warehouse_seconds --
-- Our own timings of the committed slices: COPY per dataset, and the COMMIT.
SELECT c.key AS dataset, 'copy' AS step, sum((c.value #>> '{}')::float8) AS seconds
FROM ingestion_batches b,
     jsonb_each(CASE WHEN jsonb_typeof(b.details -> 'summary' -> 'seconds' -> 'copy') = 'object'
                     THEN b.details -> 'summary' -> 'seconds' -> 'copy' ELSE '{}'::jsonb END) c
WHERE coalesce((b.details ->> 'warehouse_committed')::boolean,
               (b.details ->> 'redshift_committed')::boolean, false)
GROUP BY 1
UNION ALL
SELECT '', 'commit', coalesce(sum((b.details -> 'summary' -> 'seconds' ->> 'commit')::float8), 0)
FROM ingestion_batches b
WHERE coalesce((b.details ->> 'warehouse_committed')::boolean,
               (b.details ->> 'redshift_committed')::boolean, false)

-- gate_findings --
-- Errors: the breaches of held batches, by rule (its first word: `min_rows_ratio 0.5` and
-- `min_rows_ratio 0.8` are one series). Warnings: drift reported on a batch that went on.
-- And the content gate's own results (`batch_gates`) that warned or erred, by check (its
-- name before the column: `not_null(driver_id)` counts as `not_null`).
SELECT 'error' AS severity, split_part(br ->> 'rule', ' ', 1) AS rule, count(*) AS findings
FROM ingestion_batches b,
     jsonb_array_elements(
         CASE WHEN jsonb_typeof(b.details -> 'failure' -> 'held' -> 'breaches') = 'array'
              THEN b.details -> 'failure' -> 'held' -> 'breaches' ELSE '[]'::jsonb END) br
WHERE b.details -> 'failure' ->> 'kind' = 'held'
GROUP BY 1, 2
UNION ALL
SELECT 'warning', 'drift_' || coalesce(d.value ->> 'policy', 'unknown'), count(*)
FROM ingestion_batches b,
     jsonb_each(CASE WHEN jsonb_typeof(b.details -> 'drift') = 'object'
                     THEN b.details -> 'drift' ELSE '{}'::jsonb END) d
WHERE coalesce(b.details -> 'failure' ->> 'kind', '') <> 'held'
GROUP BY 1, 2
UNION ALL
SELECT CASE r ->> 'outcome' WHEN 'error' THEN 'error' ELSE 'warning' END,
       'gate_' || split_part(r ->> 'check', '(', 1), count(*)
FROM batch_gates g,
     jsonb_array_elements(CASE WHEN jsonb_typeof(g.results) = 'array'
                               THEN g.results ELSE '[]'::jsonb END) r
WHERE r ->> 'outcome' IN ('warn', 'error')
GROUP BY 1, 2

-- freshness --
-- The last verdict of each (tenant, dataset): how far past its due time a late one is.
SELECT tenant_id, dataset, late,
       CASE WHEN late AND expected_at IS NOT NULL
            THEN greatest(extract(epoch FROM now() - expected_at), 0)::float8
            ELSE 0 END AS lag_seconds
FROM freshness_states

-- tenant_costs --
-- Per tenant, the batches whose slice committed (created since `since`): rows loaded and
-- rejected, bytes of normalized Parquet staged, and our own timings of the load, its COPYs
-- and its COMMIT.
WITH committed AS (
    SELECT b.*
    FROM ingestion_batches b
    WHERE coalesce((b.details ->> 'warehouse_committed')::boolean,
                   (b.details ->> 'redshift_committed')::boolean, false)
      AND (%(tenant_id)s::text IS NULL OR b.tenant_id = %(tenant_id)s::text)
      AND (%(since)s::timestamptz IS NULL OR b.created_at >= %(since)s::timestamptz)
),
files AS (
    SELECT c.tenant_id,
           sum(coalesce((f ->> 'rows')::bigint, 0))::bigint AS rows,
           sum(coalesce((f ->> 'rejects')::bigint, 0))::bigint AS rejected,
           sum(coalesce((f ->> 'bytes')::bigint, 0))::bigint AS staged_bytes
    FROM committed c,
         jsonb_array_elements(CASE WHEN jsonb_typeof(c.details -> 'summary' -> 'files') = 'array'
                                   THEN c.details -> 'summary' -> 'files' ELSE '[]'::jsonb END) f
    GROUP BY 1
),
copies AS (
    SELECT c.tenant_id, sum((t.value #>> '{}')::float8) AS copy_seconds
    FROM committed c,
         jsonb_each(CASE WHEN jsonb_typeof(c.details -> 'summary' -> 'seconds' -> 'copy') = 'object'
                         THEN c.details -> 'summary' -> 'seconds' -> 'copy' ELSE '{}'::jsonb END) t
    GROUP BY 1
)
SELECT c.tenant_id,
       count(*)::int AS batches,
       array_agg(c.id::text ORDER BY c.id) AS batch_ids,
       coalesce(max(files.rows), 0)::bigint AS rows,
       coalesce(max(files.rejected), 0)::bigint AS rejected,
       coalesce(max(files.staged_bytes), 0)::bigint AS staged_bytes,
       coalesce(max(copies.copy_seconds), 0)::float8 AS copy_seconds,
       coalesce(sum((c.details -> 'summary' -> 'seconds' ->> 'commit')::float8), 0)::float8
           AS commit_seconds,
       coalesce(sum((c.details -> 'summary' -> 'seconds' ->> 'load')::float8), 0)::float8
           AS load_seconds
FROM committed c
LEFT JOIN files USING (tenant_id)
LEFT JOIN copies USING (tenant_id)
GROUP BY c.tenant_id
ORDER BY c.tenant_id
