-- A first cut of `opdump compare` for dumps too large for one machine: the
-- op calls of two dumps (A, the reference, and B) paired on a stable key,
-- every rank at once, and an error table per op.
--
-- The key of a call: (rank, step, phase, module, depth, op, overload,
-- occurrence), the occurrence being which call of that op at that depth in
-- that module it is, in the step and phase (0: the first), in seq order. A
-- tensor is the call's key and (role, arg, list_index). Calls whose key is
-- on one side only are counted, not aligned further (see docs/sql.md for
-- what this misses against compare's alignment).
--
-- `err` of a tensor pair is the largest of |A - B| / max(absmax A, absmax B)
-- over min, max, mean, std and absmax, and |l2 A - l2 B| / max(l2 A, l2 B):
-- the statistics' error relative to the tensor's magnitude. A pair is equal
-- when both fingerprints were written (OPDUMP_SKETCH) and are equal; it
-- differs when its NaN/Inf counts differ, or `err` exceeds the parameter
-- tol, or (tol = 0, the default: two runs on one device, which should
-- agree bit for bit) its fingerprints differ. Between devices, give a
-- tolerance (--param tol=1e-3): one number for every op and dtype, where
-- compare has a model per op class and dtype. A call pair differs when an
-- output pair does; it introduced the difference when it has inputs and
-- none of them differs, it inherited it otherwise.
--
-- Results:
--   per_op            op, overload, calls_a, calls_b, paired, only_a,
--                     only_b, differing, introduced, ranks_introduced,
--                     max_err_out (the largest output err of a pair),
--                     first_introduced_step. Ops with introduced calls
--                     first.
--   first_introduced  per rank, its first introduced call (by step, then
--                     A's seq): rank, step, phase, module, depth, op,
--                     overload, occurrence, seq_a, seq_b, err_out.
--
-- param: tol = 0

CREATE OR REPLACE TEMPORARY VIEW opdump_cmp_a AS
SELECT
  rank, seq, step, phase, coalesce(module, '') AS module, depth, op, overload,
  dense_rank() OVER (
    PARTITION BY rank, step, phase, coalesce(module, ''), depth, op, overload ORDER BY seq
  ) - 1 AS occurrence,
  role, coalesce(arg, '') AS arg, coalesce(list_index, -1) AS list_index,
  stats_status IN ('computed', 'reused', 'view') AS measured,
  fingerprint, min, max, mean, std, l2, absmax, nan_count, posinf_count, neginf_count
FROM {a};

CREATE OR REPLACE TEMPORARY VIEW opdump_cmp_b AS
SELECT
  rank, seq, step, phase, coalesce(module, '') AS module, depth, op, overload,
  dense_rank() OVER (
    PARTITION BY rank, step, phase, coalesce(module, ''), depth, op, overload ORDER BY seq
  ) - 1 AS occurrence,
  role, coalesce(arg, '') AS arg, coalesce(list_index, -1) AS list_index,
  stats_status IN ('computed', 'reused', 'view') AS measured,
  fingerprint, min, max, mean, std, l2, absmax, nan_count, posinf_count, neginf_count
FROM {b};

-- Measured tensors paired on the key, with whether they differ.
CREATE OR REPLACE TEMPORARY VIEW opdump_cmp_tensors AS
SELECT
  rank, step, phase, module, depth, op, overload, occurrence, role, seq_a, seq_b, err,
  CASE
    WHEN fp_a = fp_b THEN 0
    WHEN nonfinite_differs THEN 1
    -- With no tolerance, bits that differ are a difference.
    WHEN {tol} = 0 AND fp_a <> fp_b THEN 1
    WHEN coalesce(err, 0) > {tol} THEN 1
    ELSE 0
  END AS differs
FROM (
  SELECT
    a.rank, a.step, a.phase, a.module, a.depth, a.op, a.overload, a.occurrence, a.role,
    a.seq AS seq_a, b.seq AS seq_b, a.fingerprint AS fp_a, b.fingerprint AS fp_b,
    (a.nan_count <> b.nan_count OR a.posinf_count <> b.posinf_count
     OR a.neginf_count <> b.neginf_count) AS nonfinite_differs,
    greatest(
      abs(a.min - b.min) / nullif(greatest(a.absmax, b.absmax), 0),
      abs(a.max - b.max) / nullif(greatest(a.absmax, b.absmax), 0),
      abs(a.mean - b.mean) / nullif(greatest(a.absmax, b.absmax), 0),
      abs(a.std - b.std) / nullif(greatest(a.absmax, b.absmax), 0),
      abs(a.absmax - b.absmax) / nullif(greatest(a.absmax, b.absmax), 0),
      abs(a.l2 - b.l2) / nullif(greatest(a.l2, b.l2), 0)
    ) AS err
  FROM opdump_cmp_a a
  JOIN opdump_cmp_b b
    ON a.rank = b.rank AND a.step = b.step AND a.phase = b.phase AND a.module = b.module
   AND a.depth = b.depth AND a.op = b.op AND a.overload = b.overload
   AND a.occurrence = b.occurrence AND a.role = b.role AND a.arg = b.arg
   AND a.list_index = b.list_index
  WHERE a.measured AND b.measured
) pairs;

-- One row per paired call.
CREATE OR REPLACE TEMPORARY VIEW opdump_cmp_calls AS
SELECT
  rank, step, phase, module, depth, op, overload, occurrence, seq_a, seq_b,
  max(CASE WHEN role = 'output' THEN differs ELSE 0 END) AS out_differs,
  max(CASE WHEN role = 'input' THEN differs ELSE 0 END) AS in_differs,
  count(CASE WHEN role = 'input' THEN 1 END) AS inputs,
  max(CASE WHEN role = 'output' THEN err END) AS err_out
FROM opdump_cmp_tensors
GROUP BY rank, step, phase, module, depth, op, overload, occurrence, seq_a, seq_b;

CREATE OR REPLACE TEMPORARY VIEW opdump_cmp_introduced AS
SELECT * FROM opdump_cmp_calls
WHERE out_differs = 1 AND in_differs = 0 AND inputs > 0;

-- Every call of either side, and whether the other side has its key.
CREATE OR REPLACE TEMPORARY VIEW opdump_cmp_keys AS
SELECT
  coalesce(a.op, b.op) AS op, coalesce(a.overload, b.overload) AS overload,
  CASE WHEN a.seq IS NOT NULL THEN 1 ELSE 0 END AS in_a,
  CASE WHEN b.seq IS NOT NULL THEN 1 ELSE 0 END AS in_b
FROM (SELECT DISTINCT rank, step, phase, module, depth, op, overload, occurrence, seq FROM opdump_cmp_a) a
FULL OUTER JOIN
     (SELECT DISTINCT rank, step, phase, module, depth, op, overload, occurrence, seq FROM opdump_cmp_b) b
  ON a.rank = b.rank AND a.step = b.step AND a.phase = b.phase AND a.module = b.module
 AND a.depth = b.depth AND a.op = b.op AND a.overload = b.overload AND a.occurrence = b.occurrence;

-- result: per_op
SELECT
  k.op, k.overload, k.calls_a, k.calls_b, k.paired, k.only_a, k.only_b,
  coalesce(c.differing, 0) AS differing,
  coalesce(i.introduced, 0) AS introduced,
  coalesce(i.ranks_introduced, 0) AS ranks_introduced,
  c.max_err_out,
  i.first_introduced_step
FROM (
  SELECT op, overload, count(CASE WHEN in_a = 1 THEN 1 END) AS calls_a,
         count(CASE WHEN in_b = 1 THEN 1 END) AS calls_b,
         count(CASE WHEN in_a = 1 AND in_b = 1 THEN 1 END) AS paired,
         count(CASE WHEN in_b = 0 THEN 1 END) AS only_a,
         count(CASE WHEN in_a = 0 THEN 1 END) AS only_b
  FROM opdump_cmp_keys
  GROUP BY op, overload
) k
LEFT JOIN (
  SELECT op, overload, count(CASE WHEN out_differs = 1 THEN 1 END) AS differing,
         max(err_out) AS max_err_out
  FROM opdump_cmp_calls
  GROUP BY op, overload
) c ON c.op = k.op AND c.overload = k.overload
LEFT JOIN (
  SELECT op, overload, count(*) AS introduced, count(DISTINCT rank) AS ranks_introduced,
         min(step) AS first_introduced_step
  FROM opdump_cmp_introduced
  GROUP BY op, overload
) i ON i.op = k.op AND i.overload = k.overload
ORDER BY introduced DESC, differing DESC, k.op, k.overload;

-- result: first_introduced
SELECT rank, step, phase, module, depth, op, overload, occurrence, seq_a, seq_b, err_out
FROM (
  SELECT *, row_number() OVER (PARTITION BY rank ORDER BY step, seq_a) AS nth
  FROM opdump_cmp_introduced
) x
WHERE nth = 1
ORDER BY step, seq_a, rank;
