//! `opdump compare --rank all` (and `--rank SET`) end to end on synthetic
//! multi-rank runs: a planted fault on one rank or on every rank, the fleet
//! verdict that tells them apart, rank sets that differ between the dumps,
//! and the same report whatever `--jobs`. Each rank's row is checked
//! against a single-rank `compare --rank N` of the same pair.

use std::path::Path;
use std::time::Duration;

use crate::common::{compare_json, path_str, run, small_model};
use opdump_format::schema::meta;
use opdump_format::{RotateOptions, RotatingWriter};
use opdump_testkit::synth::{model_records, write_model_rank, Model, RankOf, Variant};
use serde_json::Value;

fn tmp() -> tempfile::TempDir {
    tempfile::tempdir().expect("tempdir")
}

/// Writes one rank of a synthetic run into `root/rank=<rank>/device=cpu`.
fn write_rank(root: &Path, rank: u32, m: &Model, v: &Variant, side_b: bool) {
    let dir = root.join(format!("rank={rank}")).join("device=cpu");
    let md = vec![
        (meta::PID.to_string(), (4000 + rank).to_string()),
        (meta::RANK.to_string(), rank.to_string()),
        (meta::DEVICE.to_string(), "cpu".to_string()),
        (meta::STATS_ACCUMULATE.to_string(), "float64".to_string()),
    ];
    let opts = RotateOptions {
        max_rows: 500_000,
        max_age: Duration::from_secs(3600),
        ..Default::default()
    };
    let mut w = RotatingWriter::new(dir, format!("part-{}", 4000 + rank), opts, md);
    for rec in model_records(m, v, side_b) {
        w.append(&rec).expect("append");
    }
    w.close_file().expect("close");
}

/// A planted fault in B's proj `addmm` of (step, layer).
fn fault(step: i64, layer: usize) -> Variant {
    Variant {
        fault: Some((step, layer, 0.5)),
        ..Default::default()
    }
}

/// Writes `a` with `ranks_a` ranks and `b` with `ranks_b`, B's rank `r`
/// differing from A's as `faults(r)` says.
fn fleet_pair(
    root: &Path,
    ranks_a: u32,
    ranks_b: u32,
    faults: impl Fn(u32) -> Variant,
) -> (std::path::PathBuf, std::path::PathBuf) {
    let (a, b) = (root.join("a"), root.join("b"));
    let m = small_model();
    for r in 0..ranks_a {
        write_rank(&a, r, &m, &Variant::default(), false);
    }
    for r in 0..ranks_b {
        write_rank(&b, r, &m, &faults(r), true);
    }
    (a, b)
}

fn verdicts(j: &Value) -> Vec<(u64, String)> {
    j["ranks"]
        .as_array()
        .expect("ranks")
        .iter()
        .map(|r| {
            (
                r["rank"].as_u64().expect("rank"),
                r["verdict"].as_str().expect("verdict").to_string(),
            )
        })
        .collect()
}

fn ranks_of(v: &Value) -> Vec<u64> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|x| x.as_u64().expect("rank"))
        .collect()
}

/// The row of `rank` names the op a single-rank compare names first.
fn check_row_against_single(a: &Path, b: &Path, j: &Value, rank: u64) {
    let row = j["ranks"]
        .as_array()
        .expect("ranks")
        .iter()
        .find(|r| r["rank"] == rank)
        .expect("row");
    let (_, single, _) = compare_json(a, b, &["--rank", &rank.to_string()]);
    let fi = &single["first_introduced"];
    let site = &row["first_introduced"];
    assert_eq!(site["op"], fi["op"], "{row}");
    assert_eq!(site["module"], fi["module"], "{row}");
    assert_eq!(site["step"], fi["step_a"], "{row}");
    assert_eq!(site["seq_a"], fi["seq_a"], "{row}");
    assert_eq!(site["rel_err"], fi["rel_err"], "{row}");
    assert_eq!(row["headline"]["op"], single["headline"]["op"], "{row}");
}

