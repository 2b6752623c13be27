//! `opdump ranks` on synthetic data-parallel dumps: every rank runs the same
//! small training loop (a forward reading each layer's parameters and a
//! buffer, an optimizer `_foreach_add_` over parameters and gradients), with
//! fingerprints that agree across ranks except where a test plants a
//! difference.

use std::path::Path;

use crate::common::{path_str, run};
use opdump_format::Phase;
use opdump_testkit::ranks_job::{write_job, write_rank, Flip, Job};
use opdump_testkit::schema3::strip_to_schema_3;
use opdump_testkit::synth::{input, DumpWriter};
use serde_json::Value;

fn ranks_json(dir: &Path) -> (i32, Value, String) {
    let r = run(&["ranks", path_str(dir), "--json"]);
    assert!(!r.stderr.contains("panicked"), "{}", r.stderr);
    let v = serde_json::from_str(&r.stdout).unwrap_or_else(|e| {
        panic!(
            "bad JSON ({e}); exit {}; stderr {}; stdout {}",
            r.code, r.stderr, r.stdout
        )
    });
    (r.code, v, r.stderr)
}

fn tmp() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}

#[test]
fn ranks_that_agree_exit_0_and_buffers_are_not_judged() {
    let t = tmp();
    write_job(
        t.path(),
        &Job {
            ranks: 4,
            extra_calls: true,
            ..Job::default()
        },
    )
    .unwrap();
    let (code, j, err) = ranks_json(t.path());
    assert_eq!(code, 0, "{j:#}\n{err}");
    assert!(j["first"].is_null());
    assert_eq!(j["ranks"], serde_json::json!([0, 1, 2, 3]));
    let c = &j["tensors"];
    // Per step: 3 weights in forward, 9 tensors in the optimizer, 1 buffer.
    assert_eq!(c["compared"], 3 * 13, "{c}");
    assert_eq!(c["odd"], 0);
    assert_eq!(c["not_judged"], 3, "the buffer differs on every rank: {c}");
    assert_eq!(c["one_rank"], 1, "rank 3's extra read: {c}");
    let text = run(&["ranks", path_str(t.path())]);
    assert_eq!(text.code, 0);
    assert!(
        text.stdout.contains("Verdict: ranks agree"),
        "{}",
        text.stdout
    );
}

#[test]
fn a_flipped_gradient_names_its_rank_step_and_parameter() {
    let t = tmp();
    let flip = Flip {
        rank: 2,
        step: 1,
        layer: 1,
    };
    write_job(
        t.path(),
        &Job {
            ranks: 4,
            flip: Some(flip),
            extra_calls: true,
            ..Job::default()
        },
    )
    .unwrap();
    let (code, j, err) = ranks_json(t.path());
    assert_eq!(code, 1, "{j:#}\n{err}");
    let f = &j["first"];
    assert_eq!(f["kind"], "odd");
    assert_eq!(f["odd_ranks"], serde_json::json!([2]));
    assert_eq!(f["majority_ranks"], serde_json::json!([0, 1, 3]));
    assert_eq!(f["step"], 1);
    assert_eq!(f["phase"], "optimizer");
    assert_eq!(f["name"], "fc1.weight.grad");
    assert_eq!(f["op"], "aten::_foreach_add_");
    assert_eq!(f["arg"], "other");
    assert_eq!(f["list_index"], 1);
    assert_eq!(f["reference"]["rank"], 0);
    assert_ne!(f["others"][0]["fingerprint"], f["majority_fingerprint"]);
    // From there on rank 2's fc1.weight differs: the update at step 1, the
    // forward and both optimizer reads and the update at step 2.
    let by = j["by_rank"].as_array().unwrap();
    assert_eq!(by.len(), 1, "{by:?}");
    assert_eq!(by[0]["rank"], 2);
    assert_eq!(by[0]["first_step"], 1);
    assert_eq!(by[0]["odd"], 5);
    assert_eq!(j["tensors"]["odd"], 5);
    let text = run(&["ranks", path_str(t.path())]);
    assert_eq!(text.code, 1);
    assert!(
        text.stdout
            .contains("Odd rank out: rank 2, step 1, optimizer"),
        "{}",
        text.stdout
    );
    assert!(
        text.stdout.contains("Verdict: RANK 2 DIFFERS"),
        "{}",
        text.stdout
    );
    assert!(text.stdout.contains("fc1.weight.grad"), "{}", text.stdout);
}

#[test]
fn rank_0_can_be_the_odd_one() {
    let t = tmp();
    write_job(
        t.path(),
        &Job {
            ranks: 3,
            flip: Some(Flip {
                rank: 0,
                step: 0,
                layer: 2,
            }),
            ..Job::default()
        },
    )
    .unwrap();
    let (code, j, _) = ranks_json(t.path());
    assert_eq!(code, 1);
    assert_eq!(j["first"]["odd_ranks"], serde_json::json!([0]));
    assert_eq!(j["first"]["reference"]["rank"], 1);
    assert_eq!(j["first"]["name"], "fc2.weight.grad");
    assert_eq!(j["first"]["step"], 0);
}

#[test]
fn two_ranks_that_differ_are_named_together() {
    let t = tmp();
    write_job(
        t.path(),
        &Job {
            ranks: 2,
            ..Job::default()
        },
    )
    .unwrap();
    let (code, j, _) = ranks_json(t.path());
    assert_eq!(code, 0, "a buffer that differs is no finding: {j:#}");
    assert_eq!(j["tensors"]["not_judged"], 3);

    let t = tmp();
    write_job(
        t.path(),
        &Job {
            ranks: 2,
            flip: Some(Flip {
                rank: 1,
                step: 1,
                layer: 0,
            }),
            ..Job::default()
        },
    )
    .unwrap();
    let (code, j, _) = ranks_json(t.path());
    assert_eq!(code, 1);
    let f = &j["first"];
    assert_eq!(f["kind"], "split");
    assert_eq!(f["odd_ranks"], serde_json::json!([]));
    assert_eq!(f["name"], "fc0.weight.grad");
    assert_eq!(f["step"], 1);
    assert!(j["by_rank"].as_array().unwrap().is_empty());
    let text = run(&["ranks", path_str(t.path())]);
    assert_eq!(text.code, 1);
    assert!(text.stdout.contains("Ranks 0-1 differ"), "{}", text.stdout);
}

