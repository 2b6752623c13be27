-- The ranks vote of `opdump ranks`: the ranks of one data-parallel dump
-- against each other, by fingerprint (the job must have run with
-- OPDUMP_SKETCH set, which writes fingerprints).
--
-- Every rank applies the same all-reduced gradients to the same
-- parameters, so a parameter and its gradient as the optimizer reads and
-- writes them, and a parameter as a forward reads it, hold the same bits on
-- every rank. A tensor is one key across ranks: (step, phase, op,
-- overload, name, role, arg, list_index, occurrence), the occurrence being
-- which call of that op on that tensor in the step it is (0: the first), so
-- that an extra call on one rank shifts seqs, not keys. Verdicts, per key
-- measured on at least two ranks:
--   agree       one fingerprint on every rank that measured it;
--   odd         a strict majority agrees: the other ranks are odd ones out;
--   split       optimizer tensor with no strict majority: the ranks differ
--               and none can be named;
--   not_judged  forward tensor with no strict majority (buffers such as
--               running statistics may differ per rank).
-- A key measured on one rank only is `one_rank`.
--
-- Results:
--   counts    verdict, tensors.
--   findings  one row per rank outside the majority of an `odd` tensor,
--             and per rank of a `split` one: kind, step, phase, op,
--             overload, name, role, arg, list_index (-1: none),
--             occurrence, rank, seq, module, fingerprint,
--             majority_fingerprint, majority_ranks (how many), ranks_measured,
--             reference_rank and reference_seq (the lowest rank of the
--             majority, of all ranks for `split`). First finding first (by
--             step, then the reference rank's call order, then within one
--             call inputs before outputs, by list index and argument name):
--             its rank is the odd rank out.
--   by_rank   rank, odd (tensors on which it left the majority),
--             first_step.

CREATE OR REPLACE TEMPORARY VIEW opdump_rank_tensors AS
SELECT
  rank, step, phase, op, overload, name, role, arg, list_index, seq, module, fingerprint,
  row_number() OVER (
    PARTITION BY rank, step, phase, op, overload, name, role, arg, list_index ORDER BY seq
  ) - 1 AS occurrence
FROM (
  SELECT rank, step, phase, op, overload, name, role, coalesce(arg, '') AS arg,
         coalesce(list_index, -1) AS list_index, seq, module, fingerprint
  FROM {dump}
  WHERE name IS NOT NULL AND role IN ('input', 'output')
    -- Gradients before the optimizer are each rank's own, not yet reduced.
    AND (phase = 'optimizer' OR (phase = 'forward' AND name NOT LIKE '%.grad'))
) named;

-- Per key and fingerprint: how many ranks hold it, the lowest of them, and
-- its place among the key's fingerprints (1: held by the most ranks).
CREATE OR REPLACE TEMPORARY VIEW opdump_rank_fingerprints AS
SELECT
  v.*,
  row_number() OVER (
    PARTITION BY step, phase, op, overload, name, role, arg, list_index, occurrence
    ORDER BY holders DESC, lowest_rank
  ) AS place,
  CAST(sum(holders) OVER (
    PARTITION BY step, phase, op, overload, name, role, arg, list_index, occurrence
  ) AS BIGINT) AS measured,
  count(*) OVER (
    PARTITION BY step, phase, op, overload, name, role, arg, list_index, occurrence
  ) AS distinct_fingerprints,
  min(lowest_rank) OVER (
    PARTITION BY step, phase, op, overload, name, role, arg, list_index, occurrence
  ) AS lowest_measured_rank
FROM (
  SELECT step, phase, op, overload, name, role, arg, list_index, occurrence, fingerprint,
         count(*) AS holders, min(rank) AS lowest_rank
  FROM opdump_rank_tensors
  WHERE fingerprint IS NOT NULL
  GROUP BY step, phase, op, overload, name, role, arg, list_index, occurrence, fingerprint
) v;

-- One row per key: its verdict, and the majority's fingerprint where one
-- rank holds it (`odd`).
CREATE OR REPLACE TEMPORARY VIEW opdump_rank_verdicts AS
SELECT
  step, phase, op, overload, name, role, arg, list_index, occurrence, measured,
  CASE
    WHEN measured < 2 THEN 'one_rank'
    WHEN distinct_fingerprints = 1 THEN 'agree'
    WHEN 2 * holders > measured THEN 'odd'
    WHEN phase = 'forward' THEN 'not_judged'
    ELSE 'split'
  END AS verdict,
  CASE WHEN 2 * holders > measured THEN fingerprint END AS majority_fingerprint,
  CASE WHEN 2 * holders > measured THEN holders ELSE 0 END AS majority_ranks,
  CASE WHEN 2 * holders > measured THEN lowest_rank ELSE lowest_measured_rank END AS reference_rank
FROM opdump_rank_fingerprints
WHERE place = 1;

CREATE OR REPLACE TEMPORARY VIEW opdump_rank_findings AS
SELECT
  v.verdict AS kind, t.step, t.phase, t.op, t.overload, t.name, t.role, t.arg, t.list_index,
  t.occurrence, t.rank, t.seq, t.module, t.fingerprint, v.majority_fingerprint,
  v.majority_ranks, v.measured AS ranks_measured, v.reference_rank, r.seq AS reference_seq
FROM opdump_rank_verdicts v
JOIN opdump_rank_tensors t
  ON t.step = v.step AND t.phase = v.phase AND t.op = v.op AND t.overload = v.overload
 AND t.name = v.name AND t.role = v.role AND t.arg = v.arg AND t.list_index = v.list_index
 AND t.occurrence = v.occurrence
JOIN opdump_rank_tensors r
  ON r.step = v.step AND r.phase = v.phase AND r.op = v.op AND r.overload = v.overload
 AND r.name = v.name AND r.role = v.role AND r.arg = v.arg AND r.list_index = v.list_index
 AND r.occurrence = v.occurrence AND r.rank = v.reference_rank
WHERE t.fingerprint IS NOT NULL
  AND (v.verdict = 'split' OR (v.verdict = 'odd' AND t.fingerprint <> v.majority_fingerprint));

-- result: counts
SELECT verdict, count(*) AS tensors
FROM opdump_rank_verdicts
GROUP BY verdict
ORDER BY verdict;

-- result: findings
SELECT *
FROM opdump_rank_findings
ORDER BY step, reference_seq, role, list_index, arg, rank;

-- result: by_rank
SELECT rank, count(*) AS odd, min(step) AS first_step
FROM opdump_rank_findings
WHERE kind = 'odd'
GROUP BY rank
ORDER BY rank;
