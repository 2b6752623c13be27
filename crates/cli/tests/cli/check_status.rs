//! `opdump check`'s exit status from hand-written `checks/` files: 0 all
//! checked and passed, 1 a check failed, 3 signatures never checked (the
//! time budget spent, or the checking thread's queue full at each call),
//! which the report lists; a failure comes first, with the list printed too.

use std::path::Path;

use crate::common::{path_str, run};

const MM: &str = "aten::mm.default(float32[64, 32], float32[32, 16])";
const GELU: &str = "aten::gelu.default(float32[8, 16])";

fn row(sig: &str, op: &str, verdict: &str, ratio: f64) -> String {
    format!(
        r#"{{"kind":"check","signature":"{sig}","op":"{op}","overload":"default","args":"","module":null,"phase":"forward","step":0,"seq":1,"rank":0,"device":"cpu","dtype":"float32","device_err":null,"cpu_err":null,"ratio":{ratio},"device_ulp":null,"cpu_ulp":null,"reduction_len":null,"verdict":"{verdict}","reason":null,"capture":null}}"#
    )
}

/// A summary line; `unchecked`: the list's JSON, or `None` for a plugin
/// before the list.
fn summary(passed: u64, failed: u64, budget: u64, busy: u64, unchecked: Option<&str>) -> String {
    let list = unchecked.map_or(String::new(), |u| format!(r#","unchecked":{u}"#));
    format!(
        r#"{{"kind":"summary","rank":0,"pid":4242,"checked":{},"passed":{passed},"failed":{failed},"no_reference":0,"signatures":{},"skipped_bytes":0,"skipped_budget":{budget},"skipped_busy":{busy},"waits":2,"wait_seconds":0.5{list}}}"#,
        passed + failed,
        passed + failed + budget + busy
    )
}

fn write(root: &Path, lines: &[String]) -> String {
    let dir = root.join("d/checks/rank=0");
    std::fs::create_dir_all(&dir).unwrap();
    let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
    std::fs::write(dir.join("part-4242.jsonl"), text).unwrap();
    path_str(&root.join("d")).to_string()
}

fn listed(sig: &str, why: &str) -> String {
    format!(r#"{{"signature":"{sig}","op":"aten::gelu","overload":"default","why":"{why}"}}"#)
}

#[test]
fn all_checked_and_passed_exits_0() {
    let t = tempfile::tempdir().unwrap();
    let d = write(
        t.path(),
        &[
            row(MM, "aten::mm", "pass", 1.0),
            summary(1, 0, 0, 0, Some("[]")),
        ],
    );
    let r = run(&["check", &d]);
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    assert!(!r.stdout.contains("never checked"), "{}", r.stdout);
}

#[test]
fn a_signature_never_checked_exits_3_and_is_listed() {
    let t = tempfile::tempdir().unwrap();
    let d = write(
        t.path(),
        &[
            row(MM, "aten::mm", "pass", 1.0),
            summary(1, 0, 0, 1, Some(&format!("[{}]", listed(GELU, "busy")))),
        ],
    );
    let r = run(&["check", &d]);
    assert_eq!(r.code, 3, "{}{}", r.stdout, r.stderr);
    assert!(
        r.stdout.contains("no check failed")
            && r.stdout.contains("1 signatures were never checked"),
        "{}",
        r.stdout
    );
    let line = r
        .stdout
        .lines()
        .find(|l| l.contains(GELU))
        .unwrap_or_else(|| panic!("{GELU} not listed: {}", r.stdout));
    assert!(
        line.contains("aten::gelu") && line.contains("queue was full") && line.contains("rank 0"),
        "{line}"
    );
    let r = run(&["check", &d, "--json"]);
    assert_eq!(r.code, 3, "{}", r.stderr);
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(v["exit_status"], 3);
    assert_eq!(
        v["unchecked"],
        serde_json::json!([{"signature": GELU, "op": "aten::gelu", "overload": "default", "why": "busy", "ranks": [0]}])
    );
}

#[test]
fn a_failure_comes_first_and_the_unchecked_are_listed_too() {
    let t = tempfile::tempdir().unwrap();
    let d = write(
        t.path(),
        &[
            row(MM, "aten::mm", "fail", 400.0),
            summary(0, 1, 1, 0, Some(&format!("[{}]", listed(GELU, "budget")))),
        ],
    );
    let r = run(&["check", &d]);
    assert_eq!(r.code, 1, "{}{}", r.stdout, r.stderr);
    assert!(r.stdout.contains(&format!("1. {MM}")), "{}", r.stdout);
    let line = r.stdout.lines().find(|l| l.contains(GELU)).unwrap();
    assert!(line.contains("OPDUMP_CHECK_SECONDS was spent"), "{line}");
}

#[test]
fn an_older_summary_without_the_list_exits_3_and_says_the_names_are_unknown() {
    let t = tempfile::tempdir().unwrap();
    let d = write(
        t.path(),
        &[row(MM, "aten::mm", "pass", 1.0), summary(1, 0, 2, 0, None)],
    );
    let r = run(&["check", &d, "--json"]);
    assert_eq!(r.code, 3, "{}", r.stderr);
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(v["unchecked"], serde_json::json!([]));
    assert_eq!(v["skipped"]["budget"], 2);
    let notes = v["notes"].to_string();
    assert!(
        notes.contains("2 of its 2 signatures never checked are not named"),
        "{notes}"
    );
}
