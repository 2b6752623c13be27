//! A dump built in memory from records (`Dump::from_records`) is the dump
//! the loader reads from those records written to Parquet: every column,
//! read through the dump's accessors (ids of interned strings differ with
//! the order they were met in, so strings are compared, not ids).

use std::path::Path;
use std::time::Duration;

use opdump_format::schema::meta;
use opdump_format::{OpRecord, Phase, Role, RotateOptions, RotatingWriter, StatsStatus};
use opdump_judge::{Dump, Silent};
use opdump_load::read::{load, scan};
use opdump_testkit::records::read_records;
use opdump_testkit::synth::{input, output, with_nan, write_model, Model, Variant};

/// Writes `recs` as process 7's records of rank 0 on `device`.
fn write(root: &Path, device: &str, recs: &[OpRecord], max_rows: u64) {
    let dir = root.join("rank=0").join(format!("device={device}"));
    let opts = RotateOptions {
        max_rows,
        max_age: Duration::from_secs(3600),
        ..Default::default()
    };
    let md = vec![(meta::PID.to_string(), "7".to_string())];
    let mut w = RotatingWriter::new(dir, "part-7", opts, md);
    for r in recs {
        w.append(r).expect("append");
    }
    w.close_file().expect("close");
}

fn call(seq: i64, parent_seq: Option<i64>, op: &str) -> OpRecord {
    OpRecord {
        seq,
        parent_seq,
        depth: i32::from(parent_seq.is_some()),
        pid: 7,
        thread: 1,
        step: seq / 10,
        phase: Phase::Forward,
        op: op.to_string().into(),
        overload: "default".into(),
        args: format!("alpha={seq}"),
        start_ns: 0,
        duration_ns: 1,
        error: None,
        module: None,
        fwd_seq: None,
        source: None,
        tensors: Vec::new(),
        capture: None,
    }
}

/// Records that use every column the loader reads: errors, modules, source
/// lines, backward calls, parameter names, list indices, every status
/// (measured or not), NaN and Inf counts, fingerprints, sketches, calls
/// without tensors and a parent missing from the dump.
fn varied() -> Vec<OpRecord> {
    let mut recs = Vec::new();
    for s in 0..24i64 {
        let parent = match s % 6 {
            0 => None,
            5 => Some(1000), // not in the dump: the call is a root
            _ => Some(s - s % 6),
        };
        let mut r = call(
            s,
            parent,
            ["aten::linear", "aten::add", "aten::mm"][s as usize % 3],
        );
        r.overload = if s % 4 == 1 {
            "Tensor".into()
        } else {
            "default".into()
        };
        r.phase = [Phase::Forward, Phase::Backward, Phase::Optimizer][(s / 8) as usize];
        r.error = (s == 7).then(|| "RuntimeError: boom".to_string());
        r.module = (s % 3 != 2).then(|| format!("layers.{}", s % 4).into());
        r.fwd_seq = (r.phase == Phase::Backward).then_some(s - 8);
        r.source = (s % 5 == 0).then(|| format!("train.py:{s}"));
        if s % 7 != 3 {
            let status = StatsStatus::ALL[s as usize % StatsStatus::ALL.len()];
            let mut a = with_nan(input("self", "float32", &[2, s + 1], 0.5 + s as f64), s % 2);
            a.status = status;
            a.stats.posinf_count = s % 3;
            a.fingerprint = Some(0xfeed + s as u64);
            a.sketch = (s % 2 == 0).then(|| vec![s as f64, -1.5, f64::NAN]);
            a.name = (s % 4 == 0).then(|| format!("fc{s}.weight"));
            let mut b = input("tensors", ["bfloat16", "int64"][s as usize % 2], &[3], 1.0);
            b.list_index = Some(s as i32 % 3);
            b.stats.zero_count = s;
            let mut o = output(0, "float32", &[2, s + 1], 2.0 * s as f64);
            o.stats.neginf_count = s % 4;
            r.tensors = vec![a, b, o];
            if s == 11 {
                // A row of role none among tensors is no tensor.
                let mut none = input("none", "float32", &[1], 1.0);
                none.role = Role::None;
                r.tensors.insert(1, none);
            }
        }
        recs.push(r);
    }
    recs
}

