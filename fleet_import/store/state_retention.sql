-- delete_finished_outbox --
-- Outbox steps of batches that succeeded before the cutoff: every step is done, and
-- nothing resumes a succeeded batch. A failed batch's steps stay: a resume needs them.
DELETE FROM publication_outbox
WHERE id IN (
    SELECT o.id
    FROM publication_outbox o
    JOIN ingestion_batches b ON b.id = o.batch_id
    WHERE b.status = 'succeeded'
      AND b.updated_at < now() - make_interval(secs => %(older_than_seconds)s)
    LIMIT %(limit)s
)

-- delete_delivered_lineage --
-- Lineage events delivered before the cutoff, of batches no import runs any more. Pending
-- ones stay, however old: the drain still owes them to the receiver.
DELETE FROM lineage_outbox
WHERE id IN (
    SELECT l.id
    FROM lineage_outbox l
    JOIN ingestion_batches b ON b.id = l.batch_id
    WHERE l.status = 'delivered'
      AND b.status <> 'running'
      AND l.delivered_at < now() - make_interval(secs => %(older_than_seconds)s)
    LIMIT %(limit)s
)

-- compact_succeeded_details --
-- A succeeded batch's per-file summary and rejects sample (what its run page showed) go;
-- its manifest, contract versions, row counts, rejects count and URI, review and rollback
-- facts stay: "already loaded", rollback, review, freshness and `batches show` read them.
-- Only details stored larger than the threshold: PostgreSQL compresses a row only past
-- about 2 kB, so compacting a tiny delivery's details would store them uncompressed, larger.
-- updated_at is left as it was: it says when the batch ended.
UPDATE ingestion_batches
SET details = (details - 'summary' #- '{rejects,sample}')
    || jsonb_build_object(
        'compacted',
        jsonb_build_object(
            'at', now(),
            'files', jsonb_array_length(coalesce(details -> 'summary' -> 'files', '[]'::jsonb))
        )
    )
WHERE id IN (
    SELECT id FROM ingestion_batches
    WHERE status = 'succeeded'
      AND updated_at < now() - make_interval(secs => %(older_than_seconds)s)
      AND NOT details ? 'compacted'
      AND pg_column_size(details) > %(compact_above_bytes)s
    ORDER BY updated_at
    LIMIT %(limit)s
)

-- table_bytes --
-- Each operational table's size on disk (heap, indexes, TOAST).
SELECT c.relname AS name, pg_total_relation_size(c.oid) AS bytes
FROM pg_class c
JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = current_schema()
  AND c.relname IN ('ingestion_batches', 'publication_outbox', 'lineage_outbox',
                    'normalized_files', 'freshness_states')
ORDER BY c.relname
