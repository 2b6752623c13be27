-- The per-op and per-module summary of a dump, per rank: what
-- `opdump summary` lists as per_op, nonfinite_ops, per_module, per_phase
-- and per_step.
--
-- Results:
--   per_op      rank, op, overload, calls, calls_nan_out, calls_inf_out,
--               calls_nonfinite_in, first_nonfinite_seq (the first call
--               with NaN or Inf in an input or an output; null if none).
--               Most calls first.
--   per_module  rank, module, calls, first_seq, calls_nan_out,
--               calls_inf_out, first_nonfinite_seq, first_nonfinite_op,
--               first_nonfinite_phase. A call counts for its innermost
--               module only; calls outside any module are the row whose
--               module is null. In the model's order (first call first).
--   per_step    rank, step, phase, calls, calls_raised.
--
-- include: _calls.sql

-- result: per_op
SELECT
  rank,
  op,
  overload,
  count(*) AS calls,
  count(CASE WHEN nan_out = 1 THEN 1 END) AS calls_nan_out,
  count(CASE WHEN inf_out = 1 THEN 1 END) AS calls_inf_out,
  count(CASE WHEN nonfinite_in = 1 THEN 1 END) AS calls_nonfinite_in,
  min(CASE WHEN nonfinite_in = 1 OR nan_out = 1 OR inf_out = 1 THEN seq END) AS first_nonfinite_seq
FROM opdump_calls
GROUP BY rank, op, overload
ORDER BY rank, calls DESC, op, overload;

-- result: per_module
SELECT
  m.rank,
  m.module,
  m.calls,
  m.first_seq,
  m.calls_nan_out,
  m.calls_inf_out,
  m.first_nonfinite_seq,
  -- concat() skips a null in DuckDB and is null in Spark: no call, no name.
  CASE WHEN c.op IS NULL THEN NULL
       WHEN c.overload = 'default' OR c.overload = '' THEN c.op
       ELSE concat(c.op, '.', c.overload) END AS first_nonfinite_op,
  c.phase AS first_nonfinite_phase
FROM (
  SELECT
    rank,
    module,
    count(*) AS calls,
    min(seq) AS first_seq,
    count(CASE WHEN nan_out = 1 THEN 1 END) AS calls_nan_out,
    count(CASE WHEN inf_out = 1 THEN 1 END) AS calls_inf_out,
    min(CASE WHEN nan_out = 1 OR inf_out = 1 THEN seq END) AS first_nonfinite_seq
  FROM opdump_calls
  GROUP BY rank, module
) m
LEFT JOIN opdump_calls c
  ON c.rank = m.rank AND c.seq = m.first_nonfinite_seq AND c.module = m.module
ORDER BY m.rank, m.first_seq;

-- result: per_step
SELECT rank, step, phase, count(*) AS calls, count(CASE WHEN raised = 1 THEN 1 END) AS calls_raised
FROM opdump_calls
GROUP BY rank, step, phase
ORDER BY rank, step, phase;