fn loaded(dir: &Path) -> Dump {
    let index = scan(dir).expect("scan");
    load(&index, 0, &Silent, "test").expect("load")
}

fn same_f64(a: f64, b: f64) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

/// Every call of both dumps, column by column.
fn assert_same_calls(a: &Dump, b: &Dump) {
    assert_eq!(a.len(), b.len(), "op calls");
    assert_eq!(a.parent.to_vec(), b.parent.to_vec());
    for i in 0..a.len() as u32 {
        assert_eq!(a.tensors_of(i), b.tensors_of(i), "tensors of call {i}");
    }
    assert_eq!(a.child_start.to_vec(), b.child_start.to_vec());
    assert_eq!(a.children.to_vec(), b.children.to_vec());
    assert_eq!(a.roots, b.roots);
    assert_eq!(a.has_modules, b.has_modules);
    assert_eq!(a.steps(), b.steps());
    for i in 0..a.len() as u32 {
        let (ra, rb) = (a.op_row(i), b.op_row(i));
        let at = format!("call {i} (seq {})", ra.seq);
        assert_eq!(
            (ra.seq, ra.step, ra.fwd_seq, ra.depth, ra.phase),
            (rb.seq, rb.step, rb.fwd_seq, rb.depth, rb.phase),
            "{at}"
        );
        assert_eq!(a.full_name(i), b.full_name(i), "{at}");
        assert_eq!(a.args_text(i), b.args_text(i), "{at}");
        assert_eq!(a.error_text(i), b.error_text(i), "{at}");
        assert_eq!(a.module_of(i), b.module_of(i), "{at}");
        assert_eq!(a.source_of(i), b.source_of(i), "{at}");
        assert_eq!(a.fwd_of(i), b.fwd_of(i), "{at}");
        assert_eq!(a.signature(i), b.signature(i), "{at}");
        // Both builders fold the signature as the rows pass; folded again
        // from the tensors it is the same.
        for d in [a, b] {
            assert_eq!(
                d.signature(i),
                d.signature_of_rows(i, &mut Vec::new()),
                "{at}"
            );
        }
        assert_eq!(a.name_signature(i), b.name_signature(i), "{at}");
    }
}

/// Every tensor of both dumps, column by column.
fn assert_same_tensors(a: &Dump, b: &Dump) {
    let (ta, tb) = (&a.tensors, &b.tensors);
    assert_eq!(ta.len(), tb.len(), "tensors");
    assert_eq!(ta.nf_index, tb.nf_index);
    assert_eq!(ta.nf_counts, tb.nf_counts);
    assert_eq!(ta.has_fingerprints, tb.has_fingerprints);
    assert_eq!(ta.sketch_start, tb.sketch_start);
    assert_eq!(ta.sketch_values.len(), tb.sketch_values.len());
    assert!(ta
        .sketch_values
        .iter()
        .zip(&tb.sketch_values)
        .all(|(x, y)| same_f64(*x, *y)));
    assert_eq!(a.has_captures(), b.has_captures());
    for t in 0..ta.len() as u32 {
        let (ra, rb) = (ta.row(t), tb.row(t));
        let at = format!("tensor {t}");
        assert_eq!(
            (ra.role, ra.status, ra.list_index, ra.zero, ra.fingerprint),
            (rb.role, rb.status, rb.list_index, rb.zero, rb.fingerprint),
            "{at}"
        );
        assert!(
            ra.stats()
                .iter()
                .zip(rb.stats())
                .all(|(x, y)| same_f64(*x, y)),
            "{at}: {:?} vs {:?}",
            ra.stats(),
            rb.stats()
        );
        assert_eq!(a.dtype(t), b.dtype(t), "{at}");
        assert_eq!(a.shape(t), b.shape(t), "{at}");
        assert_eq!(ta.numel(t), tb.numel(t), "{at}");
        assert_eq!(a.arg_name(t), b.arg_name(t), "{at}");
        assert_eq!(a.list_index(t), b.list_index(t), "{at}");
        assert_eq!(a.tensor_name(t), b.tensor_name(t), "{at}");
        assert_eq!(ta.nonfinite_counts(t), tb.nonfinite_counts(t), "{at}");
        assert_eq!(ta.finite_count(t), tb.finite_count(t), "{at}");
        assert_eq!(ta.fingerprint(t), tb.fingerprint(t), "{at}");
        assert_eq!(ta.has_values(t), tb.has_values(t), "{at}");
        assert_eq!(
            ta.sketch(t).map(<[f64]>::len),
            tb.sketch(t).map(<[f64]>::len)
        );
        assert_eq!(a.capture_of(t), b.capture_of(t), "{at}");
    }
}