#[test]
fn a_fault_on_one_rank_is_named_and_the_others_agree() {
    let t = tmp();
    let (a, b) = fleet_pair(t.path(), 4, 4, |r| {
        if r == 2 {
            fault(1, 3)
        } else {
            Variant::default()
        }
    });
    let (code, j, err) = compare_json(&a, &b, &["--rank", "all"]);
    assert_eq!(code, 1, "{err}");
    assert_eq!(j["format"], "opdump-compare-fleet");
    assert_eq!(j["exit_status"], 1);
    assert_eq!(
        verdicts(&j),
        vec![
            (0, "agree".into()),
            (1, "agree".into()),
            (2, "introduced".into()),
            (3, "agree".into())
        ]
    );
    check_row_against_single(&a, &b, &j, 2);
    let f = &j["fleet"];
    assert_eq!(f["verdict"], "introduced");
    assert_eq!(f["first_introduced"]["rank"], 2);
    assert_eq!(ranks_of(&f["first_introduced"]["ranks"]), vec![2]);
    assert_eq!(f["first_introduced"]["on_every_rank"], false);
    assert_eq!(f["first_introduced"]["site"]["op"], "aten::addmm");
    assert_eq!(f["first_introduced"]["site"]["module"], "layers.3");
    assert_eq!(f["first_introduced"]["site"]["step"], 1);
    assert_eq!(ranks_of(&f["agree"]), vec![0, 1, 3]);

    let r = run(&["compare", path_str(&a), path_str(&b), "--rank", "all"]);
    assert_eq!(r.code, 1, "{}", r.stderr);
    let lines: Vec<&str> = r.stdout.lines().collect();
    assert!(lines[0].contains("4 rank pairs"), "{}", r.stdout);
    assert!(
        lines[3].starts_with("rank 2  introduced  aten::addmm in layers.3 at step 1"),
        "{}",
        r.stdout
    );
    assert!(
        lines[3].contains("error 5.000e-1 vs tolerance"),
        "{}",
        r.stdout
    );
    for i in [1, 2, 4] {
        assert!(lines[i].ends_with("agree"), "{}", r.stdout);
    }
    assert!(r.stdout.contains("; on rank 2 only\n"), "{}", r.stdout);
}

#[test]
fn a_fault_on_every_rank_reads_as_such() {
    let t = tmp();
    let (a, b) = fleet_pair(t.path(), 4, 4, |_| fault(1, 3));
    let (code, j, err) = compare_json(&a, &b, &["--rank", "all"]);
    assert_eq!(code, 1, "{err}");
    let first = &j["fleet"]["first_introduced"];
    assert_eq!(first["rank"], 0);
    assert_eq!(ranks_of(&first["ranks"]), vec![0, 1, 2, 3]);
    assert_eq!(first["on_every_rank"], true);
    check_row_against_single(&a, &b, &j, 3);
    let r = run(&["compare", path_str(&a), path_str(&b), "--rank", "all"]);
    assert!(r.stdout.contains("; on all 4 ranks\n"), "{}", r.stdout);
}

#[test]
fn the_earliest_fault_over_ranks_comes_first() {
    let t = tmp();
    // Rank 1 goes wrong at step 2, rank 3 at step 1 and rank 0 at step 1
    // in a later layer: rank 3 comes first, alone at its op.
    let (a, b) = fleet_pair(t.path(), 4, 4, |r| match r {
        0 => fault(1, 4),
        1 => fault(2, 0),
        3 => fault(1, 2),
        _ => Variant::default(),
    });
    let (code, j, err) = compare_json(&a, &b, &["--rank", "all", "--jobs", "3"]);
    assert_eq!(code, 1, "{err}");
    let first = &j["fleet"]["first_introduced"];
    assert_eq!(first["rank"], 3);
    assert_eq!(first["site"]["module"], "layers.2");
    assert_eq!(ranks_of(&first["ranks"]), vec![3]);
    assert_eq!(ranks_of(&j["fleet"]["introduced"]), vec![0, 1, 3]);
    let r = run(&["compare", path_str(&a), path_str(&b), "--rank", "all"]);
    assert!(
        r.stdout
            .contains("on rank 3 only\n  introduced: ranks 0-1, 3\n  agree: rank 2\n"),
        "{}",
        r.stdout
    );
}

