-- Where NaN or Inf first came from finite inputs, per rank: what
-- `opdump summary` reports as first_nan_from_finite and
-- first_nonfinite_from_finite.
--
-- A candidate of kind `nan_from_finite` is a call with NaN in an output
-- and no NaN in any input; of kind `nonfinite_from_finite`, a call with NaN
-- or Inf in an output and only finite inputs. The origin is the first
-- candidate by seq or, when calls below it are candidates too (a composite
-- op is entered before the kernel that did the damage), the deepest of
-- them: the first candidate of that thread, from the first one on, with no
-- candidate inside it.
--
-- A call's subtree is the calls of its thread that follow it (by seq) up to
-- the next call at its depth or above, so "the next candidate on the
-- thread is inside the call" is a range test on depth; no recursion, which
-- older Spark SQL versions lack. This assumes every call of the thread was
-- recorded (the default); with OPDUMP_INCLUDE/EXCLUDE or OPDUMP_MAX_DEPTH a
-- call left out may hide where a subtree ends.
--
-- Result origins: rank, kind, seq, step, phase, depth, op, overload,
-- module, parent_seq, thread. One row per rank and kind that has one.
--
-- include: _calls.sql

CREATE OR REPLACE TEMPORARY VIEW opdump_origin_candidates AS
SELECT
  kind, rank, pid, thread, seq, depth, step,
  lead(seq) OVER (PARTITION BY kind, rank, pid, thread ORDER BY seq) AS next_seq,
  lead(step) OVER (PARTITION BY kind, rank, pid, thread ORDER BY seq) AS next_step
FROM (
  SELECT 'nan_from_finite' AS kind, rank, pid, thread, seq, depth, step
  FROM opdump_calls WHERE nan_out = 1 AND nan_in = 0
  UNION ALL
  SELECT 'nonfinite_from_finite' AS kind, rank, pid, thread, seq, depth, step
  FROM opdump_calls WHERE (nan_out = 1 OR inf_out = 1) AND nonfinite_in = 0
) candidates;

-- Candidates with no candidate inside them: the next candidate of the
-- thread is absent, in another step (a call does not span steps), or comes
-- after a call at the candidate's depth or above.
CREATE OR REPLACE TEMPORARY VIEW opdump_origin_leaves AS
SELECT n.kind, n.rank, n.pid, n.thread, n.seq
FROM opdump_origin_candidates n
LEFT JOIN opdump_calls m
  ON m.rank = n.rank AND m.pid = n.pid AND m.thread = n.thread AND m.step = n.step
 AND m.seq > n.seq AND m.seq <= n.next_seq AND m.depth <= n.depth
GROUP BY n.kind, n.rank, n.pid, n.thread, n.seq, n.next_seq, n.next_step, n.step
HAVING n.next_seq IS NULL OR n.next_step <> n.step OR count(m.seq) > 0;

-- result: origins
SELECT
  c.rank, o.kind, c.seq, c.step, c.phase, c.depth, c.op, c.overload, c.module, c.parent_seq, c.thread
FROM (
  SELECT l.kind, l.rank, l.pid, min(l.seq) AS seq
  FROM opdump_origin_leaves l
  JOIN (
    SELECT kind, rank, pid, thread, seq,
           row_number() OVER (PARTITION BY kind, rank ORDER BY seq, pid) AS nth
    FROM opdump_origin_candidates
  ) f
    ON f.nth = 1 AND l.kind = f.kind AND l.rank = f.rank AND l.pid = f.pid AND l.thread = f.thread
   AND l.seq >= f.seq
  GROUP BY l.kind, l.rank, l.pid
) o
JOIN opdump_calls c ON c.rank = o.rank AND c.pid = o.pid AND c.seq = o.seq
ORDER BY c.rank, o.kind;
