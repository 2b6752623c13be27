-- One row per op call of a dump: the op-level columns, and what its
-- measured tensors hold. A tensor counts only where its statistics were
-- measured (computed, reused from an earlier measurement, or a view's):
-- the counts of other rows are null. Shared by summary.sql and
-- nonfinite_origins.sql.
CREATE OR REPLACE TEMPORARY VIEW opdump_calls AS
SELECT
  rank,
  pid,
  thread,
  seq,
  min(parent_seq) AS parent_seq,
  min(depth) AS depth,
  min(step) AS step,
  min(phase) AS phase,
  min(op) AS op,
  min(overload) AS overload,
  min(module) AS module,
  max(CASE WHEN error IS NOT NULL THEN 1 ELSE 0 END) AS raised,
  max(CASE WHEN role = 'input' AND measured AND nan_count > 0 THEN 1 ELSE 0 END) AS nan_in,
  max(CASE WHEN role = 'input' AND measured
           AND (nan_count > 0 OR posinf_count > 0 OR neginf_count > 0) THEN 1 ELSE 0 END) AS nonfinite_in,
  max(CASE WHEN role = 'output' AND measured AND nan_count > 0 THEN 1 ELSE 0 END) AS nan_out,
  max(CASE WHEN role = 'output' AND measured
           AND (posinf_count > 0 OR neginf_count > 0) THEN 1 ELSE 0 END) AS inf_out
FROM (
  SELECT t.*, stats_status IN ('computed', 'reused', 'view') AS measured
  FROM {dump} t
) tensors
GROUP BY rank, pid, thread, seq;