fn assert_same(a: &Dump, b: &Dump) {
    assert_eq!(a.rank, b.rank);
    assert_eq!(a.pid, b.pid);
    assert_eq!(a.stats_accumulate, b.stats_accumulate);
    assert_eq!(a.schema_note(), b.schema_note());
    assert_same_calls(a, b);
    assert_same_tensors(a, b);
}

#[test]
fn varied_records_make_the_dump_the_loader_reads() {
    let dir = tempfile::tempdir().unwrap();
    let recs = varied();
    // Two devices whose seqs interleave, in files of a few calls.
    let (even, odd): (Vec<_>, Vec<_>) = recs.iter().cloned().partition(|r| r.seq % 2 == 0);
    write(dir.path(), "cpu", &even, 7);
    write(dir.path(), "meta", &odd, 10);
    let from_files = loaded(dir.path());
    // In the order the loader reads the files (device=cpu first): tensors
    // stay in that order, calls are sorted by seq.
    let mut file_order = even;
    file_order.extend(odd);
    let in_memory = Dump::from_records(dir.path(), 0, &file_order).unwrap();
    assert!(
        in_memory.tensors.nf_index.len() > 3,
        "the records have NaN and Inf"
    );
    assert!(in_memory.tensors.sketch_values.len() > 3, "and sketches");
    assert_same(&from_files, &in_memory);
}

#[test]
fn a_synthetic_run_makes_the_dump_the_loader_reads() {
    let dir = tempfile::tempdir().unwrap();
    let m = Model {
        steps: 2,
        layers: 3,
        tokens: 4,
        hidden: 8,
    };
    let v = Variant {
        noise: 1e-6,
        nan: Some((1, 2, 3)),
        ..Default::default()
    };
    write_model(dir.path(), &m, &v, true, 100).unwrap();
    let from_files = loaded(dir.path());
    let mut recs = Vec::new();
    for f in opdump_format::reader::list_files(dir.path()).unwrap() {
        recs.extend(read_records(&f.path).unwrap());
    }
    let in_memory = Dump::from_records(dir.path(), 0, &recs).unwrap();
    assert_eq!(in_memory.len() as u64, m.calls_per_step() * 2);
    // The files have a sketch column, null in every row: read as none, it
    // costs no index per tensor.
    assert!(from_files.tensors.sketch_start.is_empty());
    assert_same(&from_files, &in_memory);
}

#[test]
fn records_that_cannot_make_a_dump_are_refused() {
    use opdump_judge::RecordsError;
    let twice = [call(3, None, "aten::add"), call(3, None, "aten::mul")];
    assert_eq!(
        Dump::from_records("d", 0, &twice).err(),
        Some(RecordsError::DuplicateSeq(3))
    );
    let looped = [call(1, Some(2), "aten::add"), call(2, Some(1), "aten::mul")];
    assert!(matches!(
        Dump::from_records("d", 0, &looped).err(),
        Some(RecordsError::AncestorLoop(1 | 2))
    ));
    // The loader refuses the same loop, with the same seq.
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "cpu", &looped, 100);
    let err = load(&scan(dir.path()).unwrap(), 0, &Silent, "t")
        .err()
        .unwrap();
    assert!(err.to_string().contains("is its own ancestor"), "{err}");
    assert!(Dump::from_records("d", 0, &[]).unwrap().is_empty());
}