#[test]
fn ranks_that_agree_exit_0() {
    let t = tmp();
    let (a, b) = fleet_pair(t.path(), 3, 3, |_| Variant::default());
    let r = run(&["compare", path_str(&a), path_str(&b), "--rank", "all"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(
        r.stdout.ends_with("fleet: all 3 rank pairs agree\n"),
        "{}",
        r.stdout
    );
    let (code, j, _) = compare_json(&a, &b, &["--rank", "0-1"]);
    assert_eq!(code, 0);
    assert_eq!(verdicts(&j), vec![(0, "agree".into()), (1, "agree".into())]);
    assert_eq!(j["fleet"]["first_introduced"], Value::Null);
}

/// `all` compares the ranks both dumps have and names the others without
/// failing; a set that names ranks one dump lacks is an input error (2),
/// and the ranks both have are still compared and reported.
#[test]
fn ranks_in_one_dump_only_are_named_and_do_not_hide_the_others() {
    let t = tmp();
    // A has 8 ranks, B has 4.
    let (a, b) = fleet_pair(t.path(), 8, 4, |r| {
        if r == 1 {
            fault(1, 3)
        } else {
            Variant::default()
        }
    });
    let r = run(&["compare", path_str(&a), path_str(&b), "--rank", "all"]);
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert!(r.stdout.contains("4 rank pairs"), "{}", r.stdout);
    assert!(
        r.stdout.contains("\nonly in A (left out): ranks 4-7\n"),
        "{}",
        r.stdout
    );
    assert!(r.stdout.contains("on rank 1 only"), "{}", r.stdout);
    let (_, j, _) = compare_json(&a, &b, &["--rank", "all"]);
    assert_eq!(
        verdicts(&j),
        vec![
            (0, "agree".into()),
            (1, "introduced".into()),
            (2, "agree".into()),
            (3, "agree".into())
        ]
    );
    assert_eq!(ranks_of(&j["only_in_a"]), vec![4, 5, 6, 7]);
    assert_eq!(ranks_of(&j["only_in_b"]), Vec::<u64>::new());

    let (code, j, err) = compare_json(&a, &b, &["--rank", "0-1,5"]);
    assert_eq!(code, 2, "{err}");
    assert_eq!(
        verdicts(&j),
        vec![(0, "agree".into()), (1, "introduced".into())]
    );
    assert_eq!(ranks_of(&j["only_in_a"]), vec![5]);
    assert_eq!(j["fleet"]["first_introduced"]["rank"], 1);
    let r = run(&["compare", path_str(&a), path_str(&b), "--rank", "0-1,5"]);
    assert!(
        r.stdout.contains("\nonly in A (not compared): rank 5\n"),
        "{}",
        r.stdout
    );

    // A set of ranks both dumps have: nothing missing.
    let (code, j, _) = compare_json(&a, &b, &["--rank", "0"]);
    assert_eq!(code, 0);
    assert_eq!(j["format"], "opdump-compare", "one rank keeps its report");
    let (code, _, _) = compare_json(&a, &b, &["--rank", "1,0"]);
    assert_eq!(code, 1);
    let r = run(&["compare", path_str(&a), path_str(&b), "--rank", "8-9"]);
    assert_eq!(r.code, 2);
    assert!(r.stderr.contains("share no rank in --rank"), "{}", r.stderr);
}

#[test]
fn a_rank_pair_that_cannot_be_read_is_an_error_row() {
    let t = tmp();
    let (a, b) = fleet_pair(t.path(), 3, 3, |r| {
        if r == 2 {
            fault(0, 1)
        } else {
            Variant::default()
        }
    });
    // B's rank 1 is another program: the judge refuses that pair.
    std::fs::remove_dir_all(b.join("rank=1")).expect("remove");
    let other = Model {
        tokens: 12,
        hidden: 24,
        ..small_model()
    };
    write_rank(&b, 1, &other, &Variant::default(), true);
    let (code, j, err) = compare_json(&a, &b, &["--rank", "all"]);
    assert_eq!(code, 2, "{err}");
    assert_eq!(
        verdicts(&j),
        vec![
            (0, "agree".into()),
            (1, "error".into()),
            (2, "introduced".into())
        ]
    );
    let why = j["ranks"][1]["error"].as_str().expect("error");
    assert!(why.contains("different programs"), "{why}");
    assert_eq!(j["fleet"]["first_introduced"]["rank"], 2);
}

#[test]
fn jobs_do_not_change_the_report() {
    let t = tmp();
    let (a, b) = fleet_pair(t.path(), 5, 5, |r| {
        if r % 2 == 1 {
            fault(1, 3)
        } else {
            Variant::default()
        }
    });
    for extra in [&[][..], &["--json"][..]] {
        let out = |jobs: &str| {
            let mut args = vec![
                "compare",
                path_str(&a),
                path_str(&b),
                "--rank",
                "all",
                "--jobs",
                jobs,
            ];
            args.extend_from_slice(extra);
            let r = run(&args);
            assert_eq!(r.code, 1, "{}", r.stderr);
            r.stdout
        };
        let one = out("1");
        assert_eq!(one, out("2"));
        assert_eq!(one, out("8"));
        assert!(
            one.contains("on ranks 1, 3 (2 of 5)") || extra == ["--json"],
            "{one}"
        );
    }
    let r = run(&[
        "compare",
        path_str(&a),
        path_str(&b),
        "--rank",
        "all",
        "--jobs",
        "0",
    ]);
    assert_eq!(r.code, 2);
}

/// `--html` writes the per-rank table; `--out` (one pair's tables) is
/// refused in one line.
#[test]
fn the_html_page_has_a_row_per_rank_and_out_is_refused() {
    let t = tmp();
    let (a, b) = fleet_pair(t.path(), 3, 3, |r| {
        if r == 1 {
            fault(1, 3)
        } else {
            Variant::default()
        }
    });
    let html = t.path().join("r.html");
    let (a_s, b_s, h_s) = (path_str(&a), path_str(&b), path_str(&html));
    let r = run(&["compare", a_s, b_s, "--rank", "all", "--html", h_s]);
    assert_eq!(r.code, 1, "{}", r.stderr);
    let page = std::fs::read_to_string(&html).expect("page");
    let rows: Vec<&str> = page.split("<tr class=\"").skip(1).collect();
    assert_eq!(rows.len(), 3, "{page}");
    assert!(rows[0].starts_with("agree\"><td>0</td>"), "{page}");
    assert!(rows[1].starts_with("introduced\"><td>1</td>"), "{page}");
    assert!(
        rows[1].contains("<code>aten::addmm</code></td><td class=\"l\">layers.3</td><td>1</td>"),
        "{page}"
    );
    assert!(rows[2].starts_with("agree\"><td>2</td>"), "{page}");
    assert!(page.contains("; on rank 1 only"), "{page}");

    let out = t.path().join("out");
    let r = run(&[
        "compare",
        a_s,
        b_s,
        "--rank",
        "all",
        "--out",
        path_str(&out),
    ]);
    assert_eq!(r.code, 2);
    assert_eq!(r.stderr.lines().count(), 1, "{}", r.stderr);
    assert!(
        r.stderr.contains("--out writes one rank pair's tables"),
        "{}",
        r.stderr
    );
    assert!(!out.exists());
}

/// The generator of the fleet benchmark (`synth_ranks`, through
/// `write_model_rank`) plants what the benchmark checks for: an odd
/// gradient that `opdump ranks` names, and in B a fault on the same rank
/// that `compare --rank all` names alone, under device noise on every rank.
#[test]
fn the_benchmark_generator_plants_what_compare_and_ranks_find() {
    let t = tmp();
    let (a, b) = (t.path().join("a"), t.path().join("b"));
    let m = small_model();
    let noisy = |faulty: bool| Variant {
        noise: 1e-9,
        decompose_layer_norm: true,
        fault: faulty.then_some((m.steps - 1, 2, 0.01)),
        ..Default::default()
    };
    for rank in 0..4 {
        let of = RankOf {
            rank,
            fingerprints: true,
            odd_grad_at: (rank == 2).then_some(m.steps - 1),
        };
        write_model_rank(&a, &of, &m, &noisy(false), false, 500_000).expect("write A");
        write_model_rank(&b, &of, &m, &noisy(rank == 2), true, 500_000).expect("write B");
    }
    let r = run(&["ranks", path_str(&a), "--json"]);
    assert_eq!(r.code, 1, "{}", r.stderr);
    let j: Value = serde_json::from_str(&r.stdout).expect("json");
    assert_eq!(ranks_of(&j["first"]["odd_ranks"]), vec![2]);
    assert_eq!(j["first"]["name"], "opt.0.grad");
    assert_eq!(j["first"]["step"], m.steps - 1);
    // Every weight read in forward and every optimizer tensor, each step,
    // on every rank; only the one gradient leaves the majority.
    let per_step = m.layers as u64 * 2 + 12;
    assert_eq!(j["tensors"]["compared"], per_step * m.steps as u64);
    assert_eq!(j["tensors"]["odd"], 1);

    let (code, j, err) = compare_json(&a, &b, &["--rank", "all"]);
    assert_eq!(code, 1, "{err}");
    let first = &j["fleet"]["first_introduced"];
    assert_eq!(ranks_of(&first["ranks"]), vec![2]);
    assert_eq!(first["site"]["op"], "aten::addmm");
    assert_eq!(first["site"]["module"], "layers.2");
    assert_eq!(ranks_of(&j["fleet"]["agree"]), vec![0, 1, 3]);
}
