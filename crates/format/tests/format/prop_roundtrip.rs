//! Property: any sequence of records written with the rotating writer reads
//! back equal with the reader, across batches and file rotations.
//!
//! "Equal" as the format defines it: a NaN statistic is null in the file and
//! reads back as NaN (any payload), and a tensor whose status has no values
//! reads back with `Stats::NONE` whatever it held. Everything else, `-0.0`,
//! infinities, unicode and empty strings, empty shapes and tensor lists,
//! extreme integers, comes back bit for bit.
//!
//! Records need distinct `seq`s (the reader joins consecutive rows of one
//! seq into one call) and tensors a role other than `none` (that role marks
//! the row of a call without tensors): both are the writer's contract.

use std::path::Path;
use std::time::Duration;

use opdump_format::reader::list_files;
use opdump_format::{
    OpRecord, Phase, Role, RotateOptions, RotatingWriter, Stats, StatsStatus, TensorRecord,
};
use opdump_testkit::records::read_records;
use proptest::prelude::*;

fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        ".{0,12}",
        "[a-z_:.]{1,24}",
        Just("\u{0}\u{7f}é水🦀\u{202e}".to_string()),
    ]
}

fn float() -> impl Strategy<Value = f64> {
    prop_oneof![
        4 => any::<f64>(),
        1 => Just(f64::NAN),
        1 => Just(-f64::NAN),
        1 => Just(f64::INFINITY),
        1 => Just(f64::NEG_INFINITY),
        1 => Just(-0.0),
        1 => Just(f64::MIN_POSITIVE / 4.0),
    ]
}

fn int() -> impl Strategy<Value = i64> {
    prop_oneof![
        any::<i64>(),
        Just(i64::MIN),
        Just(i64::MAX),
        Just(0),
        Just(-1)
    ]
}

fn stats() -> impl Strategy<Value = Stats> {
    (
        [float(), float(), float(), float(), float(), float()],
        [int(), int(), int(), int()],
    )
        .prop_map(|(f, c)| Stats {
            min: f[0],
            max: f[1],
            mean: f[2],
            std: f[3],
            l2: f[4],
            absmax: f[5],
            nan_count: c[0],
            posinf_count: c[1],
            neginf_count: c[2],
            zero_count: c[3],
        })
}

fn tensor() -> impl Strategy<Value = TensorRecord> {
    (
        prop_oneof![Just(Role::Input), Just(Role::Output)],
        text(),
        proptest::option::of(any::<i32>()),
        text(),
        prop::collection::vec(int(), 0..5),
        prop::collection::vec(int(), 0..5),
        text(),
        int(),
        prop::sample::select(StatsStatus::ALL.to_vec()),
        stats(),
    )
        .prop_map(
            |(role, arg, list_index, dtype, shape, stride, device, numel, status, stats)| {
                TensorRecord {
                    role,
                    arg: arg.into(),
                    list_index,
                    dtype: dtype.into(),
                    shape,
                    stride,
                    device: device.into(),
                    numel,
                    name: None,
                    capture_key: None,
                    status,
                    stats,
                    fingerprint: None,
                    sketch: None,
                }
            },
        )
}

/// A record with seq 0; `records` gives each its own.
fn record() -> impl Strategy<Value = OpRecord> {
    (
        (
            proptest::option::of(int()),
            any::<i32>(),
            any::<i32>(),
            int(),
            int(),
            prop_oneof![
                Just(Phase::Forward),
                Just(Phase::Backward),
                Just(Phase::Optimizer)
            ],
        ),
        (text(), text(), text(), int(), int()),
        proptest::option::of(text()),
        prop::collection::vec(tensor(), 0..4),
    )
        .prop_map(
            |(
                (parent_seq, depth, pid, thread, step, phase),
                (op, overload, args, start_ns, duration_ns),
                error,
                tensors,
            )| OpRecord {
                seq: 0,
                parent_seq,
                depth,
                pid,
                thread,
                step,
                phase,
                op: op.into(),
                overload: overload.into(),
                args,
                start_ns,
                duration_ns,
                error,
                module: None,
                fwd_seq: None,
                source: None,
                capture: None,
                tensors,
            },
        )
}

/// Records with distinct seqs in increasing order (any i64 range).
fn records() -> impl Strategy<Value = Vec<OpRecord>> {
    prop::collection::vec(record(), 0..24).prop_flat_map(|recs| {
        let n = recs.len();
        prop::collection::btree_set(any::<i64>(), n).prop_map(move |seqs| {
            let mut recs = recs.clone();
            for (r, s) in recs.iter_mut().zip(seqs) {
                r.seq = s;
            }
            recs
        })
    })
}

/// What the reader gives back for `r`: statistics of a status without
/// values are not written.
fn as_read(r: &OpRecord) -> OpRecord {
    let mut r = r.clone();
    for t in &mut r.tensors {
        if !t.status.has_values() {
            t.stats = Stats::NONE;
        }
    }
    r
}

/// Compares with every NaN equal to every other (Debug prints them all as
/// `NaN`) and `-0.0` apart from `0.0`.
fn same(a: &[OpRecord], b: &[OpRecord]) -> bool {
    format!("{a:?}") == format!("{b:?}")
}

fn read_all(dir: &Path) -> Vec<OpRecord> {
    let Ok(files) = list_files(dir) else {
        return Vec::new(); // nothing written: no file
    };
    let mut out: Vec<OpRecord> = files
        .iter()
        .flat_map(|f| read_records(&f.path).unwrap())
        .collect();
    out.sort_by_key(|r| r.seq);
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn written_records_read_back_equal(
        recs in records(),
        max_rows in 1u64..40,
        batch_rows in 1usize..16,
    ) {
        let tmp = tempfile::tempdir().unwrap();
        let opts = RotateOptions {
            max_rows,
            batch_rows,
            max_age: Duration::from_secs(3600),
            ..Default::default()
        };
        let mut w = RotatingWriter::new(tmp.path(), "part-1", opts, vec![]);
        for r in &recs {
            w.append(r).unwrap();
        }
        w.close_file().unwrap();
        prop_assert_eq!(w.ops_written(), recs.len() as u64);
        let back = read_all(tmp.path());
        let expected: Vec<OpRecord> = recs.iter().map(as_read).collect();
        prop_assert!(same(&expected, &back), "wrote {:?}\nread {:?}", expected, back);
    }
}