#[test]
fn missing_fingerprints_are_a_clear_error() {
    // Schema 4 with the column empty.
    let t = tmp();
    write_job(
        t.path(),
        &Job {
            ranks: 2,
            no_fingerprints: true,
            ..Job::default()
        },
    )
    .unwrap();
    let r = run(&["ranks", path_str(t.path())]);
    assert_eq!(r.code, 2, "{}", r.stdout);
    assert!(r.stdout.is_empty());
    assert_eq!(r.stderr.lines().count(), 1, "{}", r.stderr);
    assert!(
        r.stderr.starts_with("opdump: ") && r.stderr.contains("no fingerprints"),
        "{}",
        r.stderr
    );

    // A dump from before the column existed.
    let t = tmp();
    write_job(
        t.path(),
        &Job {
            ranks: 2,
            ..Job::default()
        },
    )
    .unwrap();
    strip_to_schema_3(t.path());
    let r = run(&["ranks", path_str(t.path())]);
    assert_eq!(r.code, 2);
    assert!(
        r.stderr.contains("no fingerprint column") && r.stderr.contains("schema 4"),
        "{}",
        r.stderr
    );
}

/// Ranks `0..ranks` with fingerprints, then `blind` more without.
fn write_job_with_blind_ranks(root: &Path, job: &Job, blind: u32) {
    write_job(root, job).unwrap();
    let without = Job {
        no_fingerprints: true,
        ..*job
    };
    for r in job.ranks..job.ranks + blind {
        write_rank(root, r, &without).unwrap();
    }
}

#[test]
fn a_rank_without_fingerprints_is_no_agreement() {
    // Two ranks, one without fingerprints: nothing was compared.
    let t = tmp();
    let one = Job {
        ranks: 1,
        ..Job::default()
    };
    write_job_with_blind_ranks(t.path(), &one, 1);
    let r = run(&["ranks", path_str(t.path())]);
    assert_eq!(r.code, 2, "{}", r.stdout);
    assert!(r.stdout.is_empty(), "{}", r.stdout);
    assert_eq!(r.stderr.lines().count(), 1, "{}", r.stderr);
    assert!(
        r.stderr.starts_with("opdump: ") && r.stderr.contains("rank 1 cannot be compared"),
        "{}",
        r.stderr
    );

    // Three ranks that agree and two without: still no verdict.
    let t = tmp();
    let three = Job {
        ranks: 3,
        ..Job::default()
    };
    write_job_with_blind_ranks(t.path(), &three, 2);
    let r = run(&["ranks", path_str(t.path())]);
    assert_eq!(r.code, 2, "{}", r.stdout);
    assert!(
        r.stderr.contains("ranks 3-4 cannot be compared"),
        "{}",
        r.stderr
    );

    // A finding among the others stands; the blind rank is a note.
    let t = tmp();
    let flipped = Job {
        ranks: 3,
        flip: Some(Flip {
            rank: 2,
            step: 1,
            layer: 0,
        }),
        ..Job::default()
    };
    write_job_with_blind_ranks(t.path(), &flipped, 1);
    let (code, v, _) = ranks_json(t.path());
    assert_eq!(code, 1);
    assert_eq!(v["first"]["odd_ranks"], serde_json::json!([2]));
    let notes = v["notes"].to_string();
    assert!(notes.contains("rank 3 not compared"), "{notes}");
}

#[test]
fn one_rank_or_no_dump_is_a_usage_error() {
    let t = tmp();
    write_job(
        t.path(),
        &Job {
            ranks: 1,
            ..Job::default()
        },
    )
    .unwrap();
    let r = run(&["ranks", path_str(t.path())]);
    assert_eq!(r.code, 2);
    assert!(r.stderr.contains("only rank 0"), "{}", r.stderr);
    let empty = tmp();
    let r = run(&["ranks", path_str(empty.path())]);
    assert_eq!(r.code, 2);
    assert_eq!(r.stderr.lines().count(), 1, "{}", r.stderr);
    let r = run(&["ranks"]);
    assert_eq!(r.code, 2);
}

#[test]
fn names_from_the_dump_are_escaped() {
    let t = tmp();
    for rank in 0..3u32 {
        let mut w = DumpWriter::new(t.path(), rank, "cpu");
        w.phase = Phase::Optimizer;
        let fp = if rank == 1 { 5 } else { 6 };
        let mut p = input("self", "float32", &[2], 1.0);
        p.name = Some("evil\x1b[2J.grad".into());
        p.fingerprint = Some(fp);
        w.leaf("aten::add_\x1b]0;", "Tensor", "", vec![p], vec![])
            .unwrap();
        w.close().unwrap();
    }
    let r = run(&["ranks", path_str(t.path())]);
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert!(!r.stdout.contains('\x1b'), "{}", r.stdout);
    assert!(r.stdout.contains("evil\\x1b[2J.grad"), "{}", r.stdout);
    let (_, j, _) = ranks_json(t.path());
    assert_eq!(j["first"]["name"], "evil\x1b[2J.grad");
    assert_eq!(j["first"]["odd_ranks"], serde_json::json!([1]));
}
