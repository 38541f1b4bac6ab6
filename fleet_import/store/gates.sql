-- The content gate's profiles and check results (issue 49). Sections are named
-- `-- name --`; the GateRepository method of the same name runs it.

-- record_gate --
-- Written before the slice commit; a slice load tried again writes its rows again.
INSERT INTO batch_gates (batch_id, dataset, baseline_batch_id, outcome, profile, results)
SELECT %(batch_id)s, dataset, %(baseline_batch_id)s, outcome, profile, results
FROM unnest(%(datasets)s::text[], %(outcomes)s::text[], %(profiles)s::jsonb[],
            %(results)s::jsonb[]) AS t (dataset, outcome, profile, results)
ON CONFLICT (batch_id, dataset) DO UPDATE
SET baseline_batch_id = EXCLUDED.baseline_batch_id,
    outcome = EXCLUDED.outcome,
    profile = EXCLUDED.profile,
    results = EXCLUDED.results,
    created_at = now()

-- gate_of --
SELECT dataset, baseline_batch_id, outcome, profile, results, created_at
FROM batch_gates
WHERE batch_id = %(batch_id)s
ORDER BY dataset

-- baseline_of --
-- The profiles of the slice a batch replaces: those of the newest other batch of its scope
-- that committed (the slice's owner: a scope's batches commit one at a time). None when
-- that batch kept none (`--no-gate`): an older profile is not the replaced slice's.
WITH owner AS (
    SELECT id
    FROM ingestion_batches
    WHERE tenant_id = %(tenant_id)s
      AND source_scope = %(source_scope)s
      AND id <> %(batch_id)s
      AND COALESCE(details ->> 'warehouse_committed', details ->> 'redshift_committed')::boolean IS TRUE
    ORDER BY created_at DESC, id DESC
    LIMIT 1
)
SELECT g.batch_id, g.dataset, g.baseline_batch_id, g.outcome, g.profile, g.results, g.created_at
FROM batch_gates g
JOIN owner ON g.batch_id = owner.id
ORDER BY g.dataset
