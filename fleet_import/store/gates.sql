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