#[test]
fn one_step_read_alone_is_that_step_of_the_whole_dump() {
    let dir = tempfile::tempdir().unwrap();
    let recs = varied();
    write(dir.path(), "cpu", &recs, 7);
    let index = scan(dir.path()).unwrap();
    let steps: std::collections::BTreeSet<i64> = recs.iter().map(|r| r.step).collect();
    assert!(steps.len() > 1, "the records span several steps");
    for step in steps {
        let alone = opdump_load::load_steps(&index, 0, step..=step, &Silent, "a").unwrap();
        let of_step: Vec<OpRecord> = recs.iter().filter(|r| r.step == step).cloned().collect();
        let expected = Dump::from_records(dir.path(), 0, &of_step).unwrap();
        assert!(!alone.is_empty());
        assert_same(&alone, &expected);
    }
    let none = opdump_load::load_steps(&index, 0, 1000..=1000, &Silent, "a").unwrap();
    assert!(none.is_empty());
}

/// The loader reads a file in batches of 65,536 rows; a call whose rows
/// start in one batch and end in the next still has one signature, folded
/// over all its tensors.
#[test]
fn a_call_across_two_batches_reads_as_one() {
    let dir = tempfile::tempdir().unwrap();
    let m = Model {
        steps: 2,
        layers: 1200,
        tokens: 4,
        hidden: 8,
    };
    write_model(dir.path(), &m, &Variant::default(), false, 1 << 30).unwrap();
    let files = opdump_format::reader::list_files(dir.path()).unwrap();
    assert_eq!(files.len(), 1, "one file, many batches");
    let recs = read_records(&files[0].path).unwrap();
    // The writer's rows: one per tensor, one for a call without any.
    let mut row = 0usize;
    let straddles = recs.iter().any(|r| {
        let n = r.tensors.len().max(1);
        let across = row < 65_536 && row + n > 65_536;
        row += n;
        across
    });
    assert!(straddles, "some call's rows cross the first batch's end");
    assert_same(
        &loaded(dir.path()),
        &Dump::from_records(dir.path(), 0, &recs).unwrap(),
    );
}

/// Calls `0..n`, one output each.
fn calls(n: i64) -> Vec<OpRecord> {
    (0..n)
        .map(|s| {
            let mut r = call(s, None, ["aten::add", "aten::mul"][s as usize % 2]);
            r.tensors = vec![output(0, "float32", &[s % 5 + 1], s as f64)];
            r
        })
        .collect()
}

/// The loader spills the calls in seq order as it reads them, through a
/// buffer of a hundred: calls a few places out of order (a call
/// written after the calls it made) are put in order there, and calls
/// further out of order (the first file read holding the later calls)
/// are sorted at the end. Either way the dump is the one of the records.
#[test]
fn calls_out_of_seq_order_read_as_the_records() {
    // Each run of 7 calls written backwards, over several buffers' worth.
    let dir = tempfile::tempdir().unwrap();
    let mut near: Vec<OpRecord> = Vec::new();
    for run in calls(20_000).chunks(7) {
        near.extend(run.iter().rev().cloned());
    }
    write(dir.path(), "cpu", &near, 3000);
    assert_same(
        &loaded(dir.path()),
        &Dump::from_records(dir.path(), 0, &near).unwrap(),
    );

    // Two partitions, the one read first holding the later half.
    let dir = tempfile::tempdir().unwrap();
    let (late, early): (Vec<_>, Vec<_>) = calls(20_000).into_iter().partition(|r| r.seq >= 10_000);
    write(dir.path(), "cpu", &late, 3000);
    write(dir.path(), "meta", &early, 3000);
    let mut file_order = late;
    file_order.extend(early);
    assert_same(
        &loaded(dir.path()),
        &Dump::from_records(dir.path(), 0, &file_order).unwrap(),
    );
}
